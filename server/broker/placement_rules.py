"""The placement rules that decide (spec/placement.md, rules 1, 2 and 4), each written once.

Every way rows enter the broker runs these functions, over a batch of 1..n rows:

* a SEND — one row, nothing ahead of it (:meth:`placement.Placement.plan`);
* a transaction's COMMIT — a dry run, one SEND at a time in arrival order, each seeing what the earlier
  SENDs of the transaction add to its destination (:class:`Ahead`; :meth:`placement.Placement.admit`);
* a bulk SEND — the frame's rows at once (bulk_placement.py).

A check is pure: it reads the queue and the window and raises what refuses the rows (or says which rows
are duplicates, which make the queue deeper); it changes nothing, so the same check serves the SEND that
then acts and the COMMIT that only asks. What the rules do once rows are accepted (remember the ids, make
room, pause a producer, the log and the store) is placement.py's commit.

Rule 4 and last-value queues: a row whose key value waits in the queue already, or was left waiting by an
earlier row of the same unit (a transaction, a bulk frame), replaces that message when it enters, so it does
not make the queue deeper and a full queue takes it — on every path alike (spec/placement.md).
"""
from __future__ import annotations

import functools
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple

from pymq import enums
from pymq.errors import QueueFull, SchemaViolation

if TYPE_CHECKING:
    from pymq_server.broker.dedup import DuplicateWindow
    from pymq_server.broker.log import RetainedLog
    from pymq_server.broker.message import BrokerMessage
    from pymq_server.broker.queue import MessageQueue
    from pymq_server.schema import MessageSchema
    from pymq_server.config import QueueConfig

#: one row's properties (a SEND's, or a bulk row's)
Row = Mapping[str, str]
_NOTHING: frozenset[str] = frozenset()


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


class Policy:
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


def policies() -> dict[EntryPath, Policy]:
    return {path: Policy(path, rules) for path, rules in RULES.items()}


class Plan(NamedTuple):
    """What :meth:`Placement.plan` decided for one message (rules 1–5), for :meth:`Placement.commit` to do
    (read by name; a tuple so that one is made in C per message: :data:`new_plan`)."""

    path: EntryPath
    message: BrokerMessage
    queues: list[MessageQueue]           # the queues that get an entry (a peer's outbox for a routed one)
    outboxes: list[MessageQueue]         # peers' outboxes a topic message also goes to
    log: RetainedLog | None              # the retained log that keeps a reference
    drop_from: MessageQueue | None       # drop-oldest: its oldest waiting message goes if it is still full
    block: MessageQueue | None           # block: its producer pauses once it is full
    dedup_id: str | None                 # remembered once the message is taken
    destination: str


#: builds a Plan from a tuple of all its fields in C (Plan(...) runs a Python __new__): one per message
new_plan = functools.partial(tuple.__new__, Plan)


def stored_references(queues: list[MessageQueue], log: RetainedLog | None,
                      outboxes: list[MessageQueue]) -> list[str]:
    """Rule 6's references: the names a new message is stored under — each durable queue it enters, the
    retained log, each peer's outbox — for every path that writes one (Placement.commit, a claimed
    application-transaction message: Router.pending_write, a bulk SEND kept as a unit)."""
    refs = [q.name for q in queues if q.durable]      # (a comprehension: a fan-out's many queues cost least)
    if log is not None:
        refs.append(log.name)
    for outbox in outboxes:
        refs.append(outbox.name)
    return refs


@dataclass(slots=True)
class Ahead:
    """What the earlier rows of one unit add to one destination before the row being checked: a
    transaction's COMMIT checks each SEND as if the earlier ones had been applied."""

    grows: int = 0                                       # rows that make the queue deeper
    keys: set[str] = field(default_factory=set)          # last-value key values they leave waiting
    ids: set[str] = field(default_factory=set)           # dedup ids they carry


@dataclass(slots=True, frozen=True)
class Prospect:
    """A queue a SEND would create (by use, or a connection's own temporary queue): what the rules read
    of it before it exists — its settings, an empty depth."""

    destination: str
    config: QueueConfig
    schema: MessageSchema | None


# -- rule 1: duplicates -------------------------------------------------------------------------------

