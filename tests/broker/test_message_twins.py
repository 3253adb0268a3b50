"""A message's construction has two implementations (server/broker/_message_py.py and _ext/message.pyx) that
build the same message: every field, of the same type, and the same canonical headers written back.

The class is one (message.py's ``BrokerMessage``, slotted); what is twinned is filling it: ``init_message``
(its ``__init__``) and ``message_from_request``. The twin defines the semantics. On hostile requests (every
mapped field None, 0, negative, huge, not an int, booleans for numbers; properties with or without a group;
a bytes body or anything with a length) and hostile defaults, both give the same message field by field and
type by type (``True`` is not ``1``), with the headers in the same order, or raise the same exception with
the same text; the compiled one leaves the request's properties as the twin does when it raises.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.protocol.numbers import INT64_MAX
from pymq_server.broker import _message_py, message, placement
from pymq_server.broker._send_py import SendRequest
from pymq_server.broker.message import BrokerMessage

from tests.twins import compiled as compiled_twin


def compiled() -> Any:
    """The compiled twin: a build without it fails here unless PYMQ_NO_EXTENSIONS=1 asked for that."""
    return compiled_twin(message.MESSAGE_IMPLEMENTATIONS, "message build")


def install(monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    """Make the broker build its messages with twin ``name`` (``c`` or ``py``) for one test."""
    module = compiled() if name == "c" else _message_py
    monkeypatch.setattr(BrokerMessage, "__init__", module.init_message)
    monkeypatch.setattr(message, "message_from_request", module.message_from_request)
    monkeypatch.setattr(placement, "message_from_request", module.message_from_request)
    return module


@pytest.fixture(params=["c", "py"])
def message_twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Each test that takes it runs with both twins installed in turn (ids ``c`` and ``py``)."""
    yield install(monkeypatch, request.param)


def fields(built: BrokerMessage) -> list[tuple[str, type, Any]]:
    """Every field, its type and its value (by repr: a NaN is not equal to itself)."""
    return [(name, type(getattr(built, name)), repr(getattr(built, name))) for name in _message_py.FIELDS]


