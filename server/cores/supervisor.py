"""``pymq-server --workers W``: start W worker processes and watch them (spec/cores.md §2.3).

The supervisor forks the workers before any event loop exists, waits until every one is listening,
then announces the port. It stops them all on SIGTERM or SIGINT (each stops cleanly: listeners close,
clients are disconnected, storage is flushed) and forwards SIGHUP (each reloads).

A worker that dies is **restarted** (its own data directory: it recovers every persistent message that
got its receipt), and the supervisor says so, naming the worker and how it ended. Until it is back its
destinations are unavailable: the other workers close the client connections that used them (ERROR),
refuse frames for them (ERROR, nothing confirmed), and close their shadows of its clients (their
unacknowledged messages return to their queues); then they reconnect. More than ``worker_restarts``
deaths within ``worker_restart_window_ms`` is not a passing fault: the supervisor stops every worker and
exits 1.

Before anything starts: ``data_dir/cores.json`` records the worker count the data was written with, and
the placement rule of its destinations (ownership.py); another count is refused (moving destinations
between workers is not built), as is a data directory holding a one-process broker's storage.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable

from pymq.errors import ConfigError, ListenError, PymqError, StorageError
from pymq_server.config import BrokerConfig
from pymq_server.logs import announce

log = logging.getLogger("pymq.server")

SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
PR_SET_PDEATHSIG = 1


def check(config: BrokerConfig) -> None:
    """What the multi-worker broker does not do (yet), refused before anything starts."""
    refused = []
    if config.cluster is not None:
        refused.append("`cluster` (a node is one process)")
    if config.websocket is not None:
        refused.append("`websocket` (the WebSocket adapter does not relay other workers' frames)")
    if config.tls_port == 0:
        refused.append("`tls_port: 0` (each worker would pick its own port)")
    if refused:
        raise ConfigError(f"workers: {config.workers} cannot be combined with " + ", ".join(refused))


#: how destinations are placed over the workers (server/cores/ownership.py), recorded in cores.json with the
#: count: "numbered" spreads a numbered family round-robin; "hash" (a data directory written before that rule,
#: whose cores.json has no ``placement``) is the rendezvous hash alone
PLACEMENTS = ("numbered", "hash")


def prepare_data_dir(config: BrokerConfig) -> bool:
    """Check (or record) the worker count and placement the data directory was written with; True when its
    placement is "numbered". Both are decided once, when the directory is first used, and kept: a
    destination's messages are in its owner's storage, so the owner rule may not change under them."""
    data = config.data_dir
    try:
        os.makedirs(data, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot use data directory {data!r} (data_dir): {exc.strerror or exc}",
                           path=data) from None
    marker = os.path.join(data, "cores.json")
    if os.path.exists(marker):
        with open(marker) as fh:
            recorded = json.load(fh)
        before = recorded.get("workers")
        if before != config.workers:
            raise ConfigError(f"data directory {data!r} was written by {before} workers, not {config.workers}: "
                              f"destinations are owned by worker (spec/cores.md §2.2) and moving them to another "
                              f"count is not built; start with --workers {before}")
        placement = recorded.get("placement", "hash")
        if placement not in PLACEMENTS:
            raise ConfigError(f"data directory {data!r} records placement {placement!r}, which this broker does "
                              f"not know (one of {', '.join(PLACEMENTS)}; spec/cores.md §2)")
        return placement == "numbered"
    if os.path.exists(os.path.join(data, "file")):
        raise ConfigError(f"data directory {data!r} holds a one-process broker's storage: a multi-worker "
                          f"broker keeps its data in worker-<k>/ and would not see it")
    with open(marker, "w") as fh:
        json.dump({"workers": config.workers, "placement": "numbered"}, fh)
    return True


def _reserve_port(host: str, port: int) -> tuple[socket.socket | None, int]:
    """Port 0: one free port for all workers, held (bound, not listening) until they have bound it."""
    if port != 0:
        return None, port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, 0))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:0 for the STOMP port (port): {exc.strerror or exc}",
                          listener="STOMP port (port)", host=host, port=0) from None
    return sock, sock.getsockname()[1]


def _child(config: BrokerConfig, k: int, port: int, channel_dir: str, ready_w: int, use_uvloop: bool,
           numbered: bool) -> int:
    """In the forked worker: never returns to the supervisor's code."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    try:   # the worker ends with the supervisor, whatever ends it (kill -9 included)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    import asyncio

    from pymq_server.app import install_uvloop, tune_collector
    from pymq_server.cores.worker import Worker, worker_config
    tune_collector()
    if use_uvloop:
        install_uvloop()
    supervisor = os.getppid()
    worker = Worker(worker_config(config, k, port), config.node_id, k, config.workers, channel_dir, numbered)
    try:
        return asyncio.run(worker.run(ready_w))
    except ConfigError as exc:
        print(f"pymq-server: worker {k}: {exc.message}", file=sys.stderr)
        return 2
    except PymqError as exc:
        print(f"pymq-server: worker {k}: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"pymq-server: worker {k}: start-up failed: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        if os.getppid() != supervisor:
            # the supervisor is gone (killed with -9: its own clean-up never ran) and the workers end
            # with it; the channel directory would stay in the machine's temporary directory for good
            shutil.rmtree(channel_dir, ignore_errors=True)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"was killed by signal {sig} ({signal.Signals(sig).name})"
    return f"exited with status {os.WEXITSTATUS(status)}"


def run(config: BrokerConfig, use_uvloop: bool) -> int:
    """The supervisor: the process ``pymq-server`` runs with ``workers`` > 1. Returns the exit status."""
    check(config)
    numbered = prepare_data_dir(config)
    holder, port = _reserve_port(config.host, config.port)
    channel_dir = tempfile.mkdtemp(prefix="pymq-cores-")     # 0700: only this user reaches the channels
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    # one pipe for every worker's "listening" line, kept open for the workers restarted later
    ready_r, ready_w = os.pipe()
    workers: dict[int, int] = {}        # pid -> worker

    def spawn(k: int) -> int:
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            code = 1
            try:
                code = _child(config, k, port, channel_dir, ready_w, use_uvloop, numbered)
            finally:
                logging.shutdown()
                sys.stderr.flush()
                os._exit(code)
        workers[pid] = k
        return pid

    try:
        for k in range(config.workers):
            spawn(k)
        code = _supervise(config, port, workers, ready_r, holder, spawn)
    finally:
        _stop_all(workers)
        for fd in (ready_r, ready_w):
            os.close(fd)
        if holder is not None:
            holder.close()
        shutil.rmtree(channel_dir, ignore_errors=True)
    return code


def _reap(workers: dict[int, int]) -> tuple[int, int, int] | None:
    """A worker that ended: (pid, worker, status), or None."""
    while workers:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid in workers:
            return pid, workers.pop(pid), status
    return None


def _ready_lines(ready_r: int, buf: bytearray, wait: float) -> list[int]:
    """Workers that said they listen (a line "k" each on the ready pipe), waiting at most ``wait``."""
    readable, _, _ = select.select([ready_r], [], [], wait)
    if not readable:
        return []
    buf += os.read(ready_r, 256)
    *lines, rest = bytes(buf).split(b"\n")
    buf[:] = rest
    return [int(x) for x in lines if x.strip()]


def _supervise(config: BrokerConfig, port: int, workers: dict[int, int], ready_r: int,
               holder: socket.socket | None, spawn: Callable[[int], int]) -> int:
    ready: set[int] = set()
    deadline = time.monotonic() + START_TIMEOUT_S
    buf = bytearray()
    while len(ready) < config.workers:
        if time.monotonic() > deadline:
            print(f"pymq-server: workers {sorted(set(range(config.workers)) - ready)} did not start within "
                  f"{START_TIMEOUT_S:.0f}s", file=sys.stderr)
            return 1
        ready.update(_ready_lines(ready_r, buf, 0.1))
        ended = _reap(workers)
        if ended is not None:
            pid, k, status = ended
            # a worker that could not start said why on stderr; its exit status is the broker's
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) and os.WEXITSTATUS(status) else 1
            print(f"pymq-server: worker {k} (pid {pid}) {_describe(status)} during start-up", file=sys.stderr)
            return code
        if signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, 0) is not None:
            return 0
    if holder is not None:
        holder.close()
    announce(f"pymq-server listening on {config.host}:{port}", config.log_format)
    announce(f"pymq-server workers: {config.workers} (pids "
             + ", ".join(str(p) for p, _ in sorted(workers.items(), key=lambda x: x[1])) + ")", config.log_format)
    restarts: deque[float] = deque()
    window = config.worker_restart_window_ms / 1000
    while True:
        info = signal.sigtimedwait(SIGNALS, 0.2)
        if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
            return 0
        if info is not None and info.si_signo == signal.SIGHUP:
            for pid in workers:
                os.kill(pid, signal.SIGHUP)
        for k in _ready_lines(ready_r, buf, 0):
            pid = next((p for p, w in workers.items() if w == k), 0)
            print(f"pymq-server: worker {k} (pid {pid}) is back", file=sys.stderr, flush=True)
        ended = _reap(workers)
        if ended is None:
            continue
        pid, k, status = ended
        now = time.monotonic()
        while restarts and restarts[0] < now - window:
            restarts.popleft()
        if len(restarts) >= config.worker_restarts:
            print(f"pymq-server: worker {k} (pid {pid}) {_describe(status)}, worker death {len(restarts) + 1} "
                  f"within {window:g}s (worker_restarts: {config.worker_restarts}): stopping the other workers "
                  f"(every receipted persistent message is on disk; start the broker again)",
                  file=sys.stderr, flush=True)
            return 1
        restarts.append(now)
        new = spawn(k)
        print(f"pymq-server: worker {k} (pid {pid}) {_describe(status)}; restarting it as pid {new} (its "
              f"destinations are unavailable until it has recovered; connections that used them are "
              f"closed)", file=sys.stderr, flush=True)


def _stop_all(workers: dict[int, int]) -> None:
    for pid in workers:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while workers and time.monotonic() < deadline:
        if _reap(workers) is None:
            time.sleep(0.05)
    for pid in list(workers):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        workers.pop(pid, None)
