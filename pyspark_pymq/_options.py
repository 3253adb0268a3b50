"""Option parsing for the pymq data source: Spark's string options become frozen, picklable values.

Everything here runs on the driver while Spark plans the query, so a bad option is a ``ConfigError``
with a sentence that names the option, before any job starts.  Nothing here imports pyspark, so the
rules are testable without a JVM.  Option names are case-insensitive (Spark's own rule); values are
strings.  The parsed values travel to executors inside input partitions and writers, so they hold no
connection and no pyspark object.
"""
from __future__ import annotations

import difflib
import inspect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pymq.destination import Destination, Queue, Topic, as_destination
from pymq.errors import ConfigError, DestinationError, InvalidSelector
from pymq.selector import compile_selector
from pyspark_pymq._patterns import DestinationPattern

if TYPE_CHECKING:
    from pymq import Connection

EARLIEST = -2          # Kafka's spelling inside JSON offsets
LATEST = -1

#: options Spark itself may hand to a data source; accepted and ignored
_SPARK_OWN = frozenset({"path", "checkpointlocation", "queryname", "__partition_columns"})

#: ConnectionFactory keywords the connector sets itself or refuses, rather than passing through
_NOT_PASSED = frozenset({"client_id"})
#: the connector's own default where it differs from the SDK's: tasks wait longer on a busy cluster
_CONNECTOR_DEFAULTS = {"timeout": 30.0}

_READ_NAMES = (
    "url", "queue", "topic", "destinations", "destinationPattern", "mode", "subscription", "selector",
    "startingOffsets", "endingOffsets", "startingTimestamp", "startingOffsetsByTimestamp", "endingTimestamp",
    "endingOffsetsByTimestamp", "maxMessagesPerTrigger", "maxOffsetsPerTrigger", "minMessagesPerTrigger",
    "minOffsetsPerTrigger", "maxTriggerDelay", "maxBytesPerTrigger", "minPartitions",
    "maxMessagesPerPartition", "maxBytesPerPartition", "failOnDataLoss", "includeProperties", "fetchSize",
    "fetchRetries",
    "fetchRetryIntervalMs", "filterPushdown",
)
_WRITE_NAMES = (
    "url", "destination", "queue", "topic", "dedup", "dedupPrefix", "transactionSize", "deliveryMode",
    "priority", "timeToLive", "arrow",
)
_READ_KEYS = frozenset(k.lower() for k in _READ_NAMES)
_WRITE_KEYS = frozenset(k.lower() for k in _WRITE_NAMES)
_SPELLING = {k.lower(): k for k in (*_READ_NAMES, *_WRITE_NAMES)}


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}


def _check_known(opts: dict[str, str], allowed: frozenset, what: str) -> None:
    for key in opts:
        if key in allowed or key.startswith("pymq.") or key in _SPARK_OWN:
            continue                        # pymq.* options are checked by ConnectionOptions.parse
        known = sorted(_SPELLING[k] for k in allowed)
        close = difflib.get_close_matches(key, [k.lower() for k in known], n=1)
        hint = f"; did you mean '{_SPELLING[close[0]]}'?" if close else f"; known options: {', '.join(known)}"
        raise ConfigError(f"unknown {what} option '{key}'{hint}")


def _alias(opts: dict, names: tuple[str, ...]) -> str | None:
    """The one of ``names`` (spellings of one option: ours, Kafka's) that was given, if any."""
    given = [n for n in names if (opts.get(n.lower()) or "").strip()]
    if len(given) > 1:
        raise ConfigError(f"options {' and '.join(repr(n) for n in given)} mean the same; give one")
    return given[0] if given else None


