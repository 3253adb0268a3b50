"""Broker configuration: one typed, range-checked schema for the YAML file, the command line and programs
that embed the broker.

Every setting has a default that makes ``pymq-server`` with no arguments a working broker on
127.0.0.1:61613 keeping its data under ``./pymq-data``.  The schema is pydantic v2 models in strict
mode, so the YAML file is checked before anything opens or listens:

* an unknown key anywhere (top level, ``queues:``, ``storage:``, ``cluster:``, ``tls:``...) is an error
  naming it, so a typo never falls back to a default silently;
* types are not coerced: ``max_deliveries: "five"`` and ``port: "sixty"`` are errors, and so is
  ``default_persistent: "no"`` — a quoted string is not a boolean; write ``false`` (YAML's unquoted
  ``no``/``off`` are booleans already and are accepted);
* numbers are range-checked, names of choices are checked (``log_level: LOUD``), and sizes take a
  count of bytes or a string with a unit (``64MiB``, ``1GB``);
* an error names the file, the line, the key path, the bad value and what was expected, all of them at
  once (:class:`pymq.errors.ConfigError` with ``problems``).

``docs/configuration.md`` is generated from these models (``python -m pymq_server.config --reference``;
a test checks the committed file matches), so the descriptions below are the reference.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError,
                      ValidationInfo, field_validator, model_validator)
from typing_extensions import TypedDict

from pymq.errors import ConfigError, PymqError

OVERFLOW_POLICIES = ("block", "reject", "drop-oldest")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


# -- value types ------------------------------------------------------------------------------------

_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_RE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*\Z")
_INT_MAX = 2**63 - 1        # every count and duration fits a signed 64-bit integer (stores, metrics)


def parse_size(value: Any) -> Any:
    """``65536``, ``"64KiB"``, ``"1 GB"`` -> a count of bytes; anything else is left for the int check
    to refuse (with the size-specific message when it is a string)."""
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        unit = _SIZE_UNITS.get((m[2] or "b").lower()) if m else None
        if m is None or unit is None:
            raise ValueError("expected a size: a number of bytes or a number with a unit "
                             "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 64MiB")
        return int(m[1]) * unit
    return value


Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0, le=_INT_MAX)]
Count = Annotated[int, Field(ge=0, le=_INT_MAX)]
Positive = Annotated[int, Field(ge=1, le=_INT_MAX)]
Millis = Annotated[int, Field(ge=0, le=_INT_MAX)]
Port = Annotated[int, Field(ge=0, le=65535)]
_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


def _node_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError("expected 1-64 characters from A-Z a-z 0-9 _ . : -")
    return value


def _principal(value: str) -> str:
    if value == "*" or (value.startswith(("user:", "role:")) and len(value.split(":", 1)[1]) > 0):
        return value
    raise ValueError("expected '*', 'user:<name>' or 'role:<name>'")


def _check_principals(principals: Iterable[str]) -> None:
    """Each name a valid principal (``_principal``), the error naming the one that is not."""
    for principal in principals:
        try:
            _principal(principal)
        except ValueError as exc:
            raise ValueError(f"principal {principal!r}: {exc}") from None


def _upper_level(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


Principal = Annotated[str, Field(min_length=1)]
Permission = Literal["produce", "consume", "browse", "purge", "create", "manage"]


class _Section(BaseModel):
    """Strict: no coercion between types, no unknown keys, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# -- queues -----------------------------------------------------------------------------------------

import warnings  # noqa: E402

# ``schema`` is the public name of a queue setting (SDK, admin API, catalog records); BaseModel's deprecated
# ``schema()`` classmethod is the one shadowed, which pymq never calls.
warnings.filterwarnings("ignore", message='Field name "schema" in "QueueConfig" shadows', category=UserWarning)


class QueueConfig(_Section):
    """Settings of one queue (seed 001), kept across restarts in the catalog.  ``queue_defaults:`` gives
    every queue's; an entry under ``queues:`` overrides some of them for one queue; applications pass the
    same names to ``QueueManager.create``."""

    model_config = ConfigDict(frozen=True)

    max_deliveries: Count = Field(10, description="deliveries before the message is dead-lettered "
                                                  "(0 = unlimited)")
    dead_letter: bool = Field(True, description="move a message that reached `max_deliveries` to "
                                                "`<dead_letter_prefix><queue>` (true) or drop it, counted "
                                                "(false)")
    dead_letter_prefix: str = Field("DLQ.", min_length=1, description="name prefix of dead-letter queues")
    dead_retention_ms: Millis = Field(0, description="how long a dead-letter queue keeps a message "
                                                     "(0 = until consumed)")
    default_expiration_ms: Millis = Field(0, description="time to live of a message whose producer set "
                                                         "none (0 = never expires)")
    default_priority: int = Field(4, ge=0, le=9, description="priority of a message whose producer "
                                                             "set none (0-9)")
    delivery_timeout_ms: Millis = Field(0, description="a message held by a consumer this long without "
                                                       "an ack is assumed lost and becomes ready again "
                                                       "(0 = never)")
    max_depth: Count = Field(0, description="messages the queue may hold (0 = unbounded); see `overflow`")
    overflow: Literal["block", "reject", "drop-oldest"] = Field(
        "block", description="what a SEND to a full queue does: `block` the producer, `reject` it with "
                             "a queue-full error, or `drop-oldest`")
    redelivery_delay_ms: Millis = Field(0, description="delay before a failed message is ready again")
    redelivery_multiplier: float = Field(1.0, ge=1.0, le=1000.0, description="backoff factor applied to "
                                         "the delay after each further failed delivery")
    redelivery_max_delay_ms: Millis = Field(60_000, description="cap of the redelivery delay")
    # the setting's name is `schema` (spec/stomp.md §7); it hides pydantic's deprecated BaseModel.schema()
    schema: dict[str, Any] | None = Field(None, description="declared message properties, "  # type: ignore[assignment]
                                          "`{name: {type: string|int|float|bool, required: bool}}`")
    routing_key: Annotated[Literal["group", "correlation-id", "message-id"],
                           BeforeValidator(lambda v: getattr(v, "value", v))] = Field(
        "group", description="in a cluster, which id of a message picks its node (seed 003, spec/routing.md "
                             "§2.3): `group` (JMSXGroupID only), `correlation-id` or `message-id`; a grouped "
                             "message always routes on its group")
    exclusive: bool = Field(False, description="one consumer at a time receives every message: the first "
                                               "in subscription order; when it leaves the next takes over "
                                               "(as if every consumer asked `activemq.exclusive:true`)")
    last_value_key: str | None = Field(None, min_length=1, max_length=255, description="a last-value "
                                       "queue: a waiting message whose property of this name has the same "
                                       "value as a new message's is replaced by it (Artemis `last-value-key`; "
                                       "Artemis clients use `_AMQ_LVQ_NAME`). Unset: every message waits")

    @field_validator("schema")
    @classmethod
    def _schema_parses(cls, value: dict | None) -> dict | None:
        if value is not None:
            from pymq_server.schema import MessageSchema
            try:
                MessageSchema.from_dict(value, "schema")
            except PymqError as exc:
                raise ValueError(exc.message.removeprefix("schema: ")) from None
        return value

    def delay_for(self, deliveries: int) -> int:
        """Redelivery delay in ms after the ``deliveries``-th failed delivery (capped backoff)."""
        if self.redelivery_delay_ms <= 0:
            return 0
        delay = self.redelivery_delay_ms * (self.redelivery_multiplier ** max(0, deliveries - 1))
        return int(min(delay, self.redelivery_max_delay_ms))

    def to_dict(self) -> dict:
        return self.model_dump()

    def differences(self, other: QueueConfig) -> list[str]:
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


