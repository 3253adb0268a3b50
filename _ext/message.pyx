# cython: language_level=3
"""Compiled construction of a message: ``init_message`` (the message class's ``__init__``) and
``message_from_request``, twins of ``pymq_server/broker/_message_py.py``, which defines what they do.

The class stays the one slotted Python class of message.py (its methods, and every reader's attribute access
at the interpreter's slot speed); what is compiled is filling it: the slots are written at their offsets,
read once from the class's member descriptors when message.py hands the class over (``bind``, which refuses a
class whose slots are not exactly ``_message_py.FIELDS``), and ``message_from_request`` allocates the instance
and fills it without calling ``__init__`` or any Python frame. The request is read by field name (positions
resolved from ``SendRequest._fields`` at import); the arithmetic and texts are the twin's on Python ints, so
hostile values (huge, negative, not ints) give the twin's answer or exception.
"""
from cpython.object cimport PyObject_GetItem

from pymq.protocol.numbers import INT64_MAX
from pymq_server.broker._message_py import DEFAULT_PRIORITY, DIGITS, FIELDS

cdef extern from *:
    """
    #include <structmember.h>
    #include <time.h>
    /* the offset of a slot from its member descriptor (-1: not an object slot) */
    static Py_ssize_t pymq_slot_offset(PyObject *descr) {
        if (Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
        return m->offset;
    }
    /* a new instance with every slot unset, as object.__new__ makes it */
    static PyObject *pymq_alloc(PyObject *cls) {
        PyTypeObject *t = (PyTypeObject *)cls;
        return t->tp_alloc(t, 0);
    }
    static void pymq_set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) {
        PyObject **slot = (PyObject **)((char *)obj + offset);
        PyObject *old = *slot;
        Py_INCREF(value);
        *slot = value;
        Py_XDECREF(old);
    }
    /* int(time.time() * 1000), with time.time()'s arithmetic (nanoseconds / 1e9 as a double) */
    static long long pymq_now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        return (long long)(((double)ns / 1e9) * 1000.0);
    }
    """
    Py_ssize_t pymq_slot_offset(object descr)
    object pymq_alloc(object cls)
    void pymq_set_slot(object obj, Py_ssize_t offset, object value)
    long long pymq_now_ms()

# the slots in _message_py.FIELDS's order
cdef enum:
    F_KEY
    F_MESSAGE_ID
    F_DESTINATION
    F_SEQ
    F_HEADERS
    F_BODY
    F_PERSISTENT
    F_PRIORITY
    F_TIMESTAMP
    F_EXPIRES
    F_DELIVER_AT
    F_GROUP_ID
    F_PRODUCER
    F_SIZE
    F_DEVICE
    F_RULE
    F_CHOSEN
    F_CLIENT_ID
    F_USER
    F_REFS
    F_BULK
    F_BLOCK
    F_BLOCK_RAW
    F_VALUES
    N_FIELDS
assert FIELDS == ("key", "message_id", "destination", "seq", "headers", "body", "persistent", "priority",
                  "timestamp", "expires", "deliver_at", "group_id", "producer", "size", "device", "rule", "chosen",
                  "client_id", "user", "refs", "bulk", "_block", "_block_raw", "_values") and len(FIELDS) == N_FIELDS, \
    "_message_py.FIELDS moved: renumber the F_ constants"

cdef Py_ssize_t _offset[N_FIELDS]
cdef type _message_class = None

# the request's fields by name: positions in SendRequest resolved at the first build (_send_py imports
# message.py, which imports this module: SendRequest may not exist yet when this one is imported)
cdef type _request_class = None
cdef Py_ssize_t R_PROPERTIES, R_BODY, R_PERSISTENT, R_PRIORITY, R_EXPIRES, R_TTL, R_DELIVER_AT, R_DELAY, R_TIMESTAMP


cdef int _resolve_request() except -1:
    global _request_class, R_PROPERTIES, R_BODY, R_PERSISTENT, R_PRIORITY, R_EXPIRES, R_TTL, R_DELIVER_AT
    global R_DELAY, R_TIMESTAMP
    from pymq_server.broker._send_py import SendRequest
    fields = SendRequest._fields
    R_PROPERTIES = fields.index("properties")
    R_BODY = fields.index("body")
    R_PERSISTENT = fields.index("persistent")
    R_PRIORITY = fields.index("priority")
    R_EXPIRES = fields.index("expires")
    R_TTL = fields.index("ttl")
    R_DELIVER_AT = fields.index("deliver_at")
    R_DELAY = fields.index("delay")
    R_TIMESTAMP = fields.index("timestamp")
    _request_class = SendRequest
    return 0


cdef object _INT64_MAX = INT64_MAX
cdef tuple _DIGITS = DIGITS
cdef object _ZERO = 0


def bind(type cls):
    """The class to fill (message.py's): its slots' offsets, read from its member descriptors."""
    global _message_class
    if set(cls.__dict__.get("__slots__", ())) != set(FIELDS):
        raise TypeError(f"{cls.__name__}'s slots are not the message's fields: {sorted(FIELDS)}")
    cdef Py_ssize_t i, offset
    for i in range(N_FIELDS):
        offset = pymq_slot_offset(cls.__dict__[FIELDS[i]])
        if offset < 0:
            raise TypeError(f"{cls.__name__}.{FIELDS[i]} is not a writable object slot")
        _offset[i] = offset
    _message_class = cls


