"""Layer 3, the router: the ways a message enters, each handing it to the one placement path.

* :meth:`Router.send` — a client's SEND to a queue, a topic or a temporary queue, and a peer's forwarded
  message (cluster inbound, including a handed-over durable subscription's messages);
* :meth:`Router.send_bulk` — a client's bulk SEND (rows in one Arrow frame, spec/spark.md §7) to a queue
  or a topic;
* :meth:`Router.dead_letter`, :meth:`Router.on_expired` — a message at its delivery maximum, or expired,
  moves (as a copy that says where it came from) to its dead-letter or the expiry queue;
* :meth:`Router.redistribute`, :meth:`Router.hand_over`, :meth:`Router.reroute` — moves the cluster node
  decides (spec/cluster.md §4–§6);
* :meth:`Router.plan_pending`, :meth:`Router.commit_pending` — a message an application wrote in its own
  database transaction (apptx.py).

What each path applies is spec/placement.md; placement.py applies it.

Depends on: destinations (layer 1), subscriptions (layer 2), placement.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from pymq_server.broker import bulk_rows
from pymq_server.broker.bulk_rows import BulkResult
from pymq_server.broker import vhosts
from pymq_server.broker.clients import Client, own_reply_to
from pymq_server.broker.deadletters import dead_letter_name
from pymq_server.broker.destinations import Destinations, Kind
from pymq_server.broker.forwarded import SUBSCRIPTION
from pymq_server.broker.membership import STANDALONE, ClusterMembership
from pymq_server.broker.message import BrokerMessage
from pymq_server.broker.placement import EntryPath, Placement, Plan, Target
from pymq_server.broker.placement_rules import Ahead, Prospect, stored_references
from pymq_server.broker.queue import Entry
from pymq_server.broker.routes import MAX_NAME, MAX_ROUTES, Routes
from pymq_server.broker.requests import BulkSendRequest, SendRequest, SendResult, parse_send
from pymq_server.schema import MessageSchema
from pymq_server.broker.stored_form import stored_message
from pymq_server.broker.subscriptions import Subscriptions
from pymq_server.broker.topic import Topic
from pymq_server.config import BrokerConfig, QueueConfig
from pymq_server.storage.device import HoldingDevice, StoredMessage

from pymq.errors import AccessDenied, DestinationError, PymqError, UnknownDestination
from pymq.protocol.scanner import FrameScanner

log = logging.getLogger("pymq.broker")

#: what the claim of one pending row decided: its plan, or None (discarded), and the topic it counts for
PendingPlan = tuple[Plan, Topic | None]


class Route(NamedTuple):
    """What the entry rules decided for a client's SENDs to one destination (kept in its Routes)."""

    path: EntryPath
    target: Target
    topic: Topic | None             # the target when it is a topic (its published count)


