"""The failover option ``connectionTimeout`` (spec/ha.md §4.2) in both Python shells: a broker whose port
accepts TCP connections and never answers — a listening socket nobody serves, or a SIGSTOPped live, whose
kernel still completes handshakes — holds one attempt for that long at most, then the next broker is tried.
The connections' own ``timeout`` is 30 s here; the outcomes (connected, resumed, the send delivered) are
asserted, and for the first connect a generous bound under that timeout: without the option the attempt on
the silent port takes the whole 30 s, and the send after the loss outlives the failover ``timeout`` of 20 s.  The Java, Go and TypeScript bindings test the
same option in their own suites."""
from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import pymq
import pymq.aio

OPTIONS = "connectionTimeout=2000&initialReconnectDelay=20&maxReconnectDelay=200&timeout=20000"


class Silent:
    """A port that accepts connections and never says a word; ``accepted`` counts them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(sock)

    @property
    def accepted(self) -> int:
        return len(self.held)

    def close(self) -> None:
        self.listener.close()
        for sock in self.held:
            sock.close()


@pytest.fixture
def silent():
    made = Silent()
    yield made
    made.close()


async def call(shell: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if shell == "aio":
        result = fn(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    return await asyncio.to_thread(fn, *args, **kwargs)


async def connect(shell: str, url: str, **kwargs: Any) -> Any:
    if shell == "aio":
        return await pymq.aio.connect(url, timeout=30.0, **kwargs)
    return await asyncio.to_thread(pymq.connect, url, timeout=30.0, **kwargs)


def run(coro) -> Any:  # noqa: ANN001
    return asyncio.run(asyncio.wait_for(coro, 150))


@pytest.mark.parametrize("shell", ["blocking", "aio"])
def test_a_silent_broker_first_in_the_list_is_passed_over(shell, broker, silent):
    async def main() -> None:
        url = f"failover:(stomp://127.0.0.1:{silent.port},stomp://127.0.0.1:{broker.port})?{OPTIONS}"
        started = time.monotonic()
        conn = await connect(shell, url)
        # a generous bound: the attempt on the silent port ends after 2 s, not the connection's 30 s timeout
        # (each attempt of a first connect has the whole of it, so without the option this still connects)
        assert time.monotonic() - started < 20
        try:
            assert silent.accepted == 1                       # tried first, given up on, then the broker
            queue = pymq.Queue("connect-timeout")
            session = conn.create_session()
            consumer = await call(shell, session.create_consumer, queue)
            await call(shell, session.create_producer(queue).send, "through the second broker")
            message = await call(shell, consumer.receive, 10)
            assert message is not None and message.text == "through the second broker"
        finally:
            await call(shell, conn.close)
    run(main())


def test_a_stopped_live_is_passed_over_for_its_backup(file_group):
    """The zombie of spec/ha.md §2: the live is SIGSTOPped, the backup takes the store when its lease runs
    out; the client, which hears no heart-beat any more, tries the backup (not listening yet), the stopped
    live (its port accepts: connectionTimeout ends that attempt), then the backup again, and resumes (the
    blocking shell; the asyncio one shares the option's code, tested with the silent port above)."""
    shell = "blocking"
    live = file_group.start("A")
    port_a = live.wait_live()
    port_b = _free_port()
    backup = file_group.start("B", "--port", str(port_b))
    backup.wait_backup()

    async def main() -> None:
        events: list[str] = []
        url = f"failover:(stomp://127.0.0.1:{port_a},stomp://127.0.0.1:{port_b})?{OPTIONS}"
        conn = await connect(shell, url, heartbeat=(300, 300))
        conn.set_transport_listener(lambda event: events.append(event.kind))
        try:
            queue = pymq.Queue("zombie")
            session = conn.create_session()
            consumer = await call(shell, session.create_consumer, queue)
            producer = session.create_producer(queue)
            await call(shell, producer.send, "before")
            assert (await call(shell, consumer.receive, 10)).text == "before"
            live.stop()
            deadline = time.monotonic() + 30
            while "interrupted" not in events:
                assert time.monotonic() < deadline, "the stopped live was never noticed"
                await asyncio.sleep(0.02)
            await call(shell, producer.send, "after")        # waits while it reconnects
            message = await call(shell, consumer.receive, 20)
            if message is not None and message.text == "before":   # its ACK may not have reached the store
                assert message.redelivered
                message = await call(shell, consumer.receive, 20)
            assert message is not None and message.text == "after"
            assert events == ["interrupted", "resumed"]
            assert backup.live
        finally:
            await call(shell, conn.close)
    try:
        run(main())
    finally:
        live.cont()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
