"""The channels between worker processes: a full mesh of Unix stream sockets (spec/cores.md §2.1).

Worker k listens on ``<channel dir>/w<k>.sock`` and connects to every worker j < k, so each pair has
one socket, a FIFO in each direction. The directory is made 0700 by the supervisor, and an accepted
peer must run as this process's user (``SO_PEERCRED``): nothing but the broker's own workers can talk
on a channel, so a frame that arrives on one is trusted to carry the principal its home authenticated.

Writes are gathered per event-loop turn: one ``write`` per channel per turn, and consecutive FRAME
envelopes of one connection are merged into one (the owner then parses them in one batch, as it
would a TCP read). While a channel's transport is over its high-water mark it is *full*: a home that
forwards to it pauses reading its producer (:meth:`Channel.hold`) until the channel drains.

Losing a channel means a worker died (or everything is stopping): what this worker held for it is let go
(:meth:`Mesh.lost`), frames for its destinations are refused until it is back, and the channel is opened
again once the supervisor has restarted it (spec/cores.md §2.3).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from pymq.errors import ClusterError
from pymq_server.cores.envelope import HEAD, Envelope, EnvelopeReader, Kind
from pymq_server.cores.handover import HandoverBox
from pymq_server.cores.ownership import Ownership

if TYPE_CHECKING:
    from pymq_server.broker.broker import Broker
    from pymq_server.cores.home import HomeSession
    from pymq_server.cores.shadow import ShadowProtocol

log = logging.getLogger("pymq.cores")

#: a channel is full above this many bytes in its transport's buffer (and drained below a quarter)
CHANNEL_HIGH = 4 * 1024 * 1024
#: how long a worker waits for the other workers' channels at start-up
MESH_TIMEOUT_S = 60.0
#: how long a worker tries to reach a restarting worker again before it gives up (and stops)
RECONNECT_TIMEOUT_S = 120.0


def socket_path(directory: str, k: int) -> str:
    return os.path.join(directory, f"w{k}.sock")


class Channel(asyncio.Protocol):
    """One end of the socket between this worker and ``peer``."""

    def __init__(self, mesh: Mesh, peer: int | None) -> None:
        self.mesh = mesh
        self.peer = peer                      # None until the connector's HELLO
        self.transport: asyncio.Transport | None = None
        self.reader = EnvelopeReader(mesh.max_payload)
        self.full = False
        self.held: set[HomeSession] = set()   # homes paused because this channel was full
        # queued this turn: [kind, home, conn, payloads]; encoded and written once per turn
        self._out: list[list[Any]] = []
        self._scheduled = False
        self.sent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)
        t.set_write_buffer_limits(high=CHANNEL_HIGH, low=CHANNEL_HIGH // 4)
        sock = t.get_extra_info("socket")
        if sock is not None and self.peer is None:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                log.error("channel: refused a peer running as uid %d", uid)
                t.abort()

    def data_received(self, data: bytes) -> None:
        try:
            envelopes = self.reader.feed(data)
        except ClusterError as exc:
            log.error("channel from worker %s: %s", self.peer, exc.message)
            self.mesh.lost(self, exc.message)
            return
        mesh = self.mesh
        for env in envelopes:
            if self.peer is None:
                if env.kind is not Kind.HELLO:
                    mesh.lost(self, f"channel opened without HELLO ({env.kind.name})")
                    return
                mesh.joined(self, int(env.payload))
                continue
            try:
                mesh.deliver(self.peer, env)
            except Exception:   # a bug must cost one connection, not the channel every connection shares
                log.exception("worker %d: envelope %s for %s failed", mesh.me, env.kind.name, env.conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self.mesh.lost(self, str(exc) if exc else "closed")

    def pause_writing(self) -> None:
        self.full = True
        # the other direction too: the shadows writing to that worker's clients stop dispatching
        self.mesh.shadows_output(self.peer, held=True)

    def resume_writing(self) -> None:
        self.full = False
        held, self.held = self.held, set()
        for home in held:
            home.channel_drained(self.peer)
        self.mesh.shadows_output(self.peer, held=False)

    def hold(self, home: HomeSession) -> None:
        self.held.add(home)

    def send(self, kind: Kind, home: int, conn: str, payload: bytes = b"") -> None:
        out = self._out
        if kind is Kind.FRAME and out:
            last = out[-1]
            if last[0] is Kind.FRAME and last[2] == conn and last[1] == home:
                last[3].append(payload)
                return
        out.append([kind, home, conn, [payload]])
        if not self._scheduled:
            self._scheduled = True
            self.mesh.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        out, self._out = self._out, []
        if self.transport is None or self.transport.is_closing() or not out:
            return
        pieces: list[bytes] = []
        for kind, home, conn, payloads in out:
            c = conn.encode()
            size = sum(map(len, payloads))
            pieces.append(HEAD.pack(kind, home, len(c), size))
            pieces.append(c)
            pieces.extend(payloads)
        self.sent += len(out)
        self.transport.write(b"".join(pieces))


class Mesh:
    """This worker's channels to the others, and where each envelope goes."""

    def __init__(self, me: int, workers: int, directory: str, node_id: str,
                 loop: asyncio.AbstractEventLoop, max_frame_size: int, dead_letter_prefix: str = "DLQ.",
                 handover: bool = True, numbered: bool = True) -> None:
        self.me = me
        self.workers = workers
        self.directory = directory
        self.loop = loop
        self.ownership = Ownership(me, workers, node_id, dead_letter_prefix, numbered)
        #: an envelope holds at most a few frames' worth: merged FRAMEs of one turn may hold many
        self.max_payload = max(64 * max_frame_size, 256 * 1024 * 1024)
        self.channels: dict[int, Channel] = {}
        self.homes: dict[str, HomeSession] = {}                      # home sessions here, by id
        self.shadows: dict[tuple[int, str], ShadowProtocol] = {}     # (home, conn id) -> shadow here
        self.broker: Broker | None = None
        #: called when this worker cannot go on (a restarted worker could not be reached again)
        self.on_lost: Callable[[str], None] = lambda why: None
        # admin questions this worker answers: op -> handler(args, reply)
        self.queries: dict[str, Callable[[dict, Callable[[Any], None]], None]] = {}
        self._answers: dict[int, asyncio.Future] = {}
        self.admin: Any = None          # this worker's AdminRouter (server/cores/admin.py)
        self._query_ids = 0
        self._complete = asyncio.Event()
        self._reconnecting: set[asyncio.Task] = set()
        self._server: asyncio.base_events.Server | None = None
        self._stopping = False
        #: connections handed over to the worker that owns their destination (handover.py); None: off
        self.handover: HandoverBox | None = HandoverBox(self, loop) if handover else None

    # -- start and stop ------------------------------------------------------------------------------
    async def start(self, broker: Broker) -> None:
        """Listen, connect to the workers before this one, and wait until every channel is up."""
        self.broker = broker
        loop = self.loop
        path = socket_path(self.directory, self.me)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)         # left by this worker's previous process (it died; it is restarting)
        self._server = await loop.create_unix_server(lambda: Channel(self, None), path=path)
        os.chmod(path, 0o600)
        if self.handover is not None:
            self.handover.open()
        deadline = loop.time() + MESH_TIMEOUT_S
        for j in range(self.me):
            await self._connect(j, deadline)
        self._check_complete()
        try:
            await asyncio.wait_for(self._complete.wait(), max(0.1, deadline - loop.time()))
        except asyncio.TimeoutError:
            missing = sorted(set(range(self.workers)) - set(self.channels) - {self.me})
            raise ClusterError(f"worker {self.me}: no channel from worker(s) {missing} within "
                               f"{MESH_TIMEOUT_S:.0f}s") from None

    async def _connect(self, j: int, deadline: float) -> None:
        """The channel to worker j (< this one), trying until ``deadline`` while j is not listening."""
        loop = self.loop
        while True:
            try:
                _, proto = await loop.create_unix_connection(lambda: Channel(self, j),
                                                             path=socket_path(self.directory, j))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if loop.time() > deadline or self._stopping:
                    raise ClusterError(f"worker {self.me}: worker {j} did not open its channel within "
                                       f"{MESH_TIMEOUT_S:.0f}s") from None
                await asyncio.sleep(0.05)
        channel = proto
        channel.send(Kind.HELLO, self.me, "", str(self.me).encode())
        self.channels[j] = channel

    def joined(self, channel: Channel, peer: int) -> None:
        if not 0 <= peer < self.workers or peer == self.me:
            self.lost(channel, f"HELLO from unexpected worker {peer}")
            return
        old = self.channels.get(peer)
        if old is not None:         # a restarted worker whose death this side has not read yet
            self.lost(old, "replaced: the worker restarted")
        channel.peer = peer
        self.channels[peer] = channel
        self._check_complete()

    def _check_complete(self) -> None:
        if len(self.channels) == self.workers - 1:
            self._complete.set()

    def lost(self, channel: Channel, why: str) -> None:
        """A channel closed: its worker died (or is stopping). What this worker held for it goes: the
        client connections with a shadow there are closed with an ERROR (their subscriptions,
        transactions and deliveries there are gone), the shadows here of its clients are closed (their
        unacknowledged messages return to their queues). The supervisor restarts the worker; this side
        reconnects (to a lower id) or waits for it (a higher one) — spec/cores.md §2.3."""
        if channel.transport is not None and not channel.transport.is_closing():
            channel.transport.abort()
        peer = channel.peer
        if self._stopping or peer is None or self.channels.get(peer) is not channel:
            return
        del self.channels[peer]
        self._complete.clear()
        log.warning("worker %d: channel to worker %d lost (%s)", self.me, peer, why)
        for home in [h for h in self.homes.values() if peer in h.opened]:
            home.fail(ClusterError(f"worker {peer}, which holds destinations this connection used, stopped: its "
                           f"subscriptions, transactions and unacknowledged messages there are gone; "
                           f"reconnect"))
        for (home_id, _), shadow in list(self.shadows.items()):
            if home_id == peer:
                shadow.from_home(Kind.CLOSE, b"")
        if peer < self.me:
            task = self.loop.create_task(self._reconnect(peer))
            self._reconnecting.add(task)
            task.add_done_callback(self._reconnecting.discard)

    async def _reconnect(self, peer: int) -> None:
        try:
            await self._connect(peer, self.loop.time() + RECONNECT_TIMEOUT_S)
        except ClusterError as exc:
            if not self._stopping:
                log.error("%s", exc.message)
                self.on_lost(exc.message)
            return
        log.warning("worker %d: channel to worker %d open again", self.me, peer)
        self._check_complete()

    def stop(self) -> None:
        """Shadows first: what their connections held goes back to its queues before storage closes."""
        self._stopping = True
        for task in self._reconnecting:
            task.cancel()
        for shadow in list(self.shadows.values()):
            if shadow.session is not None:
                shadow.session.close()
        if self.handover is not None:
            self.handover.close()
        if self._server is not None:
            self._server.close()
        for channel in self.channels.values():
            channel.flush()
            if channel.transport is not None:
                channel.transport.close()

    # -- traffic -------------------------------------------------------------------------------------
    def send(self, peer: int, kind: Kind, home: int, conn: str, payload: bytes = b"") -> Channel | None:
        channel = self.channels.get(peer)
        if channel is not None:
            channel.send(kind, home, conn, payload)
        return channel

    def deliver(self, peer: int, env: Envelope) -> None:
        kind = env.kind
        if kind is Kind.QUERY or kind is Kind.ANSWER:
            self._admin(peer, kind, env.payload)
            return
        if kind is Kind.HANDOVER:
            if self.handover is not None:
                self.handover.state(env.conn, env.payload)
            return
        if env.home == self.me:                 # for one of this worker's client connections
            home = self.homes.get(env.conn)
            if home is not None:
                home.from_owner(peer, kind, env.payload)
            return
        key = (env.home, env.conn)
        shadow = self.shadows.get(key)
        if kind is Kind.OPEN:
            if shadow is None and self.broker is not None:
                from pymq_server.cores.shadow import ShadowProtocol
                self.shadows[key] = shadow = ShadowProtocol(self.broker, self.loop, self, env.home, env.conn)
                shadow.open(json.loads(env.payload))
            return
        if shadow is not None:
            shadow.from_home(kind, env.payload)

    def shadows_output(self, home: int | None, held: bool) -> None:
        """The channel to ``home`` is full (or drained): its shadows here stop (or resume) writing."""
        for (h, _), shadow in list(self.shadows.items()):
            if h == home:
                if held:
                    shadow.hold_output("channel")
                else:
                    shadow.release_output("channel")

    def shadow_gone(self, home: int, conn: str) -> None:
        self.shadows.pop((home, conn), None)

    # -- admin: ask every worker ---------------------------------------------------------------------
    async def ask(self, k: int, op: str, args: dict, timeout: float) -> Any:
        """Worker ``k``'s answer to ``op`` (this one's if k is this worker); None if it did not answer
        within ``timeout``."""
        self._query_ids += 1
        qid = self._query_ids
        fut = self._answers[qid] = self.loop.create_future()
        try:
            if k == self.me:
                self._answer(op, args, lambda result: self._resolve(qid, result))
            else:
                self.send(k, Kind.QUERY, k, "", json.dumps({"id": qid, "op": op, "args": args}).encode())
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            self._answers.pop(qid, None)

    async def ask_all(self, op: str, args: dict, timeout: float, others_only: bool = False) -> list[Any]:
        """Every worker's answer, in worker order (this one's too unless ``others_only``: then None in
        its place); None for a worker that did not answer."""
        workers = [k for k in range(self.workers) if not (others_only and k == self.me)]
        answers = await asyncio.gather(*(self.ask(k, op, args, timeout) for k in workers))
        by_worker = dict(zip(workers, answers, strict=True))
        return [by_worker.get(k) for k in range(self.workers)]

    def _answer(self, op: str, args: dict, reply: Callable[[Any], None]) -> None:
        handler = self.queries.get(op)
        if handler is None:
            reply(None)
            return
        handler(args, reply)

    def _resolve(self, qid: int, result: Any) -> None:
        fut = self._answers.get(qid)
        if fut is not None and not fut.done():
            fut.set_result(result)

    def _admin(self, peer: int, kind: Kind, payload: bytes) -> None:
        doc = json.loads(payload)
        if kind is Kind.QUERY:
            def reply(result: Any) -> None:
                self.send(peer, Kind.ANSWER, peer, "", json.dumps({"id": doc["id"], "result": result}).encode())
            self._answer(doc["op"], doc.get("args") or {}, reply)
            return
        self._resolve(doc["id"], doc["result"])