def queue_config(data: dict | QueueConfig, where: str = "queue",
                 base: QueueConfig | None = None) -> QueueConfig:
    """A validated QueueConfig from a mapping of some of its settings over ``base`` (default: the
    defaults).  A QueueConfig is returned as it is.  Errors name ``where`` and each bad key."""
    if isinstance(data, QueueConfig):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of queue settings, got {data!r}")
    merged = {**base.model_dump(), **data} if base is not None else data
    try:
        return QueueConfig.model_validate(merged)
    except ValidationError as exc:
        problems = describe_errors(exc, QueueConfig)
        raise ConfigError(f"{where}: " + "; ".join(f"{p.key}: {p.reason}" for p in problems),
                          problems=problems) from None


# -- storage ------------------------------------------------------------------------------------------

class MemoryDeviceConfig(_Section):
    """Messages in the broker's memory (lost on restart)."""

    kind: Literal["memory"]
    capacity: Size | None = Field(None, description="bytes it may hold (unbounded when unset); a full "
                                                    "device scores 0 in storage selection")


class FileDeviceConfig(_Section):
    """The paged file store with a write-ahead log (spec/storage.md)."""

    kind: Literal["file"]
    directory: str | None = Field(None, min_length=1, description="where its files live "
                                                                  "(default `<data_dir>/<device name>`)")
    page_size: Size = Field(64 * 1024, description="page size of a new store, a power of two from 4KiB "
                                                   "to 16MiB (an existing store keeps its own)")
    checkpoint_bytes: Size = Field(32 * 1024 * 1024, description="write-ahead-log bytes between "
                                   "checkpoints (at most a quarter of `max_memory`, at least 1 MiB: persistent "
                                   "pages wait in memory for the checkpoint that writes them)")
    max_bytes: Size | None = Field(None, description="bound of the page file (unbounded when unset)")
    fsync: bool = Field(True, description="false skips every fsync: fast, and loses data on a power "
                                          "failure (tests, throwaway brokers)")
    headroom_bytes: Size | None = Field(None, description="disk space held back (a file named `headroom`) so "
                                        "that a checkpoint can always run and give consumed space back on a "
                                        "full disk (default four pages and 64 KiB; 0: none)")

    @field_validator("page_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1) or not 4096 <= value <= 16 << 20:
            raise ValueError("expected a power of two from 4096 (4KiB) to 16777216 (16MiB)")
        return value


class SqlDeviceConfig(_Section):
    """SQL through SQLAlchemy: SQLite embedded or a shared PostgreSQL (extra `sql`)."""

    kind: Literal["sql"]
    url: str | None = Field(None, min_length=1, description="SQLAlchemy URL (default "
                                                            "`sqlite:///<data_dir>/<device name>.sqlite3`)")
    broker_id: str | None = Field(None, description="this broker's rows in a shared database "
                                                    "(default `node_id`)")
    table_prefix: str = Field("pymq_", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,30}$",
                              description="prefix of the device's table names")
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = Field(
        "FULL", description="SQLite's `synchronous` pragma (ignored by other databases)")
    busy_timeout_s: float = Field(10.0, gt=0, le=3600, description="how long SQLite waits for a lock")
    engine_options: dict[str, Any] | None = Field(None, description="extra `sqlalchemy.create_engine` "
                                                                    "arguments")

    @field_validator("broker_id")
    @classmethod
    def _broker_id(cls, value: str | None) -> str | None:
        return value if value is None else _node_name(value)


class GridDeviceConfig(_Section):
    """A Redis server (extra `redis`), shared by a cluster's nodes."""

    kind: Literal["grid"]
    url: str = Field("redis://127.0.0.1:6379/0", min_length=1, description="Redis URL")
    broker_id: str | None = Field(None, description="this broker's keys (default `node_id`)")
    namespace: str = Field("pymq", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="key prefix")
    socket_timeout_s: float = Field(5.0, gt=0, le=3600, description="Redis socket timeout")
    retries: int = Field(1, ge=0, le=100, description="retries of a failed Redis command")
    waitaof_timeout_ms: Millis = Field(5000, description="how long a durable write waits for Redis's "
                                                         "append-only file (WAITAOF)")

    @field_validator("broker_id")
    @classmethod
    def _broker_id(cls, value: str | None) -> str | None:
        return value if value is None else _node_name(value)


DeviceConfig = Annotated[Union[MemoryDeviceConfig, FileDeviceConfig, SqlDeviceConfig, GridDeviceConfig],
                         Field(discriminator="kind")]


