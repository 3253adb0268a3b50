"""The client core without I/O (pymq/client/_core.py): frames in, frames out, no socket, no thread, no
event loop — the acknowledgement ledger of each mode, the transaction frames, and the order of
redelivered messages after recover()/rollback(), whatever the moment their copies arrive."""
from __future__ import annotations

import pytest

from pymq.client._core import (AckMode, ConnectionCore, ConnectionSettings, ConnectionStatus, ConsumerCore,
                               SessionCore)
from pymq.destination import Queue
from pymq.errors import ConnectionClosed, IllegalStateError, PymqError
from pymq.message import TextMessage
from pymq.protocol.frame import Frame


class Wire(ConnectionCore):
    def __init__(self) -> None:
        super().__init__(ConnectionSettings("vm://core-test"))
        self.sent: list[Frame] = []
        self.status = ConnectionStatus.OPEN

    def _send(self, frame: Frame) -> None:
        self._check_open()
        self.sent.append(frame)

    def _send_on(self, frame: Frame, link: int) -> None:
        if link == self._link:
            self._send(frame)


class Consumer(ConsumerCore):
    def _notify(self) -> None:
        pass

    def _wake(self) -> None:
        pass


class Waiter:
    def __init__(self) -> None:
        self.headers: dict[str, str] | None = None
        self.error: PymqError | None = None

    def resolve(self, headers: dict[str, str]) -> None:
        self.headers = headers

    def fail(self, error: PymqError) -> None:
        self.error = error


def message(consumer: Consumer, n: int, redelivered: bool = False) -> Frame:
    headers = {"subscription": consumer._sub_id, "message-id": f"m{n}", "ack": f"a{n}{'r' if redelivered else ''}",
               "destination": "/queue/q", "content-type": "text/plain"}
    if redelivered:
        headers["redelivered"] = "true"
    return Frame("MESSAGE", headers, f"n{n}".encode())


def texts(consumer: Consumer) -> list[str]:
    out = []
    while consumer._buffer:
        m = consumer._take(consumer._buffer.popleft(), 0)
        assert isinstance(m, TextMessage)
        out.append(m.text + ("*" if m.redelivered else ""))
    return out


def setup(mode: AckMode) -> tuple[Wire, SessionCore, Consumer]:
    wire = Wire()
    session = SessionCore(wire, mode)
    consumer = Consumer(session, Queue("q"), None, 100)
    for n in range(5):
        wire._frame_received(message(consumer, n))
    return wire, session, consumer


def test_auto_acknowledge_coalesces_a_burst_into_one_cumulative_ack():
    """Issue 30: five messages read in one go are acknowledged by one ACK of the last, on a cumulative
    (``client``) subscription; nothing is held once the buffer is empty."""
    wire, session, consumer = setup(AckMode.AUTO_ACKNOWLEDGE)
    assert session._ledger.cumulative is True
    assert session._subscribe_frame(consumer).headers["ack"] == "client"
    assert texts(consumer) == ["n0", "n1", "n2", "n3", "n4"]
    assert [(f.command, f.headers) for f in wire.sent] == [("ACK", {"id": "a4"})]
    consumer._before_wait()
    assert len(wire.sent) == 1                 # nothing left held


def test_auto_acknowledge_acks_at_once_a_consumer_that_keeps_up():
    """One message buffered at a time (a consumer as fast as its broker): one ACK per message, sent when
    ``receive`` returns it, as before coalescing."""
    wire = Wire()
    session = SessionCore(wire, AckMode.AUTO_ACKNOWLEDGE)
    consumer = Consumer(session, Queue("q"), None, 100)
    for n in range(3):
        wire._frame_received(message(consumer, n))
        consumer._take(consumer._buffer.popleft(), 0)
        assert [f.headers["id"] for f in wire.sent] == [f"a{k}" for k in range(n + 1)]


def test_auto_acknowledge_holds_at_most_a_batch_or_a_while(monkeypatch):
    from pymq.client import _core
    wire = Wire()
    session = SessionCore(wire, AckMode.AUTO_ACKNOWLEDGE)
    consumer = Consumer(session, Queue("q"), None, 1000)
    total = 2 * _core.AUTO_ACK_BATCH + 3
    for n in range(total):
        wire._frame_received(message(consumer, n))
    for _ in range(_core.AUTO_ACK_BATCH * 2):
        consumer._take(consumer._buffer.popleft(), 0)
    batch = _core.AUTO_ACK_BATCH
    assert [f.headers["id"] for f in wire.sent] == [f"a{batch - 1}", f"a{2 * batch - 1}"]
    # a take long after the first held one sends the ACK though more is buffered
    consumer._take(consumer._buffer.popleft(), 0)
    clock = _core.time.monotonic() + _core.AUTO_ACK_HOLD_S + 1
    monkeypatch.setattr(_core.time, "monotonic", lambda: clock)
    consumer._take(consumer._buffer.popleft(), 0)
    assert [f.headers["id"] for f in wire.sent][-1] == f"a{2 * batch + 1}"
    assert len(consumer._buffer) == 1


