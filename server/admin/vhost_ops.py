"""Virtual hosts in the admin operations (spec/admin.md "Virtual hosts"): the ``vhost`` argument that narrows
a list to one vhost, the ``vhost`` of each listed thing, and ``list-vhosts`` (RabbitMQ's ``/api/vhosts``:
each vhost with its principals, limits and what it holds now).

A vhost is named ``/`` (the default) or by its name, with or without a leading ``/``.
"""
from __future__ import annotations

from collections import Counter
from typing import Any
from collections.abc import Callable

from pymq.errors import AccessDenied, UnknownDestination
from pymq_server.admin.checks import text_arg, user_name
from pymq_server.broker import vhosts
from pymq_server.broker.acl import may_monitor
from pymq_server.broker.flow import MESSAGE_OVERHEAD

LIMITS = ("max_connections", "max_queues", "max_memory")


def named(broker, args: dict) -> str | None:
    """The vhost the ``vhost`` argument names (None: every vhost); UnknownDestination for one not configured."""
    value = text_arg(args, "vhost", required=False)
    if value is None or value == "":
        return None
    name = value[1:] if value.startswith("/") and value != vhosts.DEFAULT else value
    if name != vhosts.DEFAULT and name not in broker.config.vhosts:
        raise UnknownDestination(f"no virtual host {value[:80]!r} (configured: /, "
                                 f"{', '.join(sorted(broker.config.vhosts)) or 'no other'})",
                                 destination="vhost:" + value[:80])
    return name


def destination_filter(broker, args: dict) -> Callable[[str], bool]:
    """Whether a core destination is in the vhost the ``vhost`` argument names (every one without it)."""
    name = named(broker, args)
    if name is None:
        return lambda destination: True
    return lambda destination: vhosts.vhost_of(destination) == name


def session_filter(broker, args: dict) -> Callable[[Any], bool]:
    """Whether a connection is in the vhost the ``vhost`` argument names."""
    name = named(broker, args)
    if name is None:
        return lambda session: True
    return lambda session: getattr(session, "vhost", vhosts.DEFAULT) == name


def list_vhosts(admin, user, args: dict) -> list:
    """Every vhost (``/`` first) with its principals, limits, connections, queues, topics, messages and
    message memory; for administrators and the monitor role."""
    if not may_monitor(user):
        raise AccessDenied(f"user '{user_name(user)}' may not list virtual hosts (administrators and the monitor "
                           f"role)", user=user_name(user), permission="monitor")
    return vhost_rows(admin.broker)


def vhost_rows(b) -> list[dict]:
    """What :func:`list_vhosts` answers (the metrics read it too)."""
    configured = b.config.vhosts
    connections = Counter(getattr(s, "vhost", vhosts.DEFAULT) for s in b.sessions.values())
    queues: Counter = Counter()
    depth: Counter = Counter()
    for queue in b.queues.values():
        vhost = vhosts.vhost_of(queue.destination)
        queues[vhost] += 1
        depth[vhost] += queue.depth
    topics = Counter(vhosts.vhost_of(t.destination) for t in b.topics.values())
    memory = dict(b.flow.vhost_memory or {})
    flow = b.flow
    memory[vhosts.DEFAULT] = (flow.held_bytes + flow.held_messages * MESSAGE_OVERHEAD) - sum(memory.values())
    out = []
    for name in [vhosts.DEFAULT, *sorted(configured)]:
        entry = configured.get(name)
        out.append({"name": name, "principals": list(entry.principals) if entry is not None else None,
                    "limits": {k: getattr(entry, k) for k in LIMITS} if entry is not None else {},
                    "connections": connections[name], "queues": queues[name], "topics": topics[name],
                    "depth": depth[name], "memory_bytes": memory.get(name, 0)})
    return out
