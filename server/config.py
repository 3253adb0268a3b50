"""Broker configuration: defaults, the YAML file, and command-line overrides.

Every setting has a default that makes ``pymq-server`` with no arguments a working broker on
127.0.0.1:61613 keeping its data under ``./pymq-data``.  Unknown keys in the YAML file are an error
naming the key (a typo must not silently fall back to a default).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from pymq.errors import ConfigError


@dataclass
class QueueConfig:
    """Per-queue settings (seed 001); the broker-wide defaults live in BrokerConfig.queue_defaults."""

    max_deliveries: int = 10             # deliveries before dead-lettering; 0 = unlimited
    dead_letter: bool = True             # False: a message at the maximum is dropped (counted)
    dead_letter_prefix: str = "DLQ."
    redelivery_delay_ms: int = 0         # delay before a failed message is ready again
    redelivery_multiplier: float = 1.0   # backoff: delay * multiplier ** (deliveries - 1)
    redelivery_max_delay_ms: int = 60_000

    def delay_for(self, deliveries: int) -> int:
        """Redelivery delay in ms after the ``deliveries``-th failed delivery (capped backoff)."""
        if self.redelivery_delay_ms <= 0:
            return 0
        delay = self.redelivery_delay_ms * (self.redelivery_multiplier ** max(0, deliveries - 1))
        return int(min(delay, self.redelivery_max_delay_ms))


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 61613
    data_dir: str = "pymq-data"
    node_id: str = "pymq"
    users_file: str | None = None
    allow_anonymous: bool = False        # with a users file: CONNECT without login is refused
    max_frame_size: int = 4 * 1024 * 1024
    max_headers: int = 1000
    max_connections: int = 10_000
    max_subscriptions_per_connection: int = 10_000
    max_transactions_per_connection: int = 1_000
    max_transaction_operations: int = 100_000
    heartbeat_send_ms: int = 10_000      # what the broker offers to send (CONNECTED sx)
    heartbeat_recv_ms: int = 10_000      # what the broker wants to receive (CONNECTED sy)
    heartbeat_grace: float = 2.0         # a peer is dead after grace × its interval without traffic
    write_buffer_high: int = 1024 * 1024 # per-connection: pause deliveries above this many bytes
    write_buffer_low: int = 256 * 1024
    max_memory: int = 1024 * 1024 * 1024 # message bytes held before producers are paused
    default_persistent: bool = True
    auto_create: bool = True
    default_prefetch: int = 1000         # client/client-individual acks without prefetch header
    sync_policy: str = "always"          # always (sync before every receipt; concurrent commits share
                                         # one fsync) | grouped (≤ 1 fsync per sync_window_ms) | never
    sync_window_ms: float = 2.0
    storage: dict = field(default_factory=dict)
    queue_defaults: QueueConfig = field(default_factory=QueueConfig)
    queues: dict = field(default_factory=dict)
    retention: dict = field(default_factory=dict)  # destination or glob -> {ms, messages} (logs)
    dedup_window_ms: int = 600_000       # duplicate detection window (pymq-dedup-id, _AMQ_DUPL_ID)
    dedup_max_ids: int = 1_000_000       # ids remembered per destination
    admin_port: int | None = None        # HTTP admin/metrics endpoint; None = off
    log_level: str = "INFO"

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, **overrides: Any) -> "BrokerConfig":
        data: dict = {}
        if path is not None:
            try:
                with open(path, encoding="utf-8") as fh:
                    data = yaml.safe_load(fh) or {}
            except OSError as exc:
                raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
            except yaml.YAMLError as exc:
                raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
            if not isinstance(data, dict):
                raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> "BrokerConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
        data = dict(data)
        qd = data.get("queue_defaults")
        if isinstance(qd, dict):
            data["queue_defaults"] = queue_config(qd, "queue_defaults")
        cfg = cls(**data)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is out of range")
        if self.sync_policy not in ("always", "grouped", "never"):
            raise ConfigError(f"sync_policy must be always, grouped or never, not {self.sync_policy!r}")
        if self.write_buffer_low > self.write_buffer_high:
            raise ConfigError("write_buffer_low must not exceed write_buffer_high")
        if self.heartbeat_grace < 1.0:
            raise ConfigError("heartbeat_grace must be at least 1.0")


def queue_config(data: dict, where: str = "queue") -> QueueConfig:
    names = {f.name for f in dataclasses.fields(QueueConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {where} setting(s): {', '.join(unknown)}")
    return QueueConfig(**data)