def test_auto_acknowledge_listener_failure_acks_what_was_held_then_nacks_only_its_message():
    """A listener that raises: the ACK held for the messages before it goes first, then the NACK
    (cumulative on a ``client`` subscription) names the failed one, which alone comes back."""
    wire, session, consumer = setup(AckMode.AUTO_ACKNOWLEDGE)
    for _ in range(2):
        _, delivery = consumer._for_listener(consumer._buffer.popleft(), 0)
        consumer._listener_done(delivery, failed=False)
    assert wire.sent == []                     # held: more is buffered
    _, delivery = consumer._for_listener(consumer._buffer.popleft(), 0)
    consumer._listener_done(delivery, failed=True)
    assert [(f.command, f.headers["id"]) for f in wire.sent] == [("ACK", "a1"), ("NACK", "a2")]


def test_auto_acknowledge_drops_an_ack_held_for_a_lost_link():
    """After a failover (a new link) the ACK held for the old link's messages is not sent: the broker
    returned them with the link, and an ACK on the new one would name unknown ids."""
    wire, session, consumer = setup(AckMode.AUTO_ACKNOWLEDGE)
    consumer._take(consumer._buffer.popleft(), 0)
    consumer._take(consumer._buffer.popleft(), 0)
    wire._link = 1
    consumer._before_wait()
    assert wire.sent == []
    consumer._closing()
    assert wire.sent == []


def test_client_acknowledge_acks_each_consumed_message():
    """Not STOMP's cumulative ``client`` acks: after recover() redelivered messages come before prefetched
    ones, and a cumulative ACK of one would acknowledge those unread (issue 28.2)."""
    wire, session, consumer = setup(AckMode.CLIENT_ACKNOWLEDGE)
    assert session._ledger.cumulative is False
    assert session._subscribe_frame(consumer).headers["ack"] == "client-individual"
    consumer._take(consumer._buffer.popleft(), 0)
    consumer._take(consumer._buffer.popleft(), 0)
    assert wire.sent == []
    session._acknowledge_now()
    assert [(f.command, f.headers) for f in wire.sent] == [("ACK", {"id": "a0"}), ("ACK", {"id": "a1"})]


def test_dups_ok_batches_and_flushes_before_waiting():
    wire, session, consumer = setup(AckMode.DUPS_OK_ACKNOWLEDGE)
    consumer.prefetch = 8                      # a batch is prefetch // 4 = 2 messages
    for _ in range(3):
        consumer._take(consumer._buffer.popleft(), 0)
    assert [f.headers["id"] for f in wire.sent] == ["a1"]
    consumer._before_wait()
    assert [f.headers["id"] for f in wire.sent] == ["a1", "a2"]


def test_transacted_acks_inside_the_transaction_and_rollback_frames():
    wire, session, consumer = setup(AckMode.SESSION_TRANSACTED)
    session._begin()
    tx = session._tx
    consumer._take(consumer._buffer.popleft(), 0)
    assert wire.sent[-1] == Frame("ACK", {"id": "a0", "transaction": tx})
    frames, _ = session._recovery_frames(rollback=True)
    assert [f.command for f in frames] == ["ABORT", "NACK", "BEGIN"]
    assert frames[0].headers["transaction"] == tx and frames[2].headers["transaction"] == session._tx != tx
    with pytest.raises(IllegalStateError):
        session._recovery_frames(rollback=False)


@pytest.mark.parametrize("copies_arrive", ["before the receipt", "after the receipt"])
def test_redelivered_copies_go_in_front_of_the_prefetched_ones(copies_arrive):
    wire, session, consumer = setup(AckMode.CLIENT_ACKNOWLEDGE)
    assert [consumer._take(consumer._buffer.popleft(), 0).message_id for _ in range(2)] == ["m0", "m1"]
    frames, _ = session._recovery_frames(rollback=False)
    assert [(f.command, f.headers["id"]) for f in frames] == [("NACK", "a0"), ("NACK", "a1")]   # each one
    waiter = Waiter()
    rid, last = wire._expect(frames[-1], waiter)
    wire._send(last)
    copies = [message(consumer, 0, True), message(consumer, 1, True)]
    if copies_arrive == "before the receipt":
        for frame in copies:
            wire._frame_received(frame)
    wire._frame_received(Frame("RECEIPT", {"receipt-id": rid}))
    assert waiter.headers is not None
    settle = session._recovery_settle_frames()
    if copies_arrive == "before the receipt":
        assert settle == []                    # every copy is back: no second round trip
    else:
        assert [f.command for f in settle] == ["BEGIN", "ABORT"]
        for frame in copies:                   # dispatched after the first receipt, before the second
            wire._frame_received(frame)
    session._end_recovery()
    assert texts(consumer) == ["n0*", "n1*", "n2", "n3", "n4"]


def test_a_closed_consumer_is_not_named_by_a_later_acknowledge():
    wire, session, consumer = setup(AckMode.CLIENT_ACKNOWLEDGE)
    other = Consumer(session, Queue("q2"), None, 100)
    wire._frame_received(message(other, 9))
    consumer._take(consumer._buffer.popleft(), 0)
    other._take(other._buffer.popleft(), 0)
    consumer._closing()
    session._acknowledge_now()
    assert [f.headers["id"] for f in wire.sent] == ["a9"]


def test_a_lost_connection_fails_every_receipt_and_refuses_more_frames():
    wire = Wire()
    waiter = Waiter()
    wire._expect(Frame("SUBSCRIBE", {"id": "s", "destination": "/queue/q"}), waiter)
    assert wire._lost(ConnectionClosed("gone")) is True
    assert isinstance(waiter.error, ConnectionClosed) and wire.status is ConnectionStatus.CLOSED
    with pytest.raises(ConnectionClosed):
        wire._send(Frame("ACK", {"id": "x"}))
