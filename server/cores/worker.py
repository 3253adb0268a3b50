"""One worker process of the multi-worker broker: today's broker plus its channels (spec/cores.md §2).

The worker is the ordinary :class:`BrokerServer` (storage, recovery, the broker core, listeners) with
three differences set before it starts: its STOMP listener binds with ``SO_REUSEPORT`` (the kernel
spreads new connections over the workers), its sessions are :class:`HomeSession` (forwarding what
another worker owns), and between recovery and the first accepted connection it builds the channels
to every other worker — so no client is served before every owner can be reached.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal

from pymq_server.app import BrokerServer
from pymq_server.config import BrokerConfig
from pymq_server.cores.home import HomeSession
from pymq_server.cores.mesh import Mesh
from pymq_server.cores.ownership import worker_node_id
from pymq_server.logs import announce

log = logging.getLogger("pymq.cores")


def worker_config(config: BrokerConfig, k: int, port: int) -> BrokerConfig:
    """Worker k's settings: its own data directory and node id (its message ids name it), the shared
    port; the admin port is worker 0's (it answers for all workers: spec/cores.md §3.7)."""
    return config.model_copy(update={
        "data_dir": os.path.join(config.data_dir, f"worker-{k}"),
        "node_id": worker_node_id(config.node_id, k),
        "port": port,
        "admin_port": config.admin_port if k == 0 else None,
    })


class Worker:
    """Worker ``k`` of ``workers``: a BrokerServer and its mesh, run until SIGTERM or a lost channel."""

    def __init__(self, config: BrokerConfig, base_node_id: str, k: int, workers: int, channel_dir: str,
                 numbered: bool = True) -> None:
        self.config = config
        self.numbered = numbered        # the data directory's placement (supervisor.prepare_data_dir)
        self.k = k
        self.workers = workers
        self.channel_dir = channel_dir
        self.base_node_id = base_node_id
        self.server = BrokerServer(config)
        self.server.owns_process = True      # a worker process is the broker's own, as the CLI's
        self.mesh: Mesh | None = None
        self.failure: str | None = None

    async def run(self, ready_fd: int) -> int:
        loop = asyncio.get_running_loop()
        mesh = self.mesh = Mesh(self.k, self.workers, self.channel_dir, self.base_node_id, loop,
                                self.config.max_frame_size, self.config.queue_defaults.dead_letter_prefix,
                                handover=self.config.worker_handover, numbered=self.numbered)
        server = self.server
        server.session_type = functools.partial(HomeSession, mesh)
        server.reuse_port = True
        if mesh.handover is not None:
            # a handed-over connection joins this worker's STOMP listener, as if it had accepted it
            mesh.handover.session_type = server.session_type
            mesh.handover.listener = lambda: server.listeners.stomp

        async def channels() -> None:
            assert server.broker is not None
            await mesh.start(server.broker)
            from pymq_server.cores.admin import install
            install(server, mesh)

        server.before_listeners = channels
        stop = asyncio.Event()

        def lost(why: str) -> None:
            if not stop.is_set():
                self.failure = why
                log.error("worker %d: %s: stopping", self.k, why)
                stop.set()

        def clean_stop() -> None:
            mesh._stopping = True
            stop.set()

        mesh.on_lost = lost
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, clean_stop)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        started = False
        try:
            await server.start()
            started = True
            if server.admin_port is not None:
                # the admin port is this worker's own (worker 0's): bound to port 0 only it knows the
                # number, so it says it (before its ready line: before the supervisor's "workers:" line)
                scheme = "https" if self.config.admin_tls else "http"
                announce(f"pymq-server admin listening on {scheme}://{self.config.host}:{server.admin_port}/",
                         self.config.log_format)
            os.write(ready_fd, f"{self.k}\n".encode())
            os.close(ready_fd)
            await stop.wait()
        finally:
            mesh.stop()
            if started:
                await server.stop()
        return 1 if self.failure else 0

    def _reload(self) -> None:
        self.server.reload_logged()
