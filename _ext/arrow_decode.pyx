# cython: auto_pickle=False
"""Compiled MESSAGE frames -> Arrow decoder: the twin of ``pyspark_pymq/_decode_py.py`` (spec/spark.md §4).

Same rules, same results, same errors; this module only writes the Arrow buffers itself instead of
building Python lists per column: fixed-width columns go straight into C arrays, strings and bodies are
copied once into a growing data buffer next to their int32 offsets and validity bits, and everything
becomes ``pyarrow.Array.from_buffers`` at the end.  What is rare or subtle is delegated to the twin's own
functions, so the semantics live in one place: content-type rules (cached per distinct header value),
bodies without a content-type, and every integer that is not plain short digits
(``parse_wire_int`` then raises exactly the twin's error, or accepts a 19-digit value).

Invariants: every buffer size is checked before it is computed or grows (no product or doubling can
wrap: row counts, first guesses and capacities are bounded by the column limit, itself at most 2**31 - 1,
before they are multiplied; a column over 2 GiB is an error, raised after all rows as the twin raises it);
each row's header names and values are checked to be text first (``_check_text``), as the twin does; errors in a row come in the twin's order (pymq-seq, timestamp, expires,
priority, JMSXDeliveryCount); memory is owned by ``_Var``/``_Fixed`` objects and freed with them.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize

cdef extern from "Python.h":
    bint PyUnicode_CheckExact(object o)
    bint PyUnicode_IS_ASCII(object o)

import pyarrow as pa

from pymq.protocol.numbers import INT32_MAX, parse_wire_int
from pyspark_pymq import _decode_py as _py

MAX_COLUMN_BYTES = _py.MAX_COLUMN_BYTES
MAX_MS = _py.MAX_MS
NOT_PROPERTIES = _py.NOT_PROPERTIES
content_kind = _py.content_kind
body_kind = _py.body_kind

cdef int64_t _MAX_MS = _py.MAX_MS
cdef int64_t _FIRST_RESERVATION = 16 * 1024 * 1024
cdef int64_t _MAX_INT32 = INT32_MAX
cdef int64_t _MAX_INT64 = 0x7FFFFFFFFFFFFFFF
_STRING = pa.string()
_BINARY = pa.binary()
_INT32 = pa.int32()
_INT64 = pa.int64()
_TS = pa.timestamp("us", tz="UTC")
_SCHEMAS = {False: _py._SCHEMAS[False], True: _py._SCHEMAS[True]}


cdef class _Var:
    """A variable-width column being built: int32 offsets, the data, and validity bits."""
    cdef char* data
    cdef int64_t size
    cdef int64_t cap
    cdef int32_t* offsets
    cdef uint8_t* valid
    cdef Py_ssize_t n
    cdef Py_ssize_t nulls
    cdef bint over
    cdef int64_t limit

    def __cinit__(self, Py_ssize_t rows, Py_ssize_t guess, int64_t limit):
        # int32 offsets hold at most 2**31 - 1: a larger limit (the twin's MAX_COLUMN_BYTES is a module
        # attribute) would wrap them, so it is clamped; every size below is checked before it is computed
        self.limit = limit if limit < _MAX_INT32 else _MAX_INT32
        if rows < 0 or rows >= (<Py_ssize_t>0x7FFFFFFFFFFFFFFF) // 8:
            raise MemoryError()
        self.offsets = <int32_t*>malloc((rows + 1) * sizeof(int32_t))
        self.valid = <uint8_t*>calloc(rows // 8 + 1, 1)
        # a guess (first body size x rows) can be far over what the column may hold: never reserve more
        # than the column limit up front; growth is by doubling, checked against the limit
        self.cap = guess if 0 <= guess < self.limit else self.limit
        if self.cap > _FIRST_RESERVATION:
            self.cap = _FIRST_RESERVATION          # grown by doubling as rows really arrive
        if self.cap < 64:
            self.cap = 64
        self.data = <char*>malloc(self.cap)
        if self.offsets == NULL or self.valid == NULL or self.data == NULL:
            raise MemoryError()
        self.offsets[0] = 0

    def __dealloc__(self):
        free(self.offsets)
        free(self.valid)
        free(self.data)

    cdef int add(self, const char* p, Py_ssize_t length) except -1:
        cdef int64_t need = self.size + length
        cdef int64_t cap
        cdef char* grown
        if self.over or need > self.limit:
            # keep counting rows (the error is raised after them all, as the twin does), copy nothing
            self.over = True
        else:
            if need > self.cap:
                # doubling, never past the limit (<= 2**31 - 1, so never near int64's end)
                cap = self.cap * 2
                while cap < need:
                    cap *= 2
                if cap > self.limit:
                    cap = self.limit
                grown = <char*>realloc(self.data, cap)
                if grown == NULL:
                    raise MemoryError()
                self.data, self.cap = grown, cap
            memcpy(self.data + self.size, p, length)
            self.size = need
        self.valid[self.n >> 3] |= <uint8_t>(1 << (self.n & 7))
        self.n += 1
        self.offsets[self.n] = <int32_t>self.size
        return 0

    cdef int add_null(self) except -1:
        self.n += 1
        self.nulls += 1
        self.offsets[self.n] = <int32_t>self.size
        return 0

    cdef int add_str(self, object text) except -1:
        cdef Py_ssize_t length
        cdef const char* p
        if text is None:
            return self.add_null()
        p = PyUnicode_AsUTF8AndSize(text, &length)
        return self.add(p, length)

    cdef int add_bytes(self, bytes data) except -1:
        return self.add(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))

    cdef object finish(self, object arrow_type, str column):
        if self.over:
            raise _py.MessageFormatError(_py.too_large(column))
        validity = None
        if self.nulls:
            validity = pa.py_buffer(PyBytes_FromStringAndSize(<char*>self.valid, self.n // 8 + 1))
        offsets = pa.py_buffer(PyBytes_FromStringAndSize(<char*>self.offsets, (self.n + 1) * sizeof(int32_t)))
        data = pa.py_buffer(PyBytes_FromStringAndSize(self.data, self.size))
        return pa.Array.from_buffers(arrow_type, self.n, [validity, offsets, data], null_count=self.nulls)


cdef class _Fixed:
    """A fixed-width column of int32 or int64 values, with validity bits."""
    cdef char* data
    cdef uint8_t* valid
    cdef Py_ssize_t width
    cdef Py_ssize_t n
    cdef Py_ssize_t nulls

    def __cinit__(self, Py_ssize_t rows, Py_ssize_t width):
        self.width = width
        if rows < 0 or rows >= ((<Py_ssize_t>0x7FFFFFFFFFFFFFFF) - 8) // width:
            raise MemoryError()
        self.data = <char*>malloc(rows * width + 8)
        self.valid = <uint8_t*>calloc(rows // 8 + 1, 1)
        if self.data == NULL or self.valid == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.data)
        free(self.valid)

    cdef inline void add(self, int64_t value):
        if self.width == 8:
            (<int64_t*>self.data)[self.n] = value
        else:
            (<int32_t*>self.data)[self.n] = <int32_t>value
        self.valid[self.n >> 3] |= <uint8_t>(1 << (self.n & 7))
        self.n += 1

    cdef inline void add_null(self):
        if self.width == 8:
            (<int64_t*>self.data)[self.n] = 0
        else:
            (<int32_t*>self.data)[self.n] = 0
        self.n += 1
        self.nulls += 1

    cdef object finish(self, object arrow_type):
        validity = None
        if self.nulls:
            validity = pa.py_buffer(PyBytes_FromStringAndSize(<char*>self.valid, self.n // 8 + 1))
        data = pa.py_buffer(PyBytes_FromStringAndSize(self.data, self.n * self.width))
        return pa.Array.from_buffers(arrow_type, self.n, [validity, data], null_count=self.nulls)


cdef int _check_text(dict headers) except -1:
    """The twin's ``check_text``, first in every row: ASCII names and values pass on a flag read; anything
    else is left to the twin's function, which raises exactly its error (or passes valid non-ASCII text)."""
    cdef Py_ssize_t pos = 0
    cdef PyObject* key
    cdef PyObject* value
    while PyDict_Next(headers, &pos, &key, &value):
        if not (PyUnicode_CheckExact(<object>key) and PyUnicode_CheckExact(<object>value)
                and PyUnicode_IS_ASCII(<object>key) and PyUnicode_IS_ASCII(<object>value)):
            _py.check_text(headers)
            return 0
    return 0


