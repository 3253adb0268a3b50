"""The broker core: destinations, routing of sent messages, subscriptions, dead letters, recovery.

Sans-IO: time, timers and worker threads come from a *runtime* object (``call_later(delay, fn, *args)``,
``run_in_thread(work, done)``, ``time()``), which the asyncio adapter provides and tests can fake.  All
methods run on the broker's single thread.

Sequence numbers and message keys survive restarts without a write per message: they are reserved in
blocks recorded (and synced) in the catalog, so after a crash numbering resumes past the last
reservation — gaps are allowed, going backwards never is (the Spark connector's offsets rely on it).
"""
from __future__ import annotations

import fnmatch
import itertools
import json
from collections import OrderedDict
import logging
import time
from typing import Callable

from pymq.errors import (AccessDenied, DestinationError, DestinationExists, IllegalStateError, InvalidHeader,
                         InvalidSelector, MissingHeader, PymqError, QueueFull, ResourceLimit,
                         StorageError, UnknownDestination)
from pymq.protocol.scanner import FrameScanner, encode_frame
from pymq_server.broker import destination as dest
from pymq_server.broker.acl import AccessControl, DestinationAcl, is_admin
from pymq_server.broker.auth import Authenticator
from pymq_server.broker.schema import MessageSchema
from pymq_server.broker.consumer import AUTO, Consumer
from pymq_server.broker.log import RetainedLog
from pymq_server.broker.message import BrokerMessage, message_from_request, now_ms
from pymq_server.broker.requests import (AckUptoRequest, RangeRequest, SendRequest, SendResult,
                                       SubscribeRequest, first_alias)
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.topic import Topic, TopicSubscription
from pymq_server.config import BrokerConfig, QueueConfig, queue_config
from pymq_server.storage.store import HoldingStore

log = logging.getLogger("pymq.broker")

RESERVE_BLOCK = 10_000


class SequenceBook:
    """Per-destination sequence numbers (and the global message key) reserved in durable blocks."""

    def __init__(self, store: HoldingStore) -> None:
        self.store = store
        self._next: dict[str, int] = {}
        self._limit: dict[str, int] = {}
        # With a memory catalog nothing is remembered across restarts: start every counter from the
        # clock (ms × 1000), which stays ahead of the previous run unless it averaged over 1M/s.
        self._origin = 1 if store.catalog.kind != "memory" else int(time.time() * 1000) * 1000

    def load(self, reserved: dict[str, int]) -> None:
        for name, upto in reserved.items():
            self._next[name] = upto
            self._limit[name] = upto

    def observe(self, name: str, value: int) -> None:
        """A recovered message used ``value``: never hand it out again."""
        if self._next.get(name, 1) <= value:
            self._next[name] = value + 1
            self._limit[name] = max(self._limit.get(name, 0), value + 1)

    def next(self, name: str) -> int:
        n = self._next.get(name)
        if n is None:
            n = self._origin
        if n >= self._limit.get(name, 0):
            self._reserve(name, n + RESERVE_BLOCK)
        self._next[name] = n + 1
        return n

    def peek(self, name: str) -> int:
        return self._next.get(name, self._origin)

    def _reserve(self, name: str, upto: int) -> None:
        self._limit[name] = upto
        if self.store.catalog.kind == "memory":
            return
        self.store.put_meta("seq:" + name, str(upto).encode())
        # a reservation must be durable before any number from it is used
        catalog = self.store.catalog
        try:
            catalog.flush()
            catalog.sync()
        except StorageError as exc:
            # The catalog device is in fault (a full or failing disk).  Messages keep flowing with the
            # numbers reserved in memory: the device's repair writes the reservation with its checkpoint;
            # only a crash before that repair could hand out these numbers again (spec/storage.md §8).
            log.warning("sequence reservation for %r is not durable yet (%s); numbering continues",
                        name or "message keys", exc.message)


