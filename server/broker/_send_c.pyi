# Interface of the compiled SEND header parser built from _ext/send.pyx; the twin
# server/broker/_send_py.py has the same function and semantics (spec/stomp.md §4).
from collections.abc import Mapping

from pymq_server.broker._send_py import SendRequest

def parse_send(headers: Mapping[str, str], body: bytes) -> SendRequest: ...