cdef inline object _get(dict headers, str name):
    cdef PyObject* found = PyDict_GetItem(headers, name)
    return None if found == NULL else <object>found


cdef int64_t _wire_int(dict headers, str name, int64_t default, int64_t maximum) except? -1:
    """``header_int(headers, name, default, maximum=maximum)``: plain digits parsed here, anything else
    (signs, spaces, 19 digits, out of range) by ``parse_wire_int``, which raises the twin's error."""
    cdef object raw = _get(headers, name)
    cdef Py_ssize_t length, i
    cdef const char* p
    cdef int64_t value = 0
    cdef char c
    if raw is None:
        return default
    p = PyUnicode_AsUTF8AndSize(raw, &length)
    if length == 0:
        return default
    if length <= 18:
        for i in range(length):
            c = p[i]
            if c < 48 or c > 57:
                break
            value = value * 10 + (c - 48)
        else:
            if value <= maximum:
                return value
    return parse_wire_int(name, raw, maximum=maximum)


cdef inline bint _flag(object value, const char* word, Py_ssize_t size):
    """``value.lower() == word`` for an ASCII ``word``."""
    cdef Py_ssize_t length, i
    cdef const char* p
    cdef char c
    if value is None:
        return False
    p = PyUnicode_AsUTF8AndSize(value, &length)
    if length != size:
        return False
    for i in range(size):
        c = p[i]
        if 65 <= c <= 90:
            c += 32
        if c != word[i]:
            return False
    return True


cdef inline bint _is_destination(object value):
    return value is not None and (value.startswith("/queue/") or value.startswith("/topic/")
                                  or value.startswith("/temp-queue/"))


