"""Admin operations: one table of named operations, served over STOMP and HTTP (spec/admin.md).

Every operation takes the calling user and a JSON-shaped argument mapping and returns a JSON-shaped
result, or raises a :class:`pymq.errors.PymqError` whose code travels back.  The STOMP admin destination
(``/pymq/admin``, server/admin/stomp_admin.py) and the HTTP endpoint (server/admin/http.py) are thin
adapters over :data:`OPERATIONS`; permissions are checked here, once.
"""
from __future__ import annotations

from typing import Any, Callable

from pymq.errors import AccessDenied, ConfigError, PymqError, UnknownDestination
from pymq_server.broker.acl import is_admin


def _name(args: dict, key: str = "name") -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"admin operation needs a non-empty string '{key}'")
    if value.startswith("/queue/"):
        value = value[len("/queue/"):]
    return value


def _require_admin(user, what: str) -> None:
    if not is_admin(user):
        name = getattr(user, "name", "anonymous")
        raise AccessDenied(f"user '{name}' may not {what}: administrators only", user=name,
                           destination="*", permission="admin")


def queue_metrics(queue, clock: float) -> dict:
    """The nine metrics of seed 001, plus the queue's current composition."""
    st = queue.stats
    depth = queue.depth
    return {
        "depth": depth,
        "average_depth": round(st.average_depth(depth, clock), 3),
        "peak_depth": st.peak_depth,
        "added": st.added,
        "removed": st.removed,
        "failed": st.failed,
        "average_wait_s": round(st.wait_total / st.wait_count, 6) if st.wait_count else 0.0,
        "max_wait_s": round(st.wait_max, 6),
        "expired": st.expired,
        "delivered": st.delivered,
        "dead_lettered": st.dead_lettered,
        "dropped": st.dropped,
        "ready": queue.ready.count,
        "in_flight": queue.acquired,
        "scheduled": queue.scheduled,
        "consumers": len(queue.consumers),
    }


class Admin:
    def __init__(self, server) -> None:
        self.server = server

    @property
    def broker(self):
        return self.server.broker

    def execute(self, user, op: str, args: dict | None) -> Any:
        handler = OPERATIONS.get(op)
        if handler is None:
            raise ConfigError(f"unknown admin operation {op!r}; known: {', '.join(sorted(OPERATIONS))}")
        if args is not None and not isinstance(args, dict):
            raise ConfigError("admin arguments must be a JSON object")
        return handler(self, user, args or {})

    # -- queues --------------------------------------------------------------------------------
    def list_queues(self, user, args: dict) -> list:
        b = self.broker
        clock = b.clock()
        out = []
        for name, queue in sorted(b.queues.items()):
            acl = b.acl.acls.get(queue.destination)
            out.append({"name": name, "destination": queue.destination, "declared": name in b.declared,
                        "owner": acl.owner if acl else None, **queue_metrics(queue, clock)})
        return out

    def create_queue(self, user, args: dict) -> dict:
        name = _name(args)
        settings = args.get("config")
        if settings is not None and not isinstance(settings, dict):
            raise ConfigError("'config' must be a mapping of queue settings")
        queue, created = self.broker.declare_queue(name, settings or {}, user, args.get("grants"))
        return {"created": created, "queue": self.queue_info(user, {"name": name})}

    def drop_queue(self, user, args: dict) -> dict:
        return {"dropped_messages": self.broker.drop_queue(_name(args), user, force=bool(args.get("force")))}

    def purge_queue(self, user, args: dict) -> dict:
        return {"purged_messages": self.broker.purge_queue(_name(args), user)}

    def queue_info(self, user, args: dict) -> dict:
        b = self.broker
        name = _name(args)
        queue = b.queues.get(name)
        if queue is None:
            raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
        return {"name": name, "destination": queue.destination, "declared": name in b.declared,
                "config": queue.config.to_dict(), "acl": b.acl.describe(queue.destination),
                "metrics": queue_metrics(queue, b.clock())}

    def metrics(self, user, args: dict) -> dict:
        b = self.broker
        clock = b.clock()
        return {"queues": {n: queue_metrics(q, clock) for n, q in sorted(b.queues.items())},
                "subscriptions": {q.name: queue_metrics(q, clock) for t in b.topics.values()
                                  for q in (s.queue for s in t.subscriptions.values())},
                "broker": self.broker_figures()}

    def broker_figures(self) -> dict:
        b = self.broker
        return {"connections": len(b.sessions), "held_bytes": b.held_bytes, "memory_high": b.memory_high,
                "expired": b.expired, "duplicates": b.duplicates,
                "dropped_no_subscriber": b.dropped_no_subscriber,
                "topics": len(b.topics), "queues": len(b.queues)}

    # -- destinations and permissions ----------------------------------------------------------
    def list_destinations(self, user, args: dict) -> dict:
        b = self.broker
        return {"queues": sorted(q.destination for q in b.queues.values()),
                "topics": sorted(t.destination for t in b.topics.values()),
                "logs": sorted(b.logs)}

    def list_topics(self, user, args: dict) -> list:
        b = self.broker
        clock = b.clock()
        return [{"name": t.name, "destination": t.destination, "published": t.published,
                 "subscriptions": [{"name": s.name, "durable": s.durable, "shared": s.shared,
                                    "selector": s.selector.text if s.selector else None,
                                    **queue_metrics(s.queue, clock)} for s in t.subscriptions.values()]}
                for _, t in sorted(b.topics.items())]

    def grant(self, user, args: dict) -> dict:
        return self.broker.grant(user, args.get("destination", ""), args.get("principal", ""),
                                 args.get("permissions") or [])

    def revoke(self, user, args: dict) -> dict:
        return self.broker.revoke(user, args.get("destination", ""), args.get("principal", ""),
                                  args.get("permissions") or [])

    def acl(self, user, args: dict) -> dict:
        destination = args.get("destination", "")
        self.broker.resolve(destination)
        return self.broker.acl.describe(destination)

    # -- storage (seed 000) --------------------------------------------------------------------
    def storage(self, user, args: dict) -> dict:
        _require_admin(user, "read storage status")
        store = self.server.store
        selection = store.selection
        return {"devices": [_status(s) for s in store.status()],
                "placements": store.placements(),
                "rules": selection.describe() if selection is not None else None,
                "syncs": store.syncs}

    def _selection(self, user):
        _require_admin(user, "change storage rules")
        layer = self.server.store.selection
        if layer is None:
            raise ConfigError("storage rules are not enabled (configure storage.selection)")
        return layer

    def add_rule(self, user, args: dict) -> Any:
        self._selection(user).add_rule(args)
        return self.server.store.selection.describe()

    def replace_rule(self, user, args: dict) -> Any:
        self._selection(user).replace_rule(args)
        return self.server.store.selection.describe()

    def remove_rule(self, user, args: dict) -> Any:
        self._selection(user).remove_rule(args.get("id", ""))
        return self.server.store.selection.describe()

    def list_rules(self, user, args: dict) -> Any:
        return self._selection(user).describe()

    def cluster(self, user, args: dict) -> dict:
        node = self.broker.cluster
        if node is None:
            raise ConfigError("this broker is not part of a cluster")
        return node.status()

    def connections(self, user, args: dict) -> list:
        _require_admin(user, "list connections")
        return [{"id": s.id, "user": getattr(s.user, "name", None), "peer": s.peer_host,
                 "client_id": s.client_id, "version": s.version, "subscriptions": len(s.consumers),
                 "received": s.received, "sent": s.sent} for s in self.broker.sessions.values()]


