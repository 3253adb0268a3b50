# cython: language_level=3
"""Compiled STOMP frame scanner and encoder; ``pymq/protocol/_scanner_py.py`` defines the semantics.

Same algorithm as the twin (heart-beat skipping, resumable header-end and NUL searches, one compaction
per feed), done over the bytearray's memory with memchr instead of Python-level slicing.  Error classes
and messages are the twin's; tests/protocol runs every case against both.
"""
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcpy

from pymq.errors import BadEscape, FrameTooLarge, InvalidHeader, MalformedFrame, ProtocolError
from pymq.protocol.frame import UNESCAPED_COMMANDS, Frame
from pymq.protocol.numbers import MAX_DIGITS, parse_wire_int

cdef extern from "Python.h":
    int _PyBytes_Resize(PyObject** bytes, Py_ssize_t size) except -1

cdef extern from *:
    """
    /* Size arithmetic on untrusted lengths: a sum that would wrap is reported, never used. */
    static inline int pymq_ssize_add_ovf(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *r) {
        return __builtin_add_overflow(a, b, r);
    }
    #define PYMQ_INT64_MAX 9223372036854775807ULL
    """
    Py_ssize_t PY_SSIZE_T_MAX
    int pymq_ssize_add_ovf(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *r)
    unsigned long long PYMQ_INT64_MAX

DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
cdef Py_ssize_t _MAX_DIGITS = MAX_DIGITS
DEFAULT_MAX_HEADERS = 1000
#: the pure twin's LARGE_BODY: a longer body not fully arrived is gathered as it is fed, straight into the
#: body (no list of chunks copied again by a join, no copy of a chunk handed over as a view): a bulk SEND's
#: 8 MiB are copied once from the socket's reads, where they were copied twice more (about a third of the
#: broker's CPU of a bulk write into a retained topic, measured)
LARGE_BODY = 64 * 1024
cdef Py_ssize_t _LARGE_BODY = LARGE_BODY
#: the body is made at its declared length up to this (memory not yet written is not resident); a longer
#: one (an operator's max_frame_size above it) starts there and grows by doubling as its bytes arrive, so
#: a declared length is never memory the sender has not sent
cdef Py_ssize_t _UPFRONT = 64 * 1024 * 1024

cdef object _Frame = Frame
cdef frozenset _NEGOTIATING = frozenset({"CONNECT", "STOMP", "CONNECTED"})
cdef object _tuple_new = tuple.__new__


cpdef str unescape(str text):
    if "\\" not in text:
        return text
    cdef list out = []
    cdef Py_ssize_t i = 0, n = len(text)
    cdef Py_UCS4 ch, nx
    while i < n:
        ch = text[i]
        if ch == u"\\":
            if i + 1 >= n:
                raise BadEscape("header ends with a lone backslash")
            nx = text[i + 1]
            if nx == u"r":
                out.append("\r")
            elif nx == u"n":
                out.append("\n")
            elif nx == u"c":
                out.append(":")
            elif nx == u"\\":
                out.append("\\")
            else:
                raise BadEscape(f"undefined escape sequence '\\{nx}' in header")
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


cpdef str escape(str text, bint cr=True):
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\n" in text:
        text = text.replace("\n", "\\n")
    if ":" in text:
        text = text.replace(":", "\\c")
    if cr and "\r" in text:
        text = text.replace("\r", "\\r")
    return text


cdef inline bint _needs_escape(str text, bint cr):
    cdef Py_UCS4 ch
    for ch in text:
        if ch == u"\\" or ch == u"\n" or ch == u":" or (cr and ch == u"\r"):
            return True
    return False


def encode_headers(headers, bint escaped=True, bint cr=True):
    """``name:value\\n`` lines: escaped for 1.2, escaped without the CR escape for 1.1 (``cr=False``),
    or raw for 1.0 (``escaped=False``, LF replaced by a space)."""
    items = headers.items() if hasattr(headers, "items") else headers
    cdef list parts = []
    cdef str k, v
    for key, value in items:
        k = key
        v = value if type(value) is str else str(value)
        if escaped:
            # escape() is a few C-level replaces; str.translate with a dict table looks every character
            # up in the dict (~1 µs for a 25-character message id), and most MESSAGEs carry two values
            # with a ':' (message-id and an application id)
            if _needs_escape(k, cr):
                k = escape(k, cr)
            if _needs_escape(v, cr):
                v = escape(v, cr)
        elif "\n" in v:
            v = v.replace("\n", " ")
        parts.append(k)
        parts.append(":")
        parts.append(v)
        parts.append("\n")
    return "".join(parts).encode("utf-8")


