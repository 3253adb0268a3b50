"""Admin operations: one table of named operations, served over STOMP and HTTP (spec/admin.md).

Every operation takes the calling user and a JSON-shaped argument mapping and returns a JSON-shaped
result, or raises a :class:`pymq.errors.PymqError` whose code travels back.  The STOMP admin destination
(``/pymq/admin``, server/admin/stomp_admin.py), the HTTP API and web console (server/admin/http.py) and
the ``pymq-admin`` command line (which speaks HTTP) are thin adapters over :data:`OPERATIONS`;
permissions are checked here, once, so a permission change applies to all of them.

Operations in :data:`READ_ONLY` change nothing; only they may be called with HTTP GET.  An operation
whose work is slow returns an :class:`~pymq_server.admin.checks.Offload`; :meth:`Admin.submit` runs it
in a worker thread and answers when it is done.
"""
from __future__ import annotations

import logging
import platform
import time
from typing import Any
from collections.abc import Callable

import pymq
from pymq.errors import ConfigError, ConnectionClosed, DestinationError, PymqError, UnknownDestination
from pymq_server.admin.ha import ha_status
from pymq_server.admin import definitions, messages, users, vhost_ops
from pymq_server.admin.checks import Offload, queue_name, require_admin, text_arg, user_name
from pymq_server.broker import vhosts
from pymq_server.broker.acl import may_monitor
from pymq_server.storage.store import block_state_key
from pymq_server.admin.rates import PERIOD_S, RateSampler, process_rss, wall_ms

log = logging.getLogger("pymq.admin")


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
        "acknowledged": st.acknowledged,
        "dead_lettered": st.dead_lettered,
        "dropped": st.dropped,
        "replaced": st.replaced,
        "ready": queue.ready.count,
        "in_flight": queue.acquired,
        "scheduled": queue.scheduled,
        "consumers": len(queue.consumers),
        # how far behind its readers are: the age of the oldest message still waiting, and the position a
        # range reader (the Spark connector's consume mode) last acknowledged up to
        "lag_s": _lag_seconds(queue),
        "acked_upto": st.acked_upto,
    }


def _lag_seconds(queue) -> float:
    oldest = queue.ready.oldest()
    if oldest is None:
        return 0.0
    return round(max(0, time.time() * 1000 - oldest.message.timestamp) / 1000, 3)