class Broker:
    def __init__(self, config: BrokerConfig, store: HoldingStore, runtime, *,
                 authenticator: Authenticator | None = None) -> None:
        self.config = config
        self.store = store
        self.runtime = runtime
        self.clock: Callable[[], float] = runtime.time
        self.now_ms: Callable[[], int] = now_ms
        self.authenticator = authenticator or Authenticator(config.users_file, config.allow_anonymous)
        self.node_id = config.node_id
        self.queues: dict[str, MessageQueue] = {}          # "orders" -> queue
        self.topics: dict[str, Topic] = {}
        self.subscription_queues: dict[str, MessageQueue] = {}  # storage name -> durable subscription
        self.temp_queues: dict[str, MessageQueue] = {}     # global name "tmp.c1.x" -> queue
        self.sessions: dict[str, object] = {}
        self.client_ids: dict[str, object] = {}
        self.seqs = SequenceBook(store)
        self._conn_ids = itertools.count(1)
        self._dest_cache: dict[str, tuple] = {}
        self.held_bytes = 0
        self.memory_high = False
        self._blocked: set = set()
        self.dropped_no_subscriber = 0
        self.expired = 0
        self.selector_compiler = None
        self.logs: dict[str, RetainedLog] = {}
        self._log_checked: dict[str, RetainedLog | None] = {}
        self.dedup: dict[str, OrderedDict] = {}
        self.duplicates = 0
        self.acl = AccessControl(config.default_permissions)
        self.cluster = None                      # a ClusterNode when this broker is part of a cluster
        self.internal: dict[str, MessageQueue] = {}   # queues clients cannot address ($cluster.out.*)
        self.declared: dict[str, dict] = {}     # explicitly created queues: name -> catalog record
        store.encode = encode_stored

    # -- runtime helpers -------------------------------------------------------------------------
    def run_in_thread(self, work: Callable, done: Callable) -> None:
        self.runtime.run_in_thread(work, done)

    def schedule_at_ms(self, when_ms: int, fn: Callable, *args) -> None:
        delay = max(0.0, (when_ms - self.now_ms()) / 1000.0)
        self.runtime.call_later(delay, fn, *args)

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.runtime.call_later(0, fn)

    def barrier(self, done: Callable[[BaseException | None], None]) -> None:
        """``done(None)`` once everything written so far is durable under the sync policy, ``done(error)``
        when storage could not make it durable."""
        self.store.barrier(done)

    def new_connection_id(self) -> str:
        return f"c{next(self._conn_ids)}"

    # -- sessions ------------------------------------------------------------------------------
    def session_opened(self, session) -> None:
        if session.id not in self.sessions and len(self.sessions) >= self.config.max_connections:
            raise ResourceLimit(f"the broker already has {self.config.max_connections} connections; "
                                f"try again later")
        self.sessions[session.id] = session

    def session_closed(self, session) -> None:
        self.sessions.pop(session.id, None)
        if session.client_id and self.client_ids.get(session.client_id) is session:
            del self.client_ids[session.client_id]
        self._blocked.discard(session)

    def claim_client_id(self, session, client_id: str) -> None:
        holder = self.client_ids.get(client_id)
        if holder is not None and holder is not session and not holder.closed:
            raise IllegalStateError(f"client id {client_id!r} is already in use by another connection",
                                    client_id=client_id)
        self.client_ids[client_id] = session

    # -- destinations --------------------------------------------------------------------------
    def resolve(self, destination: str):
        cached = self._dest_cache.get(destination)
        if cached is None:
            cached = dest.parse(destination)
            if cached[1].startswith("$"):
                raise DestinationError(f"destination {destination!r}: names starting with '$' are reserved "
                                       f"for the broker", destination=destination)
            if len(self._dest_cache) < 100_000:
                self._dest_cache[destination] = cached
        return cached

    def get_queue(self, name: str, create: bool | None = None) -> MessageQueue:
        queue = self.queues.get(name)
        if queue is None:
            if not (self.config.auto_create if create is None else create):
                raise UnknownDestination(f"queue '/queue/{name}' does not exist (auto-creation is off)",
                                         destination="/queue/" + name)
            queue = self.create_queue(name)
        return queue

    def create_queue(self, name: str, config: QueueConfig | None = None) -> MessageQueue:
        dest.check_name(name, "/queue/" + name)
        if config is None:
            config = self._configured_queue(name)
        queue = MessageQueue(self, "/queue/" + name, "/queue/" + name, kind="queue", config=config)
        if config.schema:
            queue.schema = MessageSchema.from_dict(config.schema, f"queue {name}")
        self.queues[name] = queue
        if name.startswith(self.config.queue_defaults.dead_letter_prefix):
            origin = self.acl.acls.get("/queue/" + name[len(self.config.queue_defaults.dead_letter_prefix):])
            if origin is not None and queue.destination not in self.acl.acls:
                # a dead-letter queue belongs to whoever owns the queue it serves
                self.acl.own(queue.destination, origin.owner, {p: set(v) for p, v in origin.grants.items()})
        return queue

    def _configured_queue(self, name: str) -> QueueConfig:
        settings = self.config.queues.get(name)
        if settings:
            return queue_config(settings, f"queue {name}", base=self.config.queue_defaults)
        if name.startswith(self.config.queue_defaults.dead_letter_prefix):
            # a dead-letter queue never dead-letters again
            return QueueConfig(max_deliveries=0, dead_letter=False)
        return self.config.queue_defaults

    # -- queues that applications create and manage (seed 001) ---------------------------------
    def declare_queue(self, name: str, settings: dict | None, user, grants: dict | None = None,
                      persist: bool = True) -> tuple[MessageQueue, bool]:
        """Create queue ``name`` owned by ``user`` with ``settings`` (QueueConfig fields).

        Returns (queue, created).  Declaring an existing queue with the same settings is a no-op;
        with different ones it is a DestinationExists error listing the differences.  A queue that
        was only auto-created by use takes the declared settings and owner."""
        dest.check_name(name, "/queue/" + name)
        config = queue_config(settings or {}, f"queue {name}", base=self.config.queue_defaults)
        existing = self.queues.get(name)
        record = self.declared.get(name)
        if existing is not None and record is not None:
            if settings is not None and existing.config != config:
                diff = "; ".join(existing.config.differences(config))
                raise DestinationExists(f"queue '/queue/{name}' already exists with a different "
                                        f"configuration ({diff})", destination="/queue/" + name)
            return existing, False
        if existing is None:
            existing = self.create_queue(name, config)
        else:
            existing.config = config
            existing.schema = MessageSchema.from_dict(config.schema, f"queue {name}") if config.schema else None
        owner = user.name if user is not None else None
        self.acl.own(existing.destination, owner, grants)
        record = {"config": config.to_dict(), "acl": self.acl.acls[existing.destination].to_dict()}
        self.declared[name] = record
        if persist:
            self.store.put_meta("queue:" + name, json.dumps(record).encode())
        if self.cluster is not None and settings and "routing_key" in settings:
            self.cluster.routing_key_declared(name, config.routing_key)   # every node routes alike
        return existing, True

    def drop_queue(self, name: str, user, *, force: bool = False) -> int:
        """Delete a queue and its messages (owner or administrator); refuses while consumers are
        attached unless ``force``.  Returns the number of messages dropped."""
        queue = self.queues.get(name)
        if queue is None:
            raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
        self._check_owner(user, queue.destination, "drop")
        if queue.consumers and not force:
            raise IllegalStateError(f"queue '/queue/{name}' has {len(queue.consumers)} consumer(s); "
                                    f"close them or drop with force", destination=queue.destination)
        for consumer in list(queue.consumers):
            consumer.active = False
            queue.remove_consumer(consumer)
        dropped = queue.purge()
        del self.queues[name]
        self.declared.pop(name, None)
        self.acl.forget(queue.destination)
        self.store.put_meta("queue:" + name, None)
        return dropped

    def purge_queue(self, name: str, user) -> int:
        queue = self.queues.get(name)
        if queue is None:
            raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
        self.acl.check(user, queue.destination, "consume")
        return queue.purge()

    def grant(self, user, destination: str, principal: str, permissions) -> dict:
        self.resolve(destination)
        acl = self.acl.grant(user, destination, principal, permissions)
        self._persist_acl(destination)
        return acl.to_dict()

    def revoke(self, user, destination: str, principal: str, permissions) -> dict:
        self.resolve(destination)
        acl = self.acl.revoke(user, destination, principal, permissions)
        self._persist_acl(destination)
        return acl.to_dict()

    def _persist_acl(self, destination: str) -> None:
        kind, name = self.resolve(destination)
        acl = self.acl.acls.get(destination)
        if kind is dest.Kind.QUEUE and name in self.declared:
            self.declared[name]["acl"] = acl.to_dict()
            self.store.put_meta("queue:" + name, json.dumps(self.declared[name]).encode())
        else:
            self.store.put_meta("acl:" + destination, json.dumps(acl.to_dict()).encode() if acl else None)

    def _check_owner(self, user, destination: str, what: str) -> None:
        if is_admin(user):
            return
        acl = self.acl.acls.get(destination)
        owner = acl.owner if acl is not None else None
        name = user.name if user is not None else "anonymous"
        if owner is None or owner != name:
            raise AccessDenied(f"user '{name}' may not {what} {destination}: only its owner"
                               f"{' ' + repr(owner) if owner else ''} or an administrator may",
                               user=name, destination=destination, permission=what)

    def internal_queue(self, name: str, config: QueueConfig | None = None) -> MessageQueue:
        """A queue only the broker uses (a cluster outbox): stored and recovered like any other, but no
        client can name it."""
        queue = self.internal.get(name)
        if queue is None:
            config = config or QueueConfig(max_deliveries=0, dead_letter=False)
            queue = MessageQueue(self, "/queue/" + name, "/queue/" + name, kind="internal", config=config)
            self.internal[name] = queue
        return queue

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            dest.check_name(name, "/topic/" + name)
            topic = self.topics[name] = Topic(self, name)
        return topic

    def create_temp_queue(self, session, local: str) -> MessageQueue:
        global_name = f"tmp.{session.id}.{local}"
        queue = MessageQueue(self, "/temp-queue/" + global_name, "/temp-queue/" + global_name,
                             kind="temp", durable=False)
        queue.owner = session
        self.temp_queues[global_name] = queue
        return queue

    def delete_temp_queue(self, queue: MessageQueue) -> None:
        self.temp_queues.pop(queue.name[len("/temp-queue/"):], None)
        for consumer in list(queue.consumers):
            queue.remove_consumer(consumer)
        queue.purge()

    def _temp_target(self, session, name: str) -> MessageQueue:
        if name.startswith("tmp."):
            queue = self.temp_queues.get(name)
            if queue is None:
                raise UnknownDestination(f"temporary queue '/temp-queue/{name}' does not exist "
                                         f"(its connection has closed)", destination="/temp-queue/" + name)
            return queue
        return session.temp_queue(name)

    # -- sending -------------------------------------------------------------------------------
    def send(self, session, request: SendRequest) -> SendResult:
        """Route one SEND; the result says the id the message got (None for a dropped duplicate) and
        whether it wrote data a receipt must wait for."""
        # one unpacking instead of a descriptor lookup per field: this runs once per SEND
        (destination, properties, _, _, _, _, _, _, _, _, _, _, dedup_id, forwarded, subscription) = request
        kind, name = self.resolve(destination)
        if forwarded is not None:
            if session is not None and not session.is_cluster:
                raise AccessDenied("only cluster nodes may send forwarded messages",
                                   user=getattr(session.user, "name", "anonymous"), destination=destination,
                                   permission="forward")
            if self.cluster is not None:
                self.cluster.on_forwarded()
        if dedup_id is not None and self._is_duplicate(destination, dedup_id):
            self.duplicates += 1
            return (None, False)
        reply_to = properties.get("reply-to")
        if reply_to is not None and reply_to.startswith("/temp-queue/"):
            local = reply_to[len("/temp-queue/"):]
            if not local.startswith("tmp."):
                properties = dict(properties)
                properties["reply-to"] = session.temp_queue(local).destination
                request = request._replace(properties=properties)
        if kind is dest.Kind.TOPIC and forwarded is not None and subscription is not None:
            # a handed-over durable subscription's message: straight into that subscription
            sub = self.find_subscription(subscription)
            if sub is None:
                raise UnknownDestination(f"no durable subscription {subscription!r} here")
            message = self._new_message(session, request, sub.topic.destination)
            return (message.message_id, self._enqueue(sub.queue, message))
        if kind is dest.Kind.QUEUE:
            queue = self.queues.get(name) or self.get_queue(name)
            self.authorize(session, queue.destination, "produce")
            if self.cluster is not None and forwarded is None:
                target = self.cluster.route_queue(queue, properties)
                if target is not None:
                    if queue.schema is not None:
                        queue.schema.check(properties, queue.destination)
                    message = self._new_message(session, request, queue.destination, queue.config)
                    stored = self.cluster.move_to_outbox(message, target) and message.persistent
                    return (message.message_id, stored)
            if queue.schema is not None:
                queue.schema.check(properties, queue.destination)
            cfg = queue.config
            if cfg.max_depth and queue.depth >= cfg.max_depth:
                if cfg.overflow == "reject":
                    raise QueueFull(f"queue '{queue.destination}' is full ({cfg.max_depth} messages); "
                                    f"the message was refused", destination=queue.destination)
                if cfg.overflow == "drop-oldest":
                    queue.drop_oldest()
            message = self._new_message(session, request, queue.destination, cfg)
            stored = self._enqueue(queue, message)
            if cfg.max_depth and cfg.overflow == "block" and queue.depth >= cfg.max_depth \
                    and session is not None:
                queue.block_producer(session)
            return (message.message_id, stored)
        if kind is dest.Kind.TOPIC:
            topic = self.topics.get(name) or self.get_topic(name)
            self.authorize(session, topic.destination, "produce")
            message = self._new_message(session, request, topic.destination)
            stored = self.publish(topic, message, forwarded=forwarded is not None)
            return (message.message_id, stored)
        queue = self._temp_target(session, name)
        message = self._new_message(session, request, queue.destination)
        return (message.message_id, self._enqueue(queue, message))

    def _message_id(self, key: int) -> str:
        return f"ID:{self.node_id}-{key}"

    def next_message_id(self) -> str:
        """The id the next message this broker accepts will get (a cluster routing on message ids
        picks the node before the message is built: spec/routing.md §2.3)."""
        return self._message_id(self.seqs.peek(""))

    def _new_message(self, session, request: SendRequest, destination: str,
                     config: QueueConfig | None = None) -> BrokerMessage:
        key = self.seqs.next("")
        message_id = self._message_id(key)
        extra = {} if config is None else {"default_priority": config.default_priority,
                                           "default_ttl": config.default_expiration_ms}
        message = message_from_request(request, key=key, message_id=message_id,
                                       seq=self.seqs.next(destination), destination=destination,
                                       default_persistent=self.config.default_persistent,
                                       producer=session.id if session is not None else "", **extra)
        if session is not None:
            message.client_id = session.client_id
            message.user = session.user.name if session.user is not None else None
        return message

    def _enqueue(self, queue: MessageQueue, message: BrokerMessage) -> bool:
        log = self.log_for(queue.destination)
        refs = [queue.name] if queue.durable else []
        if log is not None:
            refs.append(log.name)
        stored = self.store.hold(message, refs)
        self._held(message)
        if log is not None:
            log.append(message, stored)
        queue.enqueue(message, stored=stored and queue.durable)
        return stored and message.persistent

    def publish(self, topic: Topic, message: BrokerMessage, forwarded: bool = False) -> bool:
        topic.published += 1
        targets = topic.targets(message)
        log = self.log_for(topic.destination)
        outboxes = self.cluster.topic_outboxes(topic, message) \
            if self.cluster is not None and not forwarded else ()
        if not targets and log is None and not outboxes:
            self.dropped_no_subscriber += 1
            if forwarded and self.cluster is not None:
                self.cluster.discarded_false_positive += 1    # a peer's bloom filter matched wrongly
            return False
        durable = [sub.queue.name for sub in targets if sub.durable]
        if log is not None:
            durable.append(log.name)
        durable.extend(o.name for o in outboxes)
        stored = self.store.hold(message, durable)
        for outbox in outboxes:
            outbox.enqueue(message, stored=stored)
        self._held(message)
        if log is not None:
            log.append(message, stored)
        topic.delivered += len(targets)
        for sub in targets:
            sub.queue.enqueue(message, stored=stored and sub.durable)
        return stored and message.persistent

    # -- retention and duplicate detection (spec/stomp.md §9) ------------------------------------
    def log_for(self, destination: str) -> RetainedLog | None:
        try:
            return self._log_checked[destination]
        except KeyError:
            pass
        log = None
        for pattern, settings in self.config.retention.items():
            if pattern == destination or fnmatch.fnmatchcase(destination, pattern):
                settings = settings or {}
                log = RetainedLog(self, destination, int(settings.get("ms", 0) or 0),
                                  int(settings.get("messages", 0) or 0))
                self.logs[destination] = log
                break
        self._log_checked[destination] = log
        return log

    def _is_duplicate(self, destination: str, dedup_id: str) -> bool:
        window = self.dedup.get(destination)
        if window is None:
            window = self.dedup[destination] = OrderedDict()
        now = self.now_ms()
        while window:                                   # forget ids older than the window
            first = next(iter(window.values()))
            if first > now and len(window) <= self.config.dedup_max_ids:
                break
            window.popitem(last=False)
        if dedup_id in window:
            return True
        window[dedup_id] = now + self.config.dedup_window_ms
        return False

    def bounds(self, destination: str, queue: MessageQueue | None, use_log: bool = True) -> tuple[int, int]:
        """(earliest available sequence, latest assigned sequence) of a destination's log or queue."""
        latest = self.seqs.peek(destination) - 1
        log = self.logs.get(destination) if use_log else None
        if log is not None and len(log):
            return log.earliest, latest
        if log is None and queue is not None:
            seqs = [e.message.seq for e in queue.ready]
            if seqs:
                return min(seqs), latest
        return latest + 1, latest

    def ack_upto(self, session, request: AckUptoRequest) -> None:
        """Complete every ready message below ``request.upto`` in a queue or durable subscription."""
        queue = self._range_queue(session, request.destination, request.durable_name, request.shared)
        if queue is None:
            raise UnknownDestination(f"nothing to acknowledge on {request.destination!r}: "
                                     f"give a queue, or a topic with durable-subscription-name")
        self.authorize(session, queue.destination, "consume")
        done = [e for e in queue.ready if e.message.seq < request.upto]
        queue.remove_ready(done)

    def _range_queue(self, session, destination: str, durable_name: str | None,
                     shared: bool) -> MessageQueue | None:
        kind, name = self.resolve(destination)
        if kind is dest.Kind.QUEUE:
            return self.get_queue(name)
        if kind is dest.Kind.TOPIC:
            if not durable_name:
                return None
            owner = session.client_id or (session.user.name if session.user else "anonymous")
            key = f"sub:{'shared' if shared else owner}:{durable_name}"
            topic = self.get_topic(name)
            sub = topic.subscriptions.get(key)
            if sub is None:
                # a reader that owns a durable subscription may create it by reading it first
                sub = self._create_durable(topic, key, None, False, owner, shared, durable_name)
            return sub.queue
        return None

    def _held(self, message: BrokerMessage) -> None:
        self.held_bytes += message.size
        if not self.memory_high and self.held_bytes > self.config.max_memory:
            self.memory_high = True
            log.warning("message memory above %d bytes: pausing producers", self.config.max_memory)

    def message_gone(self, message: BrokerMessage) -> None:
        """The last entry of ``message`` finished (acked, expired, dead-lettered or purged)."""
        self.store.forget(message)
        self.held_bytes -= message.size
        if self.memory_high and self.held_bytes < self.config.max_memory * 0.8:
            self.memory_high = False
            log.info("message memory back under %d bytes: resuming producers", self.config.max_memory)
            # resume from the loop, not from inside the dispatch/ack that freed the memory
            self.runtime.call_later(0, self._resume_producers)

    def _resume_producers(self) -> None:
        blocked, self._blocked = self._blocked, set()
        for session in blocked:
            if self.memory_high:
                self._blocked.add(session)
            else:
                session.resume_input("memory")

    def block_producer(self, session) -> None:
        """Producer flow control: stop taking frames from a producer while message memory is high.
        Only connections that SEND are paused, so consumers keep acknowledging and memory drains."""
        if session not in self._blocked:
            self._blocked.add(session)
            session.pause_input("memory")

    # -- dead letters and expiry ---------------------------------------------------------------
    def dead_letter(self, entry, reason: str) -> None:
        """A message at its delivery maximum: to ``<prefix><queue>``, kept for the queue's
        ``dead_retention_ms`` (then purged by housekeeping), or dropped when dead-lettering is off."""
        queue = entry.queue
        cfg = queue.config
        if not cfg.dead_letter:
            log.info("dropping message %s from %s: %s", entry.message.message_id, queue.name, reason)
            return
        if queue.kind == "subscription":
            base = queue.name.replace(":", ".")
        else:
            base = queue.destination.split("/", 2)[2]
        expires = self.now_ms() + cfg.dead_retention_ms if cfg.dead_retention_ms else 0
        self._move(entry, cfg.dead_letter_prefix + base, "pymq-dead-letter-reason", reason, expires)

    def on_expired(self, entry) -> None:
        """An expired message leaves its queue: counted, and moved to the expiry queue if one is set
        (never from a dead-letter or the expiry queue itself: their expiry is the retention purge)."""
        self.expired += 1
        target = self.config.expiry_queue
        queue = entry.queue
        if not target or queue.destination == "/queue/" + target or \
                queue.destination.startswith("/queue/" + self.config.queue_defaults.dead_letter_prefix):
            return
        self._move(entry, target, "pymq-expiry-reason", "expired", 0)

    def _move(self, entry, queue_name: str, reason_header: str, reason: str, expires: int) -> None:
        original = entry.message
        target = self.get_queue(queue_name, create=True)
        headers = dict(original.headers)
        headers["pymq-original-destination"] = original.destination
        headers["pymq-original-message-id"] = original.message_id
        headers[reason_header] = reason
        headers["JMSXDeliveryCount"] = str(entry.deliveries)
        headers["expires"] = str(expires)
        key = self.seqs.next("")
        copy = BrokerMessage(key, f"ID:{self.node_id}-{key}", target.destination,
                             self.seqs.next(target.destination), headers, original.body,
                             original.persistent, original.priority, original.timestamp, expires, 0,
                             original.producer)
        self._enqueue(target, copy)

    # -- subscriptions -------------------------------------------------------------------------
    def compile_selector(self, text: str | None):
        if text is None or not text.strip():
            return None
        if self.selector_compiler is None:
            try:
                from pymq.selector import compile_selector
            except ImportError:
                raise InvalidSelector("selectors are not available in this build", position=0,
                                      expected="no selector") from None
            limits = self.config.selector_limits()
            self.selector_compiler = lambda text: compile_selector(text, limits=limits)
        return self.selector_compiler(text)

    def subscribe(self, session, request: SubscribeRequest) -> Consumer | None:
        destination = request.destination
        sub_id = request.id
        kind, name = self.resolve(destination)
        selector = self.compile_selector(request.selector)
        if request.browse is not None:
            self._browse(session, request.browse, selector)
            return None
        ack = request.ack
        prefetch = request.prefetch
        if prefetch is None:
            prefetch = self.config.default_prefetch if ack != AUTO else 0
        if kind is dest.Kind.QUEUE or kind is dest.Kind.TEMP_QUEUE:
            if kind is dest.Kind.QUEUE:
                queue = self.get_queue(name)
            else:
                if name.startswith("tmp."):
                    queue = self.temp_queues.get(name)
                    if queue is None or queue.owner is not session:
                        raise AccessDenied(f"only the connection that created temporary queue "
                                           f"'{destination}' may consume from it",
                                           destination=destination)
                else:
                    queue = session.temp_queue(name)
            self.authorize(session, queue.destination, "consume")
            return Consumer(session, sub_id, queue, ack, prefetch, selector, destination=destination)
        topic = self.get_topic(name)
        self.authorize(session, topic.destination, "consume")
        no_local = request.no_local
        durable_name = request.durable_name
        shared_name = request.shared_name
        if durable_name:
            owner = session.client_id or (session.user.name if session.user else "anonymous")
            shared = request.shared
            key = f"sub:{'shared' if shared else owner}:{durable_name}"
            sub = topic.subscriptions.get(key)
            if sub is not None and (_selector_text(sub.selector) != _selector_text(selector)
                                    or sub.no_local != no_local):
                if sub.queue.consumers:
                    raise IllegalStateError(f"durable subscription {durable_name!r} is in use; it cannot "
                                            f"change its selector while a consumer is active")
                self._drop_subscription(topic, sub)   # JMS: a new selector means a new subscription
                sub = None
            if sub is None:
                sub = self._create_durable(topic, key, selector, no_local, owner, shared, durable_name)
            elif sub.queue.consumers and not sub.shared:
                raise IllegalStateError(f"durable subscription {durable_name!r} already has an active "
                                        f"consumer (use a shared subscription for several)",
                                        subscription=durable_name)
            return Consumer(session, sub_id, sub.queue, ack, prefetch, None, subscription=sub,
                            destination=destination)
        if shared_name:
            key = f"shared:{shared_name}"
            sub = topic.subscriptions.get(key)
            if sub is None:
                queue = MessageQueue(self, key, topic.destination, kind="subscription", durable=False)
                sub = TopicSubscription(topic, key, queue, selector, no_local, session.id, shared=True)
                topic.add(sub)
                if self.cluster is not None:
                    self.cluster.topic_changed(topic)
            return Consumer(session, sub_id, sub.queue, ack, prefetch, None, subscription=sub,
                            destination=destination)
        key = f"{session.id}:{sub_id}"
        queue = MessageQueue(self, key, topic.destination, kind="subscription", durable=False)
        sub = TopicSubscription(topic, key, queue, selector, no_local, session.id)
        topic.add(sub)
        if self.cluster is not None:
            self.cluster.topic_changed(topic)
        return Consumer(session, sub_id, queue, ack, prefetch, None, subscription=sub,
                        destination=destination)

    def _create_durable(self, topic: Topic, key: str, selector, no_local: bool, owner: str,
                        shared: bool, name: str, persist: bool = True) -> TopicSubscription:
        queue = MessageQueue(self, key, topic.destination, kind="subscription", durable=True)
        sub = TopicSubscription(topic, key, queue, selector, no_local, None, durable=True, shared=shared,
                                client_id=owner)
        topic.add(sub)
        self.subscription_queues[key] = queue
        if self.cluster is not None:
            self.cluster.topic_changed(topic)
            self.cluster.durable_created(key)
        if persist:
            record = {"topic": topic.name, "selector": _selector_text(selector), "no_local": no_local,
                      "owner": owner, "shared": shared, "name": name}
            self.store.put_meta("dsub:" + key, json.dumps(record).encode())
        return sub

    def _drop_subscription(self, topic: Topic, sub: TopicSubscription) -> None:
        topic.remove(sub.name)
        for consumer in list(sub.queue.consumers):
            sub.queue.remove_consumer(consumer)
        sub.queue.purge()
        if sub.durable:
            self.subscription_queues.pop(sub.name, None)
            self.store.put_meta("dsub:" + sub.name, None)
        if self.cluster is not None:
            self.cluster.topic_changed(topic)
            if sub.durable:
                self.cluster.durable_removed(sub.name)

    # -- durable subscriptions moving between nodes (spec/cluster.md §6) -------------------------
    def find_subscription(self, key: str) -> TopicSubscription | None:
        queue = self.subscription_queues.get(key)
        if queue is None:
            return None
        for topic in self.topics.values():
            sub = topic.subscriptions.get(key)
            if sub is not None:
                return sub
        return None

    def durable_record(self, sub: TopicSubscription) -> dict:
        return {"topic": sub.topic.name, "selector": _selector_text(sub.selector), "no_local": sub.no_local,
                "owner": sub.client_id, "shared": sub.shared, "name": sub.name.split(":", 2)[2]}

    def adopt_durable(self, record: dict) -> TopicSubscription:
        """Host a durable subscription another node handed over (no-op when already here)."""
        key = record["key"]
        sub = self.find_subscription(key)
        if sub is not None:
            return sub
        topic = self.get_topic(record["topic"])
        return self._create_durable(topic, key, self.compile_selector(record.get("selector")),
                                    record.get("no_local", False), record["owner"], record.get("shared", False),
                                    record["name"])

    def copy_for_subscription(self, message: BrokerMessage, key: str) -> BrokerMessage:
        """A copy of ``message`` addressed to durable subscription ``key`` on another node."""
        headers = dict(message.headers)
        headers["pymq-subscription"] = key
        new_key = self.seqs.next("")
        return BrokerMessage(new_key, f"ID:{self.node_id}-{new_key}", message.destination, message.seq, headers,
                             message.body, message.persistent, message.priority, message.timestamp,
                             message.expires, message.deliver_at, message.producer)

    def consumer_added(self, session, consumer: Consumer) -> None:
        if self.cluster is not None:
            self.cluster.queue_consumers_changed(consumer.queue)

    def consumer_removed(self, session, consumer: Consumer) -> None:
        if self.cluster is not None:
            self.cluster.queue_consumers_changed(consumer.queue)
        sub = consumer.subscription
        if sub is None:
            return
        if not sub.durable and not consumer.queue.consumers:
            # a non-durable subscription ends with its last consumer
            self._drop_subscription(sub.topic, sub)

    def unsubscribe_durable(self, session, consumer: Consumer) -> None:
        sub = consumer.subscription
        if sub is None or not sub.durable:
            return
        if sub.queue.consumers:
            raise IllegalStateError(f"durable subscription {sub.name!r} still has active consumers")
        self._drop_subscription(sub.topic, sub)

    def remove_durable(self, session, durable_name: str, shared: bool = False) -> None:
        """Delete a durable subscription by name (JMS Session.unsubscribe)."""
        owner = session.client_id or (session.user.name if session.user else "anonymous")
        key = f"sub:{'shared' if shared else owner}:{durable_name}"
        for topic in self.topics.values():
            sub = topic.subscriptions.get(key)
            if sub is not None:
                if sub.queue.consumers:
                    raise IllegalStateError(f"durable subscription {durable_name!r} still has active "
                                            f"consumers")
                self._drop_subscription(topic, sub)
                return
        raise UnknownDestination(f"no durable subscription named {durable_name!r}")

    def _browse(self, session, request: RangeRequest, selector) -> None:
        """Browse without removing (spec/stomp.md §9): ActiveMQ-style whole-queue browsing, or a
        range of sequence numbers from a retained log, a queue or a durable subscription.  Each
        message once with ``browser:true``, then a ``browser:end`` marker with the bounds."""
        destination = request.destination
        sub_id = request.id
        kind, name = self.resolve(destination)
        # a durable subscription, or source:queue, reads the live queue even when a log exists (a
        # consuming reader acknowledges the queue: its ranges must come from the same place)
        use_log = request.source != "queue" and not request.durable_name
        log = self.log_for(destination) if use_log else None
        queue = None
        if log is None:
            if kind is dest.Kind.QUEUE:
                queue = self.get_queue(name)
            elif kind is dest.Kind.TEMP_QUEUE:
                queue = self.temp_queues.get(name) if name.startswith("tmp.") else session.temp_queue(name)
                if queue is None or queue.owner is not session:
                    raise AccessDenied(f"only the connection that created temporary queue "
                                       f"'{destination}' may browse it", destination=destination)
            else:
                queue = self._range_queue(session, destination, request.durable_name, request.shared)
        self.authorize(session, destination, "browse")
        from_seq = request.from_seq
        to_seq = request.to_seq
        max_messages = request.max_messages
        max_bytes = request.max_bytes
        from_ts = request.from_timestamp
        ranged = request.ranged
        if log is not None:
            candidates = log.range(from_seq or 0, to_seq)
        elif queue is None:
            candidates = iter(())
        else:
            entries = [e.message for e in queue.ready]
            if ranged:
                # ranges follow sequence numbers; whole-queue browsing follows delivery order
                entries.sort(key=lambda m: m.seq)
                entries = [m for m in entries if (from_seq is None or m.seq >= from_seq)
                           and (to_seq is None or m.seq < to_seq)]
            candidates = iter(entries)
        earliest, latest = self.bounds(destination, queue, use_log=log is not None)
        session.run_browse(self._browse_cursor(session, sub_id, destination, request, selector, log,
                                               candidates, earliest, latest))

    def _browse_cursor(self, session, sub_id: str, destination: str, request: RangeRequest, selector, log,
                       candidates, earliest: int, latest: int):
        """The messages of one browse, written while the connection's outgoing buffer has room: the
        generator yields when the transport says the buffer is full and the session resumes it when it
        drains (a browse of a whole queue never holds more than ``write_buffer_high`` in the broker).
        A log is read again from the next sequence number after each pause: it may have been trimmed
        meanwhile, and a range of it is only valid until the loop runs something else."""
        from_seq, to_seq = request.from_seq, request.to_seq
        max_messages, max_bytes, from_ts = request.max_messages, request.max_bytes, request.from_timestamp
        count = sent_bytes = 0
        next_seq = None
        exhausted = True
        candidates = iter(candidates)
        while True:
            if not session.writable:
                yield
                if session.closed:
                    return
                if log is not None and next_seq is not None:
                    candidates = log.range(next_seq, to_seq)
                continue
            message = next(candidates, None)
            if message is None:
                break
            if max_messages is not None and count >= max_messages:
                exhausted = False
                break
            if max_bytes is not None and count and sent_bytes >= max_bytes:
                exhausted = False
                break
            next_seq = message.seq + 1
            if message.expired(self.now_ms()) or (from_ts is not None and message.timestamp < from_ts):
                continue
            if selector is not None and not selector.matches(message.selector_values()):
                continue
            session.send_browse(sub_id, message)
            count += 1
            sent_bytes += message.size
        if exhausted:
            # the whole range was read: continue after it, but never past what exists yet
            end = latest + 1 if to_seq is None else min(to_seq, latest + 1)
            next_seq = max(next_seq or 0, end, from_seq or 0)
        elif next_seq is None:
            next_seq = from_seq if from_seq is not None else earliest
        session.send_frame("MESSAGE", {
            "subscription": sub_id, "destination": destination, "message-id": "browser-end",
            "browser": "end", "pymq-earliest-seq": str(earliest), "pymq-latest-seq": str(latest),
            "pymq-next-seq": str(next_seq), "pymq-count": str(count)})

    # -- access control (the queues issue refines this) -------------------------------------------
    def authorize(self, session, destination: str, permission: str) -> None:
        """AccessDenied unless the session's user holds ``permission`` on ``destination``."""
        if session is None:
            return  # the broker itself (dead letters, claims from application transactions)
        if destination.startswith("/temp-queue/"):
            return  # only the creating connection consumes (checked on subscribe); replies are open
        self.acl.check(session.user, destination, permission)

    # -- recovery ------------------------------------------------------------------------------
    def recover(self) -> int:
        """Rebuild catalog state and queues from storage; returns the number of messages recovered."""
        reserved: dict[str, int] = {}
        durable: list[tuple[str, dict]] = []
        for key, value in self.store.iter_meta():
            if key.startswith("seq:"):
                reserved[key[4:]] = int(value)
            elif key.startswith("dsub:"):
                durable.append((key[5:], json.loads(value)))
            elif key.startswith("queue:"):
                record = json.loads(value)
                name = key[6:]
                queue, _ = self.declare_queue(name, record["config"], None, persist=False)
                self.acl.acls[queue.destination] = DestinationAcl.from_dict(record.get("acl") or {})
                self.declared[name] = record
            elif key.startswith("acl:"):
                self.acl.acls[key[4:]] = DestinationAcl.from_dict(json.loads(value))
        self.seqs.load(reserved)
        for key, record in durable:
            topic = self.get_topic(record["topic"])
            selector = self.compile_selector(record.get("selector"))
            self._create_durable(topic, key, selector, record.get("no_local", False), record["owner"],
                                 record.get("shared", False), record["name"], persist=False)
        return self.recover_messages(self.store.recover())

    def recover_device(self, device) -> int:
        """A device that could not be opened at start-up is open now: its messages join their queues."""
        count = self.recover_messages((device, stored, refs) for stored, refs in device.recover())
        log.warning("recovered %d persistent messages from holding device %s", count, device.name)
        return count

    def recover_messages(self, records) -> int:
        """Put recovered (device, StoredMessage, queues) back in their queues; returns how many."""
        count = 0
        for device, stored, refs in records:
            message = decode_stored(stored)
            message.device = device
            self.seqs.observe("", stored.key)
            self.seqs.observe(stored.destination, stored.seq)
            self.held_bytes += message.size
            dedup_id = first_alias(message.headers, "dedup-id")
            if dedup_id is not None:
                self._is_duplicate(message.destination, dedup_id)
            for ref in refs:
                if ref.startswith("log:"):
                    retained = self.log_for(ref[4:])
                    if retained is None:
                        retained = self.logs[ref[4:]] = RetainedLog(self, ref[4:])
                        self._log_checked[ref[4:]] = retained
                    retained.append(message, True)
                    continue
                queue = self._queue_for_ref(ref)
                if queue is None:
                    log.warning("recovered message %s references unknown queue %r; keeping it in "
                                "/queue/%s", message.message_id, ref, "recovered")
                    queue = self.get_queue("recovered", create=True)
                    device.add_reference(stored.key, queue.name)
                    device.remove(stored.key, ref)
                queue.enqueue(message, stored=True)
            count += 1
        return count

    def _queue_for_ref(self, ref: str) -> MessageQueue | None:
        if ref.startswith("/queue/$"):
            return self.internal_queue(ref[len("/queue/"):])
        if ref.startswith("/queue/"):
            return self.get_queue(ref[len("/queue/"):], create=True)
        return self.subscription_queues.get(ref)

    # -- housekeeping --------------------------------------------------------------------------
    def housekeeping(self) -> None:
        """The daemon of seed 001: expired messages out (never delivered), acquired messages past their
        delivery timeout back to ready, dead messages past their retention purged (their expiry), logs
        trimmed.  Each queue reads only what is due, from heaps: no scans."""
        now = self.now_ms()
        clock = self.clock()
        for log in list(self.logs.values()):
            log.trim(now)
        for queue in list(self.all_queues()):
            queue.expire_ready(now)
            queue.reclaim_timed_out(clock)

    def all_queues(self):
        yield from self.queues.values()
        yield from self.internal.values()
        for topic in self.topics.values():
            for sub in topic.subscriptions.values():
                yield sub.queue
        yield from self.temp_queues.values()


