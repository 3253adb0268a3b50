"""Interned names and reference sets of an open file store.

A slot names its destination and the queues it was written for by id (``format.py``: NAME and REFSET
frames, the NAMES and REFSETS checkpoint sections), so a message costs two small integers instead of its
strings.  An id becomes *durable* once a NAME/REFSET frame or a checkpoint holds it; a persistent write
logs the frames for ids not yet durable before its PUT.  Ids are never reused nor garbage-collected (they
are small and few in practice; spec/storage.md §7).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import format as fmt

if TYPE_CHECKING:
    from .state import OpenStore


class Names:
    __slots__ = ("log", "ids", "names", "next_name", "refset_ids", "refsets", "next_refset", "durable_names",
                 "durable_refsets")

    def __init__(self, store: OpenStore) -> None:
        self.log = store.log
        self.ids: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.next_name = 1
        self.refset_ids: dict[tuple[str, ...], int] = {}
        self.refsets: dict[int, tuple[str, ...]] = {}
        self.next_refset = 1
        self.durable_names: set[int] = set()
        self.durable_refsets: set[int] = set()

    def name_id(self, name: str, log: bool) -> int:
        """The id of ``name``, interned now if new; ``log``: made durable (a NAME frame) if it is not."""
        name_id = self.ids.get(name)
        if name_id is None:
            name_id = self.next_name
            self.next_name += 1
            self.ids[name] = name_id
            self.names[name_id] = name
        if log and self.log.logging and name_id not in self.durable_names:
            self.log.append(fmt.F_NAME, fmt.encode_name(name_id, name), commit=False)
            self.durable_names.add(name_id)
        return name_id

    def refset_id(self, refs: tuple[str, ...], log: bool) -> int:
        """The id of the reference set ``refs`` (its names interned too); ``log`` as for ``name_id``."""
        refset_id = self.refset_ids.get(refs)
        if refset_id is None:
            for queue in refs:          # a checkpoint stores refsets as name ids
                self.name_id(queue, False)
            refset_id = self.next_refset
            self.next_refset += 1
            self.refset_ids[refs] = refset_id
            self.refsets[refset_id] = refs
        if log and self.log.logging and refset_id not in self.durable_refsets:
            ids = tuple(self.name_id(q, True) for q in refs)
            self.log.append(fmt.F_REFSET, fmt.encode_refset(refset_id, ids), commit=False)
            self.durable_refsets.add(refset_id)
        return refset_id

    # -- recovery: what a checkpoint or a log frame held -------------------------------------------------
    def load(self, names: dict[int, str], refsets: dict[int, tuple[int, ...]], next_name: int,
             next_refset: int) -> None:
        self.names = dict(names)
        self.ids = {name: nid for nid, name in self.names.items()}
        self.next_name, self.next_refset = next_name, next_refset
        self.refsets = {rid: tuple(self.names[i] for i in ids) for rid, ids in refsets.items()}
        self.refset_ids = {refs: rid for rid, refs in self.refsets.items()}
        self.durable_names, self.durable_refsets = set(self.names), set(self.refsets)

    def replay_name(self, name_id: int, name: str) -> None:
        self.names[name_id] = name
        self.ids[name] = name_id
        self.durable_names.add(name_id)
        self.next_name = max(self.next_name, name_id + 1)

    def replay_refset(self, refset_id: int, ids: tuple[int, ...]) -> None:
        names = tuple(self.names[i] for i in ids)
        self.refsets[refset_id] = names
        self.refset_ids[names] = refset_id
        self.durable_refsets.add(refset_id)
        self.next_refset = max(self.next_refset, refset_id + 1)