class Admin:
    def __init__(self, server) -> None:
        self.server = server
        self.sampler = RateSampler()
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self._timer = None
        self._registry = None

    @property
    def broker(self):
        return self.server.broker

    # -- running operations --------------------------------------------------------------------
    def execute(self, user, op: str, args: dict | None) -> Any:
        """Run ``op`` now: its result, or an :class:`Offload` for :meth:`submit` to finish."""
        handler = OPERATIONS.get(op)
        if handler is None:
            raise ConfigError(f"unknown admin operation {op!r}; known: {', '.join(sorted(OPERATIONS))}")
        if args is not None and not isinstance(args, dict):
            raise ConfigError("admin arguments must be a JSON object")
        return handler(self, user, args or {})

    def submit(self, user, op: str, args: Any, reply: Callable[[dict], None]) -> None:
        """Run ``op`` and call ``reply`` with ``{"ok": True, "result"}`` or ``{"ok": False, "error"}``
        on the loop: at once, or after an offloaded part ran in a worker thread."""
        try:
            result = self.execute(user, op, args)
        except PymqError as exc:
            reply(_logged(op, user, error_result(exc)))
            return
        except Exception:  # a bug in an operation: logged with its traceback, answered, never the caller's loss
            log.exception("admin %s failed", op)
            reply(_logged(op, user, internal_error(op)))
            return
        if not isinstance(result, Offload):
            reply(_logged(op, user, {"ok": True, "result": result}))
            return

        def done(value, error) -> None:
            if error is None:
                try:
                    answer = {"ok": True, "result": result.finish(value)}
                except PymqError as exc:
                    answer = error_result(exc)
                except Exception:  # as above: logged and answered
                    log.exception("admin %s failed", op)
                    answer = internal_error(op)
            elif isinstance(error, PymqError):
                answer = error_result(error)
            elif isinstance(error, OSError):
                answer = error_result(ConfigError(f"{op}: {error.strerror or error}"))
            else:
                log.error("admin %s failed", op, exc_info=error)
                answer = internal_error(op)
            reply(_logged(op, user, answer))
        self.broker.run_in_thread(result.work, done)

    # -- sampling for rates and charts ---------------------------------------------------------
    def start(self) -> None:
        """Begin sampling rates (the network broker; the embedded vm:// broker does not sample)."""
        self.sample()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sample(self) -> None:
        try:
            self.sampler.sample(time.monotonic(), self._counters(), self._figures(), wall_ms())
        finally:
            self._timer = self.server.runtime.call_later(PERIOD_S, self.sample)

    def _counters(self) -> dict[str, tuple[int, int, int]]:
        b = self.broker
        counters = {}
        for name, q in b.queues.items():
            st = q.stats
            counters["q:" + name] = (st.added, st.delivered, st.acknowledged)
        for topic in b.topics.values():
            counters["t:" + topic.name] = (topic.published, 0, 0)
            for sub in topic.subscriptions.values():
                st = sub.queue.stats
                counters["s:" + sub.name] = (0, st.delivered, st.acknowledged)
        return counters

    def _figures(self) -> dict:
        b = self.broker
        return {"depth": sum(q.depth for q in b.queues.values()),
                "subscription_depth": sum(s.queue.depth for t in b.topics.values()
                                          for s in t.subscriptions.values()),
                "connections": len(b.sessions), "held_bytes": b.held_bytes, "rss_bytes": process_rss()}

    # -- figures shared by status, metrics and the console -------------------------------------
    def client_queues(self):
        """Queues and broker-internal queues (cluster outboxes), not temporary or subscription queues."""
        b = self.broker
        yield from b.queues.values()
        yield from getattr(b, "internal", {}).values()

    def broker_figures(self) -> dict:
        b = self.broker
        return {"connections": len(b.sessions), "held_bytes": b.held_bytes, "memory_high": b.memory_high,
                "resident_bytes": b.flow.resident(), "client_bytes": b.flow.client_bytes, "entries": b.flow.entries,
                "expired": b.expired, "duplicates": b.duplicates,
                "dropped_no_subscriber": b.dropped_no_subscriber,
                "topics": len(b.topics), "queues": len(b.queues)}

    @staticmethod
    def core_kind() -> str:
        from pymq.protocol import scanner
        return "compiled" if scanner.COMPILED else "pure"

    def readiness(self) -> tuple[bool, dict]:
        """What ``/readyz`` answers: storage open with every device online, recovery done, listening,
        not stopping."""
        server = self.server
        store = server.store
        devices = {s.name: s.online for s in store.status()} if store is not None else {}
        checks: dict[str, Any] = {
            "storage": bool(devices) and all(devices.values()),
            "devices": devices,
            "recovered": bool(getattr(server, "recovery_done", False)),
            "recovered_messages": getattr(server, "recovered", 0),
            "listening": server.port is not None,
            "stopping": bool(getattr(server, "stopping", False)),
        }
        ha = ha_status(server)
        if ha is not None:
            checks["role"] = ha["role"]            # spec/ha.md §1.8: ready only while live
            checks["epoch"] = ha["epoch"]
        ready = bool(checks["storage"] and checks["recovered"] and checks["listening"] and not checks["stopping"]
                     and (ha is None or ha["role"] == "live"))
        return ready, checks


def _logged(op: str, user, answer: dict) -> dict:
    log.info("admin %s by %s: %s", op, user_name(user), "ok" if answer["ok"] else answer["error"]["code"])
    return answer


