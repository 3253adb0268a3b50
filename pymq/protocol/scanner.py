"""The frame scanner and encoder in use: compiled (``_ext/scanner.pyx``) unless unavailable or disabled."""
from pymq._accel import load

_py, _c = load("pymq.protocol._scanner_py", "pymq.protocol._scanner_c")
_impl = _c or _py

FrameScanner = _impl.FrameScanner
encode_frame = _impl.encode_frame
encode_headers = _impl.encode_headers
escape = _py.escape
unescape = _py.unescape
DEFAULT_MAX_FRAME_SIZE = _py.DEFAULT_MAX_FRAME_SIZE
DEFAULT_MAX_HEADERS = _py.DEFAULT_MAX_HEADERS
IMPLEMENTATIONS = {"py": _py, "c": _c}
COMPILED = _c is not None

__all__ = ["FrameScanner", "encode_frame", "encode_headers", "escape", "unescape", "IMPLEMENTATIONS", "COMPILED"]