def duplicate(window: DuplicateWindow, destination: str, dedup_id: str, ahead: Ahead | None) -> bool:
    """Whether a row with ``dedup_id`` is a duplicate: its id reached ``destination`` within the window,
    or an earlier row of its unit carries it. Counted in the window's figures when it is."""
    if ahead is not None and dedup_id in ahead.ids:
        window.duplicates += 1
        return True
    return window.seen(destination, dedup_id)


def duplicate_rows(window: DuplicateWindow, destination: str, ids: Sequence[str | None]) -> list[int]:
    """Rule 1 over a batch: the rows (indexes) that are duplicates, each row seeing the earlier ones."""
    out: list[int] = []
    ahead = Ahead()
    for i, dedup_id in enumerate(ids):
        if dedup_id is None:
            continue
        if duplicate(window, destination, dedup_id, ahead):
            out.append(i)
        ahead.ids.add(dedup_id)
    return out


# -- rule 2: schema -----------------------------------------------------------------------------------

def check_schema(schema: MessageSchema, destination: str, rows: Sequence[Row], numbered: bool = False) -> None:
    """Every row fits the queue's declared properties, or SchemaViolation for the first that does not
    (``numbered``: the error names the row, as a bulk SEND's does)."""
    for i, row in enumerate(rows):
        try:
            schema.check(row, destination)  # type: ignore[arg-type]
        except SchemaViolation as exc:
            if not numbered:
                raise
            raise SchemaViolation(f"bulk SEND row {i}: {exc}") from None


# -- rule 4: depth / overflow -------------------------------------------------------------------------

def growing(target: MessageQueue | Prospect, rows: Sequence[Row], ahead: Ahead | None) -> list[bool]:
    """Which rows make the queue deeper: all of them, but in a last-value queue not a row whose key value
    waits already (in the queue, or left by an earlier row of its unit or of ``rows``)."""
    key = target.config.last_value_key
    if key is None:
        return [True] * len(rows)
    last_values = getattr(target, "last_values", None)
    waiting: Container[str] = last_values.waiting if last_values is not None else _NOTHING
    earlier = set(ahead.keys) if ahead is not None else set()
    out = []
    for row in rows:
        value = row.get(key)
        if value is None:
            out.append(True)
            continue
        out.append(value not in waiting and value not in earlier)
        earlier.add(value)
    return out


def check_depth(target: MessageQueue | Prospect, grows: int, ahead: Ahead | None, what: str = "the message") -> None:
    """Rule 4's refusal: a ``reject`` queue at its ``max_depth`` takes no row that makes it deeper
    (``grows`` of them, behind ``ahead``'s); ``what`` names the refused rows in the error."""
    config = target.config
    limit = config.max_depth
    if not limit or config.overflow != "reject" or not grows:
        return
    depth = getattr(target, "depth", 0) + (ahead.grows if ahead is not None else 0)
    if depth + grows > limit:
        destination = target.destination
        if what == "the message":
            raise QueueFull(f"queue '{destination}' is full ({limit} messages); the message was refused",
                            destination=destination)
        raise QueueFull(f"queue '{destination}' holds {depth} of {limit} messages; {what} were refused",
                        destination=destination)


def must_drop(queue: MessageQueue, row: Row) -> bool:
    """Rule 4's ``drop-oldest``, as a row enters: whether the queue is at its limit and the row makes it
    deeper (so its oldest waiting message goes first). Decided as each row enters, not before a batch: an
    earlier row of the batch may be the message that went."""
    limit = queue.config.max_depth
    return bool(limit) and queue.depth >= limit and growing(queue, (row,), None)[0]


def must_block(queue: MessageQueue) -> bool:
    """Rule 4's ``block``, after rows entered: whether the queue is at its limit (the producer pauses)."""
    config = queue.config
    return config.overflow == "block" and bool(config.max_depth) and queue.depth >= config.max_depth


def note(ahead: Ahead, target: MessageQueue | Prospect, row: Row, grows: bool, dedup_id: str | None) -> None:
    """An admitted row is ahead of the next ones of its unit."""
    if grows:
        ahead.grows += 1
    key = target.config.last_value_key
    if key is not None:
        value = row.get(key)
        if value is not None:
            ahead.keys.add(value)
    if dedup_id is not None:
        ahead.ids.add(dedup_id)
