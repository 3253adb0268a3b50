"""Admin and metrics of a multi-worker broker: each operation runs where what it names lives
(spec/cores.md §3.7).

:class:`AdminRouter` is the ``submit`` of every admin entry of a worker (the HTTP port, which only
worker 0 opens, and the STOMP destination ``/pymq/admin`` at a connection's home):

* an operation on one queue (``create-queue``, ``queue-info``, ``purge-queue``, ``browse-queue``, ...:
  the ``name`` argument; ``move-messages``: ``from``, refused when ``to`` lives in another worker) and
  ``grant``/``revoke`` (``destination``) run at the owner — a queue created through worker 0 for a
  name worker 1 owns is created in worker 1, where SENDs to it go;
* the listings (``list-queues``, ``list-topics``, ``list-destinations``, ``list-subscriptions``,
  ``list-consumers``, ``list-dead-letter-queues``, ``connections``, ``list-quarantine``) run in every
  worker as the same user, and the answers are joined; so does ``drop-quarantined`` (the worker whose
  node id the request names drops the record);
* a change of the users file (``add-user``, ``set-password``, ``set-roles``, ``remove-user``) runs here,
  then every other worker reloads the file (``reload``);
* everything else (``status``, ``overview``, ``storage``, rules, ``cluster``...) answers for this worker.

``/metrics`` on worker 0: every other worker's broker families (BrokerCollector) are fetched over the
channels at each scrape and merged with worker 0's: samples with the same name and labels are summed
(a queue lives in one worker, so its series come from one; broker-wide counts add up), except
``pymq_ready`` and ``pymq_start_time_seconds`` (the minimum) and info families (worker 0's).
``process_*`` and ``python_*`` are worker 0's process only. ``/readyz`` and ``/healthz`` are worker 0's.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric

from pymq.errors import ClusterError, ConfigError
from pymq_server.admin.checks import queue_name
from pymq_server.admin.ops import error_result
from pymq_server.broker.auth import User
from pymq_server.cores.mesh import Mesh

#: operations whose answer is a listing: every worker's, joined
MERGED_OPS = frozenset({"list-queues", "list-topics", "list-destinations", "list-subscriptions",
                        "list-consumers", "list-dead-letter-queues", "connections", "list-quarantine",
                        "drop-quarantined"})
#: operations on one queue, named by ``name`` (move-messages: ``from``)
QUEUE_OPS = frozenset({"create-queue", "alter-queue", "drop-queue", "purge-queue", "queue-info",
                       "browse-queue", "get-message", "drop-messages", "retry-dead-letters", "move-messages"})
#: operations on one destination's permissions, named by ``destination``
DESTINATION_OPS = frozenset({"grant", "revoke"})
#: operations that change the users file: every other worker reloads it afterwards
USER_OPS = frozenset({"add-user", "set-password", "set-roles", "remove-user"})
#: families that do not add up over workers, and how they combine
COMBINE: dict[str, Callable[[float, float], float]] = {"pymq_ready": min, "pymq_start_time_seconds": min}
#: how long a worker waits for another's answer
ANSWER_TIMEOUT_S = 10.0

Family = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


def families(collector: Any) -> list[Family]:
    """A collector's families as JSON-able tuples (what crosses the channel for a scrape)."""
    return [(m.name, m.documentation, m.type, [(s.name, dict(s.labels), s.value) for s in m.samples])
            for m in collector.collect()]


