"""Where the storage tests find real servers, and a TCP proxy that cuts connections on demand.

The servers come from ``.ci/services.sh`` through two environment variables:

* ``PYMQ_TEST_POSTGRES_URL`` (e.g. ``postgresql+psycopg://pymq:pymq@127.0.0.1:5432/pymq_test``)
* ``PYMQ_TEST_REDIS_URL``    (e.g. ``redis://127.0.0.1:6379/0``)

This module is the one place that decides what an absent server means: a skip that names the variable
and the command that provides it, except when ``CI`` is set (CI sets it), where it is a failure, so a
CI run can never go green without having tested against the real servers.  A variable that is set
but names a server that does not answer is always a failure.  ``service_url`` is also how the
interoperability and binding suites find the foreign clients and toolchains of ``.ci/interop-clients.sh``.

Use the fixtures by importing them into a test module: ``from tests.storage.services import postgres_url``.
"""
from __future__ import annotations

import os
import socket
import threading

import pytest

POSTGRES_VAR = "PYMQ_TEST_POSTGRES_URL"
REDIS_VAR = "PYMQ_TEST_REDIS_URL"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def service_url(variable: str, what: str, provider: str = ".ci/services.sh") -> str:
    """The value of ``variable``, or skip (fail under CI) with a reason that says how to get one.

    ``provider`` is the script whose ``export`` lines set it; other suites (the interoperability
    clients of ``.ci/interop-clients.sh``) reuse this rule with their own script.
    """
    url = os.environ.get(variable, "").strip()
    if url:
        return url
    reason = (f"{variable} is not set, so there is no {what} to test against; "
              f"get one with: eval \"$({provider})\"")
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a missing one is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = service_url(POSTGRES_VAR, "PostgreSQL server")
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as exc:
        pytest.fail(f"{POSTGRES_VAR}={url} is set but PostgreSQL does not answer: {exc}", pytrace=False)
    finally:
        engine.dispose()
    return url


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = service_url(REDIS_VAR, "Redis server")
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"{REDIS_VAR}={url} is set but Redis does not answer: {exc}", pytrace=False)
    finally:
        client.close()
    return url


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a server; ``cut()`` drops every connection and refuses new ones
    until ``restore()``.  Lets a test take a real server away from a device and give it back.
    ``hold_replies()`` stops forwarding what the server says (it is dropped) while the client's bytes
    still reach it: the server acts on a request whose answer never arrives (a receipt lost with a link).
    ``sever()`` leaves each link half-open, as a network partition does: the client's side is closed, the
    server's stays open and hears nothing more (what it writes is read and dropped), so the server holds the
    connection until its heart-beat deadline."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._open = True
        self._closed = False
        self._holding = False
        self.replies_dropped = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._silent: set[socket.socket] = set()       # servers' sockets of severed links: open, never closed
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return                      # listener closed
            with self._lock:
                allowed = self._open
            if not allowed:
                client.close()
                continue
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets |= {client, server}
                self._pairs.append((client, server))
            for src, dst, replies in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, replies), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool = False) -> None:
        try:
            while chunk := src.recv(65536):
                if src in self._silent:
                    continue                    # a severed link: the server talks to nobody
                if replies and self._holding:
                    self.replies_dropped += len(chunk)
                    continue
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                if sock in self._silent:
                    continue
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        with self._lock:
            self._open = False
            sockets, self._sockets = self._sockets, set()
            self._pairs = []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def sever(self) -> None:
        """Half-open links: every client's socket is closed, every server's stays open and silent."""
        with self._lock:
            self._open = False
            pairs, self._pairs = self._pairs, []
            for client, server in pairs:
                self._silent.add(server)
                self._sockets -= {client, server}
        for client, _ in pairs:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            client.close()

    def restore(self) -> None:
        with self._lock:
            self._open = True
            self._holding = False

    def hold_replies(self) -> None:
        self._holding = True

    def close(self) -> None:
        self.cut()
        with self._lock:
            silent, self._silent = self._silent, set()
        for sock in silent:
            sock.close()
        self._listener.close()
        self._thread.join(timeout=5)
