"""Assembling a broker: config → holding store → broker core → listeners, and shutting it down.

:class:`BrokerServer` is what ``pymq-server`` runs and what tests and the embedded ``vm://`` broker
start in-process.  Start-up order matters: storage opens and recovers before the first listener
accepts, so no client ever sees a half-recovered broker.  The server owns that order and the devices
its configuration names (:func:`build_devices`); the sockets are ``listeners.py``'s, the periodic work
``chores.py``'s, a live reload ``reloading.py``'s.
"""
from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pymq_server import reloading
from pymq_server.admin import stomp_admin
from pymq_server.admin.ops import Admin
from pymq_server.broker.broker import Broker
from pymq_server.broker.session import BrokerSession
from pymq_server.broker.stored_form import STORED_CODEC
from pymq_server.chores import Chores
from pymq_server.config import BrokerConfig
from pymq_server.listeners import Listeners
from pymq_server.net.accept import ConnectionSlots, Listener
from pymq_server.net.runtime import AsyncioRuntime
from pymq_server.storage.ha.fence import NO_FENCE, Fence
from pymq_server.storage.memory import MemoryDevice
from pymq_server.storage.store import HoldingStore

from pymq.errors import ConfigError, StorageError

if TYPE_CHECKING:
    from pymq_server.admin.http import AdminHttp
    from pymq_server.ha_role import HaRole
    from pymq_server.broker.apptx import PendingClaimer
    from pymq_server.cluster.node import ClusterNode
    from pymq_server.storage.device import HoldingDevice

log = logging.getLogger("pymq.server")

def build_devices(config: BrokerConfig, fence: Fence = NO_FENCE) -> tuple[list[HoldingDevice], str | None]:
    """The holding devices named in ``config.storage`` (default: memory + the paged file store); ``fence``:
    high availability's, given to every durable device (spec/ha.md §2)."""
    storage = config.storage
    persistent = storage.persistent_device
    specs: dict[str, tuple[str, dict[str, Any]]]
    if storage.devices is None:
        specs = {"memory": ("memory", {}), "file": ("file", {})}
        persistent = persistent or "file"
    else:
        # only the options the configuration sets: each device keeps its own defaults for the rest
        specs = {name: (dev.kind, dev.model_dump(exclude={"kind"}, exclude_unset=True))
                 for name, dev in storage.devices.items()}
    devices = [make_device(kind, name, options, config, fence) for name, (kind, options) in specs.items()]
    return devices, persistent


#: the smallest log between checkpoints a small max_memory brings about
MIN_CHECKPOINT_BYTES = 1 << 20


