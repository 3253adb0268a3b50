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


OVERFLOW_POLICIES = ("block", "reject", "drop-oldest")


@dataclass(frozen=True)
class QueueConfig:
    """Per-queue settings (seed 001), kept across restarts in the catalog.

    ``max_deliveries``: deliveries before dead-lettering (0 = unlimited).  ``dead_letter``: move a
    message at the maximum to ``<prefix><queue>`` (True) or drop it, counted (False);
    ``dead_retention_ms``: how long the dead-letter queue keeps it (0 = until consumed).
    ``default_expiration_ms``/``default_priority``: applied when the producer sets none.
    ``delivery_timeout_ms``: a message held by a consumer longer than this without an ack is assumed
    lost and becomes ready again (0 = never).  ``max_depth`` + ``overflow``: what happens to a SEND when
    the queue is full — ``block`` the producer, ``reject`` it with a queue-full error, or ``drop-oldest``.
    ``redelivery_*``: delay before a failed message is ready again, with backoff and a cap.
    ``schema``: declared properties, ``{name: {type: string|int|float|bool, required: bool}}``.
    ``routing_key``: in a cluster, which id of a message picks its node (seed 003, spec/routing.md §2.3):
    ``group`` (JMSXGroupID only), ``correlation-id`` or ``message-id``; a grouped message always routes on
    its group.
    """

    max_deliveries: int = 10
    dead_letter: bool = True
    dead_letter_prefix: str = "DLQ."
    dead_retention_ms: int = 0
    default_expiration_ms: int = 0
    default_priority: int = 4
    delivery_timeout_ms: int = 0
    max_depth: int = 0
    overflow: str = "block"
    redelivery_delay_ms: int = 0
    redelivery_multiplier: float = 1.0
    redelivery_max_delay_ms: int = 60_000
    schema: dict | None = None
    routing_key: str = "group"

    def delay_for(self, deliveries: int) -> int:
        """Redelivery delay in ms after the ``deliveries``-th failed delivery (capped backoff)."""
        if self.redelivery_delay_ms <= 0:
            return 0
        delay = self.redelivery_delay_ms * (self.redelivery_multiplier ** max(0, deliveries - 1))
        return int(min(delay, self.redelivery_max_delay_ms))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def differences(self, other: "QueueConfig") -> list[str]:
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]

    def validate(self, where: str = "queue") -> None:
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(f"{where}: overflow must be one of {', '.join(OVERFLOW_POLICIES)}, "
                              f"got {self.overflow!r}")
        if not 0 <= self.default_priority <= 9:
            raise ConfigError(f"{where}: default_priority must be between 0 and 9")
        for name in ("max_deliveries", "dead_retention_ms", "default_expiration_ms", "delivery_timeout_ms",
                     "max_depth", "redelivery_delay_ms", "redelivery_max_delay_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{where}: {name} must be a non-negative integer, got {value!r}")
        if self.redelivery_multiplier < 1.0:
            raise ConfigError(f"{where}: redelivery_multiplier must be at least 1.0")
        from pymq.routing.groups import RoutingKey
        if self.routing_key not in {k.value for k in RoutingKey}:
            raise ConfigError(f"{where}: routing_key must be one of {', '.join(k.value for k in RoutingKey)}, "
                              f"got {self.routing_key!r}")
        if self.schema is not None:
            from pymq_server.broker.schema import MessageSchema
            MessageSchema.from_dict(self.schema, where)


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
    connect_timeout_ms: int = 10_000     # a connection that has not sent CONNECT by then is closed
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
    default_permissions: dict | None = None  # principal -> permissions for destinations without an ACL
    expiry_queue: str | None = None      # expired messages are moved here (a queue name) instead of dropped
    dedup_window_ms: int = 600_000       # duplicate detection window (pymq-dedup-id, _AMQ_DUPL_ID)
    dedup_max_ids: int = 1_000_000       # ids remembered per destination
    admin_port: int | None = None        # HTTP admin/metrics endpoint; None = off
    cluster: dict | None = None          # spec/cluster.md: store, secret, name, advertise, ...
    log_level: str = "INFO"
    log_format: str = "text"             # text | json (one JSON object per line, server/logs.py)
    # what one selector may cost (spec/selector.md §7); over a limit the SUBSCRIBE gets invalid-selector
    selector_max_length: int = 16_384    # characters
    selector_max_depth: int = 64         # nesting (at most 64: the evaluators' stack is sized for it)
    selector_max_terms: int = 2_048      # identifiers and literals
    selector_max_like_length: int = 1_024  # characters of one LIKE pattern

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
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log_format must be text or json, not {self.log_format!r}")
        self.selector_limits()        # raises ConfigError naming the bad limit

    def selector_limits(self):
        """The selector limits of this broker (a ``pymq.selector.SelectorLimits``)."""
        from pymq.selector import SelectorLimits
        return SelectorLimits(max_length=self.selector_max_length, max_depth=self.selector_max_depth,
                              max_terms=self.selector_max_terms,
                              max_like_length=self.selector_max_like_length)


def queue_config(data: dict, where: str = "queue", base: QueueConfig | None = None) -> QueueConfig:
    """A validated QueueConfig from a mapping (unknown keys are an error naming them)."""
    names = {f.name for f in dataclasses.fields(QueueConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {where} setting(s): {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(names))})")
    cfg = dataclasses.replace(base, **data) if base is not None else QueueConfig(**data)
    cfg.validate(where)
    return cfg