def frames_to_batch(frames, str destination, str kind, bint include_properties):
    """One record batch, a row per frame in order (see the twin for the rules)."""
    cdef Py_ssize_t n = len(frames)
    cdef Py_ssize_t i
    cdef dict headers
    cdef bytes body
    cdef object raw, group, found, value
    cdef int64_t seq, expiry
    cdef Py_ssize_t body_guess = 0
    # read per call, as the twin reads it (so the rule, and its test, are the same for both)
    cdef int64_t limit = _py.MAX_COLUMN_BYTES
    if n:
        first = frames[0][1]
        # a first guess of the bodies' size, never more than a column may hold (and never overflowing:
        # one huge body shared by many frames made this product wrap)
        body_guess = len(first) + 16
        body_guess = limit if body_guess >= limit // n + 1 else body_guess * n
    cdef _Fixed seqs = _Fixed(n, 8)
    cdef _Var ids = _Var(n, 40 * n if n < limit // 40 else limit, limit)
    cdef _Var corrs = _Var(n, 16, limit)
    cdef _Var keys = _Var(n, 16, limit)
    cdef _Var values = _Var(n, body_guess, limit)
    cdef _Var body_types = _Var(n, 5 * n if n < limit // 5 else limit, limit)
    cdef _Fixed stamps = _Fixed(n, 8)
    cdef _Fixed expires = _Fixed(n, 8)
    cdef _Fixed prios = _Fixed(n, 4)
    cdef _Fixed modes = _Fixed(n, 4)
    cdef _Fixed counts = _Fixed(n, 4)
    cdef uint8_t* redelivered = <uint8_t*>calloc(n // 8 + 1, 1)
    cdef _Var reply_tos = _Var(n, 16, limit)
    cdef _Var types = _Var(n, 16, limit)
    cdef dict kinds = {}
    props = [] if include_properties else None
    if redelivered == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            frame = frames[i]
            if type(frame[0]) is not dict:
                raise TypeError(f"a frame's headers must be a dict, not {type(frame[0]).__name__}")
            headers = frame[0]
            _check_text(headers)
            raw_body = frame[1]
            body = raw_body if type(raw_body) is bytes else bytes(raw_body)
            raw = _get(headers, "pymq-seq")
            if raw is None or raw == "":
                raise _py.MessageFormatError("a MESSAGE of a range read has no 'pymq-seq' header")
            seqs.add(_wire_int(headers, "pymq-seq", 0, _MAX_INT64))
            ids.add_str(_get(headers, "message-id"))
            corrs.add_str(_get(headers, "correlation-id"))
            group = _get(headers, "JMSXGroupID")
            if group is None:
                keys.add_null()
            else:
                keys.add_str(group)
            ctype = _get(headers, "content-type")
            transformation = _get(headers, "transformation")
            cache_key = (ctype, transformation)
            body_type = kinds.get(cache_key, False)
            if body_type is False:
                body_type = kinds[cache_key] = content_kind(ctype, transformation)
            values.add_bytes(body)
            body_types.add_str(body_kind(body) if body_type is None else body_type)
            stamps.add(_wire_int(headers, "timestamp", 0, _MAX_MS) * 1000)
            expiry = _wire_int(headers, "expires", 0, _MAX_MS)
            if expiry:
                expires.add(expiry * 1000)
            else:
                expires.add_null()
            prios.add(_wire_int(headers, "priority", 4, 9))
            modes.add(1 if _flag(_get(headers, "persistent"), b"false", 5) else 2)
            if _flag(_get(headers, "redelivered"), b"true", 4):
                redelivered[i >> 3] |= <uint8_t>(1 << (i & 7))
            counts.add(_wire_int(headers, "JMSXDeliveryCount", 1, _MAX_INT32))
            raw = _get(headers, "reply-to")
            if _is_destination(raw):
                reply_tos.add_str(raw)
            else:
                reply_tos.add_null()
            types.add_str(_get(headers, "type"))
            if include_properties:
                props.append([(k, v) for k, v in headers.items() if k not in NOT_PROPERTIES])
        value_column = values.finish(_BINARY, "value")
        columns = [
            pa.repeat(pa.scalar(destination, _STRING), n),
            pa.repeat(pa.scalar(kind, _STRING), n),
            pa.repeat(pa.scalar(0, _INT32), n),
            seqs.finish(_INT64),
            ids.finish(_STRING, "messageId"),
            corrs.finish(_STRING, "correlationId"),
            keys.finish(_BINARY, "key"),
            value_column,
            body_types.finish(_STRING, "bodyType"),
            stamps.finish(_TS),
            pa.repeat(pa.scalar(_py.CREATE_TIME, _INT32), n),
            expires.finish(_TS),
            prios.finish(_INT32),
            modes.finish(_INT32),
            pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(
                PyBytes_FromStringAndSize(<char*>redelivered, n // 8 + 1))]),
            counts.finish(_INT32),
            reply_tos.finish(_STRING, "replyTo"),
            types.finish(_STRING, "type"),
        ]
    finally:
        free(redelivered)
    if include_properties:
        columns.append(pa.array(props, pa.map_(_STRING, _STRING)))
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMAS[include_properties])