# -- status ----------------------------------------------------------------------------------------
def status(admin: Admin, user, args: dict) -> dict:
    b = admin.broker
    ready, checks = admin.readiness()
    latest = admin.sampler.latest() or {}
    queues = list(b.queues.values())
    return {
        "node": b.node_id, "version": pymq.__version__, "python": platform.python_version(),
        "core": admin.core_kind(), "started_at": int(admin.started_at * 1000),
        "uptime_s": round(time.monotonic() - admin.started_mono, 1),
        "ready": ready, "checks": checks,
        "listeners": {"stomp": admin.server.port, "admin_http": getattr(admin.server, "admin_port", None)},
        "connections": len(b.sessions), "queues": len(queues), "topics": len(b.topics),
        "subscriptions": sum(len(t.subscriptions) for t in b.topics.values()),
        "messages": {"depth": sum(q.depth for q in queues), "ready": sum(q.ready.count for q in queues),
                     "in_flight": sum(q.acquired for q in queues),
                     "scheduled": sum(q.scheduled for q in queues)},
        "rates": {k: latest.get(k, 0.0) for k in ("rate_in", "rate_out", "rate_ack")},
        "memory": {"held_bytes": b.held_bytes, "resident_bytes": b.flow.resident(), "entries": b.flow.entries,
                   "client_bytes": b.flow.client_bytes, "max_memory": b.config.max_memory,
                   "memory_high": b.memory_high, "rss_bytes": process_rss()},
        "cluster": {"members": b.cluster.status()["members"]} if b.cluster.active else None,
        "role": checks.get("role", "live"),
        "ha": ha_status(admin.server),
    }


def overview(admin: Admin, user, args: dict) -> dict:
    """Status and the sampled history the console's charts draw."""
    return {"status": status(admin, user, args), "history": list(admin.sampler.history),
            "period_s": PERIOD_S}


# -- queues ----------------------------------------------------------------------------------------
def list_queues(admin: Admin, user, args: dict) -> list:
    b = admin.broker
    clock = b.clock()
    out = []
    sees = _sees(admin, user, args)
    for name, queue in sorted(b.queues.items()):
        if not sees(queue.destination):
            continue
        acl = b.acl.acls.get(queue.destination)
        out.append({"name": name, "destination": queue.destination, "vhost": vhosts.vhost_of(queue.destination),
                    "declared": name in b.declared,
                    "owner": acl.owner if acl else None, **queue_metrics(queue, clock),
                    **admin.sampler.rate("q:" + name)})
    return out


def create_queue(admin: Admin, user, args: dict) -> dict:
    name = queue_name(args)
    settings = args.get("config")
    if settings is not None and not isinstance(settings, dict):
        raise ConfigError("'config' must be a mapping of queue settings")
    grants = args.get("grants")
    if grants is not None and not isinstance(grants, dict):
        raise ConfigError("'grants' must be a mapping of principal to permissions")
    queue, created = admin.broker.declare_queue(name, settings or {}, user, grants)
    return {"created": created, "queue": queue_info(admin, user, {"name": name})}


def alter_queue(admin: Admin, user, args: dict) -> dict:
    """Change some settings of a queue (spec/admin.md "Altering a queue"): its owner or an administrator."""
    name = queue_name(args)
    settings = args.get("config")
    if not isinstance(settings, dict):
        raise ConfigError("'config' must be a mapping of the queue settings to change")
    _, changes = admin.broker.alter_queue(name, settings, user)
    return {"altered": bool(changes), "changes": changes, "queue": queue_info(admin, user, {"name": name})}


def drop_queue(admin: Admin, user, args: dict) -> dict:
    return {"dropped_messages": admin.broker.drop_queue(queue_name(args), user, force=bool(args.get("force")))}


def purge_queue(admin: Admin, user, args: dict) -> dict:
    return {"purged_messages": admin.broker.purge_queue(queue_name(args), user)}


def queue_info(admin: Admin, user, args: dict) -> dict:
    b = admin.broker
    name = queue_name(args)
    queue = b.queues.get(name)
    if queue is None:
        raise UnknownDestination(f"queue '/queue/{name}' does not exist", destination="/queue/" + name)
    if not may_monitor(user):                   # lists and metrics show the monitor role every queue
        b.acl.check_sees(user, queue.destination)
    return {"name": name, "destination": queue.destination, "vhost": vhosts.vhost_of(queue.destination),
            "declared": name in b.declared, "config": queue.config.to_dict(), "acl": b.acl.describe(queue.destination),
            "metrics": queue_metrics(queue, b.clock()), "rates": admin.sampler.rate("q:" + name),
            "log": b.destinations.queue_logs.path_for(name)}


def _sees(admin: Admin, user, args: dict | None = None):
    """What ``user`` may see in lists and metrics: destinations it holds some permission on (every one
    for administrators and the ``monitor`` role), in the vhost the ``vhost`` argument names (vhost_ops.py)."""
    in_vhost = vhost_ops.destination_filter(admin.broker, args or {})
    if may_monitor(user):
        return in_vhost
    acl = admin.broker.acl
    return lambda destination: in_vhost(destination) and acl.sees(user, destination)