def now_ms():
    return pymq_now_ms()


cdef inline void _fill(object self, object key, object message_id, object destination, object seq,
                       object headers, object body, object persistent, object priority, object timestamp,
                       object expires, object deliver_at, object producer, object client_id, object user) except *:
    """init_message's fields, in its order (the twin's rule: group_id and size derived, the rest unset)."""
    cdef object group_id
    if type(headers) is dict:
        group_id = (<dict>headers).get("JMSXGroupID")
    else:
        group_id = headers.get("JMSXGroupID")
    size = len(body)
    pymq_set_slot(self, _offset[F_KEY], key)
    pymq_set_slot(self, _offset[F_MESSAGE_ID], message_id)
    pymq_set_slot(self, _offset[F_DESTINATION], destination)
    pymq_set_slot(self, _offset[F_SEQ], seq)
    pymq_set_slot(self, _offset[F_HEADERS], headers)
    pymq_set_slot(self, _offset[F_BODY], body)
    pymq_set_slot(self, _offset[F_PERSISTENT], persistent)
    pymq_set_slot(self, _offset[F_PRIORITY], priority)
    pymq_set_slot(self, _offset[F_TIMESTAMP], timestamp)
    pymq_set_slot(self, _offset[F_EXPIRES], expires)
    pymq_set_slot(self, _offset[F_DELIVER_AT], deliver_at)
    pymq_set_slot(self, _offset[F_GROUP_ID], group_id)
    pymq_set_slot(self, _offset[F_PRODUCER], producer)
    pymq_set_slot(self, _offset[F_SIZE], size)
    pymq_set_slot(self, _offset[F_DEVICE], None)
    pymq_set_slot(self, _offset[F_RULE], None)
    pymq_set_slot(self, _offset[F_CHOSEN], None)
    pymq_set_slot(self, _offset[F_CLIENT_ID], client_id)
    pymq_set_slot(self, _offset[F_USER], user)
    pymq_set_slot(self, _offset[F_REFS], _ZERO)
    pymq_set_slot(self, _offset[F_BULK], None)
    pymq_set_slot(self, _offset[F_BLOCK], None)
    pymq_set_slot(self, _offset[F_BLOCK_RAW], None)
    pymq_set_slot(self, _offset[F_VALUES], None)


def init_message(self, key, message_id, destination, seq, headers, body, persistent, priority, timestamp,
                 expires, deliver_at=0, producer="", client_id=None, user=None):
    """The message class's ``__init__`` (the twin's ``init_message``)."""
    if _message_class is None or not (type(self) is _message_class or isinstance(self, _message_class)):
        raise TypeError(f"init_message fills a bound message class, not {type(self).__name__}")
    _fill(self, key, message_id, destination, seq, headers, body, persistent, priority, timestamp, expires,
          deliver_at, producer, client_id, user)


cdef inline object _capped(object at):
    # min(at, INT64_MAX) as the twin's min() decides it (the first argument unless the second is smaller)
    return _INT64_MAX if _INT64_MAX < at else at


cdef inline object _field(object request, Py_ssize_t index, str name):
    # a SendRequest by position (resolved from its field names above); anything else by name, as the twin reads
    if type(request) is _request_class:
        return (<tuple>request)[index]
    return getattr(request, name)


def message_from_request(request, *, key, message_id, seq, destination, default_persistent=True, producer="",
                         now=None, default_priority=DEFAULT_PRIORITY, default_ttl=0, client_id=None, user=None):
    """The twin's ``message_from_request``: the same fields, the same headers written back."""
    if _message_class is None:
        raise TypeError("message_from_request: no message class bound")
    if _request_class is None:
        _resolve_request()
    if now is None:
        now = pymq_now_ms()
    headers = _field(request, R_PROPERTIES, "properties")
    persistent = _field(request, R_PERSISTENT, "persistent")
    if persistent is None:
        persistent = default_persistent
    priority = _field(request, R_PRIORITY, "priority")
    if priority is None:
        priority = default_priority
    expires = _field(request, R_EXPIRES, "expires")
    if not expires:
        ttl = _field(request, R_TTL, "ttl")
        if ttl and expires is None:
            expires = _capped(now + ttl)
        else:
            expires = now + default_ttl if default_ttl else 0
    deliver_at = _field(request, R_DELIVER_AT, "deliver_at")
    if not deliver_at:
        delay = _field(request, R_DELAY, "delay")
        deliver_at = _capped(now + delay) if delay else 0
    if deliver_at:
        headers["pymq-delivery-time"] = str(deliver_at)
    timestamp = _field(request, R_TIMESTAMP, "timestamp") or now
    headers["persistent"] = "true" if persistent else "false"
    headers["priority"] = PyObject_GetItem(_DIGITS, priority)   # (the twin's indexing, any index)
    headers["timestamp"] = str(timestamp)
    headers["expires"] = str(expires) if expires else "0"
    message = pymq_alloc(_message_class)
    _fill(message, key, message_id, destination, seq, headers, _field(request, R_BODY, "body"), persistent,
          priority, timestamp, expires, deliver_at, producer, client_id, user)
    return message
