"""Hostile SEND header blocks (spec/stomp.md §4): raw bytes as the scanner delivers them to ``parse_send``,
on both twins (tests/hostile/send_headers.py states the property); also a coverage-guided target
(``bench/fuzz_targets.py send``, ``python -m bench.fuzz``)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq_server.broker import requests
from tests.hostile.send_headers import check_block
from tests.twins import compiled as compiled_twin

LINES = [b"destination:/queue/q", b"persistent:true", b"persistent:TRUE", b"persistent:", b"persistent:yes",
         b"priority:9", b"priority:10", b"priority:+5", b"priority:007", b"priority: 5", b"expires:-1",
         b"expires:9223372036854775807", b"expires:9223372036854775808", b"expiration:" + b"9" * 30,
         b"timestamp:\xd9\xa5", b"timestamp:\xef\xbc\x95", b"AMQ_SCHEDULED_DELAY:5", b"pymq-delay:x",
         b"AMQ_SCHEDULED_TIME:", b"_AMQ_DUPL_ID:d", b"pymq-dedup-id:", b"pymq-forwarded:node-b",
         b"pymq-subscription:k", b"message-id:forged", b"ack:x", b"receipt:r", b"transaction:t",
         b"colour:r\\cd", b"\xc3\xa9t\xc3\xa9:\xe2\x82\xac", b"content-length:0"]


def _compiled():
    return compiled_twin(requests.SEND_IMPLEMENTATIONS, "parse_send")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.one_of(st.sampled_from(LINES), st.binary(max_size=20)), max_size=12))
def test_hostile_header_blocks_give_the_same_answer_on_both_twins(lines):
    check_block(_compiled(), b"\n".join(lines))


def test_a_repeated_header_is_read_as_the_scanner_keeps_it():
    compiled = _compiled()
    kind, fields, _ = check_block(compiled, b"destination:/queue/q\npriority:3\npriority:x\npersistent:false\n"
                                            b"persistent:true")
    assert kind == "request" and fields[6] == (int, 3) and fields[5] == (bool, False)
    assert check_block(compiled, b"destination:/queue/q\npriority:x\npriority:3")[2] == "priority"
