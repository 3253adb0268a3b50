"""Global names of temporary destinations are never reused by a later broker process (spec/stomp.md §3).

Connection ids start again at c1 in every process. Before the incarnation was part of the global name, a
responder that kept ``/temp-queue/tmp.c1.reply`` across a broker restart (or a takeover by a backup) sent
its reply into whichever new connection c1 had made a ``reply`` queue: another user's queue.
"""
from __future__ import annotations

import pytest

from tests.conftest import RawStomp


def _reply_to_name(port: int, kind: str) -> str:
    """The global name the broker gives ``/temp-<kind>/reply`` of a first connection."""
    owner = RawStomp(port)
    owner.connect()
    owner.send("SUBSCRIBE", {"destination": f"/temp-{kind}/reply", "id": "r"})
    owner.send("SEND", {"destination": f"/temp-{kind}/reply", "reply-to": f"/temp-{kind}/reply", "receipt": "s"},
               b"ask")
    got = {}
    while len(got) < 2:
        frame = owner.read(10)
        got[frame.command] = frame
    owner.close()
    return got["MESSAGE"].headers["reply-to"]


def _holder(port: int, kind: str) -> RawStomp:
    """The first connection of a process, subscribed to its own ``/temp-<kind>/reply``."""
    victim = RawStomp(port)
    victim.connect()
    victim.send("SUBSCRIBE", {"destination": f"/temp-{kind}/reply", "id": "v", "receipt": "sub"})
    assert victim.read(10).command == "RECEIPT"
    return victim


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_global_name_from_a_former_process_is_refused_not_given_to_a_new_connection(broker_factory, kind):
    first = broker_factory()
    kept = _reply_to_name(first.port, kind)
    assert kept.startswith(f"/temp-{kind}/tmp.c1-"), kept
    first.stop()
    second = broker_factory()
    victim = _holder(second.port, kind)                     # c1 again, with a temporary named 'reply' again
    responder = RawStomp(second.port)
    responder.connect()
    responder.send("SEND", {"destination": kept, "receipt": "answer"}, b"the reply")
    frame = responder.read(10)
    assert frame.command == "ERROR" and frame.headers.get("pymq-code") == "unknown-destination", frame
    with pytest.raises(TimeoutError):
        victim.read(1.0)                                    # nothing reached the new connection's queue
    # its own global name (a new one) still works for anyone
    mine = _reply_to_name(second.port, kind)
    assert mine != kept and mine.startswith(f"/temp-{kind}/tmp.c3-")          # after the victim and responder
    victim.close()