def make_device(kind: str, name: str, options: dict[str, Any], config: BrokerConfig,
                fence: Fence = NO_FENCE) -> HoldingDevice:
    if fence is not NO_FENCE and kind in ("file", "sql"):
        options["fence"] = fence
    if kind == "memory":
        return MemoryDevice(name, **options)
    if kind == "file":
        from pymq_server.storage.file import DEFAULT_CHECKPOINT_BYTES, FileDevice
        directory = options.pop("directory", os.path.join(config.data_dir, name))
        options.setdefault("checkpoint_in_sync", False)   # the store runs checkpoints after syncs
        # persistent pages stay in memory until a checkpoint writes them: with a small max_memory a
        # checkpoint is due after a quarter of it (paging keeps messages' bytes under max_memory; these
        # buffers and a checkpoint's copies of them would otherwise be most of the broker's memory)
        options["checkpoint_bytes"] = min(options.get("checkpoint_bytes", DEFAULT_CHECKPOINT_BYTES),
                                          max(MIN_CHECKPOINT_BYTES, config.max_memory // 4))
        # the index keeps the newest messages as objects (~300 bytes each) and the rest in 32 bytes: as many
        # objects as a sixteenth of max_memory pays for, between 1,024 and 65,536 (index.py)
        options.setdefault("index_hot", max(1024, min(65536, config.max_memory // (16 * 300))))
        return FileDevice(name, directory, **options)
    if kind == "sql":
        from pymq_server.storage.sql import SqlDevice
        options.setdefault("url", "sqlite:///" + os.path.join(config.data_dir, f"{name}.sqlite3"))
        options.setdefault("broker_id", config.node_id)
        return SqlDevice(name, **options)
    if kind == "grid":
        from pymq_server.storage.grid import GridDevice
        options.setdefault("broker_id", config.node_id)
        return GridDevice(name, **options)
    raise ConfigError(f"storage device {name!r}: unknown kind {kind!r} (memory, file, sql, grid)")


class BrokerServer:
    """One broker server run: it assembles the levels below and owns the order of its life — TLS material,
    (as a backup first under ``ha:``) storage, recovery, the core, then the listeners and the cluster; a
    clean stop in the reverse order, or a fenced process abandoning everything without a write.  Its parts
    each own one concern: the sockets (:class:`~pymq_server.listeners.Listeners`), the periodic work
    (:class:`~pymq_server.chores.Chores`), live configuration changes (``server/reloading.py``) and the
    high-availability role (``server/ha_role.py``)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker: Broker | None = None
        self.store: HoldingStore | None = None
        self.runtime: AsyncioRuntime | None = None
        self.listeners = Listeners(config)
        self.chores: Chores | None = None
        self.claimers: list[PendingClaimer] = []
        self.admin: Admin | None = None
        self.cluster: ClusterNode | None = None
        self.recovered = 0
        self.recovery_done = False     # /readyz: storage recovered
        self.stopping = False          # /readyz: a clean stop has begun
        # the process is the broker's own (the CLI, a worker): once started, what start-up made is moved out
        # of the cyclic collector (settle_collector); an embedded broker leaves its host's collector alone
        self.owns_process = False
        # a worker of the multi-worker broker (server/cores/worker.py) sets these three: its sessions,
        # the STOMP port shared with the other workers, and the channels built between core and listeners
        self.session_type: Callable[..., BrokerSession] = BrokerSession
        self.reuse_port = False
        self.before_listeners: Callable[[], Awaitable[None]] | None = None
        self.cores: Any = None         # worker 0's admin over all workers (server/cores/admin.py)
        # high availability (spec/ha.md): this run's role in the group, the fence its devices ask, and the
        # command line's hook told when it starts waiting as a backup
        self.ha: HaRole | None = None
        self.fence: Fence = NO_FENCE
        self.on_backup: Callable[[BrokerServer], None] | None = None
        self.abandoned = False
        self.abandon_done = asyncio.Event()

    # what the listeners hold, read by the admin operations, the command line and tests
    @property
    def port(self) -> int | None:
        return self.listeners.port

    @property
    def tls_port(self) -> int | None:
        return self.listeners.tls_port

    @property
    def websocket_port(self) -> int | None:
        return self.listeners.websocket_port

    @property
    def admin_port(self) -> int | None:
        return self.listeners.admin_port

    @property
    def http(self) -> AdminHttp | None:
        return self.listeners.http

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.listeners.ssl_context

    @property
    def connections(self) -> ConnectionSlots:
        return self.listeners.connections

    @property
    def admin_connections(self) -> ConnectionSlots:
        return self.listeners.admin_connections

    def admin_listener(self, host: str, port: int, make_inner: Callable[[], asyncio.BaseProtocol],
                       ssl_context: ssl.SSLContext | None, refusal: Callable[[], bytes]) -> Listener:
        """The admin port's listening socket (server/admin/http.py asks; :meth:`Listeners.admin_listener`)."""
        return self.listeners.admin_listener(host, port, make_inner, ssl_context, refusal)

    def core(self) -> tuple[Broker, HoldingStore, AsyncioRuntime]:
        """What :meth:`start_core` built; asking before it ran is a bug of the caller."""
        if self.broker is None or self.store is None or self.runtime is None:
            raise RuntimeError("BrokerServer.start_core() has not run")
        return self.broker, self.store, self.runtime

    async def start(self) -> BrokerServer:
        """TLS material, storage, recovery, broker core, then the listeners.

        Each step fails with its own cause: a certificate that does not load is a ConfigError naming the
        ``tls.*`` setting (before storage opens), a data directory that cannot be used is a StorageError
        naming it, a port that cannot be bound is a ListenError naming the listener (STOMP, STOMP over
        TLS, WebSocket, admin).  After a failure everything already started is stopped again."""
        cfg = self.config
        if cfg.tls is not None:
            from pymq_server.net.tls import server_context
            self.listeners.ssl_context = server_context(cfg.tls)
        if cfg.ha is not None and not await self._wait_as_backup():
            return self
        await self.start_core()
        try:
            if self.before_listeners is not None:
                await self.before_listeners()
            await self._start_listeners()
        except BaseException:
            await self.stop()
            raise
        if self.ha is not None:
            self.ha.activated()
        return self

    async def _wait_as_backup(self) -> bool:
        """spec/ha.md §1.8: a backup runs its admin port (if any), no STOMP listener, until it takes the
        store (True) or is stopped (False)."""
        from pymq_server.ha_role import HaRole
        role = self.ha = HaRole(self)
        try:
            if self.config.admin_port is not None:
                await self.listeners.start_admin_http(self)
            on_backup = self.on_backup
            # announced once the lease was read: what the admin shows from then on names the holder (epoch)
            if not await role.wait_until_live(None if on_backup is None else lambda: on_backup(self)):
                return False
        except BaseException:
            await self.stop()
            raise
        self.fence = role.medium
        return True

    @property
    def live(self) -> bool:
        """Serving clients: no high availability, or this process holds the store."""
        return self.broker is not None and not self.abandoned

    async def _start_listeners(self) -> None:
        cfg = self.config
        broker, _, _ = self.core()
        listeners = self.listeners
        # bound first, accepting last: no client connects before every listener is in place
        await listeners.bind(broker, self.session_type, self.reuse_port)
        if self.admin is not None:
            self.admin.start()
        if cfg.admin_port is not None and listeners.http is None:      # a backup started it already
            await listeners.start_admin_http(self)
        await listeners.start_serving()
        if cfg.cluster:
            from pymq_server.cluster.node import ClusterNode
            ccfg = cfg.cluster
            broker.authenticator.cluster_secret = ccfg.secret
            # with backups, the node is this process's HA epoch: peers refuse a fenced one (spec/ha.md §5)
            epoch = self.ha.medium.epoch if self.ha is not None else 0
            cluster = self.cluster = ClusterNode(broker, ccfg, asyncio.get_running_loop(), cfg.node_id,
                                                 f"{cfg.host}:{self.port}", epoch=epoch)
            broker.attach_cluster(cluster)      # after recovery: the node learns what it made
            await cluster.start()

    # -- live changes (SIGHUP, the admin "reload" operation): server/reloading.py ---------------------
    def reload_logged(self) -> None:
        """:func:`~pymq_server.reloading.reload_logged`: a SIGHUP's reload, its outcome logged."""
        reloading.reload_logged(self)

    def reload(self) -> dict:
        """:func:`~pymq_server.reloading.reload`: what can change while the broker runs, applied."""
        return reloading.reload(self)

    async def start_core(self) -> BrokerServer:
        """Storage, recovery and the broker core, without a listener (the embedded vm:// broker)."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        try:
            os.makedirs(cfg.data_dir, exist_ok=True)
            probe = os.path.join(cfg.data_dir, ".pymq-write-test")
            with open(probe, "wb"):  # noqa: ASYNC230 - once, at start-up, before any client is served
                pass
            os.unlink(probe)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise StorageError(f"cannot use data directory {cfg.data_dir!r} (data_dir): "
                                   f"{exc.strerror or exc}", path=cfg.data_dir) from None
            # a full disk is no reason not to start: the devices recover what they hold read-only
            log.warning("the data directory %s is on a full disk (%s): starting anyway; devices that "
                        "cannot write serve what they hold and refuse new messages until space returns",
                        cfg.data_dir, exc.strerror)
        runtime = self.runtime = AsyncioRuntime(loop)
        devices, persistent = build_devices(cfg, self.fence)
        store = self.store = HoldingStore(devices, persistent_device=persistent, sync_policy=cfg.sync_policy,
                                          sync_window_ms=cfg.sync_window_ms, call_later=runtime.call_later,
                                          run_in_thread=runtime.run_in_thread, codec=STORED_CODEC)
        if cfg.cluster:
            # Write-behind (spec/storage.md §9) is for a standalone broker for now: with it on, the cluster
            # test that moves an idle durable subscription with its messages missed the first message in 2
            # of 13 runs on a loaded machine (0 of 9 without); until that is understood, nodes write at once.
            store.write_behind = False
        try:
            store.open()
        except OSError as exc:
            raise StorageError(f"cannot open storage under {cfg.data_dir}: {exc}") from exc
        broker = self.broker = Broker(cfg, store, runtime)
        if self.ha is not None:
            broker.serving = self.ha.arbiter         # spec/ha.md §2.1: bytes leave only under a fresh lease
            arbiter = self.ha.arbiter
            broker.destinations.queue_logs.gate = lambda: arbiter.may_send() is True
        store.on_device_opened = broker.recover_device
        self.admin = broker.admin = Admin(self)
        broker.admin_frames = stomp_admin.handle
        chores = self.chores = Chores(broker, store, runtime)
        if cfg.storage.selection is not None:
            chores.use_selection(cfg.storage.selection)
        self.recovered = broker.recover()
        self.recovery_done = True
        if self.recovered:
            log.info("recovered %d persistent messages", self.recovered)
        if self.recovered or self.owns_process:
            # recovered messages and start-up's objects live long: out of every cyclic GC pass from now on
            settle_collector()
        self._start_claimers(loop)
        chores.start()
        return self

    def _start_claimers(self, loop: asyncio.AbstractEventLoop) -> None:
        """Messages applications commit in their own transactions on a SQL device (seed 001)."""
        from pymq_server.broker.apptx import PendingClaimer
        broker, store, _ = self.core()
        for device in store.devices.values():
            if device.kind == "sql" and hasattr(device, "pending_listener"):
                claimer = PendingClaimer(broker.router, broker.seqs, device, loop)
                claimer.start()
                self.claimers.append(claimer)
                if broker.apptx_table_prefix is None:      # the first one: what CONNECTED tells the SDKs
                    broker.apptx_table_prefix = getattr(device, "table_prefix", None)

    async def abandon(self, reason: str) -> None:
        """Fenced (spec/ha.md §2.4): another process holds the store now.  Nothing more is written or sent:
        every client connection is aborted (no ERROR, no last RECEIPT), listeners close, timers stop, and
        storage is dropped without a flush, a checkpoint or a close record; then the OS lock goes."""
        if self.abandoned:
            return
        self.abandoned = self.stopping = True
        log.error("fenced: %s; abandoning every connection and the store without writing", reason)
        if self.broker is not None:
            # the per-queue logs live in the shared data directory too: the connections aborted below would
            # append their consumers' detaching to the new live's files
            queue_logs = self.broker.destinations.queue_logs
            queue_logs.close()
            queue_logs.directory = None
        if self.chores is not None:
            self.chores.cancel()
        if self.cluster is not None:
            self.cluster.abandon()          # no beat, no link, no hand-over: the node is another's now
        self.listeners.close()
        if self.broker is not None:
            for session in list(self.broker.sessions.values()):
                link = getattr(session, "link", None)      # a BrokerSession (a cluster peer's too)
                if link is not None:
                    getattr(link, "abort", link.close)()
        for claimer in self.claimers:
            claimer.stop()
        if self.admin is not None:
            self.admin.stop()
        if self.store is not None:
            self.store.abandon()
        if self.http is not None:
            await self.http.stop()
        if self.runtime is not None:
            self.runtime.shutdown()
        if self.ha is not None:
            await asyncio.to_thread(self.ha.arbiter.abandon)
        log.error("fenced: everything abandoned")
        self.abandon_done.set()

    def stop_waiting(self) -> None:
        """A stop while waiting as a backup: the wait ends (``start`` returns without listening)."""
        if self.ha is not None:
            self.ha.stop_waiting()

    async def stop(self) -> None:
        if self.abandoned:
            return
        self.stopping = True
        if self.ha is not None:
            self.ha.stop_waiting()
        if self.admin is not None:
            self.admin.stop()
        if self.cluster is not None:
            await self.cluster.stop()          # hand-over needs the links and the loop still running
        if self.chores is not None:
            self.chores.cancel()
        self.listeners.close()
        if self.http is not None:
            await self.http.stop()
        for claimer in self.claimers:
            claimer.stop()
        if self.broker is not None:
            for session in list(self.broker.sessions.values()):
                session.close()
        await self.listeners.wait_closed()
        await asyncio.sleep(0)   # let transports flush their last frames
        if self.broker is not None:
            self.broker.destinations.queue_logs.close()
        if self.store is not None:
            # A device in fault cannot save what changed since the fault; that is said, and the stop
            # goes on: everything acknowledged is durable already (spec/storage.md §8).
            for problem in self.store.flush_all():
                log.error("storage at shutdown: %s", problem)
            try:
                self.store.close()
            except StorageError as exc:
                log.error("storage at shutdown: %s", exc.message)
        if self.runtime is not None:
            self.runtime.shutdown()
        if self.ha is not None:
            await self.ha.stop()          # after storage closed: the OS lock goes last (spec/ha.md §1.9)
        log.info("pymq-server stopped")


#: the cyclic collector's thresholds in a broker process (Python's defaults: 700, 10, 10).  A broker makes
#: and drops a few objects per message (the message, its entry, header lists) and almost never a cycle, so
#: at the default a generation-0 pass runs every few hundred messages and walks every young message still
#: held; under a queue's live consumer that was about 15 % of the broker's CPU (bench_spark's queue write:
#: 14.1-16.4 CPU-s for 1M deliveries at the defaults, 11.6-13.6 at these).  Garbage in a cycle still goes,
#: only later; the process owner's choice, so the CLI and the cores' workers set it, an embedded broker not
COLLECTOR_THRESHOLDS = (50_000, 20, 100)


def tune_collector() -> None:
    """A broker process's cyclic GC thresholds (:data:`COLLECTOR_THRESHOLDS`)."""
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def settle_collector() -> int:
    """Once a broker has started: everything alive is moved out of the cyclic collector for good (gc.freeze).
    Start-up leaves ~60k tracked objects (modules, configuration, the broker's tables) that never become
    garbage; a full collection walked them all and held the loop for 20-70 ms (measured on a started broker,
    bench/README.md "Issue 30: latency at a steady rate"), after freezing for well under a millisecond.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("collector: %d objects alive after start-up frozen (gc.freeze)", frozen)
    return frozen


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
