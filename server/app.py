"""Assembling a broker: config → holding store → broker core → listeners, and shutting it down.

:class:`BrokerServer` is what ``pymq-server`` runs and what tests and the embedded ``vm://`` broker
start in-process.  Start-up order matters: storage opens and recovers before the first listener
accepts, so no client ever sees a half-recovered broker.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os

from pymq.errors import ConfigError, StorageError
from pymq_server.admin.ops import Admin
from pymq_server.broker.broker import Broker
from pymq_server.config import BrokerConfig
from pymq_server.net.runtime import AsyncioRuntime
from pymq_server.net.tcp import StompServerProtocol
from pymq_server.storage.memory import MemoryDevice
from pymq_server.storage.store import HoldingStore

log = logging.getLogger("pymq.server")

HOUSEKEEPING_PERIOD_S = 1.0


def build_devices(config: BrokerConfig) -> tuple[list, str | None]:
    """The holding devices named in ``config.storage`` (default: memory + the paged file store)."""
    spec = config.storage.get("devices")
    persistent = config.storage.get("persistent_device")
    if spec is None:
        spec = {"memory": {"kind": "memory"}, "file": {"kind": "file"}}
        persistent = persistent or "file"
    devices = []
    for name, options in spec.items():
        options = dict(options or {})
        kind = options.pop("kind", name)
        devices.append(make_device(kind, name, options, config))
    names = {d.name for d in devices}
    if persistent is not None and persistent not in names:
        raise ConfigError(f"storage.persistent_device {persistent!r} is not one of the devices "
                          f"{sorted(names)}")
    return devices, persistent


def make_device(kind: str, name: str, options: dict, config: BrokerConfig):
    if kind == "memory":
        return MemoryDevice(name, **options)
    if kind == "file":
        from pymq_server.storage.file import FileDevice
        directory = options.pop("directory", os.path.join(config.data_dir, name))
        options.setdefault("checkpoint_in_sync", False)   # the store runs checkpoints after syncs
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
        self._server: asyncio.base_events.Server | None = None
        self._housekeeping: asyncio.TimerHandle | None = None
        self._selection_timer: asyncio.TimerHandle | None = None
        self.claimers: list = []
        self.admin = None
        self.http = None
        self.cluster = None
        self.admin_port: int | None = None
        self.port: int | None = None
        self.recovered = 0
        self.recovery_done = False     # /readyz: storage recovered
        self.stopping = False          # /readyz: a clean stop has begun

    async def start(self) -> "BrokerServer":
        """Storage, recovery, broker core, then the STOMP listener."""
        await self.start_core()
        loop = asyncio.get_running_loop()
        cfg = self.config
        self._server = await loop.create_server(lambda: StompServerProtocol(self.broker, loop),
                                                cfg.host, cfg.port, reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("pymq-server listening on %s:%d (data in %s)", cfg.host, self.port, cfg.data_dir)
        if cfg.cluster:
            from pymq_server.cluster.node import ClusterConfig, ClusterNode
            ccfg = ClusterConfig.from_dict(cfg.cluster)
            self.broker.authenticator.cluster_secret = ccfg.secret
            self.cluster = ClusterNode(self.broker, ccfg, loop, cfg.node_id, f"{cfg.host}:{self.port}")
            self.broker.cluster = self.cluster
            await self.cluster.start()
        self.admin.start()
        if cfg.admin_port is not None:
            from pymq_server.admin.http import AdminHttp
            self.http = AdminHttp(self, cfg.host, cfg.admin_port)
            self.admin_port = await self.http.start()
            log.info("admin and metrics on http://%s:%d/", cfg.host, self.admin_port)
        return self

    async def start_core(self) -> "BrokerServer":
        """Storage, recovery and the broker core, without a listener (the embedded vm:// broker)."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        os.makedirs(cfg.data_dir, exist_ok=True)
        self.runtime = AsyncioRuntime(loop)
        devices, persistent = build_devices(cfg)
        self.store = HoldingStore(devices, persistent_device=persistent, sync_policy=cfg.sync_policy,
                                  sync_window_ms=cfg.sync_window_ms, call_later=self.runtime.call_later,
                                  run_in_thread=self.runtime.run_in_thread)
        try:
            self.store.open()
        except OSError as exc:
            raise StorageError(f"cannot open storage under {cfg.data_dir}: {exc}") from exc
        self.broker = Broker(cfg, self.store, self.runtime)
        self.admin = Admin(self)
        self.broker.admin = self.admin
        selection = cfg.storage.get("selection")
        if selection is not None:
            self._setup_selection(selection)
        self.recovered = self.broker.recover()
        self.recovery_done = True
        if self.recovered:
            log.info("recovered %d persistent messages", self.recovered)
            # recovered messages live long: keep them out of every cyclic GC pass from now on
            gc.collect()
            gc.freeze()
        self._start_claimers(loop)
        self._schedule_housekeeping()
        return self

    def _start_claimers(self, loop) -> None:
        """Messages applications commit in their own transactions on a SQL device (seed 001)."""
        from pymq_server.broker.apptx import PendingClaimer
        for device in self.store.devices.values():
            if device.kind == "sql" and hasattr(device, "pending_listener"):
                claimer = PendingClaimer(self.broker, device, loop)
                claimer.start()
                self.claimers.append(claimer)

    def _setup_selection(self, selection) -> None:
        """The adaptive layer of seed 000: rules from YAML (inline mapping or a file path)."""
        import yaml
        from pymq_server.broker.broker import rule_context_of
        from pymq_server.storage.selection import AdaptiveSelection
        if isinstance(selection, str):
            try:
                with open(selection, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                raise ConfigError(f"cannot read storage selection file {selection}: {exc.strerror}") \
                    from None
        else:
            text = yaml.safe_dump(selection)
        layer = AdaptiveSelection.from_yaml(text, list(self.store.devices.values()))
        self.store.use_selection(layer, rule_context_of)
        self._refresh_selection()

    def _refresh_selection(self) -> None:
        layer = self.store.selection
        now = self.runtime.time()
        try:
            layer.refresh(now)
        except Exception:  # a monitor bug must not stop the broker; the next refresh retries
            log.exception("storage monitor refresh failed")
        delay = max(0.01, layer.next_refresh() - self.runtime.time())
        self._selection_timer = asyncio.get_running_loop().call_later(delay, self._refresh_selection)

    def _schedule_housekeeping(self) -> None:
        loop = asyncio.get_running_loop()
        self._housekeeping = loop.call_later(HOUSEKEEPING_PERIOD_S, self._run_housekeeping)

    def _run_housekeeping(self) -> None:
        try:
            self.broker.housekeeping()
        finally:
            self._schedule_housekeeping()

    async def stop(self) -> None:
        self.stopping = True
        if self.admin is not None:
            self.admin.stop()
        if self.cluster is not None:
            await self.cluster.stop()          # hand-over needs the links and the loop still running
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self._selection_timer is not None:
            self._selection_timer.cancel()
        if self._server is not None:
            self._server.close()
        if self.http is not None:
            await self.http.stop()
        for claimer in self.claimers:
            claimer.stop()
        if self.broker is not None:
            for session in list(self.broker.sessions.values()):
                session.close()
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.sleep(0)   # let transports flush their last frames
        if self.store is not None:
            self.store.flush_all()
            self.store.close()
        if self.runtime is not None:
            self.runtime.shutdown()
        log.info("pymq-server stopped")


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
