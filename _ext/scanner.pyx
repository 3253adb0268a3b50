# cython: language_level=3
"""Compiled STOMP frame scanner and encoder; ``pymq/protocol/_scanner_py.py`` defines the semantics.

Same algorithm as the twin (heart-beat skipping, resumable header-end and NUL searches, one compaction
per feed), done over the bytearray's memory with memchr instead of Python-level slicing.  Error classes
and messages are the twin's; tests/protocol runs every case against both.

Where the time of a frame went (session 39, callgrind on bench_brokers' SEND, bench/README "The 1→1
queue row"): not the buffer (one append and one compaction a feed), but the head's strs: a UTF-8 decode,
a hash and an allocation for every name, a Python-level unescape call per piece, a dict grown twice. So
a head is read in one pass of 8-byte words, names come from a small cache (``_name``), values are copied
as ASCII, the dict is made at its size; the MESSAGE header block is written into bytes sized first.
"""
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_SetDefault
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcmp, memcpy

from pymq.errors import BadEscape, FrameTooLarge, InvalidHeader, MalformedFrame, ProtocolError
from pymq.protocol.frame import UNESCAPED_COMMANDS, Frame
from pymq.protocol.numbers import MAX_DIGITS, parse_wire_int

cdef extern from "Python.h":
    int _PyBytes_Resize(PyObject** bytes, Py_ssize_t size) except -1
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object text)
    Py_ssize_t PyUnicode_GET_LENGTH(object text)
    bint PyUnicode_IS_ASCII(object text)
    object _PyDict_NewPresized(Py_ssize_t minused)
    ctypedef struct PyTypeObject
    object PyType_GenericAlloc(PyTypeObject* kind, Py_ssize_t items)
    void PyTuple_SET_ITEM(object tup, Py_ssize_t pos, PyObject* item)

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* 8 bytes as one word (unaligned: memcpy is one load), and the SWAR tests on it */
    static inline uint64_t pymq_load64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
    #define PYMQ_ONES 0x0101010101010101ULL
    #define PYMQ_HIGHS 0x8080808080808080ULL
    static inline int pymq_has_zero(uint64_t v) { return ((v - PYMQ_ONES) & ~v & PYMQ_HIGHS) != 0; }
    """
    ctypedef unsigned long long uint64_t
    uint64_t pymq_load64(const char* p) noexcept
    uint64_t PYMQ_ONES
    uint64_t PYMQ_HIGHS
    bint pymq_has_zero(uint64_t v) noexcept

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


# --- a head's bytes into strs -----------------------------------------------------------------------------
# The first pass over a head classifies each byte by this table (flags OR-ed over the block).
cdef enum:
    _NUL = 1
    _HIGH = 2           # >= 0x80: the block is decoded as UTF-8, not copied as ASCII
    _SLASH = 4          # a backslash: from 1.1 on some piece may need unescaping
    _LINES = 64         # line ends the first pass remembers; a head with more finds the rest by memchr
cdef unsigned char _CLASS[256]
for _c in range(256):
    _CLASS[_c] = _NUL if _c == 0 else (_HIGH if _c >= 0x80 else (_SLASH if _c == 92 else 0))


cdef inline str _ascii(const char* p, Py_ssize_t n):
    """A str of ``n`` ASCII bytes, copied (what PyUnicode_DecodeUTF8 gives for them, without its scan)."""
    cdef object text = PyUnicode_New(n, 127)
    memcpy(PyUnicode_DATA(text), p, n)
    return <str>text


# The name cache: header names and commands repeat from frame to frame, so each is made once and the same
# str (its hash computed once, by the first dict that held it) is handed out again. A slot is chosen by
# a mix of the bytes (_slot) and checked byte for byte, so a collision only costs a new str; it holds ASCII names
# of at most _NAME_MAX bytes, so hostile names (unique, long) cost a miss each and never grow it. Seeded
# with the spec's names as the literals the broker looks them up with (a dict look-up by the same object
# skips the comparison).
cdef enum:
    _NAME_SLOTS = 512   # a power of two
    _NAME_MAX = 48
cdef list _names = [None] * _NAME_SLOTS


cdef inline size_t _slot(const char* p, Py_ssize_t n) noexcept:
    """A name's slot: its length and its first and last (up to) 8 bytes, mixed (a slot is checked byte for
    byte, so this only spreads the names the broker sees; a hash over every byte cost more than a miss)."""
    cdef uint64_t h
    cdef Py_ssize_t i
    if n >= 8:
        h = pymq_load64(p) * 0x9E3779B97F4A7C15ULL ^ pymq_load64(p + n - 8) * 0xC2B2AE3D27D4EB4FULL
    else:
        h = 0
        for i in range(n):
            h = (h << 8) | <unsigned char>p[i]
        h *= 0x9E3779B97F4A7C15ULL
    h ^= <uint64_t>n * 0x165667B19E3779F9ULL
    return <size_t>((h >> 40) & (_NAME_SLOTS - 1))


cdef inline object _name(const char* p, Py_ssize_t n):
    """The str of ASCII bytes ``p[:n]``: the cached one when it is there."""
    if n > _NAME_MAX:
        return _ascii(p, n)
    cdef size_t slot = _slot(p, n)
    cdef object known = _names[slot]
    if known is not None and PyUnicode_GET_LENGTH(known) == n and memcmp(PyUnicode_DATA(known), p, n) == 0:
        return known
    known = _ascii(p, n)
    _names[slot] = known
    return known


cdef _seed_names():
    cdef bytes raw
    for text in ("SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT", "DISCONNECT",
                 "CONNECT", "STOMP", "CONNECTED", "MESSAGE", "RECEIPT", "ERROR",
                 "destination", "content-type", "content-length", "persistent", "receipt", "transaction",
                 "id", "ack", "subscription", "message-id", "priority", "expires", "timestamp", "type",
                 "correlation-id", "reply-to", "selector", "prefetch-count", "durable", "receipt-id",
                 "message", "version", "accept-version", "host", "login", "passcode", "heart-beat",
                 "session", "server", "redelivered", "JMSXGroupID", "JMSXGroupSeq"):
        raw = text.encode("ascii")
        if PyUnicode_IS_ASCII(text) and len(raw) <= _NAME_MAX:
            _names[_slot(raw, len(raw))] = text
_seed_names()

cdef object _Frame = Frame


cdef inline object _frame(str command, dict headers, bytes body):
    """Frame(command, headers, body): what tuple.__new__(Frame, ...) does (the subtype's allocation, then
    its three items), without the argument tuple it copies from."""
    cdef object frame = PyType_GenericAlloc(<PyTypeObject*>_Frame, 3)
    Py_INCREF(command)
    PyTuple_SET_ITEM(frame, 0, <PyObject*>command)
    Py_INCREF(headers)
    PyTuple_SET_ITEM(frame, 1, <PyObject*>headers)
    Py_INCREF(body)
    PyTuple_SET_ITEM(frame, 2, <PyObject*>body)
    return frame
cdef frozenset _NEGOTIATING = frozenset({"CONNECT", "STOMP", "CONNECTED"})


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


# The escape each ASCII byte takes in a header (its second byte after the backslash), 0 for none: 1.2's
# table, and 1.1's, where a CR travels raw.
cdef unsigned char _ESCAPE_12[128]
cdef unsigned char _ESCAPE_11[128]
for _c in range(128):
    _ESCAPE_12[_c] = 0
    _ESCAPE_11[_c] = 0
for _c, _e in ((92, 92), (10, 110), (58, 99)):
    _ESCAPE_12[_c] = _e
    _ESCAPE_11[_c] = _e
_ESCAPE_12[13] = 114


cdef inline Py_ssize_t _extra(str text, bint escaped, const unsigned char* table):
    """The bytes escaping adds to ASCII ``text`` (an escaped byte takes two); -1 when it is not ASCII, or
    (1.0, ``escaped`` false) holds a LF to blank: the general way takes those."""
    if not PyUnicode_IS_ASCII(text):
        return -1
    cdef const unsigned char* p = <const unsigned char*>PyUnicode_DATA(text)
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(text), extra = 0
    if not escaped:
        return -1 if memchr(p, 10, n) != NULL else 0
    for i in range(n):
        extra += table[p[i]] != 0
    return extra


cdef inline Py_ssize_t _put(char* dst, str text, bint escaped, const unsigned char* table) noexcept:
    """Write ASCII ``text`` at ``dst``, escaped by ``table`` when ``escaped``; the bytes written."""
    cdef const unsigned char* p = <const unsigned char*>PyUnicode_DATA(text)
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(text), at = 0
    cdef unsigned char e
    if not escaped:
        memcpy(dst, p, n)
        return n
    for i in range(n):
        e = table[p[i]]
        if e:
            dst[at] = 92
            dst[at + 1] = <char>e
            at += 2
        else:
            dst[at] = <char>p[i]
            at += 1
    return at


def encode_headers(headers, bint escaped=True, bint cr=True):
    """``name:value\\n`` lines: escaped for 1.2, escaped without the CR escape for 1.1 (``cr=False``),
    or raw for 1.0 (``escaped=False``, LF replaced by a space).

    A MESSAGE's header block is encoded once per message (server/broker/message.py), and almost always
    every name and value is ASCII: then the lines are written straight into bytes sized first, escaping
    as they are copied (no escaped copies, no list of pieces, no join, no UTF-8 encode of the joined
    text). A block with a non-ASCII name or value, or a 1.0 value holding a LF, takes the general way,
    over the same strs."""
    items = headers.items() if hasattr(headers, "items") else headers
    cdef list flat = []
    cdef str k, v
    cdef bint ascii = True
    cdef Py_ssize_t size = 0, at = 0, i, name_extra, extra = 0
    cdef const unsigned char* table = _ESCAPE_11
    if cr:
        table = _ESCAPE_12
    for key, value in items:
        k = key
        v = value if type(value) is str else str(value)
        flat.append(k)
        flat.append(v)
        if ascii:
            if escaped:
                name_extra = _extra(k, True, table)
            else:
                name_extra = 0 if PyUnicode_IS_ASCII(k) else -1
            if name_extra >= 0:
                extra = _extra(v, escaped, table)
                size += name_extra + PyUnicode_GET_LENGTH(k) + extra + PyUnicode_GET_LENGTH(v) + 2
            ascii = name_extra >= 0 and extra >= 0
    cdef bytes out
    cdef char* dst
    if ascii:
        out = PyBytes_FromStringAndSize(NULL, size)
        dst = PyBytes_AS_STRING(out)
        for i in range(0, len(flat), 2):
            at += _put(dst + at, <str>flat[i], escaped, table)
            dst[at] = 58
            at += 1
            at += _put(dst + at, <str>flat[i + 1], escaped, table)
            dst[at] = 10
            at += 1
        return out
    cdef list parts = []
    for i in range(0, len(flat), 2):
        k = <str>flat[i]
        v = <str>flat[i + 1]
        if escaped:
            # escape() is a few C-level replaces; str.translate with a dict table looks every character
            # up in the dict (~1 µs for a 25-character message id)
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
        frames.append(_frame(self._p_command, self._p_headers, body))
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
        return _frame(self._p_command, self._p_headers, body)

    cdef int _parse_head(self, const char* head, Py_ssize_t length) except -1:
        """The twin's _parse_head over the head's bytes, in two passes. The first looks at every byte
        once: a NUL, a non-ASCII byte, a backslash, and where each line ends (up to _LINES of them; a
        longer block finds the rest by memchr). The errors come in the twin's order (NUL, UTF-8, empty
        command, header count, then line by line). Names, and the command, come from the name cache (one
        str for every frame that repeats them, its hash kept); values are copied into new strs, unescaped
        only when the block holds a backslash and the value does."""
        cdef Py_ssize_t i, line_end, colon, count = 0, stop, start
        cdef Py_ssize_t[_LINES] ends
        cdef unsigned char c, seen = 0
        cdef const char* hit
        cdef str command
        cdef object name, value
        cdef dict headers
        cdef bint escaped, ascii, slashes
        cdef uint64_t word, any_high = 0, nul = 0, slash = 0
        i = 0
        while i + 8 <= length:          # 8 bytes a step; a word holding a LF is looked at byte by byte
            word = pymq_load64(head + i)
            any_high |= word
            nul |= pymq_has_zero(word)
            slash |= pymq_has_zero(word ^ (PYMQ_ONES * 92))
            if pymq_has_zero(word ^ (PYMQ_ONES * 10)):
                for start in range(i, i + 8):
                    if head[start] == 10:
                        if count < _LINES:
                            ends[count] = start
                        count += 1
            i += 8
        if any_high & PYMQ_HIGHS:
            seen |= _HIGH
        if nul:
            seen |= _NUL
        if slash:
            seen |= _SLASH
        while i < length:
            c = <unsigned char>head[i]
            seen |= _CLASS[c]
            if c == 10:
                if count < _LINES:
                    ends[count] = i
                count += 1
            i += 1
        if seen & _NUL:
            raise MalformedFrame("NUL inside the header block")
        ascii = not (seen & _HIGH)
        if not ascii:
            # the whole block must be UTF-8 before any line is judged (the twin decodes it at once, so a
            # bad byte on a later line is reported before a missing colon on an earlier one); cut at
            # ASCII bytes only, a valid block's pieces are valid too
            self._decode(head, length)
        # command line
        line_end = ends[0] if count else length
        stop = line_end
        if stop > 0 and head[stop - 1] == 13:
            stop -= 1
        command = <str>_name(head, stop) if ascii else self._decode(head, stop)
        if not command:
            raise MalformedFrame("empty command line")
        escaped = self.version != "1.0" and command not in UNESCAPED_COMMANDS
        slashes = escaped and (seen & _SLASH)
        # the header lines are the LFs' count (the twin splits the block at them)
        if count > self.max_headers:
            raise MalformedFrame(f"{command} frame has {count} headers, "
                                 f"more than the limit of {self.max_headers}")
        headers = _PyDict_NewPresized(count)     # no growth while it is filled
        cdef Py_ssize_t k = 1
        start = line_end + 1
        while line_end < length:
            if k < count and k < _LINES:
                line_end = ends[k]
            elif k < count:
                hit = <const char*>memchr(head + start, 10, length - start)
                line_end = hit - head
            else:
                line_end = length
            k += 1
            stop = line_end
            if stop > start and head[stop - 1] == 13:
                stop -= 1
            hit = <const char*>memchr(head + start, 58, stop - start) if stop > start else NULL
            if hit == NULL:
                raise MalformedFrame(f"{command} frame: header line without ':'")
            colon = hit - head
            if colon == start:
                raise MalformedFrame(f"{command} frame: header with an empty name")
            if slashes and memchr(head + start, 92, colon - start) != NULL:
                name = unescape(self._decode(head + start, colon - start))
            elif ascii:
                name = _name(head + start, colon - start)
            else:
                name = self._decode(head + start, colon - start)
            i = colon + 1
            if ascii:
                value = _ascii(head + i, stop - i)
            else:
                value = self._decode(head + i, stop - i)
            if slashes and memchr(head + i, 92, stop - i) != NULL:
                value = unescape(value)
            PyDict_SetDefault(headers, name, value)      # a repeated name: the first wins
            start = line_end + 1
        self._p_length = -1
        cl = headers.get("content-length")
        if cl is not None:
            self._p_length = _content_length(cl)
        self._p_command = command
        self._p_headers = headers
        return 0

    cdef str _decode(self, const char* p, Py_ssize_t n):
        try:
            return PyUnicode_DecodeUTF8(p, n, NULL)
        except UnicodeDecodeError:
            raise MalformedFrame("frame header is not valid UTF-8") from None
