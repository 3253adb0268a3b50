"""A long selector compiles in a worker thread while the broker serves everyone else (issue 24 item 4).

Landed main compiled every selector on the event loop: one at the documented limits takes from a few to
over a hundred milliseconds (deep parentheses), and every other client waited (a bystander: 1.05 s). Now a
selector longer than budgets.SELECTOR_ON_LOOP compiles in the broker's CPU pool while its connection's next
frames wait; its SUBSCRIBE's receipt comes once the subscription exists. The tests hold the compile in its
thread with a gate, so they show the loop serving others without measuring any time.
"""
from __future__ import annotations

import threading

from pymq_server.broker.budgets import SELECTOR_ON_LOOP
from tests.conftest import RawStomp, wait_for

LONG = " OR ".join(f"a = {i}" for i in range(400))          # ~4,000 characters: compiled off the loop


def _until(client: RawStomp, receipt: str):
    while True:
        frame = client.read(30)
        if frame.command == "ERROR" or (frame.command == "RECEIPT" and frame.headers["receipt-id"] == receipt):
            return frame


def _gate(rb):
    """Make the broker's selector compiles wait for the returned event; the threads they ran on."""
    gate, threads = threading.Event(), []
    compile_selector = rb.broker.compile_selector

    def gated(text):
        threads.append(threading.current_thread().name)
        if len(text) > SELECTOR_ON_LOOP:
            assert gate.wait(30)
        return compile_selector(text)
    rb.call(lambda: setattr(rb.broker, "compile_selector", gated))
    return gate, threads


def test_a_long_selector_compiles_off_the_loop_while_others_are_served(broker):
    assert len(LONG) > SELECTOR_ON_LOOP
    gate, threads = _gate(broker)
    subscriber = RawStomp(broker.port)
    subscriber.connect()
    subscriber.send("SUBSCRIBE", {"destination": "/queue/sel", "id": "s", "selector": LONG, "receipt": "sub"})
    # frames after it wait for it, in order: this one names the subscription being made
    subscriber.send("UNSUBSCRIBE", {"id": "s", "receipt": "unsub"})
    subscriber.send("SUBSCRIBE", {"destination": "/queue/sel", "id": "t", "selector": "a = 7", "receipt": "again"})
    bystander = RawStomp(broker.port)
    bystander.connect()
    for i in range(3):                        # the loop is free while the compile waits at its gate
        bystander.send("SEND", {"destination": "/queue/other", "receipt": f"b{i}"}, b"x")
        assert _until(bystander, f"b{i}").command == "RECEIPT"
    assert wait_for(lambda: threads) and threads[0] != broker.thread.name
    gate.set()
    assert _until(subscriber, "sub").command == "RECEIPT"
    assert _until(subscriber, "unsub").command == "RECEIPT"       # not unknown-subscription
    assert _until(subscriber, "again").command == "RECEIPT"
    assert len(threads) == 1                                       # the short selector: compiled on the loop
    bystander.send("SEND", {"destination": "/queue/sel", "a": "7", "pymq-types": "a=i"}, b"seven")
    message = subscriber.read(10)
    assert message.command == "MESSAGE" and message.body == b"seven" and message.headers["subscription"] == "t"


def test_an_invalid_long_selector_is_its_subscribes_error(broker):
    subscriber = RawStomp(broker.port)
    subscriber.connect()
    subscriber.send("SUBSCRIBE", {"destination": "/queue/bad", "id": "s", "selector": LONG + " AND (",
                                  "receipt": "sub"})
    error = _until(subscriber, "sub")
    assert error.command == "ERROR" and error.headers["pymq-code"] == "invalid-selector"
    assert error.headers["receipt-id"] == "sub"
    assert broker.call(lambda: broker.broker.flow.client_bytes) == 0       # its charge went with it
    other = RawStomp(broker.port)
    assert other.connect().command == "CONNECTED"


def test_a_connection_closed_while_its_selector_compiles_leaves_nothing(broker):
    gate, threads = _gate(broker)
    subscriber = RawStomp(broker.port)
    subscriber.connect()
    subscriber.send("SUBSCRIBE", {"destination": "/queue/gone", "id": "s", "selector": LONG, "receipt": "sub"})
    witness = RawStomp(broker.port)
    witness.connect()
    witness.send("BEGIN", {"transaction": "w", "receipt": "w"})
    assert _until(witness, "w").command == "RECEIPT"
    assert wait_for(lambda: threads)                   # the compile is waiting at its gate
    subscriber.close()
    gate.set()
    witness.send("ABORT", {"transaction": "w", "receipt": "w2"})
    assert _until(witness, "w2").command == "RECEIPT"
    # (a paused connection reads its end once the compile is done: what it held goes then)
    assert wait_for(lambda: broker.call(lambda: broker.broker.flow.client_bytes) < 64 * 1024)   # the witness's
    queue = broker.call(lambda: broker.broker.queues.get("gone"))
    assert queue is None or not broker.call(lambda: queue.consumers)