def outcome(module: Any, request: SendRequest, kwargs: dict) -> tuple:
    """What one twin does with ``request``: the message's fields and headers in order, or the exception; the
    request's properties afterwards either way (a copy of the request each time: the build writes into them)."""
    headers = dict(request.properties)
    own = request._replace(properties=headers)
    saved = BrokerMessage.__init__
    BrokerMessage.__init__ = module.init_message  # type: ignore[method-assign]
    try:
        built = module.message_from_request(own, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the twins must raise the same thing
        return ("raised", type(exc), str(exc), repr(list(headers.items())))
    finally:
        BrokerMessage.__init__ = saved  # type: ignore[method-assign]
    assert type(built) is BrokerMessage and built.headers is headers
    return ("built", fields(built), repr(list(headers.items())))


def agree(request: SendRequest, kwargs: dict) -> tuple:
    theirs = outcome(compiled(), request, kwargs)
    ours = outcome(_message_py, request, kwargs)
    assert theirs == ours, (request, kwargs)
    return ours


#: values a request's number fields may hold: the parser's (None, ints within bounds) and what no parser gives
numbers = st.one_of(st.none(), st.sampled_from([0, 1, -1, 9, 10, INT64_MAX, INT64_MAX + 1, -INT64_MAX, 1 << 80]),
                    st.integers(), st.booleans(), st.sampled_from(["", "5", 2.5, float("nan")]))
flags = st.one_of(st.none(), st.booleans(), st.sampled_from([0, 1, "", "false", [], [0]]))
properties = st.dictionaries(st.one_of(st.sampled_from(["JMSXGroupID", "persistent", "pymq-delivery-time",
                                                        "expires", "type"]), st.text(max_size=8)),
                             st.text(max_size=8), max_size=6)
bodies = st.one_of(st.binary(max_size=64), st.just(bytearray(b"abc")), st.just(b""))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(props=properties, body=bodies, persistent=flags, priority=numbers, expires=numbers, ttl=numbers,
       deliver_at=numbers, delay=numbers, timestamp=numbers, now=st.one_of(st.integers(0, 1 << 62), numbers),
       default_persistent=flags, default_priority=numbers, default_ttl=numbers,
       producer=st.sampled_from(["", "c1"]), client_id=st.sampled_from([None, "app"]),
       user=st.sampled_from([None, "guest"]))
def test_the_twins_build_the_same_message_from_hostile_requests(props, body, persistent, priority, expires, ttl,
                                                                deliver_at, delay, timestamp, now,
                                                                default_persistent, default_priority, default_ttl,
                                                                producer, client_id, user):
    if now is None:
        now = 1_700_000_000_000    # (the clock's own case is below: two readings cannot be compared)
    request = SendRequest("/queue/q", props, body, persistent=persistent, priority=priority, expires=expires,
                          ttl=ttl, deliver_at=deliver_at, delay=delay, timestamp=timestamp)
    agree(request, dict(key=7, message_id="ID:n-7", seq=3, destination="/queue/q", now=now,
                        default_persistent=default_persistent, default_priority=default_priority,
                        default_ttl=default_ttl, producer=producer, client_id=client_id, user=user))


@pytest.mark.parametrize("case", [
    dict(),                                                     # the broker's common case: defaults everywhere
    dict(persistent=False, priority=9, expires=5, timestamp=3),
    dict(ttl=1000), dict(ttl=1000, expires=0), dict(ttl=INT64_MAX),   # expires (even 0) wins over a ttl
    dict(delay=250), dict(delay=INT64_MAX), dict(deliver_at=99, delay=5),
    dict(priority=10), dict(priority=-1), dict(priority="4"),  # no parser gives these: the same IndexError/TypeError
])
def test_the_twins_agree_on_each_rule_of_the_mapping(case):
    request = SendRequest("/queue/q", {"JMSXGroupID": "g", "k": "v"}, b"body", **case)
    result = agree(request, dict(key=1, message_id="ID:n-1", seq=1, destination="/queue/q", now=1_000,
                                 default_ttl=60_000))
    if case == {}:
        built = dict((name, value) for name, _, value in result[1])
        assert (built["expires"], built["group_id"], built["size"]) == ("61000", "'g'", "4")
        assert result[2].endswith("('persistent', 'true'), ('priority', '4'), ('timestamp', '1000'), "
                                  "('expires', '61000')]")


def test_a_request_that_is_not_a_send_request_is_read_by_name():
    class Request:        # any object with the fields (the twin reads them by name; so does the compiled one then)
        properties = {"a": "b"}
        body = b"xy"
        persistent = None
        priority = 2
        expires = None
        ttl = 10
        deliver_at = None
        delay = None
        timestamp = None
    kwargs = dict(key=1, message_id="ID:n-1", seq=1, destination="/queue/q", now=5)
    made = [module.message_from_request(Request(), **kwargs) for module in (compiled(), _message_py)]
    assert fields(made[0]) == fields(made[1]) and made[0].expires == 15 and made[0].priority == 2


def test_the_clock_is_read_when_no_instant_is_given(message_twin):
    before = int(time.time() * 1000)
    built = message.message_from_request(SendRequest("/queue/q", {}, b""), key=1, message_id="ID:n-1", seq=1,
                                         destination="/queue/q")
    after = int(time.time() * 1000)
    assert before <= built.timestamp <= after and type(built.timestamp) is int
    assert built.headers["timestamp"] == str(built.timestamp)


class GroupMap(dict):
    def get(self, key, default=None):   # type: ignore[no-untyped-def,override]
        return "from-get" if key == "JMSXGroupID" else default


@pytest.mark.parametrize("headers,body", [({}, b""), ({"JMSXGroupID": "g"}, b"x" * 70_000), (GroupMap(), b"ab"),
                                         ({"JMSXGroupID": 5}, bytearray(3)), ({}, "text")])
def test_init_fills_every_field_alike(headers, body):
    args = (9, "ID:n-9", "/topic/t", 12, headers, body, True, 4, 1, 2, 3, "c9", "app", "guest")
    made = []
    for module in (compiled(), _message_py):
        built = BrokerMessage.__new__(BrokerMessage)
        module.init_message(built, *args)
        made.append(fields(built))
    assert made[0] == made[1]
    assert dict((n, v) for n, _, v in made[0])["group_id"] == repr("from-get" if type(headers) is GroupMap
                                                                   else headers.get("JMSXGroupID"))


def test_init_refuses_what_has_no_length_or_no_get_alike():
    for args in [(1, "i", "d", 1, {}, None, True, 4, 0, 0), (1, "i", "d", 1, None, b"", True, 4, 0, 0)]:
        errors = []
        for module in (compiled(), _message_py):
            built = BrokerMessage.__new__(BrokerMessage)
            with pytest.raises(Exception) as caught:
                module.init_message(built, *args)
            errors.append((type(caught.value), str(caught.value)))
        assert errors[0][0] is errors[1][0], errors


def test_the_compiled_init_fills_only_the_message_class():
    with pytest.raises(TypeError, match="bound message class"):
        compiled().init_message(object(), 1, "i", "d", 1, {}, b"", True, 4, 0, 0)


@pytest.mark.parametrize("name", ["c", "py"])
def test_a_class_whose_slots_are_not_the_messages_fields_is_refused(name):
    module = compiled() if name == "c" else _message_py

    class Other:
        __slots__ = (*_message_py.FIELDS, "extra")

    with pytest.raises(TypeError, match="slots are not the message's fields"):
        module.bind(Other)


def test_the_message_has_no_attribute_beyond_its_fields(message_twin):
    built = message.message_from_request(SendRequest("/queue/q", {}, b""), key=1, message_id="ID:n-1", seq=1,
                                         destination="/queue/q", now=1)
    with pytest.raises(AttributeError):
        built.colour = "red"   # type: ignore[attr-defined]
    assert set(BrokerMessage.__slots__) == set(_message_py.FIELDS) and not hasattr(built, "__dict__")


def test_the_broker_runs_the_compiled_one():
    module = compiled()
    assert message.message_from_request is module.message_from_request
    assert placement.message_from_request is module.message_from_request
    assert BrokerMessage.__init__ is module.init_message