def _bool(opts: dict, key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ConfigError(f"option '{key}' must be true or false, got {raw!r}")


def _int(opts: dict, key: str, default: int, minimum: int = 1) -> int:
    value = _opt_int(opts, key, minimum)
    return default if value is None else value


def _opt_int(opts: dict, key: str, minimum: int = 1) -> int | None:
    raw = opts.get(key.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"option '{key}' must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option '{key}' must be at least {minimum}, got {value}")
    return value


def _squash(name: str) -> str:
    """Option spelling without case or underscores: pymq.syncSend, pymq.sync_send, pymq.SYNCSEND."""
    return name.replace("_", "").lower()


def _factory_parameters() -> dict[str, inspect.Parameter]:
    """The keywords of ``pymq.ConnectionFactory``: every one is a ``pymq.<keyword>`` option, so an SDK
    setting added later (TLS, ...) passes through without a change here."""
    from pymq import ConnectionFactory
    params = inspect.signature(ConnectionFactory.__init__).parameters
    return {name: p for name, p in params.items()
            if name not in ("self", "url") and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _setting_kind(p: inspect.Parameter) -> str:
    """How a Spark string option becomes this keyword's value: bool, int, float, ints (a tuple) or str."""
    if p.default is not inspect.Parameter.empty and p.default is not None:
        kind = type(p.default)
        if kind is tuple:
            return "ints"
        if kind in (bool, int, float, str):
            return kind.__name__
    annotation = str(p.annotation).replace("typing.", "").replace("Optional[", "").replace(" ", "")
    parts = {a.strip("]") for a in annotation.split("|")} - {"None"}
    for name in ("bool", "float", "int", "str"):
        if parts == {name}:
            return name
    return annotation


def _convert(option: str, kind: str, raw: str) -> Any:
    value = raw.strip()
    try:
        if kind == "bool":
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if kind == "int":
            return int(value)
        if kind == "float":
            number = float(value)
            if number <= 0:
                raise ConfigError(f"option '{option}' must be positive, got {raw!r}")
            return number
        if kind == "ints":
            beats = tuple(int(p) for p in value.split(","))
            if len(beats) != 2 or min(beats) < 0:
                raise ValueError
            return beats
        if kind == "str":
            return raw
    except ValueError:
        expected = {"bool": "true or false", "int": "an integer", "float": "a number",
                    "ints": "two non-negative integers 'send_ms,recv_ms'"}[kind]
        raise ConfigError(f"option '{option}' must be {expected}, got {raw!r}") from None
    raise ConfigError(f"option '{option}' takes a {kind} object in the SDK, which a Spark string option "
                      f"cannot give")


def _tls_option(key: str, raw: str) -> dict[str, Any]:
    """``pymq.tls.<field>`` -> a field of ``pymq.TlsOptions`` (by the field's type), so TLS settings the
    SDK gains later pass through as well."""
    import dataclasses

    import pymq
    fields = {_squash(f.name): f for f in dataclasses.fields(pymq.TlsOptions)}
    found = fields.get(_squash(key[len("pymq.tls."):]))
    if found is None:
        known = ", ".join(f"pymq.tls.{f.name}" for f in dataclasses.fields(pymq.TlsOptions))
        raise ConfigError(f"unknown TLS option '{key}': the pymq.tls.* options are the fields of "
                          f"pymq.TlsOptions: {known}")
    annotation = str(found.type)
    kind = "bool" if "bool" in annotation else "int" if "int" in annotation else "str"
    return {found.name: _convert(key, kind, raw)}


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach the broker: the url and the ``pymq.*`` options as ``pymq.ConnectionFactory``
    keywords.  Hashable (it keys the executors' connection cache) and picklable (it travels to them)."""

    url: str
    settings: tuple[tuple[str, Any], ...] = ()

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'***' if k == 'password' else repr(v)}" for k, v in self.settings)
        return f"ConnectionOptions({self.url!r}{', ' if shown else ''}{shown})"

    def get(self, keyword: str, default: Any = None) -> Any:
        return dict(self.settings).get(keyword, default)

    @property
    def username(self) -> str | None:
        return self.get("username")

    @property
    def password(self) -> str | None:
        return self.get("password")

    @property
    def timeout(self) -> float:
        return self.get("timeout")

    @property
    def heartbeat(self) -> tuple[int, int]:
        return self.get("heartbeat", (10_000, 10_000))

    @property
    def host(self) -> str | None:
        return self.get("host")

    @classmethod
    def parse(cls, opts: dict[str, str]) -> ConnectionOptions:
        url = (opts.get("url") or "").strip()
        if not url:
            raise ConfigError("option 'url' is required: the broker to use, e.g. stomp://127.0.0.1:61613")
        from pymq.client.url import StompAddress, parse_url
        from pymq.errors import ConnectFailed
        try:
            address = parse_url(url)
        except ConnectFailed as exc:
            raise ConfigError(f"option 'url': {exc}") from None
        if not isinstance(address, StompAddress):
            # executors run in other processes: an in-process vm:// broker would be a different broker there
            raise ConfigError("option 'url' must be a stomp:// or stomps:// address that every Spark executor "
                              "can reach, not an in-process vm:// broker")
        params = _factory_parameters()
        by_squash = {_squash(name): name for name in params}
        settings: dict[str, Any] = {k: v for k, v in _CONNECTOR_DEFAULTS.items() if k in params}
        tls: dict[str, Any] = {}
        for key, raw in opts.items():
            if not key.startswith("pymq.") or raw is None or raw == "":
                continue
            if key.startswith("pymq.tls."):
                tls.update(_tls_option(key, raw))
                continue
            keyword = by_squash.get(_squash(key[len("pymq."):]))
            if keyword == "tls":
                raise ConfigError(f"option '{key}': give TLS settings one by one (pymq.tls.caFile, "
                                  f"pymq.tls.certFile, pymq.tls.keyFile, pymq.tls.verify, "
                                  f"pymq.tls.serverHostname) or in the stomps:// URL's query")
            if keyword == "client_id":
                raise ConfigError(
                    "option 'pymq.clientId' is not supported: the driver and every executor task open their "
                    "own connections, and a client id can be held by one live connection only. Durable "
                    "subscriptions of the data source are scoped by the user name (pymq.username) instead")
            if keyword is None or keyword in _NOT_PASSED:
                known = sorted("pymq." + n for n in params if n not in _NOT_PASSED)
                close = difflib.get_close_matches(key, [k.lower() for k in known], n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ConfigError(f"unknown connection option '{key}': {hint}the pymq.* options are the "
                                  f"keywords of pymq.ConnectionFactory: {', '.join(known)}")
            settings[keyword] = _convert(key, _setting_kind(params[keyword]), raw)
        if tls:
            if address.tls is None:
                raise ConfigError(f"options {', '.join('pymq.tls.' + k for k in sorted(tls))} need a TLS URL "
                                  f"(stomps://host:port), not {url.split('://', 1)[0]}://")
            settings["tls"] = tuple(sorted(tls.items()))
        return cls(url, tuple(sorted(settings.items())))

    def connect(self) -> Connection:
        import pymq
        kwargs = dict(self.settings)
        if "tls" in kwargs:
            kwargs["tls"] = pymq.TlsOptions(**dict(kwargs["tls"]))
        return pymq.connect(self.url, **kwargs)


def _name_list(raw: str, what: str) -> list[str]:
    names = [n.strip() for n in raw.split(",")]
    if not raw.strip() or any(not n for n in names):
        raise ConfigError(f"option '{what}' must be a comma-separated list of names, got {raw!r}")
    return names


def _destination(raw: str, kind: type[Destination] | None, what: str) -> str:
    try:
        dest = kind(raw) if kind is not None and not raw.startswith("/") else as_destination(raw)
    except DestinationError as exc:
        raise ConfigError(f"option '{what}': {exc}") from None
    if kind is not None and not isinstance(dest, kind):
        raise ConfigError(f"option '{what}' names {dest}, which is not a {kind.__name__.lower()}")
    if type(dest) not in (Queue, Topic):
        raise ConfigError(f"option '{what}': {dest} is a temporary queue, private to the connection that "
                          f"made it; Spark tasks use their own connections")
    return dest.stomp_name


def destination_kind(stomp_name: str) -> str:
    return "topic" if stomp_name.startswith(Topic.prefix) else "queue"


def _offsets(raw: str, what: str, destinations: list[str] | None, named_kind: type | None,
             allow_earliest: bool, timestamps: bool = False) -> Any:
    """``earliest`` | ``latest`` | JSON ``{"/queue/x": {"0": seq}}`` (-2 earliest, -1 latest); with
    ``timestamps``, only JSON ``{"/queue/x": {"0": ms since the epoch}}``."""
    value = raw.strip()
    if timestamps and not value.startswith("{"):
        raise ConfigError(f"option '{what}' must be JSON like {{\"/topic/orders\": {{\"0\": 1700000000000}}}} "
                          f"(ms since the epoch per destination), got {raw!r}")
    if value.lower() in ("earliest", "latest"):
        if value.lower() == "earliest" and not allow_earliest:
            raise ConfigError(f"option '{what}' cannot be 'earliest'")
        return value.lower()
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise ConfigError(f"option '{what}' must be 'earliest', 'latest' or JSON like "
                          f'{{"/queue/orders": {{"0": 42}}}}, got {raw!r}') from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"option '{what}' JSON must be an object of destination -> {{partition: offset}}")
    out: dict[str, int] = {}
    for key, parts in parsed.items():
        dest = _destination(key, named_kind, what)
        if destinations is not None and dest not in destinations:
            raise ConfigError(f"option '{what}' names {dest}, which the query does not read "
                              f"(it reads {', '.join(destinations)})")
        if not isinstance(parts, dict) or set(parts) != {"0"}:
            raise ConfigError(f"option '{what}': {dest} must map partition \"0\" (pymq destinations have "
                              f"one partition) to an offset, got {parts!r}")
        seq = parts["0"]
        if timestamps:
            if type(seq) is not int or seq < 0:
                raise ConfigError(f"option '{what}': the timestamp of {dest} must be ms since the epoch "
                                  f"(>= 0), got {seq!r}")
        elif type(seq) is not int or seq < EARLIEST or (seq == EARLIEST and not allow_earliest):
            allowed = "-2 (earliest), -1 (latest)" if allow_earliest else "-1 (latest)"
            raise ConfigError(f"option '{what}': the offset of {dest} must be a sequence number (>= 0), "
                              f"{allowed}; got {seq!r}")
        out[dest] = seq
    return out


def _one_of(opts: dict, names: tuple[str, ...]) -> None:
    given = [n for n in names if (opts.get(n.lower()) or "").strip()]
    if len(given) > 1:
        raise ConfigError(f"give one of {', '.join(repr(n) for n in names)}, not {' and '.join(given)}")


_DURATION = re.compile(r"(\d+)\s*(ms|s|sec|m|min|h|d)?")
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                "d": 86_400_000}


def _duration_ms(raw: str, what: str) -> int:
    """Spark's (and Kafka's) duration spelling: ``15m``, ``30s``, ``500ms``, ``2h``, or plain ms."""
    found = _DURATION.fullmatch(raw.strip().lower())
    if found is None:
        raise ConfigError(f"option '{what}' must be a duration such as 15m, 30s, 500ms or 2h, got {raw!r}")
    return int(found.group(1)) * _DURATION_MS[found.group(2)]


@dataclass(frozen=True)
class ReadOptions:
    """The parsed read options (see pyspark_pymq/README.md for each one's meaning)."""

    connection: ConnectionOptions
    destinations: tuple[str, ...]        # STOMP names; empty with a pattern (resolved by the source)
    pattern: str | None = None           # destinationPattern (pyspark_pymq._patterns)
    mode: str = "browse"
    subscription: str | None = None
    selector: str | None = None
    starting: Any = None                 # "earliest" | "latest" | {dest: seq} | None (the default)
    starting_timestamp: int | None = None       # ms: every destination from its first message at/after it
    starting_by_timestamp: dict[str, int] | None = None
    ending: Any = "latest"
    ending_timestamp: int | None = None         # batch: every destination up to its first message at/after it
    ending_by_timestamp: dict[str, int] | None = None
    max_messages_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000     # with a minimum: fire anyway once this long since the last
    max_bytes_per_trigger: int | None = None
    min_partitions: int = 1
    max_messages_per_partition: int | None = None
    #: the JVM source's split by bytes (spec/spark.md §2); accepted here so a query runs on either
    #: implementation, and unused: this data source splits by width
    max_bytes_per_partition: int = 64 * 1024 * 1024
    fail_on_data_loss: bool = True
    include_properties: bool = False
    fetch_size: int = 10_000
    fetch_retries: int = 3                      # consecutive failed fetches (connection lost) retried
    fetch_retry_interval_ms: int = 1_000
    filter_pushdown: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool | None) -> ReadOptions:
        """``streaming`` is None when the caller (``schema()``) does not know yet; the rules that depend
        on it are checked again when the reader is made."""
        opts = _lower(options)
        _check_known(opts, _READ_KEYS, "read")
        connection = ConnectionOptions.parse(opts)
        given = [k for k in ("queue", "topic", "destinations", "destinationpattern") if opts.get(k, "").strip()]
        if len(given) != 1:
            raise ConfigError("give exactly one of 'queue', 'topic', 'destinations' or 'destinationPattern'"
                              + (f" (got {', '.join(_SPELLING[g] for g in given)})" if given else ""))
        pattern = opts.get("destinationpattern", "").strip() or None
        named_kind: type | None = None
        destinations: tuple[str, ...] = ()
        if pattern is not None:
            # resolved on the driver against the broker's destination listing (the source reads them)
            DestinationPattern(pattern)                   # refused here, before any job, when malformed
        else:
            key = given[0]
            names = _name_list(opts[key], _SPELLING[key])
            named_kind = {"queue": Queue, "topic": Topic}.get(key)
            destinations = tuple(_destination(n, named_kind, _SPELLING[key]) for n in names)
        if len(set(destinations)) != len(destinations):
            raise ConfigError(f"a destination is named twice: {', '.join(destinations)}")

        mode = (opts.get("mode") or "browse").strip().lower()
        if mode not in ("browse", "consume"):
            raise ConfigError(f"option 'mode' must be 'browse' or 'consume', got {opts.get('mode')!r}")
        subscription = opts.get("subscription", "").strip() or None
        selector = opts.get("selector", "").strip() or None
        if selector is not None:
            try:
                compile_selector(selector)
            except InvalidSelector as exc:
                raise ConfigError(f"option 'selector' is not a valid JMS selector: {exc}") from None
        topics = [d for d in destinations if destination_kind(d) == "topic"]
        if pattern is not None and subscription is not None and not DestinationPattern(pattern).topics_only:
            raise ConfigError("option 'subscription' names a durable subscription of a topic; a "
                              "'destinationPattern' used with it must start with /topic/")
        if subscription is not None and len(topics) != len(destinations):
            raise ConfigError("option 'subscription' names a durable subscription of a topic; "
                              f"{', '.join(d for d in destinations if d not in topics)} is a queue")
        if mode == "consume":
            if pattern is not None:
                raise ConfigError("mode 'consume' needs the destinations named ('queue' or 'topic'): the query "
                                  "acknowledges what it reads, so it must own each destination it consumes, "
                                  "not whatever a pattern matches later")
            if streaming is False:
                raise ConfigError("mode 'consume' needs a streaming query (spark.readStream): it acknowledges "
                                  "messages when Spark commits a micro-batch, and a batch read has no commit. "
                                  "Use mode 'browse' to read without removing anything")
            if topics and subscription is None:
                raise ConfigError("mode 'consume' on a topic needs option 'subscription': the durable "
                                  "subscription the query owns and acknowledges")
            if len(topics) > 1:
                raise ConfigError("mode 'consume' reads one topic per subscription; start one query per topic")
            if selector is not None:
                raise ConfigError("option 'selector' cannot be used with mode 'consume': the query acknowledges "
                                  "everything up to each committed offset, so the messages a selector skips "
                                  "would be acknowledged unread. Filter in Spark, or use mode 'browse'")
            for key in ("startingoffsets", "startingtimestamp", "startingoffsetsbytimestamp"):
                if opts.get(key, "").strip():
                    raise ConfigError(f"option '{_SPELLING[key]}' cannot be used with mode 'consume': the query "
                                      f"starts where the subscription was last acknowledged")

        named = None if pattern else list(destinations)
        starting: Any = None
        if opts.get("startingoffsets", "").strip():
            starting = _offsets(opts["startingoffsets"], "startingOffsets", named, named_kind, True)
        starting_ts = _opt_int(opts, "startingTimestamp", minimum=0)
        starting_by_ts = None
        if opts.get("startingoffsetsbytimestamp", "").strip():
            starting_by_ts = _offsets(opts["startingoffsetsbytimestamp"], "startingOffsetsByTimestamp", named,
                                      named_kind, False, timestamps=True)
        _one_of(opts, ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp"))
        ending: Any = "latest"
        ending_by_ts = None
        for key in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if streaming and opts.get(key.lower(), "").strip():
                raise ConfigError(f"option '{key}' is for batch reads; a streaming query has no end "
                                  f"(use Trigger.AvailableNow to stop at what exists when it starts)")
        _one_of(opts, ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"))
        if opts.get("endingoffsets", "").strip():
            ending = _offsets(opts["endingoffsets"], "endingOffsets", named, named_kind, False)
        ending_ts = _opt_int(opts, "endingTimestamp", minimum=0)
        if opts.get("endingoffsetsbytimestamp", "").strip():
            ending_by_ts = _offsets(opts["endingoffsetsbytimestamp"], "endingOffsetsByTimestamp", named,
                                    named_kind, False, timestamps=True)
        max_key = _alias(opts, ("maxMessagesPerTrigger", "maxOffsetsPerTrigger"))
        min_key = _alias(opts, ("minMessagesPerTrigger", "minOffsetsPerTrigger"))
        max_msgs = _opt_int(opts, max_key) if max_key else None
        min_msgs = _opt_int(opts, min_key) if min_key else None
        max_bytes = _opt_int(opts, "maxBytesPerTrigger")
        delay_raw = (opts.get("maxtriggerdelay") or "").strip()
        if delay_raw and min_key is None:
            raise ConfigError("option 'maxTriggerDelay' bounds how long 'minOffsetsPerTrigger' may hold a "
                              "trigger back; give it with that option")
        delay = _duration_ms(delay_raw, "maxTriggerDelay") if delay_raw else 15 * 60_000
        if min_msgs is not None and max_msgs is not None and min_msgs > max_msgs:
            raise ConfigError(f"option '{min_key}' ({min_msgs}) is above '{max_key}' ({max_msgs}): no "
                              f"micro-batch could satisfy both")
        if streaming is False:
            for option in (max_key, min_key, "maxBytesPerTrigger", "maxTriggerDelay" if delay_raw else None):
                if option and opts.get(option.lower(), "").strip():
                    raise ConfigError(f"option '{option}' is for streaming queries; a batch read takes "
                                      f"everything between startingOffsets and endingOffsets")
        return cls(
            connection=connection, destinations=destinations, pattern=pattern, mode=mode,
            subscription=subscription, selector=selector, starting=starting, starting_timestamp=starting_ts,
            starting_by_timestamp=starting_by_ts, ending=ending, ending_timestamp=ending_ts,
            ending_by_timestamp=ending_by_ts, max_messages_per_trigger=max_msgs,
            min_messages_per_trigger=min_msgs, max_trigger_delay_ms=delay, max_bytes_per_trigger=max_bytes,
            min_partitions=_int(opts, "minPartitions", 1), max_messages_per_partition=_opt_int(
                opts, "maxMessagesPerPartition"),
            max_bytes_per_partition=_int(opts, "maxBytesPerPartition", 64 * 1024 * 1024),
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            include_properties=_bool(opts, "includeProperties", False),
            fetch_size=_int(opts, "fetchSize", 10_000), fetch_retries=_int(opts, "fetchRetries", 3, minimum=0),
            fetch_retry_interval_ms=_int(opts, "fetchRetryIntervalMs", 1_000, minimum=0),
            filter_pushdown=_bool(opts, "filterPushdown", False))


@dataclass(frozen=True)
class WriteOptions:
    connection: ConnectionOptions
    destination: str | None = None       # the option; None: every row names its own
    dedup: bool = False
    dedup_prefix: str | None = None
    transaction_size: int = 1000         # rows per broker transaction (one receipt each)
    delivery_mode: int = 2
    priority: int = 4
    time_to_live: int = 0
    arrow: bool = True                   # bulk SENDs of Arrow rows (spec/spark.md §7); false: per message

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = _lower(options)
        _check_known(opts, _WRITE_KEYS, "write")
        connection = ConnectionOptions.parse(opts)
        given = [k for k in ("destination", "queue", "topic") if opts.get(k, "").strip()]
        if len(given) > 1:
            raise ConfigError("give at most one of 'destination', 'queue' or 'topic' "
                              f"(got {', '.join(given)})")
        destination = None
        if given:
            key = given[0]
            destination = _destination(opts[key].strip(), {"queue": Queue, "topic": Topic}.get(key), key)
        mode_raw = (opts.get("deliverymode") or "persistent").strip().lower()
        modes = {"persistent": 2, "2": 2, "non_persistent": 1, "non-persistent": 1, "1": 1}
        if mode_raw not in modes:
            raise ConfigError(f"option 'deliveryMode' must be 'persistent' or 'non_persistent', "
                              f"got {opts.get('deliverymode')!r}")
        priority = _int(opts, "priority", 4, minimum=0)
        if priority > 9:
            raise ConfigError(f"option 'priority' must be between 0 and 9, got {priority}")
        prefix = opts.get("dedupprefix", "").strip() or None
        dedup = _bool(opts, "dedup", False)
        if prefix is not None and not dedup:
            raise ConfigError("option 'dedupPrefix' only has a meaning with dedup=true")
        size = _int(opts, "transactionSize", 1000)
        if size > 100_000:
            raise ConfigError(f"option 'transactionSize' must be at most 100000 (the broker's default "
                              f"max_transaction_operations), got {size}")
        return cls(connection=connection, destination=destination, dedup=dedup, dedup_prefix=prefix,
                   transaction_size=size, delivery_mode=modes[mode_raw], priority=priority,
                   time_to_live=_int(opts, "timeToLive", 0, minimum=0), arrow=_bool(opts, "arrow", True))