class AdminRouter:
    """This worker's admin entry: runs each operation here, at a queue's owner, or everywhere."""

    def __init__(self, server: Any, mesh: Mesh) -> None:
        self.server = server
        self.mesh = mesh
        self.own: Any = None
        self._others: list[Any] = []          # families of the other workers (JSON lists), last scrape
        self._tasks: set[asyncio.Task] = set()

    # -- operations ----------------------------------------------------------------------------------
    def submit(self, user: Any, op: str, args: Any, reply: Callable[[dict], None]) -> None:
        admin = self.server.admin
        try:
            where = self.where(op, args)
        except ConfigError as exc:
            reply(error_result(exc))
            return
        if where == self.mesh.me and op not in USER_OPS:
            admin.submit(user, op, args, reply)
            return
        task = asyncio.get_running_loop().create_task(self._elsewhere(user, op, args, where, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def where(self, op: str, args: Any) -> int | None:
        """The worker that runs ``op`` (None: every worker)."""
        ownership = self.mesh.ownership
        me = self.mesh.me
        if op in MERGED_OPS:
            return None
        if not isinstance(args, dict):
            return me
        if op in QUEUE_OPS:
            key = "from" if op == "move-messages" else "name"
            if not isinstance(args.get(key), str) or not args[key]:
                return me                               # the operation's own check answers
            owner = ownership.owner("/queue/" + queue_name(args, key))
            target = args.get("to")
            if op == "move-messages" and isinstance(target, str) and target:
                there = ownership.owner(target if target.startswith("/") else "/queue/" + target)
                if there != owner:
                    raise ConfigError(f"move-messages from {args[key]!r} (worker {owner}) to {target!r} "
                                      f"(worker {there}): moving messages between workers is not built "
                                      f"(spec/cores.md §3.7)")
            return owner
        if op in DESTINATION_OPS and isinstance(args.get("destination"), str) and args["destination"]:
            return ownership.owner(args["destination"])
        return me

    async def _elsewhere(self, user: Any, op: str, args: Any, where: int | None,
                         reply: Callable[[dict], None]) -> None:
        question = {"user": user.name, "roles": sorted(user.roles), "op": op, "args": args}
        if where is not None and op not in USER_OPS:
            answer = (await self.mesh.ask(where, "admin", question, ANSWER_TIMEOUT_S))
            reply(answer if answer else error_result(ClusterError(f"worker {where} did not answer {op}")))
            return
        if op in USER_OPS:
            here: asyncio.Future = asyncio.get_running_loop().create_future()
            self.server.admin.submit(user, op, args, here.set_result)
            result = await here
            if result.get("ok"):        # the file changed: every other worker reads it again
                await self.mesh.ask_all("admin", {**question, "op": "reload", "args": {}}, ANSWER_TIMEOUT_S,
                                        others_only=True)
            reply(result)
            return
        answers = await self.mesh.ask_all("admin", question, ANSWER_TIMEOUT_S)
        mine = answers[self.mesh.me]
        if not mine or not mine.get("ok"):
            reply(mine or error_result(ClusterError(f"{op}: no answer")))
            return
        joined = mine["result"]
        for k, answer in enumerate(answers):
            if k != self.mesh.me and answer and answer.get("ok"):
                joined = _join(joined, answer["result"])
        reply({**mine, "result": joined})

    # -- metrics -------------------------------------------------------------------------------------
    def collector(self, own: Any) -> AdminRouter:
        self.own = own
        return self

    async def refresh_metrics(self) -> None:
        answers = await self.mesh.ask_all("metrics", {}, ANSWER_TIMEOUT_S, others_only=True)
        self._others = [fam for answer in answers if answer for fam in answer]

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


def _join(a: Any, b: Any) -> Any:
    """Two workers' listings as one: lists joined (names sorted, as one worker lists them), mappings
    joined key by key."""
    if isinstance(a, list) and isinstance(b, list):
        joined = a + b
        return sorted(joined) if all(isinstance(x, str) for x in joined) else joined
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _join(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    return a


def install(server: Any, mesh: Mesh) -> AdminRouter:
    """What this worker answers the others, and its admin entry (worker 0's HTTP port uses it too)."""
    from pymq_server.admin.metrics import BrokerCollector
    admin = server.admin
    own = BrokerCollector(admin)
    mesh.queries["metrics"] = lambda args, reply: reply(families(own))

    def run_admin(args: dict, reply: Callable[[Any], None]) -> None:
        user = User(str(args["user"]), "", frozenset(args.get("roles", ())))
        admin.submit(user, args["op"], args.get("args") or {}, reply)

    mesh.queries["admin"] = run_admin
    router = AdminRouter(server, mesh)
    mesh.admin = router
    server.cores = router
    return router
