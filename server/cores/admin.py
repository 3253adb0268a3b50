"""The admin port of a multi-worker broker answers for every worker (spec/cores.md §3.7).

Worker 0 alone listens on ``admin_port``. For a scrape of ``/metrics`` it asks every other worker for
its broker families (:class:`~pymq_server.admin.metrics.BrokerCollector`) over the channels and
yields them merged with its own: samples with the same name and labels are summed (a queue lives in
one worker, so its series come from one; broker-wide counts add up), except ``pymq_ready`` and
``pymq_start_time_seconds`` (the minimum) and info families (worker 0's). ``process_*`` and
``python_*`` are worker 0's process only. The list operations (``list-queues``, ``list-topics``,
``list-destinations``) are run by every worker as the same user and their answers joined; every
other operation, the STOMP admin destination ``/pymq/admin`` and ``/readyz`` answer for the worker
that runs them (worker 0 for HTTP; the connection's home for STOMP).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric

from pymq_server.broker.auth import User
from pymq_server.cores.mesh import Mesh

#: operations whose answer is a listing: every worker's, joined
MERGED_OPS = frozenset({"list-queues", "list-topics", "list-destinations"})
#: families that do not add up over workers, and how they combine
COMBINE: dict[str, Callable[[float, float], float]] = {"pymq_ready": min, "pymq_start_time_seconds": min}

Family = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


def families(collector: Any) -> list[Family]:
    """A collector's families as JSON-able tuples (what crosses the channel for a scrape)."""
    return [(m.name, m.documentation, m.type, [(s.name, dict(s.labels), s.value) for s in m.samples])
            for m in collector.collect()]


class WorkersAdmin:
    """Worker 0's view over every worker, for the HTTP admin port (server/admin/http.py calls it)."""

    def __init__(self, server: Any, mesh: Mesh) -> None:
        self.server = server
        self.mesh = mesh
        self.own: Any = None
        self._others: list[Any] = []          # families of the other workers (JSON lists), last scrape

    def collector(self, own: Any) -> WorkersAdmin:
        self.own = own
        return self

    async def refresh_metrics(self) -> None:
        answers = await self.mesh.ask_all("metrics", {})
        self._others = [fam for k, answer in enumerate(answers) if k != self.mesh.me and answer
                        for fam in answer]

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        values: dict[str, dict[tuple, list]] = {}
        order: list[str] = []
        sources: list[Any] = families(self.own) if self.own is not None else []
        for name, doc, kind, samples in sources + list(self._others):
            if name not in merged:
                merged[name] = Metric(name, doc, kind)
                values[name] = {}
                order.append(name)
            elif kind == "info":
                continue                                    # worker 0's
            combine = COMBINE.get(name)
            table = values[name]
            for sample_name, labels, value in samples:
                key = (sample_name, tuple(sorted(labels.items())))
                if key in table:
                    old = table[key][2]
                    table[key][2] = combine(old, value) if combine else old + value
                else:
                    table[key] = [sample_name, dict(labels), value]
        for name in order:
            metric = merged[name]
            for sample_name, labels, value in values[name].values():
                metric.add_sample(sample_name, labels, value)
            yield metric

    async def merge(self, user: Any, op: str, args: Any, result: dict) -> dict:
        """A listing from every worker; anything else as worker 0 answered it."""
        if op not in MERGED_OPS:
            return result
        answers = await self.mesh.ask_all("admin", {"user": user.name, "roles": sorted(user.roles),
                                                    "op": op, "args": args})
        joined = result["result"]
        for k, answer in enumerate(answers):
            if k == self.mesh.me or not answer or not answer.get("ok"):
                continue
            joined = _join(joined, answer["result"])
        return {**result, "result": joined}


def _join(a: Any, b: Any) -> Any:
    """Two workers' listings as one: lists joined (names sorted, as one worker lists them), mappings
    joined key by key."""
    if isinstance(a, list) and isinstance(b, list):
        joined = a + b
        return sorted(joined) if all(isinstance(x, str) for x in joined) else joined
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _join(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    return a


def install(server: Any, mesh: Mesh) -> None:
    """What this worker answers other workers, and worker 0's admin over all of them."""
    from pymq_server.admin.metrics import BrokerCollector
    admin = server.admin
    own = BrokerCollector(admin)
    mesh.queries["metrics"] = lambda args, reply: reply(families(own))

    def run_admin(args: dict, reply: Callable[[Any], None]) -> None:
        user = User(str(args["user"]), "", frozenset(args.get("roles", ())))
        admin.submit(user, args["op"], args.get("args") or {}, reply)

    mesh.queries["admin"] = run_admin
    if mesh.me == 0:
        server.cores = WorkersAdmin(server, mesh)
