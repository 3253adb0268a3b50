"""The one placement path: every way a message enters a queue goes through :meth:`Placement.place`.

spec/placement.md is the table of entry paths and the rules each applies; :data:`RULES` is that table in
code, and tests/broker/test_placement.py checks one against the other by sending a message down every
path with every rule set up to bite. The rules, in the order they apply:

1. **duplicates** (look-up) — a message whose dedup id reached the destination within the window is
   dropped before anything else can count it;
2. **schema** — the queue's declared properties; a refusal changes nothing;
3. **cluster routing** — a queue message of a group another node owns goes to that node's outbox
   (and the rest is that node's business: no local depth, no local log); a topic message also goes to
   the outboxes of peers whose filters may want it;
4. **depth / overflow** — a full queue refuses the message (``reject``), makes room (``drop-oldest``),
   or takes it and pauses the producer (``block``);
5. **queue defaults** — priority and time to live when the producer set none: the message is built now,
   with its key, id and sequence number;
6. **duplicates** (remember) — only an accepted message's id enters the window, so a SEND refused by
   rules 2–4 may be retried with the same id;
7. **retained log** — the destination's log keeps a reference;
8. **store** — the holding store places the message (a device chosen by the storage rules) with one
   reference per durable queue, the log and each outbox; then every queue gets its entry.

Rules 1–5 decide and refuse without changing anything; rules 6–8 take effect together, the store's write
first, so a device that refuses the message (a full disk) still leaves no trace. A bulk SEND's rows
(:meth:`Placement.place_bulk`, spec/spark.md §7) go through the same rules in the same order, applied to
the frame as a whole and column-wise: every row is checked before any is numbered, and a topic's rows
that only its log keeps become one sealed segment and one stored record, with no per-message object.
Placement is split in two for the application-transaction path: :meth:`Placement.plan` decides (no side
effect except numbering), :meth:`Placement.commit` acts. Claiming a message written in an application's
transaction plans it inside the database transaction that claims it, and commits after that
transaction commits, with the message already written by the device (apptx.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Union
from collections.abc import Mapping

from pymq import enums
from pymq_server.broker.bulk_placement import BulkPlacement
from pymq_server.broker.bulk_rows import BulkResult
from pymq_server.broker.clients import Client
from pymq_server.broker.dedup import DuplicateWindow
from pymq_server.broker.flow import MemoryFlow
from pymq_server.broker.log import RetainedLog, RetainedLogs
from pymq_server.broker.membership import STANDALONE, ClusterMembership
from pymq_server.broker.message import BrokerMessage, message_from_request
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.requests import SendRequest, SendResult
from pymq_server.broker.sequences import SequenceBook
from pymq_server.broker.topic import Topic
from pymq_server.config import BrokerConfig, QueueConfig
from pymq_server.storage.store import HoldingStore

from pymq.errors import QueueFull

if TYPE_CHECKING:
    from pymq_server.storage.device import HoldingDevice


class Rule(enums.Enum):
    DEDUP = "duplicates"
    SCHEMA = "schema"
    ROUTING = "cluster routing"
    DEPTH = "depth/overflow"
    DEFAULTS = "queue defaults"
    RETAINED_LOG = "retained log"
    STORE = "store"


class EntryPath(enums.Enum):
    SEND = "SEND to a queue"
    PUBLISH = "SEND to a topic"
    CLUSTER_INBOUND = "cluster inbound"
    APP_TRANSACTION = "application transaction"
    DEAD_LETTER = "dead letter"
    EXPIRY = "expiry"
    REDISTRIBUTION = "redistribution"
    HANDOVER = "hand-over"
    REROUTE = "re-route"
    BULK_QUEUE = "bulk SEND to a queue"
    BULK_TOPIC = "bulk SEND to a topic"


_ALL = frozenset(Rule)
#: every entry path and the rules it applies (spec/placement.md holds the same table, with the reasons)
RULES: Final[Mapping[EntryPath, frozenset[Rule]]] = {
    EntryPath.SEND: _ALL,
    # a topic has no queue settings: no schema, depth or queue defaults (its subscriptions share one message)
    EntryPath.PUBLISH: frozenset({Rule.DEDUP, Rule.ROUTING, Rule.RETAINED_LOG, Rule.STORE}),
    # a forwarded message is never forwarded again; the rest holds as for a local SEND
    EntryPath.CLUSTER_INBOUND: _ALL - {Rule.ROUTING},
    EntryPath.APP_TRANSACTION: _ALL,
    # a message that dies or expires is kept, never refused: only the log and the store apply
    EntryPath.DEAD_LETTER: frozenset({Rule.RETAINED_LOG, Rule.STORE}),
    EntryPath.EXPIRY: frozenset({Rule.RETAINED_LOG, Rule.STORE}),
    # moves between nodes of a message this node accepted: the target is chosen by the cluster node
    EntryPath.REDISTRIBUTION: frozenset({Rule.STORE}),
    EntryPath.HANDOVER: frozenset({Rule.STORE}),
    EntryPath.REROUTE: frozenset({Rule.STORE}),
    # a frame of rows (spec/spark.md §7): the rules of a SEND to the same target, to the frame as a whole
    EntryPath.BULK_QUEUE: _ALL,
    EntryPath.BULK_TOPIC: frozenset({Rule.DEDUP, Rule.ROUTING, Rule.RETAINED_LOG, Rule.STORE}),
}


class _Policy:
    """RULES[path] as attributes: read once per message on the hot path."""

    __slots__ = ("path", "dedup", "schema", "routing", "depth", "defaults", "log")

    def __init__(self, path: EntryPath, rules: frozenset[Rule]) -> None:
        self.path = path
        self.dedup = Rule.DEDUP in rules
        self.schema = Rule.SCHEMA in rules
        self.routing = Rule.ROUTING in rules
        self.depth = Rule.DEPTH in rules
        self.defaults = Rule.DEFAULTS in rules
        self.log = Rule.RETAINED_LOG in rules


#: what :meth:`Placement.plan` decided: (path, message, queues, outboxes, log, queue to make room in,
#: queue whose producer to pause when full, dedup id to remember, destination)
Plan = tuple[EntryPath, BrokerMessage, list[MessageQueue], list[MessageQueue], RetainedLog | None,
             MessageQueue | None, MessageQueue | None, str | None, str]
Target = Union[MessageQueue, Topic]
Source = Union[SendRequest, BrokerMessage]


class Placement(BulkPlacement):
    def __init__(self, config: BrokerConfig, store: HoldingStore, seqs: SequenceBook, logs: RetainedLogs,
                 dedup: DuplicateWindow, flow: MemoryFlow) -> None:
        self.node_id = config.node_id
        self.default_persistent = config.default_persistent
        self.store = store
        self.seqs = seqs
        self.logs = logs
        self.dedup = dedup
        self.flow = flow
        self.cluster: ClusterMembership = STANDALONE
        self.policies = {path: _Policy(path, rules) for path, rules in RULES.items()}
        self.dropped_no_subscriber = 0

    def place(self, path: EntryPath, target: Target, source: Source, client: Client | None = None) -> SendResult:
        """Put ``source`` (a SEND's request, or a message that exists: moved or copied) where it belongs
        under ``target``, applying the rules of ``path``: (message id, stored data a receipt waits for)."""
        plan = self.plan(path, target, source, client)
        if plan is None:
            return (None, False)
        return self.commit(plan, client)

    def plan(self, path: EntryPath, target: Target, source: Source, client: Client | None) -> Plan | None:
        """Decide where a message goes (rules 1–5); None for a duplicate. Raises what refuses it."""
        policy = self.policies[path]
        destination = target.destination
        request: SendRequest | None
        if isinstance(source, BrokerMessage):
            message: BrokerMessage | None = source
            request = None
            properties = source.headers
            dedup_id = None
        else:
            message = None
            request = source
            properties = source[1]
            dedup_id = source[12] if policy.dedup else None
            if dedup_id is not None and self.dedup.seen(destination, dedup_id):
                return None
        drop_from: MessageQueue | None = None
        block: MessageQueue | None = None
        outboxes: list[MessageQueue] = []
        if isinstance(target, Topic):
            if message is None:
                assert request is not None
                message = self._build(request, destination, None, client)
            queues = [sub.queue for sub in target.targets(message)]
            if policy.routing and self.cluster.active and not target.temporary:
                outboxes = self.cluster.topic_outboxes(target, message)
            log = self.logs.get(destination) if policy.log else None
            return (path, message, queues, outboxes, log, None, None, dedup_id, destination)
        queue = target
        if policy.schema and queue.schema is not None:
            queue.schema.check(properties, destination)
        peer = None
        if policy.routing and queue.kind == "queue" and self.cluster.active:
            peer = self.cluster.route_queue(queue, properties)
        if peer is not None:
            queues = [self.cluster.outbox(peer)]
            log = None
        else:
            queues = [queue]
            cfg = queue.config
            if policy.depth and cfg.max_depth:
                # a message that replaces a waiting one (last-value queue) makes the queue no deeper
                if queue.depth >= cfg.max_depth and not (queue.last_values is not None
                                                         and queue.last_values.replaces(properties)):
                    if cfg.overflow == "reject":
                        raise QueueFull(f"queue '{destination}' is full ({cfg.max_depth} messages); the "
                                        f"message was refused", destination=destination)
                    if cfg.overflow == "drop-oldest":
                        drop_from = queue
                if cfg.overflow == "block":
                    block = queue
            log = self.logs.get(destination) if policy.log else None
        if message is None:
            assert request is not None
            message = self._build(request, destination, queue.config if policy.defaults else None, client)
        return (path, message, queues, outboxes, log, drop_from, block, dedup_id, destination)

    def admit(self, path: EntryPath, queue: MessageQueue | None, config: QueueConfig, schema: object,
              destination: str, properties: Mapping[str, str], dedup_id: str | None, ahead: int) -> bool:
        """Would rules 1, 2 and 4 take this message? Raises what would refuse it, changes nothing (a
        transaction's COMMIT asks for every SEND before applying any: transactions.py). ``queue`` None:
        a queue the SEND would create, with ``config``; ``ahead``: messages earlier operations of the same
        transaction add first. False: a duplicate, which adds nothing. In a cluster the depth is this
        node's (a message routed to a peer would not count): stricter than the SEND, never looser."""
        policy = self.policies[path]
        if policy.dedup and dedup_id is not None and self.dedup.seen(destination, dedup_id):
            return False
        if policy.schema and schema is not None:
            schema.check(properties, destination)  # type: ignore[attr-defined]
        if policy.depth and config.max_depth and config.overflow == "reject":
            depth = (queue.depth if queue is not None else 0) + ahead
            if depth >= config.max_depth:
                raise QueueFull(f"queue '{destination}' is full ({config.max_depth} messages); the "
                                f"message was refused", destination=destination)
        return True

    def commit(self, plan: Plan, client: Client | None, stored_by: HoldingDevice | None = None) -> SendResult:
        """Act on a plan (rules 6–8). The store goes first, so that a device refusing the message (a
        full disk: StorageError) leaves everything as it was; then room is made (drop-oldest), the id
        remembered, the log and the queues get it. ``stored_by``: the device that already wrote the
        message with its references (a claimed application-transaction message)."""
        path, message, queues, outboxes, log, drop_from, block, dedup_id, destination = plan
        if not queues and not outboxes and log is None:
            # a topic message nobody wants: nothing holds it
            self.dropped_no_subscriber += 1
            if path is EntryPath.CLUSTER_INBOUND:
                self.cluster.discarded_forwarded()
            return (message.message_id, False)
        # the store first: a device that refuses the message (a full disk) raises before anything changed
        if stored_by is not None:
            message.device = stored_by
            message.chosen = stored_by.name
            self.store.adopt(message)
            stored = True
            held = True
        elif message.device is None:
            # a new message, or a copy: placed on a device with one reference per queue that keeps it
            refs = [q.name for q in queues if q.durable]
            if log is not None:
                refs.append(log.name)
            for outbox in outboxes:
                refs.append(outbox.name)
            stored = self.store.hold(message, refs)
            held = True
        else:
            # a message this broker holds already, moved: one more reference (none when heap-held)
            stored = held = False
            for queue in queues:
                stored = self.store.add_reference(message, queue.name)
        if held:
            self.flow.held(message)
        if drop_from is not None:
            drop_from.drop_oldest()
        if dedup_id is not None:
            self.dedup.remember(destination, dedup_id)
        if log is not None:
            log.append(message, stored)
        for outbox in outboxes:
            outbox.enqueue(message, stored=stored)
        sole = len(queues) == 1 and not outboxes and log is None     # paging it out frees its memory
        for queue in queues:
            queue.enqueue(message, stored=stored and queue.durable, sole=sole)
        if block is not None and client is not None and block.depth >= block.config.max_depth:
            block.block_producer(client)
        return (message.message_id, stored and message.persistent)

    def place_bulk(self, target: Target, batch: Any, body: bytes, client: Client | None) -> BulkResult:
        """Put a bulk SEND's rows (``batch``, read and checked by bulk_rows.read_bulk; ``body`` the frame's
        IPC stream) under ``target`` with the rules of its bulk path (bulk_placement.py)."""
        path = EntryPath.BULK_TOPIC if isinstance(target, Topic) else EntryPath.BULK_QUEUE
        return self.place_rows(path, self.policies[path], target, batch, body, client)

    def _build(self, request: SendRequest, destination: str, config: QueueConfig | None,
               client: Client | None) -> BrokerMessage:
        """The message for a SEND, with its key, id and sequence number, and ``config``'s defaults."""
        seqs = self.seqs
        key = seqs.next("")
        if config is None:
            message = message_from_request(request, key=key, message_id=f"ID:{self.node_id}-{key}",
                                           seq=seqs.next(destination), destination=destination,
                                           default_persistent=self.default_persistent,
                                           producer=client.id if client is not None else "")
        else:
            message = message_from_request(request, key=key, message_id=f"ID:{self.node_id}-{key}",
                                           seq=seqs.next(destination), destination=destination,
                                           default_persistent=self.default_persistent,
                                           producer=client.id if client is not None else "",
                                           default_priority=config.default_priority,
                                           default_ttl=config.default_expiration_ms)
        if client is not None:
            message.client_id = client.client_id
            message.user = client.user.name
        return message