class StorageConfig(_Section):
    """Holding devices and the rules that choose among them (spec/storage_rules.md §5)."""

    devices: dict[str, DeviceConfig] | None = Field(
        None, description="name -> device; `kind` is memory, file, sql or grid (default: the name). "
                          "Default: `{memory: {kind: memory}, file: {kind: file}}`")
    persistent_device: str | None = Field(None, description="the device that also holds the catalog "
                                          "(queues, subscriptions, sequence reservations); default `file` "
                                          "with the default devices")
    selection: dict[str, Any] | str | None = Field(
        None, description="storage-selection rules: the document of spec/storage_rules.md §5 inline, or "
                          "the path of a YAML file holding it. Reloaded by SIGHUP")

    @field_validator("devices", mode="before")
    @classmethod
    def _kind_from_name(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {name: ({"kind": name, **opts} if isinstance(opts, dict) and "kind" not in opts
                           else ({"kind": name} if opts is None else opts))
                    for name, opts in value.items()}
        return value

    @field_validator("persistent_device")
    @classmethod
    def _known_device(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and "devices" in info.data:  # (absent: devices failed)
            names = _device_names(info.data.get("devices"))
            if value not in names:
                raise ValueError(f"expected one of the devices {names}")
        return value

    @field_validator("selection")
    @classmethod
    def _selection_parses(cls, value: dict | str | None, info: ValidationInfo) -> dict | str | None:
        if value is not None and "devices" in info.data:  # (absent: devices failed)
            check_selection(value, _device_names(info.data.get("devices")))
        return value

    def device_names(self) -> list[str]:
        return _device_names(self.devices)


def _device_names(devices: dict | None) -> list[str]:
    return list(devices) if devices is not None else ["memory", "file"]


def read_selection(selection: dict | str) -> str:
    """The storage-selection document as YAML text (read from its file when ``selection`` is a path)."""
    if isinstance(selection, str):
        try:
            with open(selection, encoding="utf-8") as fh:
                return fh.read()
        except OSError as exc:
            raise ConfigError(f"cannot read storage selection file {selection}: {exc.strerror}") from None
    return yaml.safe_dump(selection)


def check_selection(selection: dict | str, device_names: list[str]) -> None:
    """Parse the selection document (conditions compiled) and check it names only known devices."""
    from pymq_server.storage.selection import SelectionConfig, rules_from_document
    try:
        doc = yaml.safe_load(read_selection(selection))
        if doc is not None and not isinstance(doc, dict):
            raise ConfigError("expected a mapping with a 'rules' list")
        settings = SelectionConfig.from_document(doc)
        rules = rules_from_document(doc)
    except yaml.YAMLError as exc:
        raise ValueError(f"{selection}: not valid YAML: {exc}") from None
    except PymqError as exc:
        where = f"{selection}: " if isinstance(selection, str) else ""
        raise ValueError(where + exc.message) from None
    used = {r.device for r in rules}
    if settings.default_device is not None:
        used.add(settings.default_device)
    used |= set(settings.periods)
    unknown = sorted(used - set(device_names))
    if unknown:
        raise ValueError(f"storage selection names unknown device(s) {unknown}; the devices are "
                         f"{device_names}")


# -- cluster ------------------------------------------------------------------------------------------

class ClusterConfig(_Section):
    """Membership and links of a cluster (spec/cluster.md)."""

    model_config = ConfigDict(frozen=True)

    store: str = Field(min_length=1, description="membership store: `redis://...` or `postgresql://...`")
    secret: str = Field(min_length=1, description="shared secret nodes authenticate each other with")
    name: str = Field("pymq", min_length=1, description="cluster name (nodes of different clusters "
                                                        "ignore each other in one store)")
    advertise: str | None = Field(None, description="`host:port` other nodes connect to (default: the "
                                                    "listening address)")
    heartbeat_ms: Annotated[int, Field(ge=10, le=3_600_000)] = Field(500, description="membership "
                                                                                      "heart-beat period")
    dead_after_ms: Annotated[int, Field(ge=20, le=3_600_000)] = Field(3000, description="a node silent "
                                                                      "this long is dead")
    group_routing: Literal["rendezvous", "modulo"] = Field("rendezvous", description="how a message "
                                                           "group picks its node (spec/routing.md)")
    popular_fraction: float = Field(0.75, gt=0, le=1, description="share of the traffic the popular "
                                    "topics of a node's filter must cover")
    assignment: Literal["balance", "hash", "similar"] = Field(
        "balance", description="where durable subscriptions live (spec/cluster.md §6): `balance` (where "
        "they were created; a leaving node's go to the least loaded peer), `hash` (rendezvous of the "
        "owner), `similar` (owners with overlapping topics together)")
    rebalance_interval_ms: Millis = Field(2000, description="hash / similar: how often the coordinator "
                                          "places idle durable subscriptions (0: never)")
    rebalance_max_moves: Count = Field(100, description="recipients moved per rebalancing round at most")
    similar_slack: float = Field(0.1, ge=0, le=100, description="similar: a node holds at most (1 + slack) "
                                 "x its share of recipients")
    filter_capacity: Positive = Field(10_000, description="topics a node's bloom filter is sized for")
    filter_fpr: float = Field(0.01, gt=0, lt=1, description="bloom filter false-positive rate")
    handover_timeout_s: float = Field(10.0, gt=0, le=3600, description="how long a hand-over waits for "
                                                                       "the successor")
    held_max_messages: Count = Field(1_000_000, description="per dead peer: messages held for its durable "
                                     "subscribers (0: no cap)")
    topic_filtering: bool = Field(True, description="false: forward every topic message to every peer "
                                                    "(a baseline for measurements)")

    @field_validator("dead_after_ms")
    @classmethod
    def _dead_after_heartbeat(cls, value: int, info: ValidationInfo) -> int:
        beat = info.data.get("heartbeat_ms")
        if beat is not None and value <= beat:
            raise ValueError(f"expected more than heartbeat_ms ({beat})")
        return value

    @classmethod
    def from_dict(cls, data: dict | ClusterConfig) -> ClusterConfig:
        if isinstance(data, ClusterConfig):
            return data
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = describe_errors(exc, cls, prefix=("cluster",))
            raise ConfigError("; ".join(f"{p.key}: {p.reason}" for p in problems),
                              problems=problems) from None


# -- high availability --------------------------------------------------------------------------------

class HaConfig(_Section):
    """A live/backup group over one shared store (spec/ha.md §1–§3, docs/operations.md): every process of the
    group has this section, the same `node_id` and the same store; the one holding the store's lease is
    live, the others wait as backups with no STOMP listener and take over when the live's lease ends."""

    model_config = ConfigDict(frozen=True)

    lease_ms: Annotated[int, Field(ge=100, le=600_000)] = Field(
        2000, description="a live whose lease is not renewed for this long loses the store to a backup "
                          "(a dead live's OS lock goes at once; this is for a live that hangs); longer than the "
                          "longest stall of the broker's event loop")
    renew_ms: Annotated[int, Field(ge=10, le=300_000)] | None = Field(
        None, description="how often the live renews its lease (default a quarter of `lease_ms`; at most half)")
    poll_ms: Annotated[int, Field(ge=10, le=60_000)] = Field(
        100, description="how often the watching backup reads the lease and tries the OS lock")
    after_fenced: Literal["backup", "exit"] = Field(
        "backup", description="what a live does once it finds another took the store (a pause, a network "
                              "cut): `backup` waits as a backup again, `exit` ends the process with status 3")

    @field_validator("renew_ms")
    @classmethod
    def _renew_within_lease(cls, value: int | None, info: ValidationInfo) -> int | None:
        lease = info.data.get("lease_ms")
        if value is not None and lease is not None and value * 2 > lease:
            raise ValueError(f"expected at most half of lease_ms ({lease // 2})")
        return value

    @field_validator("poll_ms")
    @classmethod
    def _poll_within_lease(cls, value: int, info: ValidationInfo) -> int:
        lease = info.data.get("lease_ms")
        if lease is not None and value > lease:
            raise ValueError(f"expected at most lease_ms ({lease})")
        return value

    @property
    def renew_every_ms(self) -> int:
        return self.renew_ms if self.renew_ms is not None else max(10, self.lease_ms // 4)


# -- TLS and listeners --------------------------------------------------------------------------------

class TlsConfig(_Section):
    """Certificate and key of the broker, and how clients' certificates are checked (docs/tls.md)."""

    cert_file: str = Field(min_length=1, description="PEM file with the broker's certificate (and its "
                                                     "chain)")
    key_file: str = Field(min_length=1, description="PEM file with its private key")
    key_password: str | None = Field(None, description="password of an encrypted key")
    ca_file: str | None = Field(None, min_length=1, description="PEM file with the CA certificates that "
                                "sign client certificates (needed for `client_certificates`)")
    client_certificates: Literal["none", "optional", "required"] = Field(
        "none", description="ask clients for a certificate: `none`; `optional` (checked when sent); "
                            "`required` (mutual TLS). A verified certificate whose subject a user "
                            "lists as `certificate_subject` logs in as that user")
    min_version: Literal["1.2", "1.3"] = Field("1.2", description="lowest TLS version accepted")
    ciphers: str | None = Field(None, min_length=1, description="OpenSSL cipher list for TLS 1.2 "
                                                               "(default: Python's)")

    @field_validator("client_certificates")
    @classmethod
    def _ca_for_clients(cls, value: str, info: ValidationInfo) -> str:
        if value != "none" and "ca_file" in info.data and info.data["ca_file"] is None:
            raise ValueError(f"{value!r} needs ca_file (the CA certificates that sign client certificates)")
        return value


class WebSocketConfig(_Section):
    """STOMP over WebSocket (RFC 6455, subprotocols v10.stomp, v11.stomp, v12.stomp)."""

    port: Port = Field(15674, description="port of the WebSocket listener (0 picks a free one)")
    path: str = Field("/stomp", pattern=r"^/[^\s?#]*$", description="URL path clients connect to")
    tls: bool = Field(False, description="serve `wss://` with the `tls:` certificate")
    allowed_origins: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="browser pages allowed to connect, as origins (`https://app.example.com`); `*` "
                          "allows any. Unset: pages served from this machine only (an origin whose host is "
                          "`localhost`, 127.0.0.0/8 or `[::1]`, any scheme and port). A handshake with "
                          "another `Origin` header is refused with 403 (clients that send no Origin, i.e. "
                          "not browsers, are not affected). Whatever is allowed, a page whose origin is not "
                          "on this machine never logs in as a loopback-only user (`guest` without a users "
                          "file): the browser would lend it the machine's network position")


# -- the broker ---------------------------------------------------------------------------------------

class RetentionRule(TypedDict, total=False):
    """How long a destination's retained log keeps messages for replay (spec/stomp.md §9)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)  # type: ignore[misc]
    ms: Millis
    messages: Count


class VhostConfig(_Section):
    """One virtual host (spec/stomp.md §1): who may connect to it and what it may hold. The default vhost
    ``/`` has none of these: the broker-wide limits bound it."""

    model_config = ConfigDict(frozen=True)

    principals: list[Principal] = Field(default_factory=list, description="who may connect (`*`, "
                                        "`user:<name>`, `role:<name>`); administrators always may")
    max_connections: Positive | None = Field(None, description="connections it may have at once; a CONNECT "
                                             "past it is a `resource-limit` ERROR naming `max_connections` "
                                             "(unset: only the broker's `max_connections`)")
    max_queues: Positive | None = Field(None, description="queues it may hold (declared or made by use; the "
                                        "dead-letter and expiry queues the broker makes count and are never "
                                        "refused); a SEND, SUBSCRIBE or `create-queue` that would make one "
                                        "more is a `resource-limit` ERROR naming `max_queues`, and makes nothing")
    max_memory: Size | None = Field(None, description="message memory its messages may hold in the broker "
                                    "(bodies + ~0.75 KiB each, counted as `max_memory` counts them: a message "
                                    "paged to disk leaves it); a SEND that would pass it is a `resource-limit` "
                                    "ERROR naming `max_memory` and places nothing (unset: only the broker's "
                                    "`max_memory`)")

    @field_validator("principals")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        _check_principals(value)
        return value

    def to_dict(self) -> list[str] | dict[str, Any]:
        """The entry as written in a configuration file or a definitions document: the list of principals
        alone when no limit is set."""
        limits = {k: v for k, v in self.model_dump().items() if k != "principals" and v is not None}
        return {"principals": list(self.principals), **limits} if limits else list(self.principals)


def _vhost_entry(value: Any) -> Any:
    """A vhost's entry may be its list of principals alone (the form before limits)."""
    return {"principals": value} if isinstance(value, list) else value


class BrokerConfig(_Section):
    """The broker's settings: the YAML file's top level."""

    model_config = ConfigDict(validate_assignment=False)

    host: str = Field("127.0.0.1", min_length=1, description="address every listener binds")
    port: Port = Field(61613, description="STOMP port (0 picks a free port)")
    data_dir: str = Field("pymq-data", min_length=1, description="where persistent data lives")
    node_id: str = Field("pymq", min_length=1, max_length=64, pattern=r"^[^\s\x00-\x1f]+$",
                         description="this broker's name (message ids, storage rows, clustering)")
    users_file: str | None = Field(None, min_length=1, description="YAML users file with password hashes "
                                   "(docs/users.md); none: only guest/guest, from loopback. Reloaded by "
                                   "SIGHUP")
    allow_anonymous: bool = Field(False, description="with a users file, accept CONNECT without a login "
                                                     "(as user `anonymous`, no roles). Reloaded by SIGHUP")
    # what one client may cost (spec/stomp.md §10)
    max_frame_size: Size = Field(64 * 1024 * 1024, ge=1024, description="largest frame a client may send "
                                 "(headers and body); RabbitMQ and ActiveMQ take 16 MiB and more")
    max_connect_frame_size: Size = Field(64 * 1024, ge=1024, description="largest frame before CONNECTED "
                                         "(a CONNECT is a few hundred bytes; an unauthenticated peer must "
                                         "not make the broker hold megabytes)")
    max_unauthenticated_bytes: Size = Field(16 * 1024 * 1024, ge=1024, description="bytes held for all "
                                            "connections that have not received CONNECTED, together; the "
                                            "connection that would pass it gets `resource-limit`")
    frame_timeout_ms: Positive = Field(30_000, description="a frame must be complete this long after its "
                                       "first byte, plus one second per `frame_min_rate` bytes of it "
                                       "(`frame-timeout` otherwise), heart-beats or not")
    frame_min_rate: Positive = Field(8 * 1024, description="bytes per second a slow frame earns one more "
                                     "second with (see `frame_timeout_ms`)")
    read_budget: Size = Field(16 * 1024, ge=1024, description="input bytes handled per connection per "
                              "event-loop turn: a pipelining client shares the loop with everyone else "
                              "(WebSocket: each frame decoded also counts 64 bytes); the rest of a large body "
                              "whose head was read goes in at once, uncounted (spec/stomp.md §10)")
    max_headers: Annotated[int, Field(ge=1, le=100_000)] = Field(1000, description="headers per frame")
    max_connections: Positive = Field(10_000, description="connections the broker holds at once on the "
                                      "STOMP, TLS and WebSocket listeners, counted from accept (a TLS "
                                      "handshake, a WebSocket upgrade, a connection that has not logged in "
                                      "yet: each counts), in-process (vm://) ones at CONNECT; over it a "
                                      "socket is refused at once (`resource-limit`). Kept within the file-"
                                      "descriptor limit, raised towards the hard limit when needed")
    admin_max_connections: Positive = Field(128, description="connections the admin HTTP port holds at once, "
                                            "counted from accept, apart from `max_connections` (neither can "
                                            "lock the other out); over it a socket gets 503 at once")
    max_pending_logins: Positive = Field(64, description="password checks (scrypt, about 16 MiB and tens of "
                                         "ms each, off the event loop) waiting or running at once; a login "
                                         "over it (CONNECT, admin HTTP) is refused with `resource-limit`")
    max_subscriptions_per_connection: Positive = Field(10_000, description="subscriptions per connection "
                                                       "(each ~4 KiB of broker memory, its selector besides, "
                                                       "counted in `max_memory_per_connection`)")
    max_transactions_per_connection: Positive = Field(1_000, description="open transactions per connection "
                                                      "(each ~0.5 KiB and its id until COMMIT/ABORT, counted in "
                                                      "`max_memory_per_connection`)")
    max_transaction_operations: Positive = Field(100_000, description="sends and acks in one transaction (each "
                                                 "~0.5 KiB and its frame's bytes, counted in `max_transaction_bytes`)")
    max_transaction_bytes: Size = Field(128 * 1024 * 1024, ge=1024, description="bytes one open transaction "
                                        "holds until COMMIT or ABORT: its frames plus ~0.5 KiB per operation "
                                        "(counted in `max_memory_per_connection` and in the broker's memory: a "
                                        "SEND in a transaction while the broker is over `max_memory` is refused)")
    max_temporary_destinations_per_connection: Positive = Field(
        10_000, description="temporary queues and topics one connection may make (each ~4 KiB of broker "
                            "memory, counted in `max_memory_per_connection`; they go with the connection)")
    temporary_reclaim_ms: Millis = Field(
        30_000, description="how long a client whose link was lost may take its temporary queues' and topics' "
        "global names back by reconnecting (spec/ha.md §4.7): from the loss on this broker, or, after a restart "
        "or a takeover by a backup, from the new process starting to serve. Only the same user with the token "
        "its CONNECTED gave, and only while no other client holds them; 0 turns re-claiming off (every "
        "connection gets new names). Meanwhile a lost link's temporary queues are kept in memory with what they "
        "hold and take SENDs (on this broker only: temporary destinations are never persistent)")
    max_memory_per_connection: Size = Field(
        128 * 1024 * 1024, ge=64 * 1024, description="broker memory one connection may hold besides its "
        "messages, charged before anything is made: subscriptions (~4 KiB each), compiled selectors (1 KiB + "
        "64 bytes per character, ~1 MiB at `selector_max_length`), temporary destinations (~4 KiB), the ids "
        "of its last 1,024 finished browses (~0.5 KiB), open transactions (their frames + ~0.5 KiB per "
        "operation), and the length of every id or name it chose; `resource-limit` over it (spec/stomp.md "
        "§10). At least `max_transaction_bytes`")
    max_memory_per_user: Size = Field(
        256 * 1024 * 1024, ge=64 * 1024, description="the same over every connection of one user, plus the "
        "durable subscriptions the user created (~4 KiB each with its name, and its selector, while it "
        "exists); at least `max_memory_per_connection`. All clients together hold at most half of "
        "`max_memory` (at least 8 MiB)")
    heartbeat_send_ms: Millis = Field(10_000, description="the longest heart-beat interval the broker offers "
                                      "to send at (CONNECTED sx); a client asking for beats more often gets them, "
                                      "down to `heartbeat_min_ms` (spec/stomp.md §6; 0 = the broker sends none)")
    heartbeat_recv_ms: Millis = Field(10_000, description="the longest heart-beat interval the broker asks "
                                      "to receive at (CONNECTED sy); a client promising beats more often is held "
                                      "to its own promise, down to `heartbeat_min_ms` (0 = none wanted)")
    heartbeat_min_ms: Positive = Field(250, description="the shortest heart-beat interval the broker agrees to "
                                       "in either direction, whatever a client asks (each beat the broker owes is a "
                                       "timer every half interval per connection)")
    heartbeat_grace: float = Field(2.0, ge=1.0, le=100.0, description="a peer is dead after grace × its "
                                                                      "interval without traffic")
    connect_timeout_ms: Positive = Field(10_000, description="a connection that has not sent CONNECT by "
                                                             "then is closed")
    write_buffer_high: Size = Field(1024 * 1024, ge=1, description="per connection: pause deliveries "
                                    "and reading above this many queued bytes (receipts and errors count)")
    write_buffer_low: Size = Field(256 * 1024, description="per connection: resume deliveries and reading "
                                                           "below this")
    max_memory: Size = Field(1024 * 1024 * 1024, ge=1, description="message memory: message bytes plus "
                             "~0.75 KiB per message and ~0.3 KiB per queue entry in memory (a topic message "
                             "for 1,000 subscriptions is 1,000 entries). Above about three quarters of it (what "
                             "clients hold counted too) queues page waiting messages to the file device; "
                             "producers are paused only when memory holds more than this of what cannot be "
                             "paged (a full disk, messages shared by queues, delayed ones). What clients hold "
                             "besides messages (subscriptions, selectors, temporary destinations, browse ids, "
                             "open transactions) is bounded to half of it (at least 8 MiB) besides: a request "
                             "over that gets `resource-limit`")
    default_persistent: bool = Field(True, description="whether a SEND without a `persistent` header is "
                                     "persistent. A boolean: `true`/`false` (a quoted \"no\" is refused)")
    auto_create: bool = Field(True, description="create queues and topics on first use")
    auto_delete_idle_ms: Millis = Field(300_000, description="a queue or topic created by use (never a "
                                        "declared one, nor one under `queues:`) is deleted once it has had no "
                                        "consumer, no subscription and no message for this long (0 = never)")
    default_prefetch: Count = Field(1000, description="unacknowledged messages per client/client-"
                                    "individual subscription without a prefetch header")
    sync_policy: Literal["always", "grouped", "never"] = Field(
        "always", description="`always`: sync before every receipt (concurrent commits share one fsync); "
                              "`grouped`: at most one fsync per `sync_window_ms`; `never`")
    sync_window_ms: float = Field(2.0, ge=0, le=60_000, description="the `grouped` sync window")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="holding devices and "
                                   "storage-selection rules (see below)")
    queue_defaults: QueueConfig = Field(default_factory=QueueConfig, description="settings of every queue "
                                        "(see Queue settings)")
    queues: dict[str, QueueConfig] = Field(default_factory=dict, description="queue name -> settings that "
                                           "override `queue_defaults` for it (see Queue settings)")
    retention: dict[str, RetentionRule] = Field(default_factory=dict, description="destination or glob "
                                                "-> `{ms, messages}`: keep a log for replay")
    default_permissions: dict[Principal, list[Permission]] | None = Field(
        None, description="principal (`*`, `user:<name>`, `role:<name>`) -> permissions (produce, "
                          "consume, browse, purge, create, manage) on destinations without an ACL of their "
                          "own; `create` there lets a user declare new queues. Default: everyone may do "
                          "everything but `manage`. Reloaded by SIGHUP")
    queue_logs: bool = Field(True, description="a separate log file for each queue (seed 001): its declarations, "
                             "changes, purges, consumers, dead letters and expiries, in `queue_log_dir`; its path is "
                             "the `log` of `queue-info`")
    queue_log_dir: str | None = Field(None, description="where the per-queue logs go (default: "
                                      "`<data_dir>/queue-logs`)")
    queue_log_max_bytes: Annotated[int, Field(ge=4096, le=1 << 34)] = Field(
        1 << 20, description="a queue's log rotates at this size (one older file kept: at most twice this "
                             "per queue)")
    vhosts: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
                 Annotated[VhostConfig, BeforeValidator(_vhost_entry)]] = Field(
        default_factory=dict, description="virtual hosts besides the default `/` (spec/stomp.md §1): name "
        "(letters, digits, `_`, `-`) -> its principals and limits (see Virtual hosts); a list is its principals "
        "alone. A CONNECT with `host:/<name>` (or `host:<name>`) selects one: its own queues, topics, grants "
        "and durable subscriptions, kept apart in storage; an unknown `/<name>` is refused; a host name such as "
        "`localhost` means `/`")
    expiry_queue: str | None = Field(None, min_length=1, description="expired messages are moved to this "
                                     "queue instead of dropped")
    dedup_window_ms: Millis = Field(600_000, description="duplicate detection window (`pymq-dedup-id`, "
                                                         "`_AMQ_DUPL_ID`)")
    dedup_max_ids: Count = Field(1_000_000, description="ids remembered per destination")
    dedup_persisted_ids: Count = Field(100_000, description="the newest ids of stored persistent messages "
                                       "kept in the catalog, so the window survives a restart or a takeover "
                                       "with the ids of messages already consumed (spec/ha.md §3.1); 0: only "
                                       "the ids of messages still stored come back")
    admin_port: Port | None = Field(None, description="HTTP admin, console and metrics port; unset = off")
    admin_tls: bool = Field(False, description="serve the admin port over HTTPS with the `tls:` "
                                               "certificate")
    admin_max_body: Size = Field(1024 * 1024, ge=1024, description="largest admin HTTP request body; a "
                                 "larger one gets 413 as soon as its Content-Length says so (a chunked one "
                                 "as it passes it), unread")
    admin_request_timeout_ms: Positive = Field(10_000, description="an admin HTTP request's head and body "
                                               "must arrive within this, and its answer be read within this "
                                               "(else the connection is closed); also how long an idle "
                                               "keep-alive connection stays open")
    tls: TlsConfig | None = Field(None, description="certificate, key and client-certificate policy "
                                  "(see TLS); needed by `tls_port`, `websocket.tls`, `admin_tls`")
    tls_port: Port | None = Field(None, description="STOMP over TLS port (`stomp+ssl://`); unset = off")
    websocket: WebSocketConfig | None = Field(None, description="STOMP over WebSocket listener (see "
                                              "WebSocket); unset = off")
    cluster: ClusterConfig | None = Field(None, description="join a cluster (see Cluster)")
    ha: HaConfig | None = Field(None, description="live/backup over a shared store (see High availability); "
                                "unset = a single broker")
    workers: Annotated[int, Field(ge=1, le=256)] = Field(
        1, description="worker processes, each owning a shard of the destinations (spec/cores.md); 1 = one "
                       "process. More than 1: no `cluster`, `websocket` or `tls_port: 0`; data in "
                       "`data_dir/worker-<k>/`")
    worker_handover: bool = Field(
        True, description="with `workers` > 1: a connection whose first SEND or SUBSCRIBE names another "
                          "worker's destination moves to that worker (its socket is handed over) instead of "
                          "having its frames forwarded (spec/cores.md §2.4); false = always forward")
    worker_restarts: Annotated[int, Field(ge=0, le=1000)] = Field(
        3, description="with `workers` > 1: a worker that dies is restarted, this many times within "
                       "`worker_restart_window_ms`; one more death stops every worker (exit 1)")
    worker_restart_window_ms: Millis = Field(60_000, description="the window `worker_restarts` counts in")
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                         BeforeValidator(_upper_level)] = Field("INFO", description="log level (any case)")
    log_format: Literal["text", "json"] = Field("text", description="`text` lines, or `json`: one JSON "
                                                "object per line for log collectors (server/logs.py)")
    # what one selector may cost (spec/selector.md §7); over a limit the SUBSCRIBE gets invalid-selector
    selector_max_length: Positive = Field(16_384, description="characters of one selector (a subscription's "
                                          "selector is charged 1 KiB + 64 bytes per character to its connection "
                                          "before it is compiled: ~1 MiB at the default; one over 1,024 "
                                          "characters compiles in a worker thread)")
    selector_max_depth: Annotated[int, Field(ge=1, le=64)] = Field(
        64, description="nesting of one selector (at most 64: the evaluators' stack is sized for it)")
    selector_max_terms: Positive = Field(2_048, description="identifiers and literals of one selector")
    selector_max_like_length: Positive = Field(1_024, description="characters of one LIKE pattern")

    # where the settings came from, so SIGHUP can read them again the same way
    _source: str | None = PrivateAttr(None)
    _overrides: dict = PrivateAttr(default_factory=dict)

    @field_validator("default_permissions")
    @classmethod
    def _principals(cls, value: dict | None) -> dict | None:
        if value is not None:
            _check_principals(value)
        return value

    @field_validator("max_connect_frame_size")
    @classmethod
    def _connect_frame_at_most_frame(cls, value: int, info: ValidationInfo) -> int:
        full = info.data.get("max_frame_size")
        if full is not None and value > full:
            raise ValueError(f"expected at most max_frame_size ({full})")
        return value

    @field_validator("max_memory_per_connection")
    @classmethod
    def _connection_holds_a_transaction(cls, value: int, info: ValidationInfo) -> int:
        transaction = info.data.get("max_transaction_bytes")
        if transaction is not None and value < transaction:
            raise ValueError(f"expected at least max_transaction_bytes ({transaction})")
        return value

    @field_validator("max_memory_per_user")
    @classmethod
    def _user_holds_a_connection(cls, value: int, info: ValidationInfo) -> int:
        connection = info.data.get("max_memory_per_connection")
        if connection is not None and value < connection:
            raise ValueError(f"expected at least max_memory_per_connection ({connection})")
        return value

    @field_validator("write_buffer_low")
    @classmethod
    def _low_below_high(cls, value: int, info: ValidationInfo) -> int:
        high = info.data.get("write_buffer_high")
        if high is not None and value > high:
            raise ValueError(f"expected at most write_buffer_high ({high})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _queues_over_defaults(cls, data: Any) -> Any:
        """An entry under ``queues:`` names only what differs from ``queue_defaults``."""
        if not isinstance(data, dict) or not isinstance(data.get("queues"), dict):
            return data
        base = data.get("queue_defaults")
        if isinstance(base, QueueConfig):
            base = base.model_dump()
        if not isinstance(base, dict):
            base = {}
        data = dict(data)
        data["queues"] = {name: ({**base, **entry} if isinstance(entry, dict) else
                                 (dict(base) if entry is None else entry))
                          for name, entry in data["queues"].items()}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> BrokerConfig:
        needs_tls = [name for name, on in (("tls_port", self.tls_port is not None),
                                           ("websocket.tls", self.websocket is not None and self.websocket.tls),
                                           ("admin_tls", self.admin_tls)) if on]
        if needs_tls and self.tls is None:
            raise ValueError(f"{', '.join(needs_tls)} need(s) a `tls:` section with cert_file and key_file")
        if self.admin_tls and self.admin_port is None:
            raise ValueError("admin_tls is set but admin_port is not")
        limited = sorted(name for name, entry in self.vhosts.items()
                         if (entry.max_connections, entry.max_queues, entry.max_memory) != (None, None, None))
        if limited and self.workers > 1:
            # each worker counts only its own connections, queues and memory (spec/cores.md): a limit would
            # hold per worker, not per vhost
            raise ValueError(f"vhosts {', '.join(limited)}: limits (max_connections, max_queues, max_memory) with "
                             f"workers > 1 are not supported yet (each worker would count only its own)")
        if self.ha is not None:
            self.ha_store()
        return self

    def ha_store(self) -> tuple[str, str]:
        """Under ``ha:``, the shared store: ``("file", <data_dir>)`` or ``("postgresql", <url>)`` (spec/ha.md
        §2.5: every durable device must be one the lease fences).  ValueError when the devices do not allow it."""
        if self.workers > 1:
            raise ValueError("ha: with workers > 1 is not supported (one process per member of the group)")
        devices = self.storage.devices
        if devices is None:
            return ("file", self.data_dir)
        kinds = {name: dev.kind for name, dev in devices.items()}
        durable = {name: dev for name, dev in devices.items() if dev.kind != "memory"}
        if not durable:
            raise ValueError("ha: needs a durable device (file, or sql on PostgreSQL) to share")
        grid = [name for name, kind in kinds.items() if kind == "grid"]
        if grid:
            raise ValueError(f"ha: cannot fence grid device(s) {grid}: use file or sql on PostgreSQL")
        files = [name for name, dev in durable.items() if dev.kind == "file"]
        sqls = {name: dev for name, dev in durable.items() if isinstance(dev, SqlDeviceConfig)}
        if files and sqls:
            raise ValueError(f"ha: the shared store is one kind: file devices {files} and sql devices "
                             f"{sorted(sqls)} cannot both be fenced")
        if files:
            return ("file", self.data_dir)
        urls = {dev.url for dev in sqls.values()}
        if None in urls or any(not url.startswith("postgresql") for url in urls if url):
            raise ValueError("ha: sql devices must be on PostgreSQL (`url: postgresql+psycopg://...`); SQLite "
                             "is not a shared store")
        if len(urls) != 1:
            raise ValueError(f"ha: every sql device must use the one database of the lease, not {len(urls)}")
        prefixes = {dev.table_prefix for dev in sqls.values()}
        if len(prefixes) != 1:
            raise ValueError("ha: every sql device must use the same table_prefix (the lease row's table)")
        ids = {dev.broker_id for dev in sqls.values()} - {None}
        if ids - {self.node_id}:
            raise ValueError("ha: sql devices' broker_id must be the group's node_id (the members share its rows)")
        return ("postgresql", urls.pop() or "")

    def selector_limits(self):
        """The selector limits of this broker (a ``pymq.selector.SelectorLimits``)."""
        from pymq.selector import SelectorLimits
        return SelectorLimits(max_length=self.selector_max_length, max_depth=self.selector_max_depth,
                              max_terms=self.selector_max_terms,
                              max_like_length=self.selector_max_like_length)

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike | None = None, **overrides: Any) -> BrokerConfig:
        """The YAML file at ``path`` (if any) with ``overrides`` (command-line flags; None = not given)
        on top, validated.  Raises ConfigError naming the file, each bad key, its value and what was
        expected."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        data: dict = {}
        node = None
        source = os.fspath(path) if path is not None else None
        if source is not None:
            data, node = load_yaml_mapping(source, "config file")
        merged = {**data, **overrides}
        try:
            cfg = cls.model_validate(merged)
        except ValidationError as exc:
            problems = describe_errors(exc, cls, node=node, command_line=set(overrides) - set(data))
            raise ConfigError(format_problems(source or "the command line", problems),
                              file=source, problems=problems) from None
        cfg._source = source
        cfg._overrides = overrides
        return cfg

    @classmethod
    def from_dict(cls, data: dict) -> BrokerConfig:
        """Settings from a mapping (tests, embedding); the same checks as the YAML file."""
        if not isinstance(data, dict):
            raise ConfigError(f"configuration must be a mapping, not {type(data).__name__}")
        try:
            cfg = cls.model_validate(data)
        except ValidationError as exc:
            problems = describe_errors(exc, cls)
            raise ConfigError(format_problems("configuration", problems), problems=problems) from None
        cfg._overrides = dict(data)
        return cfg

    def reread(self) -> BrokerConfig:
        """The same sources (file and command-line overrides) read again, validated (SIGHUP).  A
        configuration built in code (no file) gives its own settings again: a reload then re-reads only
        the files they name (users file, storage rules, certificates)."""
        if self._source is None and not self._overrides:
            return type(self).load(None, **self.model_dump(include=self.model_fields_set))
        return type(self).load(self._source, **self._overrides)

    @property
    def source(self) -> str | None:
        return self._source


# -- the users file ------------------------------------------------------------------------------------

_SCRYPT_RE = re.compile(r"scrypt\$\d+\$\d+\$\d+\$[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+\Z")


class UserEntry(_Section):
    """One user of the users file (docs/users.md)."""

    password: str | None = Field(None, description="salted scrypt hash written by `pymq-server passwd` "
                                 "(plain-text passwords are refused)")
    roles: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list, description="roles; "
                                                             "`admin` may do everything")
    loopback_only: bool = Field(False, description="accept this user only from a loopback address")
    certificate_subject: str | None = Field(None, min_length=1, description="RFC 4514 subject of a client "
                                            "certificate that logs in as this user without a password "
                                            "(mutual TLS), e.g. `CN=alice,O=Example`")

    @field_validator("password")
    @classmethod
    def _hashed(cls, value: str | None) -> str | None:
        if value is not None and not _SCRYPT_RE.match(value):
            raise ValueError("not a scrypt hash (plain-text passwords are refused; use "
                             "`pymq-server passwd USER --users-file FILE`)")
        return value

    @model_validator(mode="after")
    def _some_credential(self) -> UserEntry:
        if self.password is None and self.certificate_subject is None:
            raise ValueError("needs a `password` hash or a `certificate_subject`")
        return self


class UsersFile(_Section):
    """The users file: ``users: {name: {password: <scrypt hash>, roles: [...]}}``."""

    users: dict[Annotated[str, Field(min_length=1)], UserEntry] = Field(
        description="user name -> entry (an empty mapping: nobody may log in)")

    @model_validator(mode="after")
    def _unique_subjects(self) -> UsersFile:
        seen: dict[str, str] = {}
        for name, entry in self.users.items():
            subject = entry.certificate_subject
            if subject is not None:
                key = normalise_subject(subject)
                if key in seen:
                    raise ValueError(f"users {seen[key]!r} and {name!r} have the same certificate_subject")
                seen[key] = name
        return self


def load_users_file(path: str) -> UsersFile:
    data, node = load_yaml_mapping(path, "users file", empty_ok=True)
    try:
        return UsersFile.model_validate(data)
    except ValidationError as exc:
        problems = describe_errors(exc, UsersFile, node=node)
        raise ConfigError(format_problems(path, problems, what="users file"), file=path,
                          problems=problems) from None


def normalise_subject(subject: str) -> str:
    """An RFC 4514 subject compared without regard to spaces around separators or attribute-name case
    (``cn=alice, o=Example`` == ``CN=alice,O=Example``)."""
    parts = []
    for rdn in re.split(r"(?<!\\),", subject):
        name, _, value = rdn.partition("=")
        parts.append(f"{name.strip().upper()}={value.strip()}")
    return ",".join(parts)


# -- YAML and error reports ----------------------------------------------------------------------------

class Problem:
    """One thing wrong in a configuration: where, the value found, and what was expected."""

    __slots__ = ("key", "value", "reason", "line", "source")

    def __init__(self, key: str, value: Any, reason: str, line: int | None = None,
                 source: str | None = None) -> None:
        self.key, self.value, self.reason, self.line, self.source = key, value, reason, line, source

    def __repr__(self) -> str:
        return f"Problem({self.key!r}, {self.value!r}, {self.reason!r}, line={self.line})"

    def to_dict(self) -> dict:
        return {"key": self.key, "value": self.value, "reason": self.reason, "line": self.line}


def load_yaml_mapping(path: str, what: str, empty_ok: bool = False) -> tuple[dict, Any]:
    """(mapping, YAML node tree for line numbers) of the file at ``path``."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}", file=path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text: {exc.reason} at byte {exc.start}",
                          file=path) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML: {exc}", file=path) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping of settings at the top level, got "
                          f"{type(data).__name__}", file=path)
    return data, node


