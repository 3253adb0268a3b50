# Interface of the compiled message construction built from _ext/message.pyx; the twin
# server/broker/_message_py.py has the same functions and semantics (spec/stomp.md §4).
from pymq_server.broker._send_py import SendRequest
from pymq_server.broker.message import BrokerMessage

def bind(cls: type) -> None: ...
def now_ms() -> int: ...
def init_message(self: BrokerMessage, key: int, message_id: str, destination: str, seq: int, headers: dict,
                 body: bytes, persistent: bool, priority: int, timestamp: int, expires: int,
                 deliver_at: int = 0, producer: str = "", client_id: str | None = None,
                 user: str | None = None) -> None: ...
def message_from_request(request: SendRequest, *, key: int, message_id: str, seq: int, destination: str,
                         default_persistent: bool = True, producer: str = "", now: int | None = None,
                         default_priority: int = ..., default_ttl: int = 0,
                         client_id: str | None = None, user: str | None = None) -> BrokerMessage: ...