def _status(status) -> dict:
    return {"name": status.name, "kind": status.kind, "messages": status.messages,
            "bytes_used": status.bytes_used, "bytes_free": status.bytes_free, "capacity": status.capacity,
            "errors": status.errors, "write_latency_s": status.write_latency_s, "online": status.online}


OPERATIONS: dict[str, Callable[[Admin, Any, dict], Any]] = {
    "list-queues": Admin.list_queues,
    "create-queue": Admin.create_queue,
    "drop-queue": Admin.drop_queue,
    "purge-queue": Admin.purge_queue,
    "queue-info": Admin.queue_info,
    "metrics": Admin.metrics,
    "list-destinations": Admin.list_destinations,
    "list-topics": Admin.list_topics,
    "grant": Admin.grant,
    "revoke": Admin.revoke,
    "acl": Admin.acl,
    "storage": Admin.storage,
    "add-rule": Admin.add_rule,
    "replace-rule": Admin.replace_rule,
    "remove-rule": Admin.remove_rule,
    "list-rules": Admin.list_rules,
    "connections": Admin.connections,
    "cluster": Admin.cluster,
}


def prometheus(admin: Admin) -> str:
    """Every queue's metrics and the broker's figures in the Prometheus text format (0.0.4)."""
    b = admin.broker
    clock = b.clock()
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            label_text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{label_text}}} {value}" if label_text else f"{name} {value}")

    queues = [({"queue": q.destination}, queue_metrics(q, clock)) for q in b.all_queues()]
    spec = [
        ("pymq_queue_depth", "gauge", "Messages in the queue (ready, in flight, scheduled)", "depth"),
        ("pymq_queue_depth_average", "gauge", "Time-weighted average depth since start", "average_depth"),
        ("pymq_queue_depth_peak", "gauge", "Peak depth since start", "peak_depth"),
        ("pymq_queue_added_total", "counter", "Messages added", "added"),
        ("pymq_queue_removed_total", "counter", "Messages completed (acknowledged or purged)", "removed"),
        ("pymq_queue_failed_total", "counter", "Failed deliveries (NACK, lost consumer, timeout)", "failed"),
        ("pymq_queue_wait_seconds_average", "gauge", "Average wait before first delivery", "average_wait_s"),
        ("pymq_queue_wait_seconds_max", "gauge", "Longest wait before first delivery", "max_wait_s"),
        ("pymq_queue_expired_total", "counter", "Messages that expired", "expired"),
        ("pymq_queue_dead_lettered_total", "counter", "Messages moved to the dead-letter queue",
         "dead_lettered"),
        ("pymq_queue_consumers", "gauge", "Consumers attached", "consumers"),
    ]
    for name, kind, help_text, key in spec:
        family(name, kind, help_text, [(labels, m[key]) for labels, m in queues])
    figures = admin.broker_figures()
    family("pymq_connections", "gauge", "Open client connections", [({}, figures["connections"])])
    family("pymq_held_bytes", "gauge", "Message bytes held by the broker", [({}, figures["held_bytes"])])
    family("pymq_duplicates_total", "counter", "SENDs dropped by duplicate detection",
           [({}, figures["duplicates"])])
    statuses = admin.server.store.status()
    family("pymq_device_messages", "gauge", "Messages held per holding device",
           [({"device": s.name, "kind": s.kind}, s.messages) for s in statuses])
    family("pymq_device_bytes", "gauge", "Bytes held per holding device",
           [({"device": s.name, "kind": s.kind}, s.bytes_used) for s in statuses])
    return "\n".join(lines) + "\n"


def _escape_label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def error_result(exc: PymqError) -> dict:
    return {"ok": False, "error": {"code": exc.code, "message": exc.message,
                                   **{k: v for k, v in vars(exc).items()
                                      if k != "message" and isinstance(v, (str, int, float))}}}