_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false (unquoted)", "bool_parsing": "true or false (unquoted)",
    "string_type": "a string", "dict_type": "a mapping", "list_type": "a list",
    "model_type": "a mapping", "model_attributes_type": "a mapping", "missing": "a value (required)",
    "none_required": "null",
}


def describe_errors(exc: ValidationError, model: type, *, prefix: tuple = (), node: Any = None,
                    command_line: set | None = None) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        raw = tuple(str(p) if not isinstance(p, int) else p for p in err["loc"])
        loc = _drop_tags(raw, model)
        key = _key(prefix + loc)
        value = err.get("input")
        kind = err["type"]
        ctx = err.get("ctx") or {}
        if kind == "extra_forbidden":
            reason = _unknown_key(str(loc[-1]) if loc else "", _known_keys(model, raw[:-1]), model, loc)
        elif kind == "literal_error":
            reason = f"expected {ctx.get('expected', 'one of the listed values')}"
        elif kind == "union_tag_invalid":
            reason = f"unknown {ctx.get('discriminator', 'kind')} {ctx.get('tag')!r}; expected " \
                     f"{ctx.get('expected_tags')}"
        elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
            op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
                  "less_than": "<"}[kind]
            bound = next(iter(ctx.values())) if ctx else "?"
            reason = f"expected a number {op} {bound}"
        elif kind in ("string_too_short",):
            reason = "expected a non-empty string"
        elif kind == "string_pattern_mismatch":
            reason = f"expected a string matching {ctx.get('pattern')}"
        elif kind in ("value_error", "assertion_error"):
            reason = str(ctx.get("error", err["msg"]))
        elif kind in _EXPECTED:
            reason = f"expected {_EXPECTED[kind]}"
        else:
            reason = err["msg"]
        if kind == "missing":
            value = None
        line = _line_of(node, loc) if node is not None else None
        source = "command line" if command_line and loc and loc[0] in command_line else None
        problems.append(Problem(key, value, reason, line, source))
    problems.sort(key=lambda p: p.line or 0)
    return problems