def encode_frame(str command, headers, bytes body=b"", str version="1.2"):
    items = headers.items() if hasattr(headers, "items") else headers
    cdef list parts = [command, "\n"]
    cdef bint raw = version == "1.0" or command in UNESCAPED_COMMANDS
    cdef bint cr = version != "1.1"
    for name, value in items:
        if name == "content-length":
            continue
        if type(value) is not str:
            value = str(value)
        if raw:
            if "\n" in name or "\n" in value or ":" in name:
                raise InvalidHeader(f"header {name!r} cannot be sent unescaped in a {command} frame "
                                    f"(STOMP {version})")
            parts.append(name)
        else:
            parts.append(escape(name, cr))
            value = escape(value, cr)
        parts.append(":")
        parts.append(value)
        parts.append("\n")
    if body:
        parts.append("content-length:")
        parts.append(str(len(body)))
        parts.append("\n")
    parts.append("\n")
    return "".join(parts).encode("utf-8") + body + b"\x00"


cdef Py_ssize_t _content_length(str text) except -1:
    """The rule of pymq.protocol.numbers.parse_wire_int, in C: 1 to 19 ASCII digits, at most
    2**63-1.  Anything else is handed to parse_wire_int, which raises the error both twins share."""
    cdef Py_ssize_t i, n = len(text)
    cdef unsigned long long value = 0
    cdef Py_UCS4 ch
    if 0 < n <= _MAX_DIGITS:
        for i in range(n):
            ch = text[i]
            if ch < u"0" or ch > u"9":
                break
            value = value * 10 + (<unsigned long long>ch - 48)    # 19 digits < 2**64: no wrap
        else:
            if value <= PYMQ_INT64_MAX and value <= <unsigned long long>PY_SSIZE_T_MAX:
                return <Py_ssize_t>value
    parse_wire_int("content-length", text)      # raises InvalidHeader naming the header
    raise InvalidHeader(f"header 'content-length' {text!r} is out of range", header="content-length")


