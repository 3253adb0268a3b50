"""What the cluster's state (state.py) asks the node to do: the actions its events return.

Each action is a value; the driver (node.py) does the I/O it asks for — a link opened or closed, a
control message sent, a broker queue's messages moved. Tests of the state read them as they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Connect:
    """``peer`` is live and its link is not up: open one (unless one is open or opening)."""

    peer: str
    address: str


@dataclass(frozen=True)
class PeerDead:
    """``peer`` stopped beating: close its link, take its outbox off it, re-route what the outbox holds for
    its queues (its topic messages stay, held for its durable subscribers: spec/cluster.md §5)."""

    peer: str


@dataclass(frozen=True)
class Reroute:
    """At the first read: ``peer`` is dead and this node may have recovered an outbox for it."""

    peer: str


@dataclass(frozen=True)
class Announce:
    """Send this node's filter announcement (spec/cluster.md §2) to ``peers``."""

    peers: tuple[str, ...]


@dataclass(frozen=True)
class SendConsumers:
    """Send this node's consumer counts to ``peers``."""

    peers: tuple[str, ...]


@dataclass(frozen=True)
class AttachOutbox:
    """The link to ``peer`` is up: it becomes the reader of ``peer``'s outbox."""

    peer: str


@dataclass(frozen=True)
class CheckRedistribution:
    """Attach or detach the redistributors of these queues (by name; None: every queue)."""

    queues: tuple[str, ...] | None


@dataclass(frozen=True)
class HeldTransfer:
    """Durable subscription ``key`` of dead node ``dead`` is now hosted by ``to``: what this node held for
    it in ``dead``'s outbox goes there (spec/cluster.md §5); ``release``: no other subscription of the dead
    node wants ``topic`` any more, so its held messages leave that outbox."""

    dead: str
    key: str
    topic: str
    selector: str | None
    to: str
    release: bool


@dataclass(frozen=True)
class MoveOrder:
    """``host`` moves idle durable subscription ``key`` to ``target`` (spec/cluster.md §6): this node when
    it is the host, else the host is told (``/pymq/cluster/move-to``)."""

    key: str
    host: str
    target: str


@dataclass(frozen=True)
class FollowConsumer:
    """``key``'s consumer subscribed through ``to``, which now hosts it: our pending messages go there and
    our copy goes."""

    key: str
    to: str


@dataclass(frozen=True)
class Adopt:
    """Host the durable subscription of ``record`` at its host's request, announcing the filter before the
    receipt the host waits for."""

    record: dict


@dataclass(frozen=True)
class DropAdopted:
    """The host that asked us to adopt ``key`` kept it (a consumer attached meanwhile): drop our copy."""

    key: str


@dataclass(frozen=True)
class Replaced:
    """``peer``'s node id is held at a higher HA epoch now (its backup took over, spec/ha.md §5): the link to
    the former process and its links here of a lower epoch close; its filter and consumer counts are
    forgotten until the new process announces them; a link to the record's address follows."""

    peer: str
    epoch: int


@dataclass(frozen=True)
class Fenced:
    """This node's own record carries a higher epoch than this process holds: another process took the
    node over. Nothing more is written to the store or sent on a link."""

    epoch: int


Action = Union[Connect, PeerDead, Reroute, Announce, SendConsumers, AttachOutbox, CheckRedistribution,
               HeldTransfer, MoveOrder, FollowConsumer, Adopt, DropAdopted, Replaced, Fenced]
