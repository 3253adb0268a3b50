"""The broker core's facade: what sessions, the admin interface, the cluster node and the server call.

The core is cut into layers whose imports point one way (docs/architecture.md):

    destinations  <  subscriptions  <  router (placement) and range reader  <  recovery  <  Broker

:class:`Broker` builds the layers, wires them, and forwards each call to the one layer that does it; it
holds no logic of its own beyond the sessions' registry. Sans-IO: time, timers and worker threads come
from a *runtime* (``time()``, ``call_later(delay, fn, *args)``, ``run_in_thread(work, done)``), which
the asyncio adapter provides and tests can fake. Every method runs on the broker's single thread.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Protocol
from collections.abc import Callable, Iterator

from pymq_server.broker.acl import AccessControl
from pymq_server.broker.bulk_rows import MAX_DECODED_BYTES, BulkResult
from pymq_server.broker.auth import Authenticator, PasswordChecks, User
from pymq_server.broker.backlog import Pager
from pymq_server.broker.budgets import Budgets
from pymq_server.broker.clients import Client
from pymq_server.broker.consumer import Consumer
from pymq_server.broker.dedup import DedupJournal, DuplicateWindow
from pymq_server.broker.destinations import Destinations
from pymq_server.broker.temporary import NAMES_KEY_RECORD, Reclaimed, TemporaryNames
from pymq_server.broker.flow import MemoryFlow
from pymq_server.broker.log import RetainedLogs
from pymq_server.broker.membership import STANDALONE, ClusterMembership
from pymq_server.broker.message import BrokerMessage, now_ms
from pymq_server.broker.placement import Placement
from pymq_server.broker.queue import Entry, MessageQueue
from pymq_server.broker.quarantine import Quarantine
from pymq_server.broker.ranges import Browse, RangeReader
from pymq_server.broker.recovery import Recovery
from pymq_server.broker.requests import (AckUptoRequest, BulkSendRequest, RangeRequest, SendRequest, SendResult,
                                         SubscribeRequest)
from pymq_server.broker.router import Router
from pymq_server.broker.sequences import SequenceBook
from pymq_server.broker.subscriptions import Subscriptions
from pymq_server.broker.topic import Topic, TopicSubscription
from pymq_server.config import BrokerConfig, QueueConfig
from pymq_server.storage.store import HoldingStore

from pymq.errors import AuthenticationFailed, IllegalStateError, PymqError, ResourceLimit, UnknownDestination

log = logging.getLogger("pymq.broker")


def _key_stored(error: BaseException | None) -> None:
    if error is not None:
        log.warning("the key of temporary names' re-claim tokens is not stored (%s): a restarted broker or a "
                    "backup taking over will refuse this process's tokens", error)


class Runtime(Protocol):
    """The event loop as the core sees it (server/net/runtime.py)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> object: ...

    def run_in_thread(self, work: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None: ...

    def run_cpu_bound(self, work: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None: ...


def _not_wired(*args: object) -> None:
    raise RuntimeError("the broker's layers are not wired yet")


class AdminFrames(Protocol):
    """The admin interface over STOMP, as sessions reach it (server/admin/stomp_admin.handle, set by the
    server): a SEND to the admin destination, answered on the client's ``reply-to``."""

    def __call__(self, session: Client, headers: dict[str, str], body: bytes) -> None: ...


def _no_admin(session: Client, headers: dict[str, str], body: bytes) -> None:
    raise UnknownDestination("this broker has no admin interface", destination=headers.get("destination"))


class QueueServices:
    """What queues and retained logs need from the broker (queue.QueueHost): time, timers, storage
    references, memory accounting, and the router's dead-letter and expiry moves (bound once the
    router exists: queues are made by a lower layer than the one that moves their messages)."""

    __slots__ = ("clock", "now_ms", "release_reference", "message_gone", "delivered", "pager",
                 "flow", "dead_letter", "on_expired", "max_decoded", "_runtime")

    def __init__(self, runtime: Runtime, store: HoldingStore, flow: MemoryFlow) -> None:
        self._runtime = runtime
        self.max_decoded = max(MAX_DECODED_BYTES, flow.config.max_frame_size)
        self.clock = runtime.time
        self.now_ms = now_ms
        self.release_reference, self.delivered = store.release, store.delivered
        self.pager: Pager | None = Pager(store, flow)
        self.message_gone, self.flow = flow.message_gone, flow
        self.dead_letter: Callable[[Entry, str], None] = _not_wired
        self.on_expired: Callable[[Entry], None] = _not_wired

    def schedule_at_ms(self, when_ms: int, fn: Callable[..., None], *args: object) -> None:
        self._runtime.call_later(max(0.0, (when_ms - self.now_ms()) / 1000.0), fn, *args)

    def call_soon(self, fn: Callable[..., None], *args: object) -> None:
        self._runtime.call_later(0, fn, *args)


class Broker:
    def __init__(self, config: BrokerConfig, store: HoldingStore, runtime: Runtime, *,
                 authenticator: Authenticator | None = None) -> None:
        self.config = config
        self.store = store
        self.runtime = runtime
        self.clock: Callable[[], float] = runtime.time
        self.now_ms: Callable[[], int] = now_ms
        self.authenticator = authenticator or Authenticator(config.users_file, config.allow_anonymous)
        self.password_checks = PasswordChecks(config.max_pending_logins)
        self.node_id = config.node_id
        self.sessions: dict[str, Client] = {}
        self.client_ids: dict[str, Client] = {}
        self.admin: Any = None                    # the admin operations (server/admin/ops.py), set by the server
        #: high availability's serving check (spec/ha.md §2.1: ``may_send()`` before bytes leave for a
        #: client), set by the server; None without ``ha:``
        self.serving: Any = None
        self.admin_frames: AdminFrames = _no_admin   # and their STOMP end (server/admin/stomp_admin.py)
        #: the table prefix of the SQL device claiming app-transaction rows (server/app.py), announced to clients
        self.apptx_table_prefix: str | None = None
        self._conn_ids = itertools.count(1)
        # the layers, bottom up
        self.seqs = SequenceBook(store)
        self.flow = MemoryFlow(config, store, self.call_soon)
        self.host = QueueServices(runtime, store, self.flow)
        self.acl = AccessControl(config.default_permissions)
        self.budgets = Budgets(config, self.flow)
        self.destinations = Destinations(config, store, self.host, self.acl)
        self.destinations.name_holders = TemporaryNames(config.temporary_reclaim_ms, self.clock)
        self.subscriptions = Subscriptions(config, self.destinations, store, self.budgets)
        self.logs = RetainedLogs(config.retention, self.host)
        self.dedup = DuplicateWindow(config.dedup_window_ms, config.dedup_max_ids, now_ms)
        self.dedup_journal = DedupJournal(store, config.dedup_window_ms, config.dedup_persisted_ids, now_ms)
        store.before_barrier = self.dedup_journal.write
        self.placement = Placement(config, store, self.seqs, self.logs, self.dedup, self.flow)
        self.placement.journal = self.dedup_journal
        self.placement.call_soon = self.call_soon
        self.router = Router(config, self.destinations, self.subscriptions, self.placement, now_ms)
        self.ranges = RangeReader(self.destinations, self.subscriptions, self.logs, self.seqs, now_ms)
        self.host.dead_letter = self.router.dead_letter
        self.host.on_expired = self.router.on_expired
        self.cluster: ClusterMembership = STANDALONE
        self.quarantine = Quarantine()            # stored records that did not decode (quarantine.py)

    # -- runtime ----------------------------------------------------------------------------------
    def run_in_thread(self, work: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        self.runtime.run_in_thread(work, done)

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.runtime.call_later(0, fn)

    def barrier(self, done: Callable[[BaseException | None], None]) -> None:
        """``done(None)`` once everything written so far is durable under the sync policy, ``done(error)``
        when storage could not make it durable."""
        self.store.barrier(done)

    # -- start-up: recovery, then the cluster ----------------------------------------------------------
    def recover(self) -> int:
        """Rebuild catalog state and queues from storage; returns the number of messages recovered."""
        count = self._recovery().run()
        holders = self.destinations.name_holders
        if holders.key is None:                   # the store had none (a new store): one for every later process
            self.store.put_meta(NAMES_KEY_RECORD, holders.start(None))
            self.store.barrier(_key_stored)
        else:
            holders.start(holders.key)
        return count

    def recover_device(self, device: Any) -> int:
        """A device that could not be opened at start-up is open now: its messages join their queues."""
        count = self._recovery().messages((device, stored, refs) for stored, refs in device.recover())
        log.warning("recovered %d persistent messages from holding device %s", count, device.name)
        return count

    def _recovery(self) -> Recovery:
        return Recovery(self.store, self.seqs, self.destinations, self.subscriptions, self.logs, self.dedup,
                        self.flow, self.quarantine, self.dedup_journal)

    def attach_cluster(self, node: ClusterMembership) -> None:
        """Join a cluster, after recovery: from now on ``node`` routes and hears of local changes.  What
        recovery made before it (topics with subscriptions, durable subscriptions, outboxes) the node
        reads when it starts (ClusterNode._attach_recovered), so peers forward to a restarted node as before."""
        self.cluster = node
        self.subscriptions.cluster = node
        self.placement.cluster = node
        self.router.cluster = node

    # -- sessions ---------------------------------------------------------------------------------
    def new_connection_id(self) -> str:
        return f"c{next(self._conn_ids)}"

    def session_opened(self, session: Client) -> None:
        if session.id not in self.sessions and len(self.sessions) >= self.config.max_connections:
            raise ResourceLimit(f"the broker already has {self.config.max_connections} connections; "
                                f"try again later")
        self.sessions[session.id] = session

    def session_closed(self, session: Client) -> None:
        self.sessions.pop(session.id, None)
        if session.client_id and self.client_ids.get(session.client_id) is session:
            del self.client_ids[session.client_id]
        self.flow.forget(session)

    def temporary_names(self, session: Client, vhost: str, token: str | None) -> Reclaimed:
        """The global names of ``session``'s temporaries (spec/ha.md §4.7): new ones, or, for a CONNECT that
        offers the ``token`` an earlier connection of the same client got, that connection's names.  A
        connection of that client still open with them (a half-open link not yet seen to end) is closed
        first, which also frees its client id."""
        holders = self.destinations.name_holders
        user = session.user.name
        if token is None:
            return holders.issue(session.id, vhost, user)
        answer = holders.reclaim(token, session.id, vhost, user)
        if answer.holder:
            old = self.sessions.get(answer.holder)
            if old is not None and old is not session and not old.closed:
                log.info("connection %s re-claims the temporary names of %s: closing it", session.id, old.id)
                old.close()
            holders.released(answer.names, answer.holder, lost=True)     # (if it was not closed by now)
            answer = holders.reclaim(token, session.id, vhost, user)
        return answer

    def temporary_names_released(self, session: Client, names: str, lost: bool,
                                 queues: dict[str, MessageQueue], keep: bool = True) -> None:
        """``session`` ended; ``lost``: without DISCONNECT, so its client may re-claim its names, and its
        temporary ``queues`` (local name -> queue) are kept for that until the window passes, unless not
        ``keep`` (the broker ended the connection with an ERROR)."""
        holders = self.destinations.name_holders
        keep = keep and lost and bool(holders.window) and holders.held.get(names) == session.id
        holders.released(names, session.id, lost)
        if not keep:
            for queue in queues.values():
                self.destinations.delete_temp_queue(queue)
            return
        generation = self.destinations.orphan_temp_queues(names, queues)
        if generation:
            self.runtime.call_later(holders.window, self.destinations.drop_orphaned, names, generation)

    def adopt_temporaries(self, session: Client, names: str) -> dict[str, MessageQueue]:
        """The temporary queues ``session``'s re-claimed ``names`` kept since their link was lost."""
        return self.destinations.adopt_temp_queues(names, session)

    def claim_client_id(self, session: Client, client_id: str) -> None:
        self.subscriptions.check_client_id(session.user, client_id)
        holder = self.client_ids.get(client_id)
        if holder is not None and holder is not session and not holder.closed:
            raise IllegalStateError(f"client id {client_id!r} is already in use by another connection",
                                    client_id=client_id)
        self.subscriptions.bind_client_id(session.user, client_id)
        self.client_ids[client_id] = session

    def authenticate(self, login: str | None, passcode: str | None, peer_host: str | None,
                     certificate: str | None, done: Callable[[User | None, PymqError | None], None]) -> bool:
        """Check a CONNECT's (or an admin HTTP request's) credentials and call ``done(user, None)`` or
        ``done(None, error)``: at once when the answer is known without a password hash (False), else
        later from the hashing pool (True: scrypt is slow by design, so the loop never runs it; the
        connection holds its input meanwhile).  At most ``max_pending_logins`` hashes wait or run at
        once: past that the check is refused at once with ``resource-limit``."""
        auth = self.authenticator
        if not auth.needs_slow_check(login, passcode, certificate):
            try:
                user = auth.authenticate(login, passcode, peer_host, certificate)
            except PymqError as exc:
                done(None, exc)
                return False
            done(user, None)
            return False
        checks = self.password_checks
        try:
            checks.begin()
        except ResourceLimit as exc:
            done(None, exc)
            return False

        def work() -> User:
            return auth.authenticate(login, passcode, peer_host, certificate)

        def finished(user: User | None, error: BaseException | None) -> None:
            checks.end()
            if error is not None and not isinstance(error, PymqError):
                log.error("authentication crashed", exc_info=error)
                error = AuthenticationFailed("authentication failed: internal error")
            done(user, error)

        self.runtime.run_cpu_bound(work, finished)
        return True

    # -- what a session asks ------------------------------------------------------------------------------
    def send(self, client: Client | None, request: SendRequest, admitted: bool = False, *,
             pause: bool = True) -> SendResult:
        """Place one SEND (``client`` None: the broker itself; ``admitted``: a COMMIT's SEND, checked with its
        transaction); a producer pauses while memory is high (spec/stomp.md §8) unless ``pause`` is false."""
        result = self.router.send(client, request, admitted)
        if self.flow.high:          # (throttle's own test, asked first: a call less per SEND)
            self.flow.throttle(client if pause else None)
        return result

    def send_bulk(self, client: Client, request: BulkSendRequest) -> BulkResult:
        """Place a bulk SEND's rows as a unit (spec/spark.md §7); flow control as for :meth:`send`."""
        result = self.router.send_bulk(client, request)
        self.flow.throttle(client)
        return result

    def admit(self, client: Client, request: SendRequest, unit: dict[str, Any]) -> None:
        """Raise what :meth:`send` would refuse ``request`` for, changing nothing but ``unit`` (what the
        transaction's earlier SENDs add: a COMMIT's check)."""
        self.router.admit(client, request, unit)

    def subscribe(self, client: Client, request: SubscribeRequest, selector: Any = None) -> Consumer:
        return self.subscriptions.consumer(client, request, selector)

    def browse(self, client: Client, request: RangeRequest) -> Browse:
        return self.ranges.browse(client, request)

    def ack_upto(self, client: Client, request: AckUptoRequest) -> None:
        self.ranges.ack_upto(client, request)

    def consumer_added(self, consumer: Consumer) -> None:
        self.subscriptions.consumer_added(consumer)

    def consumer_removed(self, consumer: Consumer) -> None:
        self.subscriptions.consumer_removed(consumer)

    def unsubscribe_durable(self, consumer: Consumer) -> None:
        self.subscriptions.unsubscribe(consumer)

    def remove_durable(self, client: Client, name: str, shared: bool = False) -> None:
        self.subscriptions.remove(client, name, shared)

    def create_temp_queue(self, client: Client, local: str) -> MessageQueue:
        return self.destinations.create_temp_queue(client, local)

    def delete_temp_queue(self, queue: MessageQueue) -> None:
        self.destinations.delete_temp_queue(queue)

    def delete_temporary(self, client: Client, destination: str) -> None:
        self.destinations.delete_temporary(client, destination)

    def create_temp_topic(self, client: Client, local: str) -> Topic:
        return self.destinations.create_temp_topic(client, local)

    def delete_temp_topic(self, topic: Topic) -> None:
        """Its connection closed: the topic and whatever subscription is left go."""
        for sub in list(topic.subscriptions.values()):
            self.subscriptions.drop(sub)
        self.destinations.forget_temp_topic(topic)

    def cluster_control(self, session: Client, headers: dict, body: bytes) -> None:
        """A control message from another node (spec/cluster.md)."""
        self.cluster.on_control(session, headers, body)

    # -- what the admin interface asks (server/admin/ops.py) ----------------------------------------------
    def resolve(self, destination: str) -> tuple:
        return self.destinations.resolve(destination)

    def get_queue(self, name: str, create: bool | None = None) -> MessageQueue:
        return self.destinations.queue(name, create)

    def get_topic(self, name: str) -> Topic:
        return self.destinations.topic(name)

    def declare_queue(self, name: str, settings: dict | None, user: User, grants: dict | None = None
                      ) -> tuple[MessageQueue, bool]:
        queue, created = self.destinations.declare_queue(name, settings, user, grants)
        if created and settings and "routing_key" in settings:
            self.cluster.routing_key_declared(name, queue.config.routing_key)   # every node routes alike
        return queue, created

    def alter_queue(self, name: str, settings: dict, user: User) -> tuple[MessageQueue, list[str]]:
        queue, changes = self.destinations.alter_queue(name, settings, user)
        if any(change.startswith("routing_key:") for change in changes):
            self.cluster.routing_key_declared(name, queue.config.routing_key)   # every node routes alike
        return queue, changes

    def drop_queue(self, name: str, user: User, *, force: bool = False) -> int:
        return self.destinations.drop_queue(name, user, force=force)

    def purge_queue(self, name: str, user: User) -> int:
        return self.destinations.purge_queue(name, user)

    def grant(self, user: User, destination: str, principal: str, permissions: list[str]) -> dict:
        return self.destinations.grant(user, destination, principal, permissions)

    def revoke(self, user: User, destination: str, principal: str, permissions: list[str]) -> dict:
        return self.destinations.revoke(user, destination, principal, permissions)

    def compile_selector(self, text: str | None) -> Any:
        return self.subscriptions.compile_selector(text)

    @property
    def queues(self) -> dict[str, MessageQueue]:
        return self.destinations.queues

    @property
    def internal(self) -> dict[str, MessageQueue]:
        """Queues only the broker uses (cluster outboxes)."""
        return self.destinations.internal

    @property
    def topics(self) -> dict[str, Topic]:
        return self.destinations.topics

    @property
    def declared(self) -> dict[str, dict]:
        return self.destinations.declared

    @property
    def held_bytes(self) -> int:
        return self.flow.held_bytes

    @property
    def memory_high(self) -> bool:
        return self.flow.high

    @property
    def duplicates(self) -> int:
        return self.dedup.duplicates

    @property
    def expired(self) -> int:
        return self.router.expired

    @property
    def dropped_no_subscriber(self) -> int:
        return self.placement.dropped_no_subscriber

    def all_queues(self) -> Iterator[MessageQueue]:
        return self.destinations.all_queues()

    # -- what the cluster node asks (server/cluster/node.py) ----------------------------------------------
    def internal_queue(self, name: str, config: QueueConfig | None = None) -> MessageQueue:
        return self.destinations.internal_queue(name, config)

    def redistribute(self, message: BrokerMessage, peer: str) -> None:
        self.router.redistribute(message, peer)

    def hand_over(self, message: BrokerMessage, subscription: str, peer: str) -> None:
        self.router.hand_over(message, subscription, peer)

    def reroute(self, message: BrokerMessage, peer: str | None) -> None:
        self.router.reroute(message, peer)

    def find_subscription(self, key: str) -> TopicSubscription | None:
        return self.subscriptions.find(key)

    def durable_subscriptions(self) -> Iterator[TopicSubscription]:
        return self.subscriptions.hosted()

    def durable_record(self, sub: TopicSubscription) -> dict:
        return self.subscriptions.record(sub)

    def adopt_durable(self, record: dict) -> TopicSubscription:
        return self.subscriptions.adopt(record)

    def drop_subscription(self, sub: TopicSubscription) -> None:
        self.subscriptions.drop(sub)

    # -- housekeeping ------------------------------------------------------------------------------
    def housekeeping(self) -> None:
        """The daemon of seed 001: expired messages out (never delivered), acquired messages past their
        delivery timeout back to ready, dead messages past their retention purged (their expiry), logs
        trimmed.  Each queue reads only what is due, from heaps: no scans."""
        now = self.now_ms()
        clock = self.clock()
        self.logs.trim(now)
        self.dedup_journal.expire()
        for queue in list(self.all_queues()):
            queue.expire_ready(now)
            queue.reclaim_timed_out(clock)
        self.destinations.reclaim_idle(now, self.logs.keeps)
