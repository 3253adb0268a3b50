"""Shared fixtures: a real broker on 127.0.0.1 (free port, private data dir) and a raw STOMP client.

The broker runs in-process on its own event-loop thread, exactly as ``pymq-server`` runs it, so tests
talk to it over real TCP with real clients (the pymq SDK, stomp.py, raw sockets).

Two rules for the whole suite live here too, so that a green CI run means what it says:

* **No skip under CI.**  When ``CI`` is set, a test (or a whole module, e.g. a module-level
  ``pytest.importorskip``) that skips is reported as a failure, unless its reason is in
  :data:`ALLOWED_SKIPS` *and* that entry's condition holds right now.  A missing server, toolchain or
  library therefore can never turn into a quiet green run.  tests/test_ci_rules.py proves the hook works.
* **Hypothesis without luck.**  Under ``CI`` the ``ci`` profile derandomizes every property test (the
  examples are derived from the test's source, so a mutant that a property test kills is killed in every
  run, not in three of four); locally the ``dev`` profile draws at random, and ``HYPOTHESIS_PROFILE=nightly``
  draws ten times as many examples where a test does not fix its own count.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings

from pymq.protocol.scanner import FrameScanner, encode_frame
from pymq_server.app import BrokerServer
from pymq_server.config import BrokerConfig
from tests.storage.services import in_ci

# --- hypothesis profiles ----------------------------------------------------------------------------------

# each from hypothesis's own defaults: hypothesis loads its built-in "ci" profile by itself whenever a CI
# variable is set at all (CI=0 included), and a profile registered without a parent inherits what is loaded
_DEFAULTS = settings.get_profile("default")
settings.register_profile("dev", _DEFAULTS, deadline=None)
settings.register_profile("ci", _DEFAULTS, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", _DEFAULTS, deadline=None, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow])
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if in_ci() else "dev")
settings.load_profile(HYPOTHESIS_PROFILE)


# --- skips under CI -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AllowedSkip:
    """A skip that stays a skip under CI: its reason starts with ``reason`` and ``applies()`` is true now."""
    reason: str
    applies: Callable[[], bool]
    why: str


def _no_extensions() -> bool:
    from pymq._accel import NO_EXTENSIONS
    return NO_EXTENSIONS


#: The reviewed list.  Add to it only a skip whose condition is a choice made on purpose or a platform the
#: code does not run on; never a missing server, toolchain or library (those fail under CI).
ALLOWED_SKIPS: tuple[AllowedSkip, ...] = (
    AllowedSkip("PYMQ_NO_EXTENSIONS=1: the compiled twin is disabled on purpose", _no_extensions,
                "a run of the pure-Python twins was asked for: the compiled half of a twin test has nothing to run"),
    AllowedSkip("POSIX sockets", lambda: os.name != "posix", "platform: the test needs POSIX sockets"),
    AllowedSkip("SIGHUP is POSIX", lambda: sys.platform == "win32", "platform: Windows has no SIGHUP"),
)


def skip_reason(report) -> str:
    """The reason a test or a module gave for skipping (pytest keeps it as ``(path, line, 'Skipped: ...')``)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def skip_allowed(reason: str) -> bool:
    return any(reason.startswith(entry.reason) and entry.applies() for entry in ALLOWED_SKIPS)


def _skip_failure(reason: str) -> str:
    return (f"skipped under CI: {reason}\n(CI is set, so a skip is a failure unless tests/conftest.py "
            f"ALLOWED_SKIPS allows it: provide what the test needs)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and in_ci():
        reason = skip_reason(report)
        if not skip_allowed(reason):
            report.outcome = "failed"
            report.longrepr = _skip_failure(reason)
    return report


class SkippedModule(pytest.Item):
    """Stands for a module that skipped as a whole while it was imported under CI: one failing test, so
    the rest of the run goes on and the summary names the module and its reason."""

    def __init__(self, *, reason: str, **kw) -> None:
        super().__init__(**kw)
        self.reason = reason

    def runtest(self) -> None:
        pytest.fail(_skip_failure(self.reason), pytrace=False)

    def reportinfo(self):
        return self.path, None, f"{self.name}: skipped at import"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.skipped and in_ci() and isinstance(collector, pytest.Module):
        reason = skip_reason(report)
        if not skip_allowed(reason):
            report.outcome = "passed"
            report.longrepr = None
            report.result = [SkippedModule.from_parent(collector.parent, name=collector.name, reason=reason,
                                                       path=collector.path,
                                                       nodeid=f"{collector.nodeid}::skipped-at-import")]
    return report


class RunningBroker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(config)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="test-broker")
        self.thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("broker did not start")
        if self._error:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"stomp://127.0.0.1:{self.port}"

    @property
    def broker(self):
        return self.server.broker

    def call(self, fn, *args, timeout: float = 10.0):
        """Run ``fn(*args)`` on the broker's loop thread and return its result (inspect state safely)."""
        done = threading.Event()
        box: list = []

        def run():
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # hand it to the test thread
                box.append((False, exc))
            done.set()

        self.loop.call_soon_threadsafe(run)
        if not done.wait(timeout):
            raise TimeoutError("broker loop did not answer")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        if not self.loop.is_running():
            return
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        fut.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def broker_factory(tmp_path):
    started: list[RunningBroker] = []

    def make(**overrides) -> RunningBroker:
        settings = dict(host="127.0.0.1", port=0, data_dir=str(tmp_path / f"data{len(started)}"))
        settings.update(overrides)
        rb = RunningBroker(BrokerConfig.from_dict(settings))
        started.append(rb)
        return rb

    yield make
    for rb in started:
        rb.stop()


