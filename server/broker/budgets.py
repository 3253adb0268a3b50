"""What a client may make the broker hold besides its messages: budgets per connection and per user.

A request that makes the broker keep something — a subscription and its compiled selector, a temporary
destination, the id of a finished browse, an open transaction's frames, a durable subscription — is
*charged* its cost in bytes before anything is made: against its connection's budget
(``max_memory_per_connection``) and its user's (``max_memory_per_user``: every connection of that user,
plus the durable subscriptions the user created, which outlive connections), and against what all clients
together may hold (half of ``max_memory``, flow.py) — except that a connection's first
:data:`CONNECTION_ALLOWANCE` bytes are always granted, so a full budget of one user cannot lock everyone
out (nor an operator's admin tool). A charge over a budget is refused with
``resource-limit`` naming the budget, what was asked and what is held, and nothing is made; the broker serves
everyone else on. Charges count in the memory flow's ``client_bytes``, so queues page earlier when clients
hold much; they never pause producers (they do not drain as messages do).

The costs are measured, not guessed (tracemalloc and RSS on CPython 3.11, tests/broker/test_costs.py
checks the charges stay above what the objects cost): :data:`SUBSCRIPTION_COST` and the other constants
below, plus the length of every name the client chose (ids, names), since a header value may be as long as
a frame. A selector is charged before it is compiled, from its text: :data:`SELECTOR_COST_PER_CHAR` per
character (a compiled selector takes 17-50 bytes per character of its text; spec/selector.md §7 bounds
the text), so an expensive compile is refused, not done and then regretted.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pymq.errors import ResourceLimit

if TYPE_CHECKING:
    from pymq_server.broker.flow import MemoryFlow
    from pymq_server.config import BrokerConfig

#: a subscription (SUBSCRIBE): the consumer and, on a topic, its subscription queue (~3 KiB measured)
SUBSCRIPTION_COST = 4096
#: a durable subscription, kept while it exists: its queue, its catalog record, its indexes (~3.1 KiB
#: measured by tracemalloc, ~3.6 KiB of RSS with the file store's catalog record)
DURABLE_COST = 4096
#: a temporary queue or topic (~2.8 KiB measured for a queue, 0.8 KiB for a topic)
TEMPORARY_COST = 4096
#: the id of a finished browse, remembered so that a later UNSUBSCRIBE of it is accepted (~0.45 KiB)
BROWSE_ID_COST = 512
#: an open transaction (BEGIN), and each operation it holds besides its frame's bytes (~0.3 KiB measured)
TRANSACTION_COST = 512
OPERATION_COST = 512
#: a compiled selector, per character of its text, and once per selector
SELECTOR_COST_PER_CHAR = 64
SELECTOR_COST = 1024
#: what a connection may always hold, whatever its user's other connections or other users hold: a few
#: subscriptions and temporary destinations, so that a client (an operator's admin tool) can still log in and
#: be answered when others have filled what clients may hold; at most ``max_connections`` times this
CONNECTION_ALLOWANCE = 64 * 1024


#: a selector longer than this compiles in a worker thread (a few ms to tens of ms; shorter ones take well
#: under a millisecond and are shared through the compiler's cache)
SELECTOR_ON_LOOP = 1024


def selector_cost(text: str | None) -> int:
    """What a selector is charged, from its text, before it is compiled (0: no selector)."""
    if text is None or not text.strip():
        return 0
    return SELECTOR_COST + SELECTOR_COST_PER_CHAR * len(text)


class Budget:
    """One budget: a user's (over all its connections and durable subscriptions) or a connection's."""

    __slots__ = ("name", "limit", "setting", "held", "parent", "flow", "allowance")

    def __init__(self, name: str, limit: int, setting: str, flow: MemoryFlow,
                 parent: Budget | None = None, allowance: int = 0) -> None:
        self.name = name
        self.limit = limit
        self.setting = setting            # the configuration setting the limit comes from (named in errors)
        self.held = 0
        self.parent = parent
        self.flow = flow
        self.allowance = allowance        # held up to this much, a charge is granted whatever others hold

    def charge(self, what: str, cost: int) -> int:
        """Hold ``cost`` more bytes for ``what`` (a phrase: "a selector of 9386 characters"); refused
        with ResourceLimit, nothing held, when this budget, its parent or all clients together would pass
        their limit — unless this budget's allowance covers it. Returns the cost (to release later)."""
        if self.held + cost <= min(self.allowance, self.limit):
            self.force(cost)
            return cost
        budget: Budget | None = self
        while budget is not None:
            if budget.held + cost > budget.limit:
                raise ResourceLimit(
                    f"{budget.name} would hold more than {budget.limit} bytes of broker memory "
                    f"({budget.setting}): {what} costs {cost} bytes and {budget.held} are held "
                    f"(subscriptions, selectors, temporary destinations, browse ids, open transactions)",
                    limit=budget.setting, held=budget.held, cost=cost)
            budget = budget.parent
        flow = self.flow
        if flow.client_bytes + cost > flow.client_limit():
            raise ResourceLimit(
                f"the broker's memory for what clients hold besides messages is full ({flow.client_limit()} "
                f"bytes, half of max_memory): {what} costs {cost} bytes and clients hold {flow.client_bytes}",
                limit="max_memory", held=flow.client_bytes, cost=cost)
        self.force(cost)
        return cost

    def force(self, cost: int) -> None:
        """Hold ``cost`` whatever the limit (what exists already: recovered or handed-over subscriptions)."""
        budget: Budget | None = self
        while budget is not None:
            budget.held += cost
            budget = budget.parent
        self.flow.charge(cost)

    def release(self, cost: int) -> None:
        budget: Budget | None = self
        while budget is not None:
            budget.held -= cost
            budget = budget.parent
        self.flow.release(cost)


