"""stomp.py (a STOMP client nobody here wrote) as the tests drive it: a listener that queues what arrives and a
factory of logged-in connections that closes them afterwards."""
from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import stomp


class Collector(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue = queue.Queue()
        self.receipts: queue.Queue = queue.Queue()
        self.errors: queue.Queue = queue.Queue()

    def on_message(self, frame):
        self.messages.put(frame)

    def on_receipt(self, frame):
        self.receipts.put(frame.headers["receipt-id"])

    def on_error(self, frame):
        self.errors.put(frame)

    def next(self, timeout: float = 5.0):
        return self.messages.get(timeout=timeout)

    def none(self, timeout: float = 0.3) -> bool:
        try:
            self.messages.get(timeout=timeout)
            return False
        except queue.Empty:
            return True

    def drain(self, timeout: float = 0.3) -> list:
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=timeout))
            except queue.Empty:
                return out


def connections(cls: Any, default_port: int) -> Iterator[Callable[..., tuple[Any, Collector]]]:
    """Yields make(port=None) -> (connection, collector), each logged in as guest; disconnects them all after."""
    conns = []

    def make(port: int | None = None):
        c = cls([("127.0.0.1", port or default_port)], heartbeats=(0, 0))
        listener = Collector()
        c.set_listener("collector", listener)
        c.connect("guest", "guest", wait=True)
        conns.append(c)
        return c, listener

    yield make
    for c in conns:
        try:
            c.disconnect()
        except Exception:  # noqa: BLE001 - best-effort clean-up of a connection a test may have broken
            pass