class Router:
    def __init__(self, config: BrokerConfig, destinations: Destinations, subscriptions: Subscriptions,
                 placement: Placement, now_ms: Callable[[], int]) -> None:
        self.config = config
        self.now_ms = now_ms
        self.destinations = destinations
        self.generation = destinations.generation         # a client's kept routes are valid while it stands
        self.subscriptions = subscriptions
        self.placement = placement
        self.cluster: ClusterMembership = STANDALONE
        self.expired = 0

    # -- SEND and cluster inbound -------------------------------------------------------------------
    def send(self, client: Client | None, request: SendRequest, admitted: bool = False) -> SendResult:
        """Route one SEND: (the id the message got, None for a dropped duplicate; whether it stored data
        a receipt must wait for).  ``client`` None: the broker itself re-sends (the admin's move and
        retry, server/admin/messages.py), which checked permissions already. ``admitted``: a COMMIT's
        SEND, checked with the rest of its transaction by :meth:`admit`.

        A client's SEND takes the route its connection's earlier SEND to the same destination was given,
        while nothing it depends on has changed (routes.py); otherwise the entry rules decide it here and
        the connection keeps the outcome. A peer's forwarded message is :meth:`_inbound`'s."""
        if request.forwarded is not None and client is not None:
            return self._inbound(client, request, admitted)
        routes = None
        route: Route | None = None
        if client is not None:
            routes = client.routes
            if routes.generation != self.generation.value:
                routes.renew(self.generation.value)
            route = routes.get(request.destination)
        if route is None:
            route = self._route(client, request, routes, request.destination)
        reply_to = request.properties.get("reply-to")
        if reply_to is not None and client is not None and reply_to.startswith(("/temp-queue/", "/temp-topic/")):
            # a connection's own temporary queue or topic, named so that others can reply to it
            # (spec/stomp.md §3)
            own = own_reply_to(client, reply_to)
            if own is not None:
                properties = dict(request.properties)
                properties["reply-to"] = own
                request = request._replace(properties=properties)
        result = self.placement.place(route.path, route.target, request, client, admitted)
        if route.topic is not None:
            route.topic.published += 1
        return result

    def _inbound(self, client: Client, request: SendRequest, admitted: bool) -> SendResult:
        """A peer's forwarded message (spec/cluster.md §3), on its link's connection. The link keeps its
        routes like any connection, under keys of their own (a 1-tuple: never a client SEND's), so that a
        non-forwarded SEND on the same connection never takes a forwarded one's path; a handed-over durable
        subscription's copy (``pymq-subscription``) goes where it is addressed and keeps no route. A topic
        message that nothing here would hold (a filter's false positive, or any topic message in broadcast
        mode) is dropped before a message is built (placement.holds_nothing). The cluster's headers were taken
        out of the request as it was parsed (forwarded.split): it carries the message's own id and crossing.
        The reply-to of a forwarded message is global already (made so on its first node, :meth:`send`); a
        link has no temporary queues of its own."""
        routes = client.routes
        if routes.generation != self.generation.value:
            routes.renew(self.generation.value)
        destination = request.destination
        key = (destination,)
        subscription = request.subscription
        route = routes.get(key) if subscription is None else None
        if route is None:
            route = self._route(client, request, routes if subscription is None else None, key)
        self.cluster.on_forwarded(client)          # refuses a fenced former process's link (spec/ha.md §5)
        topic = route.topic
        placement = self.placement
        if topic is not None and placement.holds_nothing(route.path, topic):
            topic.published += 1
            return placement.unheld(route.path, request.message_id)
        # the message it was on its first node: its id and crossing were taken out as it was parsed (forwarded.py)
        result = placement.place(route.path, route.target, request, client, admitted)
        if topic is not None:
            topic.published += 1
        return result

    def _route(self, client: Client | None, request: SendRequest, routes: Routes | None,
               key: str | tuple[str]) -> Route:
        """The entry rules' outcome for a SEND whose connection keeps none for its destination (a client's,
        or a peer's forward, :meth:`_inbound`): the name resolved, a pattern refused, the rules of the
        entry, its target (made on first use: after the rules, so that a refused SEND creates nothing), kept
        in ``routes`` under ``key`` when the name is short enough."""
        kind, name = self.destinations.resolve(request.destination)
        if kind is Kind.TOPIC:
            self.destinations.check_publishable(name)   # a pattern is refused before anything is made
        path = self._entry(client, request, kind)
        target = self._target(client, request, kind, name, path, create=True)
        assert target is not None and not isinstance(target, Prospect)
        route = Route(path, target, target if isinstance(target, Topic) else None)
        if routes is not None and len(request.destination) <= MAX_NAME:
            if len(routes) >= MAX_ROUTES or routes.generation != self.generation.value:
                routes.renew(self.generation.value)     # (made something: the generation moved)
            routes[key] = route
        return route

    def admit(self, client: Client, request: SendRequest, unit: dict[str, Ahead]) -> None:
        """Everything :meth:`send` would refuse this SEND for, checked without creating or numbering
        anything (a transaction validates every operation before applying one: transactions.py): the
        same entry rules, then placement's rules as a dry run. ``unit`` holds what the earlier SENDs of
        the transaction add to each destination, and grows with this one."""
        kind, name = self.destinations.resolve(request.destination)
        if kind is Kind.TOPIC:
            self.destinations.check_publishable(name)   # a pattern is refused before anything is made
        path = self._entry(client, request, kind)
        target = self._target(client, request, kind, name, path, create=False)
        if target is None:
            return                      # a destination use would make, and no rule refuses a message to it
        ahead = unit.get(target.destination)
        if ahead is None:
            ahead = unit[target.destination] = Ahead()
        self.placement.admit(path, target, request, ahead)

    def _entry(self, client: Client | None, request: SendRequest, kind: Kind) -> EntryPath:
        """The rules of the entry, before placement: who may send a forwarded message, the ``produce``
        permission; the entry path the SEND takes."""
        forwarded = request.forwarded
        if forwarded is not None and client is not None:
            if not client.is_cluster:
                raise AccessDenied("only cluster nodes may send forwarded messages", user=client.user.name,
                                   destination=request.destination, permission="forward")
        else:
            forwarded = None
        if client is not None and kind is not Kind.TEMP_QUEUE and kind is not Kind.TEMP_TOPIC:
            # first: a refused SEND creates nothing (no queue or topic by use, no reply-to temporary queue)
            self.destinations.acl.check(client.user, request.destination, "produce")
        if forwarded is not None:
            return EntryPath.CLUSTER_INBOUND
        return EntryPath.PUBLISH if kind is Kind.TOPIC or kind is Kind.TEMP_TOPIC else EntryPath.SEND

    def _target(self, client: Client | None, request: SendRequest, kind: Kind, name: str, path: EntryPath,
                create: bool) -> Target | Prospect | None:
        """Where a SEND goes. ``create`` False (a COMMIT's check): nothing is made — a queue use would
        create is a Prospect, a topic or temporary topic use would make is None (nothing refuses a
        message to it) — and what :meth:`send` would refuse for is raised the same."""
        destinations = self.destinations
        if kind is Kind.QUEUE:
            queue = destinations.queues.get(name)
            if queue is not None:
                return queue
            if create:
                return destinations.queue(name)
            destinations.check_creatable(name)
            return self._prospect("/queue/" + name, destinations.configured(name), name)
        if kind is Kind.TOPIC:
            subscription = request.subscription
            if path is EntryPath.CLUSTER_INBOUND and subscription is not None:
                # a handed-over durable subscription's message: straight into that subscription
                sub = self.subscriptions.find(subscription)
                if sub is None:
                    raise UnknownDestination(f"no durable subscription {subscription!r} here")
                return sub.queue
            topic = destinations.topics.get(name)
            if topic is None and create:
                topic = destinations.topic(name)
            return topic
        if kind is Kind.TEMP_TOPIC:
            if create or name.startswith("tmp.") or client is None:
                return destinations.temp_topic_target(client, name)
            return client.temp_topic(name, create=False)     # one's own: made on first use
        if client is None and not name.startswith("tmp."):
            raise UnknownDestination(f"temporary queue '{request.destination}' belongs to a connection",
                                     destination=request.destination)
        if create or name.startswith("tmp."):
            return destinations.temp_target(client, name)  # type: ignore[arg-type]
        assert client is not None
        own = client.temp_queue(name, create=False)         # one's own: made on first use
        return own if own is not None else self._prospect(request.destination, self.config.queue_defaults, name)

    @staticmethod
    def _prospect(destination: str, config: QueueConfig, name: str) -> Prospect:
        schema = MessageSchema.from_dict(config.schema, f"queue {name}") if config.schema else None
        return Prospect(destination, config, schema)

    def send_bulk(self, client: Client, request: BulkSendRequest) -> BulkResult:
        """A bulk SEND: its rows read and checked column by column, then placed as a unit (spec/spark.md §7)."""
        destinations = self.destinations
        kind, name = destinations.resolve(request.destination)
        # the rows read and checked, and the permission, before the queue or topic is created by this use:
        # a refused bulk SEND creates nothing
        batch = bulk_rows.read_bulk(request.body, max_bytes=self.config.max_frame_size)
        if kind is Kind.QUEUE:
            target: Target = destinations.queue_for(client.user, name, "produce")
        elif kind is Kind.TOPIC:
            target = destinations.topic_for(client.user, name, "produce")
        else:
            raise DestinationError(f"a bulk SEND goes to a queue or a topic, not {request.destination!r}")
        result = self.placement.place_bulk(target, batch, request.body, client)
        if isinstance(target, Topic):
            target.published += result.count
        return result

    # -- dead letters and expiry ---------------------------------------------------------------------
    def dead_letter(self, entry: Entry, reason: str) -> None:
        """A message at its delivery maximum: to ``<prefix><queue>``, kept for the queue's
        ``dead_retention_ms`` (then purged by housekeeping), or dropped when dead-lettering is off."""
        queue = entry.queue
        cfg = queue.config
        if queue.kind == "queue":
            name = queue.destination[len("/queue/"):]
            where = "to " + dead_letter_name(name, cfg.dead_letter_prefix) if cfg.dead_letter else "dropped"
            self.destinations.queue_logs.event(
                name, f"message {entry.message.message_id} after {entry.deliveries} deliveries: {where} ({reason})")
        if not cfg.dead_letter:
            log.info("dropping message %s from %s: %s", entry.message.message_id, queue.name, reason)
            return
        if queue.kind == "subscription":
            # 'sub:<owner>:<name>'; in a vhost the owner is '<vhost>/<owner>' and the queue goes inside it
            vh = vhosts.split(queue.destination.split("/", 2)[2])[0]
            base = queue.name.replace(":", ".")
            if vh:
                base = vh + "sub." + base.removeprefix(f"sub.{vh[len(vhosts.PREFIX):-1]}/")
        else:
            base = queue.destination.split("/", 2)[2]
        expires = self.now_ms() + cfg.dead_retention_ms if cfg.dead_retention_ms else 0
        self._move(EntryPath.DEAD_LETTER, entry, dead_letter_name(base, cfg.dead_letter_prefix),
                   "pymq-dead-letter-reason", reason, expires)

    def on_expired(self, entry: Entry) -> None:
        """An expired message leaves its queue: counted, and moved to the expiry queue if one is set
        (never from a dead-letter or the expiry queue itself: their expiry is the retention purge)."""
        self.expired += 1
        target = self.config.expiry_queue
        queue = entry.queue
        if queue.kind == "queue":
            self.destinations.queue_logs.event(queue.destination[len("/queue/"):],
                                               f"message {entry.message.message_id} expired"
                                               f"{' (to ' + target + ')' if target else ''}")
        vh, local = vhosts.split(queue.destination.split("/", 2)[2])     # a vhost's expiry queue is its own
        if not target or local == target or local.startswith(self.config.queue_defaults.dead_letter_prefix):
            return
        self._move(EntryPath.EXPIRY, entry, vh + target, "pymq-expiry-reason", "expired", 0)

    def _move(self, path: EntryPath, entry: Entry, queue_name: str, reason_header: str, reason: str,
              expires: int) -> None:
        original = entry.message
        target = self.destinations.queue(queue_name, create=True)
        headers = dict(original.headers)
        headers["pymq-original-destination"] = vhosts.outside(original.destination)   # as its vhost names it
        headers["pymq-original-message-id"] = original.message_id
        headers[reason_header] = reason
        headers["JMSXDeliveryCount"] = str(entry.deliveries)
        headers["expires"] = str(expires)
        copy = self._copy(original, target.destination, headers, expires)
        self.placement.place(path, target, copy)

    def _copy(self, original: BrokerMessage, destination: str, headers: dict, expires: int) -> BrokerMessage:
        """A new message (own key, id and sequence number) with ``original``'s body and fields, due now."""
        seqs = self.placement.seqs
        key = seqs.next("")
        return BrokerMessage(key, f"{self.placement.id_prefix}{key}", destination, seqs.next(destination), headers,
                             original.body, original.persistent, original.priority, original.timestamp, expires, 0,
                             original.producer)

    # -- moves the cluster node decides (spec/cluster.md) ----------------------------------------------
    def redistribute(self, message: BrokerMessage, peer: str) -> None:
        """A queue message with no local consumer, to a peer that has one (§4)."""
        self.placement.place(EntryPath.REDISTRIBUTION, self.cluster.outbox(peer), message)

    def hand_over(self, message: BrokerMessage, subscription: str, peer: str) -> None:
        """A durable subscription's message, as a copy addressed to the subscription, to the node that
        hosts it now (§5, §6): ``peer``'s outbox, or the subscription's queue when ``peer`` is this node.
        The copy is the same message (its id, timestamp and headers: forwarded.py) under a key of its own."""
        headers = dict(message.headers)
        if peer == self.config.node_id:
            sub = self.subscriptions.find(subscription)
            if sub is None:
                raise UnknownDestination(f"no durable subscription {subscription!r} here")
            target = sub.queue
        else:
            headers[SUBSCRIPTION] = subscription        # where it goes on the peer (taken out there)
            target = self.cluster.outbox(peer)
        copy = BrokerMessage(self.placement.seqs.next(""), message.message_id, message.destination, message.seq,
                             headers, message.body, message.persistent, message.priority, message.timestamp,
                             message.expires, message.deliver_at, message.producer)
        self.placement.place(EntryPath.HANDOVER, target, copy)

    def reroute(self, message: BrokerMessage, peer: str | None) -> None:
        """A dead peer's queue message, to where routing says now: ``peer``'s outbox, or (None) its local
        queue (§5)."""
        if peer is None:
            _, name = self.destinations.resolve(message.destination)
            target = self.destinations.queue(name, create=True)
        else:
            target = self.cluster.outbox(peer)
        self.placement.place(EntryPath.REROUTE, target, message)

    # -- messages from applications' database transactions (apptx.py) -------------------------------------
    def plan_pending(self, destination: str, data: bytes, batch: set[tuple[str, str]]) -> PendingPlan | None:
        """Inside the claiming database transaction: the plan for a pending SEND frame (None: a
        duplicate), or PymqError saying why it cannot be placed (it is then discarded: its transaction
        has committed).  ``batch``: the (destination, dedup id) pairs planned earlier in the same claim,
        which the window learns only when the claim commits."""
        frames = FrameScanner(max_frame_size=len(data) + 1, version="1.2").feed(data)
        if len(frames) != 1 or frames[0].command != "SEND":
            raise PymqError("not exactly one SEND frame")
        headers = dict(frames[0].headers)
        headers["destination"] = destination
        request = parse_send(headers, frames[0].body)
        if request.forwarded is not None:
            # (a peer's header: parsed as one, it would give the message an id of the writer's choosing)
            raise PymqError("pymq-forwarded is a cluster node's header, not an application's")
        kind, name = self.destinations.resolve(destination)
        if kind is Kind.TEMP_QUEUE or kind is Kind.TEMP_TOPIC:
            raise PymqError("temporary queues and topics cannot receive messages from database transactions")
        if kind is Kind.TOPIC:
            self.destinations.check_publishable(name)
        topic = self.destinations.topic(name) if kind is Kind.TOPIC else None
        target: Target = topic if topic is not None else self.destinations.queue(name)
        if request.dedup_id is not None:
            seen = (target.destination, request.dedup_id)
            if seen in batch:
                return None
            batch.add(seen)
        plan = self.placement.plan(EntryPath.APP_TRANSACTION, target, request, None)
        return None if plan is None else (plan, topic)

    @staticmethod
    def pending_write(plan: Plan) -> tuple[StoredMessage, list[str]] | None:
        """What the device writes in the claiming transaction: the message and its references (None:
        nothing keeps it — only non-durable subscribers, or nobody)."""
        refs = stored_references(plan.queues, plan.log, plan.outboxes)
        return (stored_message(plan.message), refs) if refs else None

    def commit_pending(self, pending: PendingPlan, device: HoldingDevice | None) -> None:
        """After the claiming transaction committed: the message enters its queues (``device``: the
        device that wrote it; None when nothing stores it)."""
        plan, topic = pending
        if device is None:
            self.placement.commit(plan, None)
        else:
            self.placement.commit(plan, None, stored_by=device)
        if topic is not None:
            topic.published += 1
