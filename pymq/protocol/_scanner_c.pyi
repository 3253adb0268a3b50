# Interface of the compiled frame scanner built from _ext/scanner.pyx; the twin
# pymq/protocol/_scanner_py.py has the same names and semantics (spec/stomp.md).
from typing import Union
from collections.abc import Iterable, Mapping

from pymq.protocol.frame import Frame

Headers = Union[Mapping[str, object], Iterable[tuple[str, object]]]

DEFAULT_MAX_FRAME_SIZE: int
DEFAULT_MAX_HEADERS: int

def unescape(text: str) -> str: ...
def escape(text: str, cr: bool = True) -> str: ...
def encode_headers(headers: Headers, escaped: bool = True, cr: bool = True) -> bytes: ...
def encode_frame(command: str, headers: Headers, body: bytes = b"", version: str = "1.2") -> bytes: ...

class FrameScanner:
    max_frame_size: int
    max_headers: int
    version: str
    def __init__(self, max_frame_size: int = ..., max_headers: int = ..., version: str = "1.0") -> None: ...
    @property
    def buffered(self) -> int: ...
    def feed(self, data: bytes | memoryview) -> list[Frame]: ...
