"""The records the cluster keeps in its store (spec/cluster.md §1), as values: a member's heartbeat record
and where a durable subscription lives.  No I/O here: registry.py reads and writes them, the cluster's
state (state.py and its parts) decides from them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Member:
    node: str
    address: str            # host:port of its STOMP listener
    started: int            # ms since the epoch
    beat: int               # last heartbeat, ms since the epoch
    #: the high-availability epoch of the process that holds the node's store (spec/ha.md §1.2; 0 for a
    #: node without ``ha:``): a node id's record and links of a lower epoch are a fenced former live's
    epoch: int = 0

    def alive(self, now_ms: int, dead_after_ms: int) -> bool:
        return now_ms - self.beat < dead_after_ms

    def encode(self) -> str:
        """The stored JSON; ``epoch`` only when there is one, so a record of a node without ``ha:`` reads
        the same to a node of an earlier version (which would refuse a field it does not know)."""
        data = {"node": self.node, "address": self.address, "started": self.started, "beat": self.beat}
        if self.epoch:
            data["epoch"] = self.epoch
        return json.dumps(data)

    @classmethod
    def decode(cls, raw: str | bytes) -> Member:
        """A stored record; fields a later version may add are ignored, a missing epoch is 0."""
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Hosted:
    """Where a durable subscription lives, and what it is (None for a record written before records were
    kept: such a subscription can be held for but not adopted by another node)."""

    node: str
    record: dict | None = None

    @property
    def topic(self) -> str | None:
        return None if self.record is None else self.record.get("topic")

    def encode(self) -> str:
        return json.dumps({"node": self.node, "record": self.record}, sort_keys=True)

    @classmethod
    def decode(cls, raw: str) -> Hosted:
        if not raw.startswith("{"):
            return cls(raw)                        # the layout before records: the node id alone
        data = json.loads(raw)
        return cls(data["node"], data.get("record"))
