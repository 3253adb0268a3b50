"""Layer 1, destinations: names to queues and topics, and the queues' life — declare, drop, purge.

Owns every queue the broker has: point-to-point queues (created on first use when ``auto_create``, or
declared with settings and an owner, and altered later), topics, temporary queues and topics
(``tmp.<connection>.<name>``, gone with their connection) and internal queues no client can name (cluster
outboxes, ``$``-names). Queues and topics created by use are deleted once idle and empty for
``auto_delete_idle_ms`` (:meth:`Destinations.reclaim_idle`); declared ones never are. Subscription
queues live in their topic; this layer makes them. Declared queues and ACLs are kept in the catalog
(``queue:<name>``, ``acl:<destination>``) and come back at recovery.

Ownership (spec/admin.md, "Ownership and permissions"): a declared queue has its creator as owner; an
auto-created or configured queue and a topic belong to no one, and claiming one needs ``create`` or
``manage`` on it; dead-letter queues and the expiry queue are system-owned, and this layer tells the
access control which queue each dead-letter queue serves (:meth:`Destinations.system_source`). Every
check runs before anything is created: callers reach a destination through :meth:`queue_for` and
:meth:`topic_for`, which authorize first.

Depends on: the building blocks (names, queues, topics, ACLs) and the store's catalog. Nothing here
knows about subscriptions, routing or the cluster.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterator

from pymq_server.broker import destination as names
from pymq_server.broker.acl import AccessControl, DestinationAcl
from pymq_server.broker.auth import User
from pymq_server.broker.deadletters import DEAD_LETTER_CONFIG, DeadLetterNames
from pymq_server.broker.queue import MessageQueue, QueueHost
from pymq_server.broker.idle import IdleWatch
from pymq_server.broker.queue_logs import QueueLogs
from pymq_server.broker.routes import Watched
from pymq_server.schema import MessageSchema
from pymq_server.broker.temporary import Temporaries, TemporaryNames
from pymq_server.broker import vhosts
from pymq_server.broker.topic import Topic, TopicPatterns
from pymq.routing import topics as topic_patterns
from pymq_server.config import BrokerConfig, QueueConfig, queue_config
from pymq_server.storage.store import HoldingStore

from pymq.errors import (ConfigError, DestinationError, DestinationExists, IllegalStateError,
                         UnknownDestination)

Kind = names.Kind
_CACHE_LIMIT = 100_000


class Destinations(Temporaries, DeadLetterNames):
    def __init__(self, config: BrokerConfig, store: HoldingStore, host: QueueHost, acl: AccessControl) -> None:
        self.config = config
        self.store = store
        self.host = host
        self.acl = acl
        #: moves with every change of what a SEND's route depends on (routes.py): names here, access lists
        self.generation = generation = acl.generation
        self.queues: Watched[str, MessageQueue] = Watched(generation)         # "orders" -> queue
        self.topics: Watched[str, Topic] = Watched(generation)
        self.patterns = TopicPatterns()                     # pattern topics with subscriptions (topic.py)
        #: global name "tmp.c1-<nonce>.x" -> queue, topic
        self.temp_queues: Watched[str, MessageQueue] = Watched(generation)
        self.temp_topics: Watched[str, Topic] = Watched(generation)
        #: whose global names are whose, and their re-claim (temporary.py; the broker gives it its clock)
        self.name_holders = TemporaryNames(config.temporary_reclaim_ms, time.monotonic)
        self.incarnation = secrets.token_hex(8)             # temporary.py: for a client driven directly
        #: temporary queues of lost links kept for a re-claim: names -> (generation, local name -> queue)
        self.orphaned: dict[str, tuple[int, dict[str, MessageQueue]]] = {}
        self.orphaned_count = 0
        self._orphan_generation = 0
        self.idle = IdleWatch()                             # auto-delete of what use created
        # one log per queue (seed 001; queue_logs.py)
        self.queue_logs = QueueLogs((config.queue_log_dir or os.path.join(config.data_dir, "queue-logs"))
                                    if config.queue_logs else None, config.queue_log_max_bytes)
        self.internal: dict[str, MessageQueue] = {}        # queues clients cannot address ($cluster.out.*)
        self.declared: dict[str, dict] = {}                # explicitly created queues: name -> catalog record
        self._resolved: dict[str, tuple[names.Kind, str]] = {}
        #: reserved dead-letter names (deadletters.py)
        self.dead_letter_sources: Watched[str, str] = Watched(generation)
        self._not_system: set[str] = set()
        #: durable subscription key with ':' as '.' -> its creator (set by the subscriptions layer), so a
        #: subscription's dead-letter queue ``DLQ.sub.<owner>.<name>`` is readable by its creator only
        self.subscription_creator: Callable[[str], str | None] = lambda dotted: None
        acl.system_source = self.system_source
        self.reserve_configured()

    # -- names ------------------------------------------------------------------------------------
    def resolve(self, destination: str) -> tuple[names.Kind, str]:
        """``"/queue/orders"`` -> (Kind.QUEUE, "orders"), or DestinationError naming what is wrong."""
        resolved = self._resolved.get(destination)
        if resolved is None:
            resolved = names.parse(destination)
            if resolved[1].startswith("$") and not resolved[1].startswith(vhosts.PREFIX):
                # ('$vh.<vhost>.' names are a vhost's own, mapped by its sessions: vhosts.py)
                raise DestinationError(f"destination {destination!r}: names starting with '$' are reserved "
                                       f"for the broker", destination=destination)
            if len(self._resolved) < _CACHE_LIMIT:
                self._resolved[destination] = resolved
        return resolved

    # -- queues ----------------------------------------------------------------------------------
    def queue_for(self, user: User, name: str, permission: str) -> MessageQueue:
        """Queue ``name`` for a client's ``permission``: authorized first, so a refusal creates nothing."""
        self.acl.check(user, "/queue/" + name, permission)
        return self.queues.get(name) or self.queue(name)

    def topic_for(self, user: User, name: str, permission: str) -> Topic:
        """Topic ``name`` for a client's ``permission``, authorized before it is created. A pattern
        (``stocks.*``, spec/routing.md §5) is a topic one subscribes to by its normal form, never one to
        publish to."""
        if permission == "produce":
            self.check_publishable(name)
        elif _may_be_pattern(name):
            name = topic_patterns.normalize(name)
        self.acl.check(user, "/topic/" + name, permission)
        return self.topics.get(name) or self.topic(name)

    @staticmethod
    def check_publishable(name: str) -> None:
        """A message goes to a topic, not to a pattern: DestinationError for ``stocks.*`` and the like."""
        if _may_be_pattern(name) and topic_patterns.is_pattern(name):
            raise DestinationError(f"/topic/{name} is a pattern (a word '*', '#' or '>'): it can be subscribed "
                                   f"to, not published to (spec/routing.md §5)", destination="/topic/" + name)

    def queue(self, name: str, create: bool | None = None) -> MessageQueue:
        """Queue ``name``, created on first use unless auto-creation is off (or ``create`` says)."""
        queue = self.queues.get(name)
        if queue is None:
            self.check_creatable(name, create)
            queue = self.create_queue(name)
        return queue

    def check_creatable(self, name: str, create: bool | None = None) -> None:
        """What :meth:`queue` would refuse to create queue ``name`` for, raised without creating it."""
        if not (self.config.auto_create if create is None else create):
            raise UnknownDestination(f"queue '/queue/{name}' does not exist (auto-creation is off)",
                                     destination="/queue/" + name)
        names.check_name(name, "/queue/" + name)
        if create is None:
            # a client's use makes it: its vhost's max_queues (the broker's own queues, dead-letter and expiry
            # ones, recovery's, pass create=True and are never refused: a dead letter is not lost to a limit)
            vhosts.check_queues(name, self.config.vhosts, self.queues)

    def create_queue(self, name: str, config: QueueConfig | None = None) -> MessageQueue:
        names.check_name(name, "/queue/" + name)
        if config is None:
            config = self._configured(name)
        queue = MessageQueue(self.host, "/queue/" + name, "/queue/" + name, kind="queue", config=config)
        if config.schema:
            queue.schema = MessageSchema.from_dict(config.schema, f"queue {name}")
        self.queues[name] = queue
        return queue

    def configured(self, name: str) -> QueueConfig:
        """The settings queue ``name`` gets when use creates it."""
        return self._configured(name)

    def _configured(self, name: str) -> QueueConfig:
        settings = self.config.queues.get(name)
        if settings:
            return queue_config(settings, f"queue {name}", base=self.config.queue_defaults)
        if (vhosts.split(name)[1].startswith(self.config.queue_defaults.dead_letter_prefix)
                or name in self.dead_letter_sources):
            return DEAD_LETTER_CONFIG           # a dead-letter queue never dead-letters again
        return self.config.queue_defaults

    def declare_queue(self, name: str, settings: dict | None, user: User | None, grants: dict | None = None,
                      persist: bool = True) -> tuple[MessageQueue, bool]:
        """Create queue ``name`` owned by ``user`` (None: the broker itself, at recovery) with ``settings``
        (QueueConfig fields).

        Returns (queue, created).  Declaring an existing declared queue with the same settings is a
        no-op for whoever may see it; with different ones it is a DestinationExists error listing the
        differences.  A queue that exists but was never declared (auto-created by use, configured in the
        YAML) belongs to no one: claiming it needs ``create``/``manage`` on it (or an administrator); the
        claimant becomes its owner and the grants already made on it stay. An auto-created queue takes the
        declared settings; a configured one keeps its configured settings (others are DestinationExists).
        Every refusal comes before anything changes."""
        destination = "/queue/" + name
        names.check_name(name, destination)
        existing = self.queues.get(name)
        record = self.declared.get(name)
        configured = self.config.queues.get(name) is not None
        if existing is not None and configured and record is None and not settings:
            config = existing.config                # a claim of a configured queue: as configured
        else:
            config = queue_config(settings or {}, f"queue {name}", base=self.config.queue_defaults)
        self.check_reserved(name, user)             # another queue's dead-letter queue: never one's own
        if existing is not None and record is not None:
            if user is not None:
                if self.system_source(destination) is not None:
                    self.acl.check_create(user, destination, claim=True)     # administrators only
                self.acl.check_sees(user, destination)
            if settings is not None and existing.config != config:
                diff = "; ".join(existing.config.differences(config))
                raise DestinationExists(f"queue '{destination}' already exists with a different "
                                        f"configuration ({diff})", destination=destination)
            return existing, False
        self.check_dead_letter_name(name, config, user, create_checked=False)    # a taken name: for anyone
        if user is not None:
            self.acl.check_create(user, destination, claim=existing is not None)
        if existing is not None and configured and existing.config != config:
            diff = "; ".join(existing.config.differences(config))
            raise DestinationExists(f"queue '{destination}' is configured by the broker's configuration file "
                                    f"with other settings ({diff})", destination=destination)
        dead_letters = self.check_dead_letter_name(name, config, user)     # and one its declarer may create
        self.acl.checked_grants(grants)                 # a bad principal refuses before the queue exists
        if existing is None and user is not None:
            vhosts.check_queues(name, self.config.vhosts, self.queues)      # (recovery's are never refused)
        if existing is None:
            existing = self.create_queue(name, config)
        else:
            existing.config = config
            existing.schema = MessageSchema.from_dict(config.schema, f"queue {name}") if config.schema else None
        if dead_letters is not None:
            self.reserve_dead_letter_name(name, dead_letters, persist=persist)
        self.acl.own(destination, user.name if user is not None else None, grants, keep=True)
        record = {"config": config.to_dict(), "acl": self.acl.acls[destination].to_dict()}
        self.declared[name] = record
        if persist:
            self.store.put_meta("queue:" + name, json.dumps(record).encode())
            self.store.put_meta("acl:" + destination, None)     # the queue's record holds its ACL now
            self.queue_logs.event(name, f"declared by {user.name if user is not None else 'the broker'}: "
                                        f"{json.dumps(config.to_dict(), sort_keys=True)}")
        return existing, True

    def restore_queue(self, name: str, record: dict) -> None:
        """A declared queue found in the catalog at start: its settings and its ACL as they were (none: an
        altered queue that was created by use follows the default permissions, as before)."""
        queue, _ = self.declare_queue(name, record["config"], None, persist=False)
        if record.get("acl") is None:
            self.acl.forget(queue.destination)
        else:
            self.acl.acls[queue.destination] = DestinationAcl.from_dict(record["acl"])
        self.declared[name] = record
        self.restore_reservation(name, record)

    def alter_queue(self, name: str, settings: dict, user: User) -> tuple[MessageQueue, list[str]]:
        """Change some settings of queue ``name`` (the others keep theirs): its owner, a holder of
        ``manage`` or an administrator, as for dropping it. Returns the queue and the changes
        (``"key: old -> new"``, none when the settings were already so). The queue is declared from now on
        (kept in the catalog, never auto-deleted). Every refusal comes before anything changes."""
        queue = self.queues.get(name)
        if queue is None:
            raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
        self.acl.check_manage(user, queue.destination, "alter")
        if not isinstance(settings, dict):
            raise ConfigError("the settings to alter must be a mapping of queue settings")
        config = queue_config(settings, f"queue {name}", base=queue.config)
        before, after = queue.config.to_dict(), config.to_dict()
        changes = [f"{key}: {before[key]!r} -> {after[key]!r}" for key in after if before[key] != after[key]]
        if not changes:
            return queue, []
        old = queue.config
        if (config.dead_letter, config.dead_letter_prefix) != (old.dead_letter, old.dead_letter_prefix):
            # as at declaration: a free name its changer may create, reserved from now on
            dead_letters = self.check_dead_letter_name(name, config, user)
            if dead_letters is not None:
                self.reserve_dead_letter_name(name, dead_letters, persist=True)
        if config.schema != queue.config.schema:
            queue.schema = MessageSchema.from_dict(config.schema, f"queue {name}") if config.schema else None
        queue.alter(config)
        acl = self.acl.acls.get(queue.destination)
        record = self.declared.get(name) or {"acl": acl.to_dict() if acl is not None else None}
        record["config"] = after
        self.declared[name] = record
        self.store.put_meta("queue:" + name, json.dumps(record).encode())
        self.queue_logs.event(name, f"altered by {user.name}: {'; '.join(changes)}")
        return queue, changes

    def drop_queue(self, name: str, user: User, *, force: bool = False) -> int:
        """Delete a queue and its messages (owner or administrator); refuses while consumers are
        attached unless ``force``.  Returns the number of messages dropped."""
        queue = self.queues.get(name)
        if queue is None:
            raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
        self.acl.check_manage(user, queue.destination, "drop")
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
        self.store.put_meta("acl:" + queue.destination, None)
        self.release_dead_letter_names(name)
        source = self.dead_letter_sources.get(name)
        if source is not None and source in self.queues:
            # its source still names it: emptied, and there again at once (the name stays reserved)
            self.reserve_dead_letter_name(source, name, persist=True)
        self.queue_logs.event(name, f"dropped by {user.name}: {dropped} message(s) with it")
        return dropped

    def purge_queue(self, name: str, user: User) -> int:
        queue = self.queues.get(name)
        if queue is None:
            raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
        self.acl.check(user, queue.destination, "purge")     # consume alone does not empty a queue
        purged = queue.purge()
        self.queue_logs.event(name, f"purged by {user.name}: {purged} message(s)")
        return purged

    def reclaim_idle(self, now_ms: int, keeps_log: Callable[[str], bool]) -> tuple[list[MessageQueue], list[Topic]]:
        """Delete the queues and topics created by use that have been idle and empty for
        ``auto_delete_idle_ms`` (idle.py says which); declared queues, those under ``queues:`` and temporary
        ones never go. Returns what was deleted."""
        queues, topics = self.idle.due(self.queues, self.topics, lambda name: name in self.declared or
                                       name in self.config.queues, keeps_log, now_ms,
                                       self.config.auto_delete_idle_ms)
        return [self.queues.pop(name) for name in queues], [self.topics.pop(name) for name in topics]
    def internal_queue(self, name: str, config: QueueConfig | None = None) -> MessageQueue:
        """A queue only the broker uses (a cluster outbox): stored and recovered like any other, but no
        client can name it."""
        queue = self.internal.get(name)
        if queue is None:
            config = config or QueueConfig(max_deliveries=0, dead_letter=False)
            queue = MessageQueue(self.host, "/queue/" + name, "/queue/" + name, kind="internal", config=config)
            self.internal[name] = queue
        return queue

    # -- permissions -------------------------------------------------------------------------------
    def grantable(self, destination: str) -> str:
        """Temporary queues and topics belong to their connection: no access list to read or change. The
        destination whose access list it is: a topic pattern in its normal form (``stocks.>`` is
        ``stocks.#``)."""
        kind, name = self.resolve(destination)
        if kind is Kind.TEMP_QUEUE or kind is Kind.TEMP_TOPIC:
            raise DestinationError(f"temporary {kind.value.split('-')[1]} '{destination}' belongs to its "
                                   f"connection: it has no permissions", destination=destination)
        if kind is Kind.TOPIC and _may_be_pattern(name):
            return "/topic/" + topic_patterns.normalize(name)
        return destination

    def grant(self, user: User, destination: str, principal: str, permissions: list[str]) -> dict:
        destination = self.grantable(destination)
        acl = self.acl.grant(user, destination, principal, permissions)
        self._persist_acl(destination)
        return acl.to_dict()

    def revoke(self, user: User, destination: str, principal: str, permissions: list[str]) -> dict:
        destination = self.grantable(destination)
        acl = self.acl.revoke(user, destination, principal, permissions)
        self._persist_acl(destination)
        return acl.to_dict()

    def _persist_acl(self, destination: str) -> None:
        kind, name = self.resolve(destination)
        acl = self.acl.acls.get(destination)
        if kind is Kind.QUEUE and name in self.declared and acl is not None:
            self.declared[name]["acl"] = acl.to_dict()
            self.store.put_meta("queue:" + name, json.dumps(self.declared[name]).encode())
        else:
            self.store.put_meta("acl:" + destination, json.dumps(acl.to_dict()).encode() if acl else None)

    # -- topics and subscription queues ------------------------------------------------------------
    def topic(self, name: str) -> Topic:
        """Topic ``name``, made on first use; a pattern's topic under its normal form (``stocks.>`` is
        ``stocks.#``)."""
        topic = self.topics.get(name)
        if topic is None:
            names.check_name(name, "/topic/" + name)
            pattern = _may_be_pattern(name) and topic_patterns.is_pattern(name)
            if pattern:
                name = topic_patterns.normalize(name)
                topic = self.topics.get(name)
                if topic is not None:
                    return topic
            topic = self.topics[name] = Topic(name, patterns=self.patterns, pattern=pattern)
        return topic

    def subscription_queue(self, key: str, topic: Topic, durable: bool) -> MessageQueue:
        """The queue behind a topic subscription (durable ones keep storage references)."""
        return MessageQueue(self.host, key, topic.destination, kind="subscription",
                            config=self.config.queue_defaults, durable=durable)

    # -- everything --------------------------------------------------------------------------------
    def all_queues(self) -> Iterator[MessageQueue]:
        """Every queue the broker holds: queues, internal queues, subscriptions, temporary queues."""
        yield from self.queues.values()
        yield from self.internal.values()
        for topic in self.topics.values():
            for sub in topic.subscriptions.values():
                yield sub.queue
        yield from self.temp_queues.values()
        for topic in self.temp_topics.values():
            for sub in topic.subscriptions.values():
                yield sub.queue


def _may_be_pattern(name: str) -> bool:
    """A cheap first test (most names have none of the three characters) before the word-wise one."""
    return "*" in name or "#" in name or ">" in name