def _selector_text(selector) -> str | None:
    return None if selector is None else selector.text


def rule_context_of(message: BrokerMessage) -> dict:
    """The storage-rule context (spec/storage_rules.md §2) of a message."""
    from pymq.selector import rule_context
    ctype = message.headers.get("content-type", "")
    if ctype.startswith("application/x-pymq-map") or message.headers.get("transformation") == "jms-map-json":
        body_type = "MAP"
    elif ctype.startswith("text/") or not ctype:
        body_type = "TEXT" if ctype or _is_text(message.body) else "BYTES"
    else:
        body_type = "BYTES"
    dest_type = "TOPIC" if message.destination.startswith("/topic/") else "QUEUE"
    return rule_context(size_bytes=message.size, body_type=body_type, headers=message.headers,
                        destination=message.destination, destination_type=dest_type,
                        client_id=message.client_id, priority=message.priority,
                        persistent=message.persistent, producer=message.user)


def _is_text(body: bytes) -> bool:
    try:
        body.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def encode_stored(message: BrokerMessage) -> bytes:
    """A message's storage form: its MESSAGE frame (spec/stomp.md framing), plus deliver-at."""
    headers = message.frame_headers()
    if message.deliver_at:
        headers["pymq-deliver-at"] = str(message.deliver_at)
    return encode_frame("MESSAGE", headers, message.body, "1.2")


def decode_stored(stored) -> BrokerMessage:
    scanner = FrameScanner(max_frame_size=len(stored.data) + 1, version="1.2")
    frames = scanner.feed(stored.data)
    if len(frames) != 1:
        raise StorageError(f"stored message {stored.key} does not decode to one frame")
    h = dict(frames[0].headers)
    body = frames[0].body
    message_id = h.pop("message-id")
    h.pop("destination", None)
    h.pop("pymq-seq", None)
    h.pop("content-length", None)
    deliver_at = int(h.pop("pymq-deliver-at", "0"))
    return BrokerMessage(stored.key, message_id, stored.destination, stored.seq, h, body,
                         stored.persistent, int(h.get("priority", 4)), int(h.get("timestamp", 0)),
                         int(h.get("expires", 0)), deliver_at)