cdef class FrameScanner:
    cdef public Py_ssize_t max_frame_size
    cdef public Py_ssize_t max_headers
    cdef public str version
    cdef bytearray _buf
    cdef Py_ssize_t _pos
    cdef Py_ssize_t _scan
    cdef object _failed
    cdef bint _has_pending
    cdef str _p_command
    cdef dict _p_headers
    cdef Py_ssize_t _p_length
    cdef Py_ssize_t _p_body
    cdef bytes _body          # the large body being gathered (filled up to _have - _p_body), or None
    cdef Py_ssize_t _have

    def __init__(self, Py_ssize_t max_frame_size=DEFAULT_MAX_FRAME_SIZE,
                 Py_ssize_t max_headers=DEFAULT_MAX_HEADERS, str version="1.0"):
        self.max_frame_size = max_frame_size
        self.max_headers = max_headers
        self.version = version
        self._buf = bytearray()
        self._pos = 0
        self._scan = 0
        self._failed = None
        self._has_pending = False
        self._body = None
        self._have = 0

    @property
    def buffered(self):
        return PyByteArray_GET_SIZE(self._buf) - self._pos + self._have

    @property
    def body_missing(self):
        """The pure twin's body_missing: bytes a large body being gathered still needs, NUL included."""
        if self._body is None:
            return 0
        return self._p_body + self._p_length + 1 - self._have

    def unparsed(self):
        """The pure twin's unparsed: the bytes fed and not yet returned in a frame; None while a large
        body is gathered or after a protocol error."""
        if self._body is not None or self._failed is not None:
            return None
        return bytes(self._buf[self._pos:])

    def feed(self, data):
        if self._failed is not None:
            raise self._failed
        cdef list frames = []
        try:
            if self._body is not None:
                rest = self._gather(data, frames)
                if rest is None or (<tuple>frames[0])[0] in _NEGOTIATING:
                    if rest is not None:
                        self._buf += rest
                    return frames
                data = rest
            self._buf += data
            while True:
                frame = self._next()
                if frame is None:
                    break
                frames.append(frame)
                if (<tuple>frame)[0] in _NEGOTIATING:
                    break
        except ProtocolError as exc:
            self._failed = exc
            self._buf = bytearray()
            self._pos = 0
            self._scan = 0
            self._body = None
            self._have = 0
            raise
        if self._pos:
            del self._buf[:self._pos]
            self._scan -= self._pos
            self._pos = 0
        return frames

    cdef object _gather(self, data, list frames):
        """The pure twin's _gather: None while the large body is incomplete; else the frame goes to
        ``frames`` and the bytes fed past its NUL are returned (a view of ``data``).  Each piece fed is
        copied once, into the body at its place (made at the declared length when the head was read)."""
        cdef Py_buffer view
        cdef Py_ssize_t need = self._p_body + self._p_length + 1 - self._have
        cdef Py_ssize_t at = self._have - self._p_body          # body bytes already in place
        cdef Py_ssize_t size
        cdef const unsigned char* src
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            size = view.len
            src = <const unsigned char*>view.buf
            if size < need:
                if size:
                    self._room(at + size)
                    memcpy(PyBytes_AS_STRING(self._body) + at, src, size)
                    self._have += size
                return None
            if src[need - 1] != 0:
                raise MalformedFrame(f"{self._p_command} frame: expected NUL after "
                                     f"{self._p_length} body bytes (content-length)")
            self._room(self._p_length)
            memcpy(PyBytes_AS_STRING(self._body) + at, src, need - 1)
        finally:
            PyBuffer_Release(&view)
        body = self._body
        self._body = None
        self._have = 0
        self._has_pending = False
        frames.append(_tuple_new(_Frame, (self._p_command, self._p_headers, body)))
        return memoryview(data)[need:] if size > need else b""

    cdef int _room(self, Py_ssize_t size) except -1:
        """The body being gathered holds at least ``size`` bytes (<= the declared length): grown by doubling,
        in place (it is this scanner's alone until complete: _PyBytes_Resize needs the only reference)."""
        cdef Py_ssize_t have = PyBytes_GET_SIZE(self._body)
        if size <= have:
            return 0
        size = max(size, min(2 * have, self._p_length))
        cdef PyObject* raw = <PyObject*>self._body
        Py_INCREF(self._body)          # ours, handed over once the attribute's reference is gone
        self._body = None
        _PyBytes_Resize(&raw, size)    # on failure it freed the body and raised
        self._body = <bytes>raw
        Py_DECREF(self._body)          # the attribute keeps the only reference
        return 0

    cdef object _next(self):
        cdef char* base = PyByteArray_AS_STRING(self._buf)
        cdef Py_ssize_t n = PyByteArray_GET_SIZE(self._buf)
        cdef Py_ssize_t limit = self.max_frame_size
        cdef Py_ssize_t p = self._pos
        cdef Py_ssize_t i, head_len = -1, body_start = -1, b, end
        cdef char* hit
        if not self._has_pending:
            while p < n and (base[p] == 10 or base[p] == 13):
                if base[p] == 13:
                    if p + 1 >= n:
                        break
                    if base[p + 1] != 10:
                        raise MalformedFrame("stray CR before a command")
                p += 1
            self._pos = p
            if self._scan < p:
                self._scan = p
            if p >= n or base[p] == 13:
                return None
            # header end: the first LF followed by LF or CRLF (resumable)
            i = self._scan - 2
            if i < p:
                i = p
            while i < n:
                hit = <char*>memchr(base + i, 10, n - i)
                if hit == NULL:
                    i = n
                    break
                i = hit - base
                if i + 1 >= n:
                    break
                if base[i + 1] == 10:
                    head_len = i - p
                    body_start = i + 2 - p
                    break
                if base[i + 1] == 13:
                    if i + 2 >= n:
                        break
                    if base[i + 2] == 10:
                        head_len = i - p
                        body_start = i + 3 - p
                        break
                i += 1
            if head_len < 0:
                self._scan = n - 2 if n - 2 > p else p
                if n - p > limit:
                    raise FrameTooLarge(size=n - p, limit=limit)
                return None
            if body_start > limit:
                raise FrameTooLarge(size=body_start, limit=limit)
            self._parse_head(base + p, head_len)
            self._has_pending = True
            self._p_body = body_start
            self._scan = p + body_start
        b = p + self._p_body
        if self._p_length >= 0:
            # _p_body <= limit (checked above), so ``limit - _p_body`` cannot wrap, and a declared
            # length up to 2**63-1 is compared, never added: the sum is what overflowed before.
            if self._p_length > limit - self._p_body:
                raise FrameTooLarge(size=<object>self._p_body + <object>self._p_length, limit=limit)
            if pymq_ssize_add_ovf(b, self._p_length, &end) or end >= n:
                if self._p_length >= _LARGE_BODY:
                    # gather the rest as it is fed, into the body made now (see _UPFRONT; n - b <= the
                    # declared length); nothing of this frame stays in _buf
                    self._body = PyBytes_FromStringAndSize(NULL, max(min(self._p_length, _UPFRONT), n - b))
                    memcpy(PyBytes_AS_STRING(self._body), base + b, n - b)
                    self._have = n - p
                    del self._buf[p:]
                    self._pos = p
                    self._scan = p
                return None
            if base[end] != 0:
                raise MalformedFrame(f"{self._p_command} frame: expected NUL after "
                                     f"{self._p_length} body bytes (content-length)")
        else:
            if self._scan >= n:
                hit = NULL
            else:
                hit = <char*>memchr(base + self._scan, 0, n - self._scan)
            if hit == NULL:
                if n - p > limit:
                    raise FrameTooLarge(size=n - p, limit=limit)
                self._scan = n
                return None
            end = hit - base
            if end - p > limit:
                raise FrameTooLarge(size=end - p, limit=limit)
        body = PyBytes_FromStringAndSize(base + b, end - b)
        self._pos = end + 1
        self._scan = end + 1
        self._has_pending = False
        return _tuple_new(_Frame, (self._p_command, self._p_headers, body))

    cdef int _parse_head(self, char* head, Py_ssize_t length) except -1:
        cdef Py_ssize_t i, line_end, colon, count = 0, stop
        cdef char* hit
        cdef str command, name, value
        cdef dict headers = {}
        cdef bint escaped
        if memchr(head, 0, length) != NULL:
            raise MalformedFrame("NUL inside the header block")
        # the whole block must be UTF-8 before any line is judged (the twin decodes it at once, so a
        # bad byte on a later line is reported before a missing colon on an earlier one)
        for i in range(length):
            if <unsigned char>head[i] >= 0x80:
                self._decode(head, length)
                break
        # command line
        hit = <char*>memchr(head, 10, length)
        line_end = (hit - head) if hit != NULL else length
        stop = line_end
        if stop > 0 and head[stop - 1] == 13:
            stop -= 1
        command = self._decode(head, stop)
        if not command:
            raise MalformedFrame("empty command line")
        escaped = self.version != "1.0" and command not in UNESCAPED_COMMANDS
        # count header lines first, for the same limit message as the twin
        i = line_end + 1
        while i <= length:
            count += 1
            hit = <char*>memchr(head + i, 10, length - i) if i < length else NULL
            if hit == NULL:
                break
            i = (hit - head) + 1
        if line_end >= length:
            count = 0
        if count > self.max_headers:
            raise MalformedFrame(f"{command} frame has {count} headers, "
                                 f"more than the limit of {self.max_headers}")
        i = line_end + 1
        while i <= length and line_end < length:
            hit = <char*>memchr(head + i, 10, length - i) if i < length else NULL
            line_end = (hit - head) if hit != NULL else length
            stop = line_end
            if stop > i and head[stop - 1] == 13:
                stop -= 1
            hit = <char*>memchr(head + i, 58, stop - i) if stop > i else NULL
            if hit == NULL:
                raise MalformedFrame(f"{command} frame: header line without ':'")
            colon = hit - head
            if colon == i:
                raise MalformedFrame(f"{command} frame: header with an empty name")
            name = self._decode(head + i, colon - i)
            value = self._decode(head + colon + 1, stop - colon - 1)
            if escaped:
                name = unescape(name)
                value = unescape(value)
            if name not in headers:
                headers[name] = value
            i = line_end + 1
        self._p_length = -1
        cl = headers.get("content-length")
        if cl is not None:
            self._p_length = _content_length(cl)
        self._p_command = command
        self._p_headers = headers
        return 0

    cdef str _decode(self, char* p, Py_ssize_t n):
        try:
            return PyUnicode_DecodeUTF8(p, n, NULL)
        except UnicodeDecodeError:
            raise MalformedFrame("frame header is not valid UTF-8") from None