def metrics(admin: Admin, user, args: dict) -> dict:
    b = admin.broker
    clock = b.clock()
    sees = _sees(admin, user, args)
    return {"queues": {n: queue_metrics(q, clock) for n, q in sorted(b.queues.items()) if sees(q.destination)},
            "subscriptions": {q.name: queue_metrics(q, clock) for t in b.topics.values() if sees(t.destination)
                              for q in (s.queue for s in t.subscriptions.values())},
            "broker": admin.broker_figures()}


# -- destinations and permissions ------------------------------------------------------------------
def list_destinations(admin: Admin, user, args: dict) -> dict:
    b = admin.broker
    sees = _sees(admin, user, args)
    return {"queues": sorted(q.destination for q in b.queues.values() if sees(q.destination)),
            "topics": sorted(t.destination for t in b.topics.values() if sees(t.destination)),
            "logs": sorted(d for d in b.logs if sees(d))}


def _subscription(sub, clock: float, sampler: RateSampler) -> dict:
    return {"name": sub.name, "durable": sub.durable, "shared": sub.shared,
            "client_id": sub.client_id, "selector": sub.selector.text if sub.selector else None,
            **queue_metrics(sub.queue, clock), **sampler.rate("s:" + sub.name)}


def list_topics(admin: Admin, user, args: dict) -> list:
    b = admin.broker
    clock = b.clock()
    sees = _sees(admin, user, args)
    return [{"name": t.name, "destination": t.destination, "vhost": vhosts.vhost_of(t.destination),
             "published": t.published, **admin.sampler.rate("t:" + t.name),
             "subscriptions": [_subscription(s, clock, admin.sampler) for s in t.subscriptions.values()]}
            for _, t in sorted(b.topics.items()) if sees(t.destination)]


def list_subscriptions(admin: Admin, user, args: dict) -> list:
    b = admin.broker
    clock = b.clock()
    sees = _sees(admin, user, args)
    return [{"topic": t.destination, "vhost": vhosts.vhost_of(t.destination), **_subscription(s, clock, admin.sampler)}
            for _, t in sorted(b.topics.items()) if sees(t.destination) for s in t.subscriptions.values()]


def grant(admin: Admin, user, args: dict) -> dict:
    return admin.broker.grant(user, args.get("destination", ""), args.get("principal", ""),
                              args.get("permissions") or [])


def revoke(admin: Admin, user, args: dict) -> dict:
    return admin.broker.revoke(user, args.get("destination", ""), args.get("principal", ""),
                               args.get("permissions") or [])


def acl(admin: Admin, user, args: dict) -> dict:
    destination = text_arg(args, "destination") or ""
    kind, _ = admin.broker.resolve(destination)
    if kind.value.startswith("temp-"):
        # a temporary destination belongs to its connection: no access list, nothing to tell others
        raise DestinationError(f"'{destination}' is temporary: it belongs to its connection and has no "
                               f"permissions", destination=destination)
    admin.broker.acl.check_sees(user, destination)
    return admin.broker.acl.describe(destination)


# -- storage (seed 000) ----------------------------------------------------------------------------
def _status(status) -> dict:
    return {"name": status.name, "kind": status.kind, "messages": status.messages,
            "bytes_used": status.bytes_used, "bytes_free": status.bytes_free, "capacity": status.capacity,
            "errors": status.errors, "write_latency_s": status.write_latency_s, "online": status.online}


def storage(admin: Admin, user, args: dict) -> dict:
    require_admin(user, "read storage status")
    store = admin.server.store
    selection = store.selection
    return {"devices": [_status(s) for s in store.status()],
            "persistent_device": store.persistent_device.name,
            "placements": store.placements(),
            "rules": selection.describe() if selection is not None else None,
            "syncs": store.syncs}


def list_quarantine(admin: Admin, user, args: dict) -> list:
    """Stored records recovery could not decode and set aside (spec/storage.md §12)."""
    require_admin(user, "list quarantined records")
    return admin.broker.quarantine.listing(admin.broker.node_id)


