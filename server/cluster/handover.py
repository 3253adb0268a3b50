"""Moving durable subscriptions between nodes (spec/cluster.md §6): the steps that cross a link and wait.

Three kinds of move, each keeping every pending message (a copy addressed to the subscription, the same
message under a key of its own: server/broker/forwarded.py):

* **follow the consumer** (:meth:`Moves.follow`): the subscription's client came back through another
  node, which now hosts it and asked us: our pending messages go there, our copy goes;
* **transfer** (:meth:`Moves.transfer`): an idle subscription moved by the assignment policy (the
  coordinator's order), or each of ours when this node leaves: the target adopts it first and announces
  its filter before its receipt, then — in one step no consumer can attach in between — the pending
  messages go through its outbox, our copy goes (unless leaving: it stays stored here), and the store
  names the target. Refused while a consumer is attached, before and after the adoption;
* **adopt** (:meth:`Moves.adopt`, :meth:`Moves.drop_adopted`): the other side of a transfer.

The decisions (who is the host, where a leaving node's subscriptions go) are the state's (hosting.py);
this module does the broker work and the waiting.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from pymq.errors import PymqError
from pymq_server.broker.topic import TopicSubscription
from pymq_server.cluster.host import ClusterHost
from pymq_server.cluster.link import PeerLink
from pymq_server.cluster.state import CONTROL_PREFIX, ClusterState

log = logging.getLogger("pymq.cluster")


class Moves:
    def __init__(self, host: ClusterHost, state: ClusterState, links: dict[str, PeerLink],
                 announce_now: Callable[[], None], assign: Callable[[str, str, dict], Awaitable[None]]) -> None:
        self.host = host
        self.state = state
        self.links = links                       # the node's links by peer (read, never changed here)
        self.announce_now = announce_now         # send the filter to every peer now (before a receipt)
        self.assign = assign                     # record a subscription's host and record in the store

    def _send_on(self, sub: TopicSubscription, to: str) -> None:
        """Every pending message of ``sub`` to ``to`` as a copy addressed to it (before ``sub`` goes)."""
        key = sub.name
        self.state.hosting.moved(key, to)       # before the drop: it must not erase the new host's entry
        for entry in list(sub.queue.ready):
            self.host.hand_over(entry.message, key, to)
            sub.queue.remove_ready([entry])

    def follow(self, key: str, to: str) -> None:
        """``to`` hosts ``key`` now (its consumer subscribed there): send it our pending messages, then
        drop our copy. A copy with a consumer attached here stays (logged)."""
        sub = self.host.find_subscription(key)
        if sub is None:
            return
        if sub.queue.consumers:
            log.warning("durable subscription %s is being consumed here; not moving it to %s", key, to)
            return
        self._send_on(sub, to)
        self.host.drop_subscription(sub)
        log.info("cluster: durable subscription %s moved to %s, where its consumer is", key, to)

    async def transfer(self, key: str, to: str, drop: bool) -> bool:
        """Move ``key`` from here to ``to``; ``drop`` False (this node leaving) keeps the stored copy."""
        host, hosting, figures = self.host, self.state.hosting, self.state.figures
        sub = host.find_subscription(key)
        link = self.links.get(to)
        if sub is None or to == self.state.node_id or link is None or not link.ready or key in hosting.transfers:
            return False
        if drop and sub.queue.consumers:
            figures.moves_refused += 1
            log.info("cluster: durable subscription %s has a consumer here; not moving it to %s", key, to)
            return False
        hosting.transfers.add(key)
        try:
            record = host.durable_record(sub)
            record["key"] = key
            done = asyncio.get_running_loop().create_future()

            def confirmed() -> None:
                if not done.done():
                    done.set_result(True)
            try:
                link.send({"destination": CONTROL_PREFIX + "subscription", "pymq-node": self.state.node_id,
                           "content-type": "application/json"}, json.dumps(record).encode(),
                          on_receipt=confirmed)
                await asyncio.wait_for(done, self.state.config.handover_timeout_s)
            except (PymqError, asyncio.TimeoutError) as exc:
                log.warning("moving durable subscription %s to %s failed: %s", key, to, exc)
                return False
            sub = host.find_subscription(key)
            if sub is None or (drop and sub.queue.consumers):
                # a consumer attached while the new host adopted it: it stays here; the new host drops its copy
                figures.moves_refused += 1
                try:
                    link.send({"destination": CONTROL_PREFIX + "drop-subscription",
                               "pymq-node": self.state.node_id, "pymq-subscription": key})
                except PymqError:
                    pass
                return False
            self._send_on(sub, to)
            if drop:
                host.drop_subscription(sub)
                figures.moved_out += 1
            del record["key"]
            await self.assign(key, to, record)
            log.info("cluster: durable subscription %s moved to %s (%s)", key, to,
                     f"assignment: {self.state.config.assignment}" if drop else "hand-over")
            return True
        finally:
            hosting.transfers.discard(key)

    async def leave(self) -> None:
        """This node leaves: each durable subscription it hosts to the successor the policy names."""
        state = self.state
        peers = [p for p in state.ready_peers() if p in self.links]
        for sub in list(self.host.durable_subscriptions()):
            successor = state.hosting.successor(sub.name, sub.topic.name, peers)
            if successor is None:
                log.warning("no live peer to take durable subscription %s; it stays stored here", sub.name)
                continue
            await self.transfer(sub.name, successor, drop=False)

    def adopt(self, record: dict) -> None:
        """Host ``record``'s subscription at its host's request (the host records us once it moved the
        messages): its topic joins our filter, announced before the receipt the host waits for."""
        quiet = self.state.hosting.quiet
        quiet.add(record["key"])
        try:
            self.host.adopt_durable(record)
        finally:
            quiet.discard(record["key"])
        self.announce_now()

    def drop_adopted(self, key: str) -> None:
        """The host that asked us to adopt ``key`` kept it after all (a consumer attached meanwhile)."""
        sub = self.host.find_subscription(key)
        if sub is not None and not sub.queue.consumers:
            self.host.drop_subscription(sub)
