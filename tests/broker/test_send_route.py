"""A client's SEND and a peer's forward reach their route by one path (Router._route: resolve, the entry
rules, the target, kept in the connection's routes); the target comes after the rules and before anything
the SEND's own headers make, so that a refused SEND creates nothing."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pymq.errors import UnknownDestination
from tests.broker.core_harness import Core, FakeClient


class _Requester(FakeClient):
    """A connection whose own temporary queues are recorded as they are made."""

    def __init__(self) -> None:
        super().__init__(name="requester")
        self.made: list[str] = []

    def temp_queue(self, local: str, create: bool = True) -> SimpleNamespace:
        self.made.append(local)
        return SimpleNamespace(destination=f"/temp-queue/tmp.c0.{local}")


@pytest.fixture
def core(tmp_path):
    c = Core(tmp_path)
    yield c
    c.close()


def test_a_send_refused_for_its_destination_makes_no_temporary_queue_for_its_reply_to(core):
    client = _Requester()
    with pytest.raises(UnknownDestination):
        core.broker.send(client, Core.request("/temp-queue/tmp.c999.gone", {"reply-to": "/temp-queue/answers"}))
    assert client.made == []
    # the same reply-to on a SEND that is placed makes it (the name a reply reaches)
    core.broker.send(client, Core.request("/queue/svc", {"reply-to": "/temp-queue/answers"}))
    assert client.made == ["answers"]
    (entry,) = core.queue("svc").ready
    assert entry.message.headers["reply-to"] == "/temp-queue/tmp.c0.answers"