class Budgets:
    """The users' budgets of one broker (a user's exists while it holds something or has a connection)."""

    def __init__(self, config: BrokerConfig, flow: MemoryFlow) -> None:
        self.config = config
        self.flow = flow
        self.users: dict[str, Budget] = {}
        self._connections: dict[str, int] = {}        # user -> open connection budgets

    def user(self, name: str) -> Budget:
        budget = self.users.get(name)
        if budget is None:
            budget = self.users[name] = Budget(f"user '{name}'", self.config.max_memory_per_user,
                                               "max_memory_per_user", self.flow)
        return budget

    def connection(self, user: str, conn_id: str) -> Budget:
        """A new connection's budget, under its user's."""
        self._connections[user] = self._connections.get(user, 0) + 1
        return Budget(f"connection {conn_id}", self.config.max_memory_per_connection,
                      "max_memory_per_connection", self.flow, self.user(user), CONNECTION_ALLOWANCE)

    def holdings(self, user: str, conn_id: str) -> ConnectionHoldings:
        """What a new connection will hold, charged to its budget under its user's."""
        return ConnectionHoldings(self.connection(user, conn_id),
                                  self.config.max_temporary_destinations_per_connection)

    def connection_closed(self, user: str, budget: Budget) -> None:
        """Everything the connection held goes (its user's durable subscriptions stay charged)."""
        if budget.held:
            budget.release(budget.held)
        left = self._connections.get(user, 1) - 1
        if left:
            self._connections[user] = left
        else:
            self._connections.pop(user, None)
            self._forget_idle(user)

    def charge_user(self, user: str | None, what: str, cost: int, *, force: bool = False) -> int:
        """A user-level charge (a durable subscription); ``user`` None (made by the broker): not charged."""
        if user is None:
            return 0
        budget = self.user(user)
        if force:
            budget.force(cost)
            return cost
        try:
            return budget.charge(what, cost)
        finally:
            self._forget_idle(user)

    def release_user(self, user: str | None, cost: int) -> None:
        if user is None or not cost:
            return
        self.user(user).release(cost)
        self._forget_idle(user)

    def _forget_idle(self, user: str) -> None:
        budget = self.users.get(user)
        if budget is not None and not budget.held and user not in self._connections:
            del self.users[user]


#: finished browses whose ids a connection remembers (a later UNSUBSCRIBE of one is accepted; an older one is
#: forgotten, and an UNSUBSCRIBE of it is an unknown subscription)
BROWSE_IDS_KEPT = 1024


class ConnectionHoldings:
    """What one connection holds besides messages, charged to its budget: subscriptions (with their
    selectors), temporary destinations, the ids of its finished browses. Open transactions charge the same
    budget (transactions.py). Everything is released at once when the connection closes
    (:meth:`Budgets.connection_closed`)."""

    __slots__ = ("budget", "max_temporaries", "temporaries", "browse_ids")

    def __init__(self, budget: Budget, max_temporaries: int) -> None:
        self.budget = budget
        self.max_temporaries = max_temporaries
        self.temporaries = 0
        self.browse_ids: dict[str, int] = {}       # finished or running browse id -> its charge, oldest first

    def subscription(self, sub_id: str, selector: str | None) -> int:
        """Charge a SUBSCRIBE (before its selector is compiled); the cost, to release at UNSUBSCRIBE."""
        what = f"subscription {sub_id[:64]!r}"
        if selector is not None:
            what += f" with a selector of {len(selector)} characters"
        return self.budget.charge(what, SUBSCRIPTION_COST + len(sub_id) + selector_cost(selector))

    def temporary(self, local: str) -> None:
        """Charge a new temporary queue or topic (until it is deleted or the connection closes)."""
        if self.temporaries >= self.max_temporaries:
            raise ResourceLimit(f"more than {self.max_temporaries} temporary destinations on one connection "
                                f"(max_temporary_destinations_per_connection)",
                                limit="max_temporary_destinations_per_connection")
        # its local name, its global name (tmp.<connection>.<local>) and the keys of two maps
        self.budget.charge(f"temporary destination {local[:64]!r}", TEMPORARY_COST + 3 * len(local))
        self.temporaries += 1

    def temporary_gone(self, local: str) -> None:
        """A temporary destination was deleted (JMS ``delete()``)."""
        self.budget.release(TEMPORARY_COST + 3 * len(local))
        self.temporaries -= 1

    def browse(self, sub_id: str) -> None:
        """Remember a browse's id (the last :data:`BROWSE_IDS_KEPT` of them, charged while remembered)."""
        ids = self.browse_ids
        if sub_id in ids:
            return
        ids[sub_id] = self.budget.charge(f"browse id {sub_id[:64]!r}", BROWSE_ID_COST + len(sub_id))
        if len(ids) > BROWSE_IDS_KEPT:
            self.budget.release(ids.pop(next(iter(ids))))

    def forget_browse(self, sub_id: str) -> bool:
        """An UNSUBSCRIBE of a browse: True when the id was one (still remembered)."""
        cost = self.browse_ids.pop(sub_id, None)
        if cost is None:
            return False
        self.budget.release(cost)
        return True
