"""Which worker owns a destination, and which worker an acknowledgement goes to (spec/cores.md §2.2).

owner(d) = rendezvous over the worker ids ``w0 .. w<W-1>`` with the specified hash (spec/routing.md
§2.2: the worker ids are the candidates, the destination name is the key):
``score(w, d) = murmur3(UTF8(d), murmur3(UTF8(w), 0))``, the highest wins. It is the cluster's
``GroupRouter``, not a second hash. A *numbered* name, ``<stem>.<n>`` with n decimal (a load partitioned
over destinations: ``/queue/orders.0`` .. ``/queue/orders.7``), is placed round-robin from its stem's
winner: ``(rendezvous(stem) + n) mod W``, so W consecutive numbers land on W different workers and a family of
D members leaves no worker more than ceil(D/W) of them (a hash puts 4 names on 2 workers 3:1 or 4:0 five
times in eight). A pure function of the name, as the hash: every worker computes it alone, no table to
share, grow or lose, the same after every restart. A data directory written before the rule
(``cores.json`` without ``placement``) keeps the hash alone (``numbered=False``): its messages stay where
they were written. Names that are not shared destinations stay with the home:
``/pymq/...`` (admin, answered by the worker the client is connected to) and a connection's own
temporary destinations by their local name. A dead-letter queue (the default prefix,
``queue_defaults.dead_letter_prefix``) belongs to the owner of the queue whose dead letters it holds.
A temporary destination's global name (``tmp.<session id>.<local>``) names its home, because a home
session's id starts with ``w<k>``.
"""
from __future__ import annotations

from pymq.routing import GroupRouter

#: owner look-ups are cached per destination; the cache is dropped when it grows past this many names
#: (names are client input: the cache must not grow without bound)
CACHE_LIMIT = 65536
#: the longest number a numbered name's last segment may be (longer: the name is hashed whole)
NUMBER_DIGITS = 18


def worker_name(k: int) -> str:
    return f"w{k}"


def worker_node_id(node_id: str, k: int) -> str:
    """A worker's node id: its message ids are ``ID:<node>.w<k>-<n>``, so they name their owner."""
    return f"{node_id}.w{k}"


class Ownership:
    """Owner look-ups for worker ``me`` of ``workers``; everything here is a pure function of names."""

    __slots__ = ("me", "workers", "numbered", "_router", "_index", "_cache", "_id_prefix", "_dead_letters")

    def __init__(self, me: int, workers: int, node_id: str, dead_letter_prefix: str = "DLQ.",
                 numbered: bool = True) -> None:
        if not 0 <= me < workers:
            raise ValueError(f"worker {me} of {workers}")
        self.me = me
        self.workers = workers
        self.numbered = numbered
        self._router = GroupRouter([worker_name(k) for k in range(workers)])
        self._index = {worker_name(k): k for k in range(workers)}
        self._cache: dict[str, int] = {}
        self._id_prefix = f"ID:{node_id}.w"
        self._dead_letters = "/queue/" + dead_letter_prefix

    def owner(self, destination: str) -> int:
        owner = self._cache.get(destination)
        if owner is None:
            owner = self._compute(destination)
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[destination] = owner
        return owner

    def _compute(self, destination: str) -> int:
        if destination.startswith("/pymq/"):
            return self.me
        for prefix in ("/temp-queue/", "/temp-topic/"):
            if destination.startswith(prefix):
                return self._temporary_home(destination[len(prefix):])
        dead = self._dead_letters
        if destination.startswith(dead) and len(destination) > len(dead):
            # a queue's dead letters are moved by its owner, into a queue of its own (router.py)
            return self.owner("/queue/" + destination[len(dead):])
        if self.numbered:
            stem, dot, number = destination.rpartition(".")
            if dot and 0 < len(number) <= NUMBER_DIGITS and number.isascii() and number.isdigit():
                return (self._index[self._router.route(stem)] + int(number)) % self.workers
        return self._index[self._router.route(destination)]

    def _temporary_home(self, name: str) -> int:
        """``tmp.w<k>c<n>-<incarnation>.<local>``: worker k; a local name (one's own temporary): here."""
        if not name.startswith("tmp.w"):
            return self.me
        digits = ""
        for ch in name[5:]:
            if not ch.isdigit() or len(digits) > 5:
                break
            digits += ch
        k = int(digits) if digits else -1
        return k if 0 <= k < self.workers else self.me

    def ack_owner(self, token: str) -> int | None:
        """The owner an ACK/NACK token names, None if it names none (then it is the home's own).

        STOMP 1.2: a shadow's ack token is ``w<k>.<n>`` (the owner's prefix, spec/cores.md §3);
        1.0/1.1 acknowledge by message id, ``ID:<node>.w<k>-<n>``."""
        if token.startswith("w"):
            head, sep, _ = token.partition(".")
            if sep and head[1:].isdigit() and len(head) < 8:
                k = int(head[1:])
                return k if k < self.workers else None
            return None
        if token.startswith(self._id_prefix):
            head, sep, _ = token[len(self._id_prefix):].partition("-")
            if sep and head.isdigit() and len(head) < 8:
                k = int(head)
                return k if k < self.workers else None
        return None


def ack_prefix(owner: int) -> str:
    return f"w{owner}."