def drop_quarantined(admin: Admin, user, args: dict) -> dict:
    """Remove a quarantined record's references, so its device frees it: ``{node, key}`` (a broker of
    several workers runs this in each; only the one whose node id matches drops it), ``device`` when two
    devices hold the same key.  ``{"dropped": [...]}``: what was dropped here."""
    require_admin(user, "drop quarantined records")
    broker = admin.broker
    node, key, device = text_arg(args, "node", required=False), text_arg(args, "key"), \
        text_arg(args, "device", required=False)
    if node is not None and node != broker.node_id:
        return {"dropped": []}
    dropped = []
    for record in [r for r in broker.quarantine.records.values() if r.key == key and device in (None, r.device)]:
        broker.quarantine.take(record.device, record.key)
        if record.kind == "catalog":
            broker.store.put_meta(record.key, None)
        else:
            for ref in record.references:
                broker.store.release(_Stored(record.handle, int(record.key)), ref)
                broker.store.put_meta(block_state_key(int(record.key), ref), None)
        log.warning("administrator '%s' dropped quarantined %s record %s of device %s", user_name(user),
                    record.kind, record.key, record.device)
        dropped.append(record.describe(broker.node_id))
    if dropped:
        broker.barrier(lambda error: None)      # written now, not with whatever next asks for a barrier
    return {"dropped": dropped}


class _Stored:
    """What HoldingStore.release needs of a stored record (its device and key)."""

    __slots__ = ("device", "key", "size")

    def __init__(self, device: Any, key: int) -> None:
        self.device, self.key, self.size = device, key, 0


def _selection(admin: Admin, user):
    require_admin(user, "change storage rules")
    layer = admin.server.store.selection
    if layer is None:
        raise ConfigError("storage rules are not enabled (configure storage.selection)")
    return layer


def add_rule(admin: Admin, user, args: dict) -> Any:
    _selection(admin, user).add_rule(args)
    return admin.server.store.selection.describe()


def replace_rule(admin: Admin, user, args: dict) -> Any:
    _selection(admin, user).replace_rule(args)
    return admin.server.store.selection.describe()


def remove_rule(admin: Admin, user, args: dict) -> Any:
    _selection(admin, user).remove_rule(args.get("id", ""))
    return admin.server.store.selection.describe()


def list_rules(admin: Admin, user, args: dict) -> Any:
    return _selection(admin, user).describe()


def _cluster_node(admin: Admin):
    node = admin.broker.cluster
    if not node.active:
        raise ConfigError("this broker is not part of a cluster")
    return node


def cluster(admin: Admin, user, args: dict) -> dict:
    require_admin(user, "read the cluster's state")
    return _cluster_node(admin).status()


def list_outboxes(admin: Admin, user, args: dict) -> list:
    """This node's outboxes to its peers; those of peers that are not alive hold messages for their durable
    subscribers (spec/cluster.md §5)."""
    require_admin(user, "list cluster outboxes")
    return _cluster_node(admin).list_outboxes()


def purge_outbox(admin: Admin, user, args: dict) -> dict:
    require_admin(user, "purge a cluster outbox")
    node = _cluster_node(admin)
    return node.purge_outbox(text_arg(args, "node"), forget=bool(args.get("forget")))


# -- connections and consumers ---------------------------------------------------------------------
def connections(admin: Admin, user, args: dict) -> list:
    require_admin(user, "list connections")
    in_vhost = vhost_ops.session_filter(admin.broker, args)
    return [{"id": s.id, "user": getattr(s.user, "name", None), "peer": s.peer_host,
             "vhost": getattr(s, "vhost", vhosts.DEFAULT),
             "client_id": s.client_id, "version": s.version, "subscriptions": len(s.consumers),
             "received": s.received, "sent": s.sent, "writable": s.writable}
            for s in admin.broker.sessions.values() if in_vhost(s)]


def close_connection(admin: Admin, user, args: dict) -> dict:
    require_admin(user, "close connections")
    conn_id = text_arg(args, "id")
    session = admin.broker.sessions.get(conn_id)
    if session is None:
        raise UnknownDestination(f"no open connection {conn_id!r}", destination=conn_id)
    # an ERROR frame first, so the client knows why; its unacknowledged messages return to their queues
    session.fail(ConnectionClosed(f"connection closed by administrator '{user_name(user)}'"))
    return {"closed": conn_id}


