"""The embedded broker behind ``vm://name`` URLs: a full broker on a background thread, no socket.

``embedded_broker(name)`` starts (once per process and name) a :class:`BrokerServer` on its own event
loop thread; its connections are vm:// links (server/net/vm.py). Options (from the URL query): ``data_dir``
(persistent storage there; by default the embedded broker keeps everything in memory), ``port`` (also
listen on TCP, for tools). It runs a whole server, so it lives beside server/app.py, above the listeners.
"""
from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
import threading

from pymq_server.app import BrokerServer
from pymq_server.broker.broker import Broker
from pymq_server.config import BrokerConfig, StorageConfig
from pymq_server.net.vm import VmClient, VmLink

_brokers: dict[str, EmbeddedBroker] = {}
_lock = threading.Lock()


class EmbeddedBroker:
    def __init__(self, name: str, options: dict[str, str]) -> None:
        self.name = name
        storage: dict[str, object] = {"devices": {"memory": {"kind": "memory"}}, "persistent_device": "memory"}
        data_dir = options.get("data_dir")
        if data_dir:
            storage = {}
        self._tmpdir: str | None = None
        if not data_dir:
            # memory only: nothing is kept, so nothing is written into the application's directory
            self._tmpdir = data_dir = tempfile.mkdtemp(prefix=f"pymq-vm-{name}-")
        # the URL grammar (pymq.client.url) checked that port is a number
        self.config = BrokerConfig(host="127.0.0.1", port=int(options.get("port", 0)), data_dir=data_dir,
                                   node_id=f"vm-{name}", storage=StorageConfig.model_validate(storage))
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(self.config)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"pymq-vm-{name}", daemon=True)
        self.thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits for the start
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        if not self.config.port:
            # no TCP listener: start only storage and the broker core
            await self.server.start_core()
        else:
            await self.server.start()

    @property
    def broker(self) -> Broker | None:
        return self.server.broker

    def link(self, client: VmClient) -> VmLink:
        """A new connection for ``client``; ``link.open(headers)`` sends its CONNECT."""
        return VmLink(self, client)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.loop.is_running():
            return
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        try:
            fut.result(timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)


def embedded_broker(name: str, options: dict[str, str] | None = None) -> EmbeddedBroker:
    """The embedded broker ``name``, started on first use (this may take a moment: not on an event loop)."""
    with _lock:
        broker = _brokers.get(name)
        if broker is None:
            broker = _brokers[name] = EmbeddedBroker(name, options or {})
        return broker


def stop_embedded(name: str | None = None) -> None:
    with _lock:
        names = [name] if name else list(_brokers)
        for n in names:
            broker = _brokers.pop(n, None)
            if broker is not None:
                broker.stop()


atexit.register(stop_embedded)
