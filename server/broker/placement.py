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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union

from pymq_server.broker.bulk_placement import BulkPlacement
from pymq_server.broker import placement_rules as rules
from pymq_server.broker.placement_rules import RULES, EntryPath, Plan, Rule, new_plan, policies
from pymq_server.broker.bulk_rows import BulkResult
from pymq_server.broker.clients import Client
from pymq_server.broker.dedup import DedupJournal, DuplicateWindow
from pymq_server.broker.flow import MemoryFlow
from pymq_server.broker.log import RetainedLogs
from pymq_server.broker.membership import STANDALONE, ClusterMembership
from pymq_server.broker.message import DEFAULT_PRIORITY, BrokerMessage, message_from_request
from pymq_server.broker.queue import MessageQueue
from pymq_server.broker.requests import SendRequest, SendResult
from pymq_server.broker.sequences import SequenceBook
from pymq_server.broker.topic import Topic
from pymq_server.config import BrokerConfig, QueueConfig
from pymq_server.storage.store import HoldingStore

if TYPE_CHECKING:
    from pymq_server.storage.device import HoldingDevice


Target = Union[MessageQueue, Topic]
Source = Union[SendRequest, BrokerMessage]


__all__ = ["RULES", "EntryPath", "Placement", "Plan", "Rule", "Target"]


