"""The outboxes: a local queue of messages waiting for each peer (spec/cluster.md §3, §5), and what happens to
them when the peer's link comes and goes, when the peer dies, and when a dead peer's subscription is
adopted elsewhere.

An outbox is a broker-internal queue ``$cluster.out.<peer>`` (stored like any queue, recovered at start)
whose only reader is the link to the peer (link.OutboxConsumer): store and forward with the queue machinery
the broker already has. A dead peer's outbox is sorted: queue messages go where routing says now (their
key's new node, or the local queue), topic messages stay, held for the peer's durable subscribers, until
it returns, its subscriptions are adopted elsewhere, or an administrator purges them.

Invariant: a message leaves an outbox only after its next holder holds its own reference (re-routed or
copied through the core's one placement path first), on the peer's receipt, or by a purge.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator

from pymq.errors import IllegalStateError, PymqError
from pymq_server.broker.destinations import Kind
from pymq_server.broker.forwarded import SUBSCRIPTION
from pymq_server.broker.queue import MessageQueue
from pymq_server.cluster.actions import HeldTransfer
from pymq_server.cluster.host import ClusterHost
from pymq_server.cluster.link import OutboxConsumer, PeerLink
from pymq_server.cluster.state import ClusterState
from pymq_server.config import QueueConfig

log = logging.getLogger("pymq.cluster")

OUTBOX_PREFIX = "$cluster.out."
_OUTBOX_CONFIG = QueueConfig(max_deliveries=0, dead_letter=False)


class Outboxes:
    def __init__(self, host: ClusterHost, state: ClusterState) -> None:
        self.host = host
        self.state = state
        self.queues: dict[str, MessageQueue] = {}
        self.readers: dict[str, OutboxConsumer] = {}

    def recovered(self) -> None:
        """The outboxes the broker recovered from storage before the node joined."""
        for name, queue in self.host.internal.items():
            if name.startswith(OUTBOX_PREFIX):
                self.queues[name[len(OUTBOX_PREFIX):]] = queue

    def __call__(self, peer: str) -> MessageQueue:
        """``peer``'s outbox (made on first use)."""
        queue = self.queues.get(peer)
        if queue is None:
            queue = self.queues[peer] = self.host.internal_queue(OUTBOX_PREFIX + peer, _OUTBOX_CONFIG)
        return queue

    def __iter__(self) -> Iterator[tuple[str, MessageQueue]]:
        return iter(sorted(self.queues.items()))

    # -- the link as the reader -----------------------------------------------------------------------
    def attach(self, peer: str, link: PeerLink) -> None:
        reader = self.readers[peer] = OutboxConsumer(self(peer), link, self.state.figures)
        reader.queue.add_consumer(reader)

    def detach(self, peer: str, link: PeerLink | None = None) -> None:
        """The link to ``peer`` (``link``, or whichever) is gone: what was in flight returns to the outbox."""
        reader = self.readers.get(peer)
        if reader is not None and (link is None or reader.link is link):
            del self.readers[peer]
            reader.detach()

    # -- a dead peer -----------------------------------------------------------------------------------
    def reroute(self, peer: str) -> None:
        """A dead peer's outbox: queue messages go where routing says now (their key's new node, or the
        local queue); topic messages and hand-over copies stay (held for the peer's return)."""
        outbox = self.queues.get(peer)
        if outbox is None:
            return
        host, state = self.host, self.state
        router, node_id = state.membership.router, state.node_id
        for entry in list(outbox.ready):
            message = entry.message
            kind, name = host.resolve(message.destination)
            if kind is not Kind.QUEUE or SUBSCRIPTION in message.headers:
                continue
            key = state.routes.message_key(name, message.group_id, message.headers.get("correlation-id"),
                                           message.message_id)
            target = router.route(key) if key is not None else node_id
            host.reroute(message, None if target == node_id else target)
            outbox.remove_ready([entry])        # its new reference was added first: nothing to lose
            state.figures.rerouted += 1

    def held_for(self, peers: list[str]) -> list[MessageQueue]:
        """The outboxes of dead peers that hold a topic message for their durable subscribers, within
        ``held_max_messages`` each (beyond it the peer misses the message: counted)."""
        cap, figures = self.state.config.held_max_messages, self.state.figures
        held = []
        for peer in peers:
            outbox = self(peer)
            if cap and outbox.depth >= cap:
                figures.held_refused += 1
            else:
                held.append(outbox)
        if held:
            figures.held += 1
        return held

    def transfer_held(self, transfer: HeldTransfer) -> None:
        """What this node held for a dead node's durable subscription goes to the node that adopted it (a
        copy addressed to the subscription), and what no subscription of the dead node wants any more is
        released from its outbox (spec/cluster.md §5)."""
        outbox = self.queues.get(transfer.dead)
        if outbox is None:
            return
        host = self.host
        topic_dest = "/topic/" + transfer.topic
        try:
            selector = host.compile_selector(transfer.selector)
        except PymqError:
            selector = None                        # hold on the safe side: the new host filters again
        here = transfer.to == self.state.node_id
        local = host.find_subscription(transfer.key) if here else None
        moved = released = 0
        for entry in list(outbox.ready):
            message = entry.message
            if message.destination != topic_dest or SUBSCRIPTION in message.headers:
                continue
            if selector is None or selector.matches(message.selector_values()):
                if local is not None or not here:
                    host.hand_over(message, transfer.key, transfer.to)   # a copy addressed to the subscription
                moved += 1
            if transfer.release:
                outbox.remove_ready([entry])       # its copy (if any) holds its own reference
                released += 1
        self.state.figures.held_transferred += moved
        if moved or released:
            log.info("cluster: %d message(s) held for %s's durable subscription %s sent on to %s; %d released",
                     moved, transfer.dead, transfer.key, transfer.to, released)

    # -- admin: list-outboxes, purge-outbox -----------------------------------------------------------
    def listing(self) -> list[dict]:
        """Every outbox with what it holds; ``held`` marks a peer that is not alive (its messages wait for
        it to return or for its subscriptions to be adopted)."""
        membership, hosting = self.state.membership, self.state.hosting
        out = []
        for peer, queue in self:
            alive = membership.alive(peer)
            entries = list(queue.ready)
            out.append({"node": peer, "alive": alive, "held": not alive,
                        "state": "alive" if alive else ("dead" if peer in membership.dead else "gone"),
                        "messages": queue.depth, "in_flight": queue.acquired,
                        "bytes": sum(e.message.size for e in entries),
                        "topics": sorted({e.message.destination for e in entries
                                          if e.message.destination.startswith("/topic/")}),
                        "subscriptions": hosting.subscriptions_of(peer)})
        return out

    def purge(self, peer: str) -> int:
        """Drop what this node holds for ``peer``, which must not be alive (a node gone for good)."""
        state = self.state
        if peer == state.node_id:
            raise IllegalStateError("a node has no outbox to itself", node=peer)
        if state.membership.alive(peer):
            raise IllegalStateError(f"node {peer!r} is alive: its outbox drains to it and is not purged",
                                    node=peer)
        queue = self.queues.get(peer)
        purged = queue.purge() if queue is not None else 0
        state.figures.held_purged += purged
        return purged

    def draining(self, ready: set[str]) -> bool:
        """Some outbox of a peer whose link is up still holds messages (a leaving node waits for them)."""
        return any(q.depth for p, q in self.queues.items() if p in ready)