def _unknown_key(name: str, known: list[str], model: type, loc: tuple) -> str:
    import difflib
    what = "unknown queue setting" if _known_keys(model, loc[:-1]) == sorted(QueueConfig.model_fields) \
        else "unknown setting"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if close:
        return f"{what}; did you mean {close[0]!r}?"
    if model is BrokerConfig and len(loc) == 1:
        queue_setting = difflib.get_close_matches(name, list(QueueConfig.model_fields), n=1, cutoff=0.75)
        if queue_setting:
            return (f"unknown setting; the queue setting {queue_setting[0]!r} goes under `queue_defaults:` "
                    f"or `queues: {{<name>: ...}}`")
    if len(known) > 16:
        return f"{what} (see docs/configuration.md for the list)"
    return what + (f" (known: {', '.join(known)})" if known else "")


def format_problems(source: str, problems: list[Problem], what: str = "configuration") -> str:
    head = f"invalid {what} in {source}" if what != "configuration" or source != "configuration" \
        else "invalid configuration"
    lines = [head + ":"]
    for p in problems:
        where = f"line {p.line}: " if p.line else ""
        if p.source:
            where = f"({p.source}) "
        shown = "" if p.value is None and p.reason.startswith("expected a value") else \
            f" = {_show(p.value)}"
        if isinstance(p.value, (dict, list)) and len(repr(p.value)) > 60:
            shown = ""      # a whole section: its key path says where
        lines.append(f"  {where}{p.key}{shown}: {p.reason}")
    return "\n".join(lines)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _key(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (the key)"
        else:
            out += ("." if out else "") + part
    return out or "(top level)"


def _drop_tags(loc: tuple, model: type) -> tuple:
    """Pydantic puts a discriminated union's tag (``file``) and function-validator names into the
    location; the key path a user wrote has neither."""
    out = []
    current: Any = model
    for part in loc:
        if isinstance(part, str) and part.startswith("function-"):
            continue
        member = _union_member(current, part)
        if member is not None:
            current = member
            continue
        out.append(part)
        current = _child(current, part)
    return tuple(out)


def _unwrap(tp: Any) -> Any:
    import typing
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin is Union or (sys.version_info >= (3, 10) and origin is __import__("types").UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _union_member(current: Any, part: Any) -> Any:
    import typing
    tp = _unwrap(current)
    if typing.get_origin(tp) is Union:
        for arg in typing.get_args(tp):
            arg = _unwrap(arg)
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                kind = arg.model_fields.get("kind")
                if kind is not None and part in typing.get_args(_unwrap(kind.annotation)):
                    return arg
    return None


def _child(current: Any, part: Any) -> Any:
    import typing
    tp = _unwrap(current)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field is not None else None
    origin = typing.get_origin(tp)
    if origin is dict:
        return typing.get_args(tp)[1]
    if origin is list:
        return typing.get_args(tp)[0]
    return None


def _known_keys(model: type, loc: tuple) -> list[str]:
    current: Any = model
    for part in loc:
        member = _union_member(current, part)
        current = member if member is not None else _child(current, part)
    tp = _unwrap(current)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return sorted(tp.model_fields)
    import typing
    if isinstance(tp, type) and typing.is_typeddict(tp):
        return sorted(tp.__annotations__)
    return []


def _line_of(node: Any, loc: tuple) -> int | None:
    """Line (1-based) of the YAML node at ``loc``, or of its nearest ancestor."""
    line = node.start_mark.line + 1 if node is not None else None
    for depth, part in enumerate(loc):
        child = None
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == str(part):
                    child = value_node if depth < len(loc) - 1 else key_node
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


# -- the reference (docs/configuration.md) --------------------------------------------------------------

def reference() -> str:
    """The configuration reference in Markdown, generated from the models above."""
    from pymq_server._config_reference import render
    return render()


if __name__ == "__main__":  # python -m pymq_server.config --reference
    if sys.argv[1:] == ["--reference"]:
        sys.stdout.write(reference())
    else:
        sys.stderr.write("usage: python -m pymq_server.config --reference\n")
        sys.exit(2)
