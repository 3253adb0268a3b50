"""What the admin interface says about high availability (spec/ha.md §1.8), and what it answers while the
process is a backup: a backup has no broker core, so its admin port answers ``/healthz``, ``/readyz``
(503, ``"role": "backup"``), ``/metrics`` (the role, the epoch, the holder), the console's log-in and the
``status`` operation; every other operation is ``illegal-state``.  Users log in against the configured
users file as on a live (a password hash off the event loop).
"""
from __future__ import annotations

import asyncio
import platform
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

import pymq
from pymq.errors import IllegalStateError
from pymq_server.broker.auth import Authenticator

ROLES = ("backup", "activating", "live", "fenced", "stopped")


def ha_status(server: Any) -> dict | None:
    """The ``ha`` part of ``status`` (None without ``ha:``)."""
    role = getattr(server, "ha", None)
    return None if role is None else role.status()


class BackupAdmin:
    """The admin port's answers while this process waits as a backup."""

    def __init__(self, server: Any) -> None:
        self.server = server
        config = server.config
        self.authenticator = Authenticator(config.users_file, config.allow_anonymous)

    def readiness(self) -> tuple[bool, dict]:
        ha = ha_status(self.server) or {}
        return False, {"role": ha.get("role", "backup"), "storage": False, "recovered": False,
                       "listening": False, "stopping": bool(getattr(self.server, "stopping", False)),
                       "epoch": ha.get("epoch", 0)}

    def status(self) -> dict:
        ready, checks = self.readiness()
        config = self.server.config
        return {"node": config.node_id, "version": pymq.__version__, "python": platform.python_version(),
                "role": checks["role"], "ready": ready, "checks": checks, "ha": ha_status(self.server),
                "listeners": {"stomp": None, "admin_http": getattr(self.server, "admin_port", None)}}

    def answer(self, op: str) -> dict:
        if op == "status":
            return {"ok": True, "result": self.status()}
        if op == "overview":                     # the console's first page
            return {"ok": True, "result": {"status": self.status(), "history": []}}
        error = IllegalStateError(f"this broker is a {self.readiness()[1]['role']} of node "
                                  f"{self.server.config.node_id}: only 'status' is answered until it takes over")
        return {"ok": False, "error": {"code": error.code, "message": error.message}}

    async def authenticate(self, login: str, password: str, peer: str | None) -> Any:
        auth = self.authenticator
        return await asyncio.to_thread(auth.authenticate, login, password, peer, None)


class HaCollector:
    """spec/ha.md §1.8's metrics, read at scrape time."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        status = ha_status(self.server)
        if status is None:
            return
        role = GaugeMetricFamily("pymq_ha_role", "1 for this process's role in its high-availability group",
                                 labels=["role"])
        for name in ROLES:
            role.add_metric([name], 1 if status["role"] == name else 0)
        yield role
        yield GaugeMetricFamily("pymq_ha_epoch", "The store's epoch as this process last read or wrote it",
                                value=status["epoch"])
        yield CounterMetricFamily("pymq_ha_takeovers", "Times this process took the store",
                                  value=status["takeovers"])
        yield CounterMetricFamily("pymq_ha_renewals", "Lease renewals this process made",
                                  value=status["renewals"])
        if status["last_takeover_s"] is not None:
            yield GaugeMetricFamily("pymq_ha_takeover_seconds", "This process's last takeover: from taking "
                                    "the store to listening", value=status["last_takeover_s"])


def backup_registry(server: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HaCollector(server))
    ProcessCollector(registry=registry)
    return registry