def list_consumers(admin: Admin, user, args: dict) -> list:
    require_admin(user, "list consumers")
    only = text_arg(args, "queue", required=False)     # a queue name, a destination or a subscription name
    if only is not None and not only.startswith("/") and only not in _subscription_names(admin.broker):
        only = "/queue/" + only
    out = []
    in_vhost = vhost_ops.session_filter(admin.broker, args)
    for session in admin.broker.sessions.values():
        if not in_vhost(session):
            continue
        for consumer in session.consumers.values():
            queue = consumer.queue
            if only is not None and only not in (queue.name, queue.destination):
                continue
            sub = consumer.subscription
            out.append({"connection": session.id, "user": getattr(session.user, "name", None),
                        "vhost": getattr(session, "vhost", vhosts.DEFAULT),
                        "peer": session.peer_host, "id": consumer.id, "destination": consumer.destination,
                        "queue": queue.name, "ack": consumer.ack_mode, "prefetch": consumer.prefetch,
                        "in_flight": consumer.in_flight,
                        "selector": consumer.selector.text if consumer.selector is not None else
                        (sub.selector.text if sub is not None and sub.selector is not None else None),
                        "subscription": sub.name if sub is not None else None,
                        "durable": bool(sub is not None and sub.durable), "active": consumer.active})
    return out


def _subscription_names(broker) -> set[str]:
    return {name for t in broker.topics.values() for name in t.subscriptions}


OPERATIONS: dict[str, Callable[[Admin, Any, dict], Any]] = {
    "status": status,
    "overview": overview,
    "list-queues": list_queues,
    "create-queue": create_queue,
    "alter-queue": alter_queue,
    "drop-queue": drop_queue,
    "purge-queue": purge_queue,
    "queue-info": queue_info,
    "metrics": metrics,
    "list-destinations": list_destinations,
    "list-topics": list_topics,
    "list-subscriptions": list_subscriptions,
    "grant": grant,
    "revoke": revoke,
    "acl": acl,
    "storage": storage,
    "add-rule": add_rule,
    "replace-rule": replace_rule,
    "remove-rule": remove_rule,
    "list-rules": list_rules,
    "list-quarantine": list_quarantine,
    "drop-quarantined": drop_quarantined,
    "connections": connections,
    "close-connection": close_connection,
    "list-consumers": list_consumers,
    "list-vhosts": vhost_ops.list_vhosts,
    "cluster": cluster,
    "list-outboxes": list_outboxes,
    "purge-outbox": purge_outbox,
    "browse-queue": messages.browse_queue,
    "get-message": messages.get_message,
    "move-messages": messages.move_messages,
    "retry-dead-letters": messages.retry_dead_letters,
    "drop-messages": messages.drop_messages,
    "publish": messages.publish,
    "list-dead-letter-queues": messages.list_dead_letter_queues,
    "list-users": users.list_users,
    "add-user": users.add_user,
    "set-password": users.set_password,
    "set-roles": users.set_roles,
    "remove-user": users.remove_user,
    "reload": users.reload,
    "export-definitions": definitions.export_definitions,
    "import-definitions": definitions.import_definitions,
}

#: operations that change nothing (HTTP GET may call only these)
READ_ONLY = frozenset({
    "status", "overview", "list-queues", "queue-info", "metrics", "list-destinations", "list-topics",
    "list-subscriptions", "acl", "storage", "list-rules", "connections", "list-consumers", "cluster",
    "list-outboxes", "list-quarantine", "list-vhosts",
    "browse-queue", "get-message", "list-dead-letter-queues", "list-users", "export-definitions",
})


def internal_error(op: str) -> dict:
    """The answer to an operation that failed for a reason of the broker's own (a bug): the log has the
    traceback; HTTP answers 500."""
    return {"ok": False, "internal": True,
            "error": {"code": PymqError.code, "message": f"{op} failed: internal broker error (see the broker's log)"}}


def error_result(exc: PymqError) -> dict:
    return {"ok": False, "error": {"code": exc.code, "message": exc.message,
                                   **{k: v for k, v in vars(exc).items()
                                      if k != "message" and isinstance(v, (str, int, float))}}}