class Placement:
    def __init__(self, config: BrokerConfig, store: HoldingStore, seqs: SequenceBook, logs: RetainedLogs,
                 dedup: DuplicateWindow, flow: MemoryFlow) -> None:
        self.node_id = config.node_id
        #: a message's id is this and its key (spec/stomp.md §4): formatted once, read by every place that
        #: names a new message (a SEND's, a dead letter's copy, a bulk SEND's rows, a cluster route by id)
        self.id_prefix = f"ID:{config.node_id}-"
        self.default_persistent = config.default_persistent
        self.store = store
        self.seqs = seqs
        self.logs = logs
        self.dedup = dedup
        self.flow = flow
        self.cluster: ClusterMembership = STANDALONE
        self.policies = policies()
        self.bulk = BulkPlacement(self)
        self.dropped_no_subscriber = 0
        #: the persisted duplicate window (spec/ha.md §3.1), set by the broker
        self.journal: DedupJournal | None = None
        #: high availability (spec/ha.md §3.3): a new persistent message reaches its queues, log and outboxes
        #: only once the barrier its receipt waits for made it durable; ``call_soon`` asks that barrier once a
        #: loop turn for every message placed during it
        self.visible_when_durable = config.ha is not None
        self.call_soon: Callable[[Callable[[], None]], None] | None = None
        self._waiting_durable: list[Callable[[], None]] = []

    def place(self, path: EntryPath, target: Target, source: Source, client: Client | None = None,
              admitted: bool = False) -> SendResult:
        """Put ``source`` (a SEND's request, or a message that exists: moved or copied) where it belongs
        under ``target``, applying the rules of ``path``: (message id, stored data a receipt waits for).
        ``admitted``: a transaction's COMMIT checked it already with the SENDs before it (:meth:`admit`),
        so a full queue does not refuse it now."""
        plan = self.plan(path, target, source, client, admitted)
        if plan is None:
            return (None, False)
        return self.commit(plan, client)

    def plan(self, path: EntryPath, target: Target, source: Source, client: Client | None,
             admitted: bool = False) -> Plan | None:
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
            properties = source.properties
            dedup_id = source.dedup_id if policy.dedup else None
            if dedup_id is not None and rules.duplicate(self.dedup, destination, dedup_id, None):
                return None
        drop_from: MessageQueue | None = None
        block: MessageQueue | None = None
        outboxes: list[MessageQueue] = []
        if isinstance(target, Topic):
            matched = target.matched()
            if message is None:
                assert request is not None
                if matched:
                    self.pattern_floor(target, 1)
                message = self._build(request, destination, None, client)
            queues = [sub.queue for sub in target.targets(message, matched)]
            if policy.routing and self.cluster.active and not target.temporary:
                outboxes = self.cluster.topic_outboxes(target, message)
            log = self.logs.get(destination) if policy.log else None
            return new_plan((path, message, queues, outboxes, log, None, None, dedup_id, destination))
        queue = target
        if policy.schema and queue.schema is not None:
            rules.check_schema(queue.schema, destination, (properties,))
        peer = None
        if self.cluster.active and policy.routing and queue.kind == "queue":    # (standalone: one test)
            # the id the message is given below (nothing numbers keys in between): a queue routing on
            # message ids routes by the id its consumers see (spec/routing.md §2.3)
            peer = self.cluster.route_queue(queue, properties, f"{self.id_prefix}{self.seqs.peek('')}")
        if peer is not None:
            queues = [self.cluster.outbox(peer)]
            log = None
        else:
            queues = [queue]
            cfg = queue.config
            if policy.depth and cfg.max_depth:
                grows = rules.growing(queue, (properties,), None)[0]
                if not admitted:
                    rules.check_depth(queue, grows, None)
                if cfg.overflow == "drop-oldest":
                    drop_from = queue
                elif cfg.overflow == "block":
                    block = queue
            log = self.logs.get(destination) if policy.log else None
        if message is None:
            assert request is not None
            message = self._build(request, destination, queue.config if policy.defaults else None, client)
        return new_plan((path, message, queues, outboxes, log, drop_from, block, dedup_id, destination))

    def admit(self, path: EntryPath, target: Target | rules.Prospect, request: SendRequest,
              ahead: rules.Ahead) -> None:
        """Rules 1, 2 and 4 of :meth:`plan` for ``request`` as a dry run: raises what would refuse it,
        changes nothing but ``ahead`` (what the SENDs of a transaction add to ``target`` before the next
        one: a COMMIT asks for every SEND before applying any, transactions.py). ``target``: a Prospect for
        a queue the SEND would create. In a cluster the depth is this node's (a message routed to a peer
        would not count): stricter than the SEND, never looser."""
        policy = self.policies[path]
        destination = target.destination
        dedup_id = request.dedup_id if policy.dedup else None
        if dedup_id is not None and rules.duplicate(self.dedup, destination, dedup_id, ahead):
            return                      # a duplicate adds nothing
        row = request.properties
        grows = True
        if not isinstance(target, Topic):
            if policy.schema and target.schema is not None:
                rules.check_schema(target.schema, destination, (row,))
            if policy.depth and target.config.max_depth:
                grows = rules.growing(target, (row,), ahead)[0]
                rules.check_depth(target, grows, ahead)
            rules.note(ahead, target, row, grows, dedup_id)
        elif dedup_id is not None:
            ahead.ids.add(dedup_id)

    def holds_nothing(self, path: EntryPath, topic: Topic) -> bool:
        """Nothing here would hold a message on ``topic`` by ``path``, known before the message is built:
        no subscription of the topic's own or of a pattern topic matching it (rule 1's queues), no peer it
        goes on to (rule 2's outboxes), no retained log (rule 3). With subscriptions whose selectors all
        refuse it, :meth:`commit` finds the same after :meth:`plan` (those need the message)."""
        if topic.subscriptions or topic.matched():
            return False
        policy = self.policies[path]
        if policy.routing and self.cluster.active and not topic.temporary:
            return False
        return not policy.log or self.logs.get(topic.destination) is None

    def unheld(self, path: EntryPath, message_id: str | None) -> SendResult:
        """A topic message nobody wants: nothing holds it (counted; on a peer's link, as the false
        positive of its filter: spec/cluster.md §3)."""
        self.dropped_no_subscriber += 1
        if path is EntryPath.CLUSTER_INBOUND:
            self.cluster.discarded_forwarded()
        return (message_id, False)

    def commit(self, plan: Plan, client: Client | None, stored_by: HoldingDevice | None = None) -> SendResult:
        """Act on a plan (rules 6–8). The store goes first, so that a device refusing the message (a
        full disk: StorageError) leaves everything as it was; then room is made (drop-oldest), the id
        remembered, the log and the queues get it. ``stored_by``: the device that already wrote the
        message with its references (a claimed application-transaction message)."""
        path, message, queues, outboxes, log, drop_from, block, dedup_id, destination = plan   # (one step)
        if not queues and not outboxes and log is None:
            return self.unheld(path, message.message_id)
        # the store first: a device that refuses the message (a full disk) raises before anything changed
        if stored_by is not None:
            message.device = stored_by
            message.chosen = stored_by.name
            self.store.adopt(message)
            stored = True
            held = True
        elif message.device is None:
            # a new message, or a copy: placed on a device with one reference per queue that keeps it
            stored = self.store.hold(message, rules.stored_references(queues, log, outboxes))
            held = True
        else:
            # a message this broker holds already, moved: one more reference (none when heap-held)
            stored = held = False
            for queue in queues:
                stored = self.store.add_reference(message, queue.name)
        if held:
            self.flow.held(message)
        if drop_from is not None and rules.must_drop(drop_from, message.headers):
            drop_from.drop_oldest()
        if dedup_id is not None:
            self.dedup.remember(destination, dedup_id)
            if stored and message.persistent and self.journal is not None:
                self.journal.note(destination, dedup_id)
        if self.visible_when_durable and held and stored and message.persistent:     # (the broker's, asked first)
            self._when_durable(lambda: self._enter(message, queues, outboxes, log, stored))
        else:
            self._enter(message, queues, outboxes, log, stored)
        if block is not None and client is not None and rules.must_block(block):
            block.block_producer(client)
        return (message.message_id, stored and message.persistent)

    def _enter(self, message: BrokerMessage, queues: list[MessageQueue], outboxes: list, log: Any,
               stored: bool) -> None:
        """Rule 8's second half: the log, the outboxes and every queue get the placed message.

        A message for several queues is held by the placement (one reference) while it is given to each: a
        subscriber that takes and completes its copy at once (auto-ack) would otherwise drop the message's
        last reference before the next queue has its own, and the message would end once per subscriber
        (its bytes uncounted from the memory flow several times over, the store told to forget it as often)."""
        if log is not None or outboxes:
            if log is not None:
                log.append(message, stored)
            for outbox in outboxes:
                outbox.enqueue(message, stored=stored)
        elif len(queues) == 1:
            queues[0].enqueue(message, stored=stored and queues[0].durable, sole=True)   # paging it frees it
            return
        message.refs += 1               # (not sole: another queue, the log or an outbox holds it too)
        if queues:
            # one reading of the clock for every queue's entry (their host is the broker's, one clock): the
            # same instant, asked once a message rather than once a subscription
            now = queues[0].host.clock()
            for queue in queues:
                queue.enqueue(message, stored=stored and queue.durable, now=now, sole=False)
        message.refs -= 1
        if not message.refs:
            self.flow.message_gone(message)     # every queue's copy was taken and completed already

    def _when_durable(self, enter: Callable[[], None]) -> None:
        """Run ``enter`` once what is written now is durable (spec/ha.md §3.3): one barrier per loop turn."""
        waiting = self._waiting_durable
        if not waiting and self.call_soon is not None:
            self.call_soon(self._durable_barrier)
        waiting.append(enter)
        if self.call_soon is None:
            self._durable_barrier()

    def _durable_barrier(self) -> None:
        batch, self._waiting_durable = self._waiting_durable, []
        if not batch:
            return

        def durable(error: BaseException | None) -> None:
            # even when the store could not make them durable (the device is in fault: their receipts say
            # so) the messages are held, and delivered as without high availability
            for enter in batch:
                enter()
        self.store.barrier(durable)

    def place_bulk(self, target: Target, batch: Any, body: bytes, client: Client | None) -> BulkResult:
        """Put a bulk SEND's rows (``batch``, read and checked by bulk_rows.read_bulk; ``body`` the frame's
        IPC stream) under ``target`` with the rules of its bulk path (bulk_placement.py)."""
        path = EntryPath.BULK_TOPIC if isinstance(target, Topic) else EntryPath.BULK_QUEUE
        return self.bulk.place_rows(path, self.policies[path], target, batch, body, client)

    def pattern_floor(self, topic: Topic, count: int) -> None:
        """``topic``'s next ``count`` numbers come after every number a pattern subscription may hold
        (TopicPatterns.clock), and the clock moves past them: a pattern subscription's queue, which holds
        the messages of many topics, stays in publishing order."""
        patterns = topic.patterns
        assert patterns is not None
        if patterns.clock is None:
            patterns.clock = self.seqs.highest("/topic/")
        self.seqs.raise_to(topic.destination, patterns.clock + 1)
        patterns.clock = self.seqs.peek(topic.destination) + count - 1

    def _build(self, request: SendRequest, destination: str, config: QueueConfig | None,
               client: Client | None) -> BrokerMessage:
        """The message for a SEND, with its key, id and sequence number and ``config``'s defaults (a forwarded
        message's id is the one it keeps); each field set once, the producing connection's with the rest."""
        seqs = self.seqs
        key = seqs.next("")
        # a forwarded message keeps the id it was given where it was accepted (forwarded.py)
        message_id = request.message_id or f"{self.id_prefix}{key}"
        if client is None:
            producer, client_id, user = "", None, None
        else:
            producer, client_id, user = client.id, client.client_id, client.user.name
        return message_from_request(request, key=key, message_id=message_id, seq=seqs.next(destination),
                                    destination=destination, default_persistent=self.default_persistent,
                                    default_priority=DEFAULT_PRIORITY if config is None else config.default_priority,
                                    default_ttl=0 if config is None else config.default_expiration_ms,
                                    producer=producer, client_id=client_id, user=user)
