# cython: language_level=3
"""Compiled ``parse_send``: a SEND frame's headers into a SendRequest, one C look-up per header.

The twin ``pymq_server/broker/_send_py.py`` defines the semantics, the request type and the header sets;
this module reads them from there at import, so there is one list of spellings. For every input both
give the same request, or raise the same exception naming the same header (tests/broker/test_send_twins.py,
the ``send`` fuzz target). What is compiled is the common case: the loop over the headers (dropped, mapped,
property, special in one dict look-up), the mapped numbers when they are plain ASCII digits within their
bound, the two exact boolean spellings, and the request built from one tuple. Anything else is handed to
the twin's rule for it (``parse_wire_int``, ``parse_bool``: the same rule reached sooner, one definition of
each error), and the rarer path (scheduling, duplicates, cluster forwarding) is the twin's ``rarer_send``.
"""
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

from pymq.protocol.numbers import INT64_MAX, parse_wire_int
from pymq_server.broker._send_py import DROPPED, MAPPED, SPECIAL, SendRequest, parse_bool, rarer_send

# what a header is to a SEND, by name (the twin's order of tests: dropped before mapped before the rest)
cdef enum:
    K_SPECIAL = 1
    K_DROPPED
    K_DESTINATION
    K_RECEIPT
    K_TRANSACTION
    K_PERSISTENT
    K_PRIORITY
    K_EXPIRES
    K_EXPIRATION
    K_TIMESTAMP

cdef dict _KINDS = {}
_KINDS.update({name: K_SPECIAL for name in SPECIAL})
_KINDS.update({"persistent": K_PERSISTENT, "priority": K_PRIORITY, "expires": K_EXPIRES,
               "expiration": K_EXPIRATION, "timestamp": K_TIMESTAMP})
assert set(MAPPED) == {"persistent", "priority", "expires", "expiration", "timestamp"}, "_send_py.MAPPED moved"
_KINDS.update({name: K_DROPPED for name in DROPPED})
_KINDS.update({"destination": K_DESTINATION, "receipt": K_RECEIPT, "transaction": K_TRANSACTION})
assert {"destination", "receipt", "transaction"} <= DROPPED, "_send_py.DROPPED moved"

cdef long long _INT64_MAX = INT64_MAX
cdef object _new = tuple.__new__


cdef object _number(str name, object value, long long maximum):
    """parse_number's rule: plain digits (at most 18: no overflow) within ``maximum`` here, the rest by
    parse_wire_int, which accepts or refuses it exactly as the twin does."""
    cdef Py_ssize_t n, i
    cdef long long acc = 0
    cdef Py_UCS4 ch
    if type(value) is not str:
        return parse_wire_int(name, value, maximum=maximum)
    n = len(<str>value)
    if n == 0:
        return None
    if n <= 18:
        for i in range(n):
            ch = (<str>value)[i]
            if ch < u'0' or ch > u'9':
                break
            acc = acc * 10 + (<long long>ch - 48)
        else:
            if acc <= maximum:
                return acc
    return parse_wire_int(name, value, maximum=maximum)


def parse_send(headers, body):
    """A SEND frame's headers and body as a SendRequest (spec/stomp.md §4): _send_py.parse_send, compiled."""
    cdef dict properties = {}
    cdef PyObject *found
    cdef int kind
    cdef bint special = False
    cdef object destination = None, receipt = None, transaction = None
    cdef object persistent = None, priority = None, expires = None, ttl = None, timestamp = None
    cdef bint seen_destination = False
    for name, value in headers.items():
        found = PyDict_GetItem(_KINDS, name)
        if found is NULL:
            properties[name] = value
            continue
        kind = <int><object>found
        if kind == K_SPECIAL:
            properties[name] = value
            special = True
        elif kind == K_DROPPED:
            pass
        elif kind == K_DESTINATION:
            destination = value
            seen_destination = True
        elif kind == K_RECEIPT:
            receipt = value
        elif kind == K_TRANSACTION:
            transaction = value
        elif kind == K_PERSISTENT:
            if value == "true":
                persistent = True
            elif value == "false":
                persistent = False
            else:
                persistent = parse_bool(name, value)
        elif kind == K_PRIORITY:
            priority = _number(name, value, 9)
        elif kind == K_EXPIRES:
            expires = _number(name, value, _INT64_MAX)
        elif kind == K_EXPIRATION:
            ttl = _number(name, value, _INT64_MAX)
        else:
            timestamp = _number(name, value, _INT64_MAX)
    if not special:                            # the common case: none of the rarer headers
        if not seen_destination:
            destination = headers["destination"]
        return _new(SendRequest, (destination, properties, body, transaction, receipt, persistent, priority,
                                  expires, ttl, None, None, timestamp, None, None, None, None))
    return rarer_send(headers, properties, body, persistent, priority, expires, ttl, timestamp)
