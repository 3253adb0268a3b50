"""Assembling a broker: config → holding store → broker core → listeners, and shutting it down.

:class:`BrokerServer` is what ``pymq-server`` runs and what tests and the embedded ``vm://`` broker
start in-process.  Start-up order matters: storage opens and recovers before the first listener
accepts, so no client ever sees a half-recovered broker.
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

from pymq_server.admin import stomp_admin
from pymq_server.admin.ops import Admin
from pymq_server.broker.broker import Broker
from pymq_server.broker.session import BrokerSession
from pymq_server.broker.stored_form import STORED_CODEC
from pymq_server.config import BrokerConfig
from pymq_server.logs import announce
from pymq_server.net.accept import ConnectionSlots, Listener, fit_descriptors
from pymq_server.net.runtime import AsyncioRuntime
from pymq_server.net.tcp import StompServerProtocol, refusal_frame
from pymq_server.storage.ha.fence import NO_FENCE, Fence
from pymq_server.storage.memory import MemoryDevice
from pymq_server.storage.store import HoldingStore

from pymq.errors import ConfigError, ListenError, PymqError, StorageError

if TYPE_CHECKING:
    from pymq_server.admin.http import AdminHttp
    from pymq_server.ha_role import HaRole
    from pymq_server.broker.apptx import PendingClaimer
    from pymq_server.cluster.node import ClusterNode
    from pymq_server.storage.device import HoldingDevice

log = logging.getLogger("pymq.server")

HOUSEKEEPING_PERIOD_S = 1.0
#: how often the store is asked to bring back devices out of service (each has its own back-off)
STORAGE_MAINTENANCE_PERIOD_S = 0.25


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
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker: Broker | None = None
        self.store: HoldingStore | None = None
        self.runtime: AsyncioRuntime | None = None
        self._server: Listener | None = None
        self._tls_server: Listener | None = None
        self._housekeeping: asyncio.TimerHandle | None = None
        self._maintenance: asyncio.TimerHandle | None = None
        self._selection_timer: asyncio.TimerHandle | None = None
        self.claimers: list[PendingClaimer] = []
        self.admin: Admin | None = None
        self.http: AdminHttp | None = None
        self.websocket: Listener | None = None
        self.cluster: ClusterNode | None = None
        self.ssl_context: ssl.SSLContext | None = None
        self.admin_port: int | None = None
        self.port: int | None = None
        self.tls_port: int | None = None
        self.websocket_port: int | None = None
        self.recovered = 0
        self.recovery_done = False     # /readyz: storage recovered
        self.stopping = False          # /readyz: a clean stop has begun
        # a worker of the multi-worker broker (server/cores/worker.py) sets these three: its sessions,
        # the STOMP port shared with the other workers, and the channels built between core and listeners
        self.session_type: Callable[..., BrokerSession] = BrokerSession
        self.reuse_port = False
        self.before_listeners: Callable[[], Awaitable[None]] | None = None
        self.cores: Any = None         # worker 0's admin over all workers (server/cores/admin.py)
        # sockets open at once, counted from accept (server/net/accept.py): the STOMP, TLS and WebSocket
        # listeners share max_connections, the admin port has its own
        self.connections = ConnectionSlots(config.max_connections, "max_connections")
        self.admin_connections = ConnectionSlots(config.admin_max_connections, "admin_max_connections")
        # high availability (spec/ha.md): this run's role in the group, the fence its devices ask, and the
        # command line's hook told when it starts waiting as a backup
        self.ha: HaRole | None = None
        self.fence: Fence = NO_FENCE
        self.on_backup: Callable[[BrokerServer], None] | None = None
        self.abandoned = False
        self.abandon_done = asyncio.Event()

    def _core(self) -> tuple[Broker, HoldingStore, AsyncioRuntime]:
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
            self.ssl_context = server_context(cfg.tls)
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
                await self._start_admin_http()
            if self.on_backup is not None:
                self.on_backup(self)
            if not await role.wait_until_live():
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

    async def _start_admin_http(self) -> None:
        from pymq_server.admin.http import AdminHttp
        cfg = self.config
        self.http = AdminHttp(self, cfg.host, cfg.admin_port or 0,
                              ssl_context=self.ssl_context if cfg.admin_tls else None)
        self.admin_port = await _listen("admin HTTP port (admin_port)", cfg.host, cfg.admin_port or 0,
                                        self.http.start())

    async def _start_listeners(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        broker, _, _ = self._core()

        session_type = self.session_type
        self._fit_connection_caps()
        slots = self.connections
        handshake = cfg.connect_timeout_ms / 1000

        def stomp() -> StompServerProtocol:
            return StompServerProtocol(broker, loop, session_type)

        def stomp_refusal() -> bytes:
            return refusal_frame(slots.limit)

        # bound first, accepting last: no client connects before every listener is in place; every socket
        # counted from accept, TLS handshakes under connect_timeout_ms (server/net/accept.py)
        self._server = await _listen("STOMP port (port)", cfg.host, cfg.port, _bind(
            loop, cfg.host, cfg.port, slots, stomp, reuse_port=self.reuse_port, refusal=stomp_refusal))
        self.port = self._server.sockets[0].getsockname()[1]
        if cfg.tls_port is not None:
            self._tls_server = await _listen("STOMP over TLS port (tls_port)", cfg.host, cfg.tls_port, _bind(
                loop, cfg.host, cfg.tls_port, slots, stomp, reuse_port=self.reuse_port,
                ssl_context=self.ssl_context, handshake_timeout=handshake))
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
        if cfg.websocket is not None:
            from pymq_server.net.websocket import WebSocketConnection, origins, refusal_response
            ws = cfg.websocket
            allowed = origins(ws.allowed_origins)

            def websocket() -> WebSocketConnection:
                return WebSocketConnection(broker, loop, ws.path, allowed)

            self.websocket = await _listen("WebSocket port (websocket.port)", cfg.host, ws.port, _bind(
                loop, cfg.host, ws.port, slots, websocket, ssl_context=self.ssl_context if ws.tls else None,
                handshake_timeout=handshake, refusal=refusal_response))
            self.websocket_port = self.websocket.sockets[0].getsockname()[1]
        if self.admin is not None:
            self.admin.start()
        if cfg.admin_port is not None and self.http is None:      # a backup started it already
            await self._start_admin_http()
        for server in (self._server, self._tls_server, self.websocket):
            if server is not None:
                await server.start_serving()
        log.info("pymq-server listening on %s:%d (data in %s)", cfg.host, self.port, cfg.data_dir)
        if self.tls_port is not None:
            log.info("STOMP over TLS on %s:%d", cfg.host, self.tls_port)
        if self.websocket is not None and cfg.websocket is not None:
            scheme = "wss" if cfg.websocket.tls else "ws"
            log.info("STOMP over WebSocket on %s://%s:%d%s", scheme, cfg.host, self.websocket_port,
                     cfg.websocket.path)
        if self.http is not None:
            scheme = "https" if cfg.admin_tls else "http"
            log.info("admin and metrics on %s://%s:%d/", scheme, cfg.host, self.admin_port)
        if cfg.cluster:
            from pymq_server.cluster.node import ClusterNode
            ccfg = cfg.cluster
            broker.authenticator.cluster_secret = ccfg.secret
            cluster = self.cluster = ClusterNode(broker, ccfg, loop, cfg.node_id, f"{cfg.host}:{self.port}")
            broker.attach_cluster(cluster)      # after recovery: the node learns what it made
            await cluster.start()

    def admin_listener(self, host: str, port: int, make_inner: Callable[[], asyncio.BaseProtocol],
                       ssl_context: ssl.SSLContext | None, refusal: Callable[[], bytes]) -> Listener:
        """The admin port's listening socket (server/admin/http.py asks): counted from accept against
        ``admin_max_connections``, HTTPS handshakes under ``connect_timeout_ms``."""
        return Listener.bind(asyncio.get_running_loop(), host, port, self.admin_connections, make_inner,
                             ssl_context=ssl_context, handshake_timeout=self.config.connect_timeout_ms / 1000,
                             refusal=refusal)

    def _fit_connection_caps(self) -> None:
        """Keep the connection caps within the file-descriptor limit: a broker out of descriptors stops
        accepting on every listener (asyncio pauses them all), so past the limit a connection is refused
        by its cap instead.  The soft limit is raised towards the hard one first when the caps need it."""
        cfg = self.config
        admin = cfg.admin_max_connections if cfg.admin_port is not None else 0
        wanted = cfg.max_connections + admin
        room = fit_descriptors(wanted)
        if room >= wanted:
            return
        admin = min(admin, max(8, room // 8)) if admin else 0
        stomp = max(1, room - admin)
        self.connections.limit = stomp
        self.admin_connections.limit = admin
        log.warning("the file-descriptor limit (ulimit -n) leaves room for %d connections, fewer than "
                    "max_connections %d + admin_max_connections %d: accepting %d STOMP/TLS/WebSocket and %d "
                    "admin connections at once; raise the limit for more", room, cfg.max_connections,
                    cfg.admin_max_connections if cfg.admin_port is not None else 0, stomp, admin)

    # -- live changes (SIGHUP, the admin "reload" operation) ---------------------------------------
    def reload_logged(self) -> None:
        """:meth:`reload` for a SIGHUP (the CLI's, a worker's): the outcome logged, a refusal or a bug
        keeping the running configuration, never taking the broker down."""
        try:
            result = self.reload()
        except PymqError as exc:
            log.error("reload refused, the running configuration is kept: %s", exc.message)
        except Exception:  # a bug in reload must not take the broker down with it
            log.exception("reload failed, the running configuration is kept")
        else:
            announce(f"pymq-server reloaded: {len(result['users'])} user(s)"
                     + (f", needing a restart: {', '.join(result['restart_needed'])}" if result["restart_needed"]
                        else ""), self.config.log_format)

    def reload(self) -> dict:
        """Read the configuration file and the users file again and apply what can change while the
        broker runs: users (and ``allow_anonymous``), ``default_permissions``, the storage-selection
        rules, the TLS certificate and key, ``log_level``.  Open connections are kept (they keep the user
        they logged in as).  Everything is read and checked before anything changes: an invalid file
        raises ConfigError and the broker keeps what it had.  Settings that differ but need a restart
        are listed under ``restart_needed``.  Runs on the broker's event loop."""
        from pymq_server.broker.acl import AccessControl
        from pymq_server.broker.auth import load_users
        broker, store, _ = self._core()
        old = self.config
        new = old.reread()
        users = load_users(new.users_file) if new.users_file else None
        defaults = AccessControl(new.default_permissions).defaults
        layer = None
        if new.storage.selection is not None:
            from pymq_server.config import read_selection
            from pymq_server.storage.selection import AdaptiveSelection
            layer = AdaptiveSelection.from_yaml(read_selection(new.storage.selection),
                                                list(store.devices.values()))
        fresh_tls = None
        ssl_context = self.ssl_context
        if new.tls is not None and ssl_context is not None:
            from pymq_server.net.tls import load_certificates, server_context
            fresh_tls = new.tls
            server_context(new.tls)                     # loads and checks every file; nothing live yet
        # -- everything read and valid: apply --------------------------------------------------------
        broker.authenticator.replace(new.users_file, users, new.allow_anonymous)
        broker.acl.defaults = defaults
        if layer is not None:
            from pymq_server.broker.stored_form import rule_context_of
            had = store.selection is not None
            store.use_selection(layer, rule_context_of)
            if not had:
                self._refresh_selection()
        if fresh_tls is not None and ssl_context is not None:
            load_certificates(ssl_context, fresh_tls)
        logging.getLogger().setLevel(new.log_level)
        applied = {"users_file", "allow_anonymous", "default_permissions", "log_level"}
        for key in applied:
            setattr(old, key, getattr(new, key))
        if layer is not None:
            old.storage = old.storage.model_copy(update={"selection": new.storage.selection})
        restart = sorted(k for k in type(new).model_fields
                         if k not in applied and k not in ("storage", "tls")
                         and getattr(new, k) != getattr(old, k))
        if new.storage.model_copy(update={"selection": None}) != old.storage.model_copy(
                update={"selection": None}) or (layer is None and old.storage.selection is not None):
            restart.append("storage")
        if (new.tls is None) != (old.tls is None) or (
                new.tls is not None and old.tls is not None
                and new.tls.model_copy(update={"cert_file": "", "key_file": "", "key_password": None})
                != old.tls.model_copy(update={"cert_file": "", "key_file": "", "key_password": None})):
            restart.append("tls")
        if fresh_tls is not None:
            old.tls = new.tls
        result = {"users": sorted(broker.authenticator.users),
                  "default_permissions": broker.acl.defaults.to_dict()["grants"],
                  "storage_rules": len(layer.rules) if layer is not None else None,
                  "tls_reloaded": fresh_tls is not None,
                  "restart_needed": restart}
        log.info("configuration reloaded from %s: %d user(s), %s storage rule(s)%s",
                 old.source or "the command line", len(result["users"]),
                 result["storage_rules"] if layer is not None else "no",
                 f"; changed but needing a restart: {', '.join(restart)}" if restart else "")
        return result

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
        selection = cfg.storage.selection
        if selection is not None:
            self._setup_selection(selection)
        self.recovered = broker.recover()
        self.recovery_done = True
        if self.recovered:
            log.info("recovered %d persistent messages", self.recovered)
            # recovered messages live long: keep them out of every cyclic GC pass from now on
            gc.collect()
            gc.freeze()
        self._start_claimers(loop)
        self._schedule_housekeeping()
        self._schedule_maintenance()
        return self

    def _start_claimers(self, loop: asyncio.AbstractEventLoop) -> None:
        """Messages applications commit in their own transactions on a SQL device (seed 001)."""
        from pymq_server.broker.apptx import PendingClaimer
        broker, store, _ = self._core()
        for device in store.devices.values():
            if device.kind == "sql" and hasattr(device, "pending_listener"):
                claimer = PendingClaimer(broker.router, broker.seqs, device, loop)
                claimer.start()
                self.claimers.append(claimer)
                if broker.apptx_table_prefix is None:      # the first one: what CONNECTED tells the SDKs
                    broker.apptx_table_prefix = getattr(device, "table_prefix", None)

    def _setup_selection(self, selection: Any) -> None:
        """The adaptive layer of seed 000: rules from YAML (inline mapping or a file path)."""
        from pymq_server.broker.stored_form import rule_context_of
        from pymq_server.config import read_selection
        from pymq_server.storage.selection import AdaptiveSelection
        _, store, _ = self._core()
        layer = AdaptiveSelection.from_yaml(read_selection(selection), list(store.devices.values()))
        store.use_selection(layer, rule_context_of)
        self._refresh_selection()

    def _refresh_selection(self) -> None:
        _, store, runtime = self._core()
        layer = store.selection
        if layer is None:
            return
        now = runtime.time()
        try:
            layer.refresh(now)
        except Exception:  # a monitor bug must not stop the broker; the next refresh retries
            log.exception("storage monitor refresh failed")
        delay = max(0.01, layer.next_refresh() - runtime.time())
        self._selection_timer = asyncio.get_running_loop().call_later(delay, self._refresh_selection)

    def _schedule_housekeeping(self) -> None:
        loop = asyncio.get_running_loop()
        self._housekeeping = loop.call_later(HOUSEKEEPING_PERIOD_S, self._run_housekeeping)

    def _run_housekeeping(self) -> None:
        try:
            self._core()[0].housekeeping()
        finally:
            self._schedule_housekeeping()

    def _schedule_maintenance(self) -> None:
        loop = asyncio.get_running_loop()
        self._maintenance = loop.call_later(STORAGE_MAINTENANCE_PERIOD_S, self._run_maintenance)

    def _run_maintenance(self) -> None:
        """Devices in fault are repaired, devices that did not open at start-up opened (spec/storage.md
        §8), each with its own back-off; the work runs in worker threads."""
        _, store, runtime = self._core()
        try:
            store.maintain(runtime.time())
        except Exception:  # a bug here must not stop the broker; the next round retries
            log.exception("storage maintenance failed")
        finally:
            self._schedule_maintenance()

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
        for timer in (self._housekeeping, self._maintenance, self._selection_timer):
            if timer is not None:
                timer.cancel()
        for server in (self._server, self._tls_server, self.websocket):
            if server is not None:
                server.close()
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
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self._maintenance is not None:
            self._maintenance.cancel()
        if self._selection_timer is not None:
            self._selection_timer.cancel()
        for server in (self._server, self._tls_server, self.websocket):
            if server is not None:
                server.close()
        if self.http is not None:
            await self.http.stop()
        for claimer in self.claimers:
            claimer.stop()
        if self.broker is not None:
            for session in list(self.broker.sessions.values()):
                session.close()
        for server in (self._server, self._tls_server, self.websocket):
            if server is not None:
                await server.wait_closed()
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


async def _bind(loop: asyncio.AbstractEventLoop, host: str, port: int, slots: ConnectionSlots,
                make_inner: Callable[[], asyncio.BaseProtocol], **options: Any) -> Listener:
    return Listener.bind(loop, host, port, slots, make_inner, **options)


async def _listen(what: str, host: str, port: int, starting):
    """Await ``starting`` (a server start); a bind failure becomes a ListenError naming the listener."""
    try:
        return await starting
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port} for the {what}: {exc.strerror or exc}",
                          listener=what, host=host, port=port) from None


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


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