@pytest.fixture
def broker(broker_factory) -> RunningBroker:
    return broker_factory()


class RawStomp:
    """A deliberately dumb STOMP client over a socket, for protocol-level tests."""

    def __init__(self, port: int, version: str = "1.2", rcvbuf: int | None = None) -> None:
        if rcvbuf is None:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        else:
            # a small receive window must be set before connecting to take effect
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(5)
            self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.scanner = FrameScanner(max_frame_size=64 * 1024 * 1024, version=version)
        self.version = version
        self.frames: list = []

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def encode(self, command: str, headers: dict | None = None, body: bytes = b"") -> bytes:
        return encode_frame(command, headers or {}, body, self.version)

    def send(self, command: str, headers: dict | None = None, body: bytes = b"") -> None:
        self.sock.sendall(self.encode(command, headers, body))

    def connect(self, login: str = "guest", passcode: str = "guest", **headers) -> object:
        h = {"accept-version": self.version, "host": "/", "login": login, "passcode": passcode}
        h.update(headers)
        self.sock.sendall(encode_frame("CONNECT", h, b"", "1.2"))
        frame = self.read()
        # the scanner stopped after CONNECTED (to learn the version): what came in the same read follows it
        self.frames.extend(self.scanner.feed(b""))
        return frame

    def read(self, timeout: float = 5.0):
        """The next frame, or raise TimeoutError / ConnectionError('closed')."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            more = self.scanner.feed(b"")
            if more:
                self.frames.extend(more)
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no frame") from None
            except ConnectionResetError:
                raise ConnectionError("closed") from None
            if not data:
                raise ConnectionError("closed")
            self.frames.extend(self.scanner.feed(data))
        return self.frames.pop(0)

    def read_until_closed(self, timeout: float = 5.0) -> list:
        out = []
        while True:
            try:
                out.append(self.read(timeout))
            except ConnectionError:
                return out

    def is_closed(self, timeout: float = 3.0) -> bool:
        try:
            self.read_until_closed(timeout)
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


@pytest.fixture
def raw(broker):
    clients: list[RawStomp] = []

    def make(version: str = "1.2", connect: bool = True, **kw) -> RawStomp:
        client = RawStomp(broker.port, version)
        clients.append(client)
        if connect:
            frame = client.connect(**kw)
            assert frame.command == "CONNECTED", frame
        return client

    yield make
    for c in clients:
        c.close()


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Wait for a condition that another thread or process makes true (tests never assert timings)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.fixture
def broker_processes():
    """``start(data_dir, *args, config=None) -> BrokerProcess`` (tests/storage/disks.py: a real ``pymq-server``
    child, for kill -9 and restarts); every one still running is killed afterwards."""
    from tests.storage.disks import BrokerProcess

    started: list = []

    def start(data_dir, *args: str, config: str | None = None):
        bp = BrokerProcess(Path(data_dir), *args, config=config)
        started.append(bp)
        return bp

    yield start
    for bp in started:
        if bp.proc.poll() is None:
            bp.proc.kill()
            bp.proc.wait(10)


# -- tests that measure the whole process run in a process of their own ------------------------------------

OWN_PROCESS = "PYMQ_TEST_OWN_PROCESS"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_process: run in a fresh interpreter (heap figures from tracemalloc "
                                       "count every thread's allocations; threads left by earlier tests would "
                                       "be counted too)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked ``own_process`` runs again in a child pytest and passes or fails with it.

    tracemalloc traces every thread of the process: in a whole-suite run a broker thread or pool left behind
    by an earlier test allocates while such a test measures, and its figure is the sum (CI saw 80 bytes per
    paged message where the broker alone spends 47). The child runs only this test, so the figure is the
    broker's."""
    if pyfuncitem.get_closest_marker("own_process") is None or os.environ.get(OWN_PROCESS) == pyfuncitem.nodeid:
        return None
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                          pyfuncitem.nodeid], cwd=str(pyfuncitem.config.rootpath),
                         env={**os.environ, OWN_PROCESS: pyfuncitem.nodeid},
                         capture_output=True, text=True, timeout=900)
    if run.returncode != 0 or " passed" not in run.stdout:
        pytest.fail(f"in its own process (exit {run.returncode}):\n{run.stdout[-8000:]}\n{run.stderr[-2000:]}",
                    pytrace=False)
    return True
