"""pymq.aio's transport when the task connecting is cancelled while it waits for CONNECTED (an application's
own timeout, a failover attempt given up): the socket is closed at once, not left open to a broker that may
answer later, and the CONNECTED future it waited on leaves no "exception was never retrieved" behind."""
from __future__ import annotations

import asyncio
import gc
import socket
import threading

import pytest

import pymq.aio


class Answerless:
    """Accepts one connection, reads the CONNECT (``asked``), never answers; ``ended`` is set when the
    client closes."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.asked = threading.Event()
        self.ended = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        sock.settimeout(30)
        try:
            while sock.recv(4096):
                self.asked.set()
            self.ended.set()
        except OSError:
            self.ended.set()
        finally:
            sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def answerless():
    server = Answerless()
    yield server
    server.close()


def test_a_connect_cancelled_while_waiting_for_connected_closes_its_socket(answerless):
    async def main() -> list[dict]:
        loop = asyncio.get_running_loop()
        problems: list[dict] = []
        loop.set_exception_handler(lambda _loop, context: problems.append(context))
        async def connecting() -> None:
            await pymq.aio.connect(f"stomp://127.0.0.1:{answerless.port}", timeout=30.0)

        task = asyncio.create_task(connecting())
        # cancelled once it waits for CONNECTED (earlier, Python 3.11's wait_for may swallow a cancellation
        # that lands as create_connection completes)
        assert await asyncio.to_thread(answerless.asked.wait, 10), "the client never sent CONNECT"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ended = await asyncio.to_thread(answerless.ended.wait, 10)
        assert ended, "the cancelled connect left its socket open"
        del task
        gc.collect()
        await asyncio.sleep(0)
        return problems

    problems = asyncio.run(main())
    assert not problems, problems
