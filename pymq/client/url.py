"""The one URL grammar of both SDKs (blocking ``pymq`` and ``pymq.aio``).

::

    stomp://[user[:password]@]host[:port][/vhost]          plain TCP (``tcp://`` is the same), port 61613
    stomps://[user[:password]@]host[:port][?tls options]   TLS (``stomp+ssl://`` and ``ssl://`` too), port 61614
    vm://[user[:password]@]name[?data_dir=...&port=...]    the embedded broker ``name`` in this process

TLS options (query parameters): ``ca_file`` (PEM file of the certificate authorities to trust; without
it the system's default ones), ``cert_file`` and ``key_file`` (a client certificate for mutual TLS; the
key may sit in ``cert_file``), ``verify`` (``true``/``false``: check the broker's certificate and host
name; default true) and ``server_hostname`` (the name to check the certificate against and to send
as SNI, when it differs from the host connected to).  Percent-encode reserved characters in user
names, passwords and paths (``%40`` for ``@``).  A path names the broker's virtual host (spec/stomp.md §1):
``stomp://host:61613/shop`` connects to vhost ``shop`` (sent as ``host:/shop``).

An unknown option, a TLS option on a plain ``stomp://`` URL or a bad value is refused with
:class:`~pymq.errors.ConnectFailed` naming it, before anything is connected: a typo must not silently
turn verification off or drop a credential.

Groups of brokers that fail over (spec/ha.md §4.1; vectors in spec/vectors/failover_urls.json)::

    failover:(URL,URL,...)[?failover options]   ActiveMQ's form; one inner URL means "reconnect to it"
    failover:URL,URL,...                        the same with the default options (a query belongs to the last URL)
    URL,URL,...                                 a plain comma list of two or more: the default options

Inner URLs are complete ``stomp://``/``stomps://`` URLs (each with its own credentials and TLS options;
percent-encode a comma inside one).  ``vm://`` cannot be in a group.  :func:`parse_group` reads all
three forms and a single URL (a group of one without failover); the options are
:class:`FailoverOptions`, spelled as ActiveMQ spells them.  Every refusal is a
:class:`~pymq.errors.ConnectFailed` whose ``reason`` names the kind (the vectors' ``error``).

Precedence: what the application passes explicitly (``username=``, ``password=``, ``tls=``) wins over
the URL; the URL wins over the defaults.  Explicit TLS options are merged field by field
(:meth:`TlsOptions.merged`), and an :class:`ssl.SSLContext` passed as ``tls`` is used as it is.
"""
from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field, fields, replace
from urllib.parse import parse_qsl, unquote, urlsplit

from pymq.errors import ConnectFailed

DEFAULT_PORT = 61613
DEFAULT_TLS_PORT = 61614

_PLAIN_SCHEMES = frozenset({"stomp", "tcp"})
_TLS_SCHEMES = frozenset({"stomps", "stomp+ssl", "ssl", "stomp+tls"})
_TLS_KEYS = frozenset({"ca_file", "cert_file", "key_file", "verify", "server_hostname"})
_VM_KEYS = frozenset({"data_dir", "port"})
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True)
class TlsOptions:
    """How to set up TLS to the broker; ``None`` fields take the default (or the URL's value)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool | None = None
    server_hostname: str | None = None

    def merged(self, explicit: TlsOptions | None) -> TlsOptions:
        """These options with every field ``explicit`` sets taking precedence."""
        if explicit is None:
            return self
        return replace(self, **{name: value for name, value in vars(explicit).items() if value is not None})

    @property
    def verifying(self) -> bool:
        return self.verify is not False

    def context(self) -> ssl.SSLContext:
        """A client-side SSL context for these options (the files are read here)."""
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"cannot load the CA file {self.ca_file!r}: {_reason(exc)}",
                                ca_file=self.ca_file or "") from None
        if not self.verifying:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file is not None:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConnectFailed(f"cannot load the client certificate {self.cert_file!r}"
                                    f"{' / key ' + repr(self.key_file) if self.key_file else ''}: {_reason(exc)}",
                                    cert_file=self.cert_file) from None
        elif self.key_file is not None:
            raise ConnectFailed("key_file needs cert_file (the client certificate it belongs to)")
        return ctx


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)


@dataclass(frozen=True)
class StompAddress:
    """A broker reached over TCP, optionally with TLS (``tls`` is None for plain TCP)."""

    host: str
    port: int
    tls: TlsOptions | None = None
    username: str | None = None
    password: str | None = None
    vhost: str | None = None        # the URL's path: the broker's virtual host (spec/stomp.md §1)

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class VmAddress:
    """The embedded broker ``name`` in this process (started on first use)."""

    name: str
    options: dict[str, str] = field(default_factory=dict)
    username: str | None = None
    password: str | None = None


Address = StompAddress | VmAddress


@dataclass(frozen=True)
class FailoverOptions:
    """The failover options of spec/ha.md §4.2 (delays and ``timeout`` in milliseconds)."""

    initial_reconnect_delay: int = 100
    max_reconnect_delay: int = 5000
    use_exponential_backoff: bool = True
    backoff_multiplier: float = 2.0
    jitter: float = 0.2
    max_reconnect_attempts: int = -1
    startup_max_reconnect_attempts: int = 0
    randomize: bool = False
    timeout: int = -1
    connection_timeout: int = 3000

    def delay_ms(self, attempt: int) -> float:
        """The wait before ``attempt`` (1 = the first attempt after a loss, which is immediate), before
        jitter: ``initial * multiplier ** (attempt - 2)`` (or ``initial`` without back-off), capped."""
        if attempt <= 1:
            return 0.0
        delay = float(self.initial_reconnect_delay)
        if self.use_exponential_backoff:
            # the power stops growing once it passes the cap (no float overflow however many attempts)
            for _ in range(attempt - 2):
                if delay >= self.max_reconnect_delay:
                    break
                delay *= self.backoff_multiplier
        return min(delay, float(self.max_reconnect_delay))

    def attempt_timeout(self, timeout: float) -> float:
        """How long one attempt may take to open its link (TCP, TLS, CONNECTED), in seconds: the
        ``connectionTimeout`` option within the client's own ``timeout`` (0: the client's timeout alone).  A
        stopped broker's port still accepts TCP connections, so without it an attempt there would wait the
        whole client timeout before the next broker is tried."""
        if self.connection_timeout <= 0:
            return timeout
        return min(timeout, self.connection_timeout / 1000.0)

    def jittered(self, delay_ms: float, uniform: float) -> float:
        """``delay_ms`` scaled by ``1 + jitter * (2 * uniform - 1)`` for ``uniform`` in [0, 1], capped."""
        return min(delay_ms * (1.0 + self.jitter * (2.0 * uniform - 1.0)), float(self.max_reconnect_delay))


@dataclass(frozen=True)
class BrokerGroup:
    """What a URL names: one broker (``failover`` False: a lost connection is final), or a group that
    fails over with ``options``.  ``brokers`` are in the URL's order."""

    brokers: tuple[StompAddress | VmAddress, ...]
    options: FailoverOptions = FailoverOptions()
    failover: bool = False


#: URL option name (ActiveMQ's) -> FailoverOptions field
FAILOVER_OPTIONS = {
    "initialReconnectDelay": "initial_reconnect_delay",
    "maxReconnectDelay": "max_reconnect_delay",
    "useExponentialBackOff": "use_exponential_backoff",
    "backOffMultiplier": "backoff_multiplier",
    "jitter": "jitter",
    "maxReconnectAttempts": "max_reconnect_attempts",
    "startupMaxReconnectAttempts": "startup_max_reconnect_attempts",
    "randomize": "randomize",
    "timeout": "timeout",
    "connectionTimeout": "connection_timeout",
}
#: the smallest value of each integer option (the largest is 2**31 - 1, so every binding's int holds it)
_INT_MINIMUM = {"initial_reconnect_delay": 0, "max_reconnect_delay": 0, "max_reconnect_attempts": -1,
                "startup_max_reconnect_attempts": -1, "timeout": -1, "connection_timeout": 0}
#: the closed range of each decimal option
_FLOAT_RANGE = {"backoff_multiplier": (1.0, 1000.0), "jitter": (0.0, 1.0)}
_INT_TEXT = re.compile(r"-?[0-9]{1,10}")
_FLOAT_TEXT = re.compile(r"[0-9]{1,10}(\.[0-9]{1,10})?")
_MAX_INT = 2**31 - 1


def _refuse(reason: str, message: str) -> ConnectFailed:
    return ConnectFailed(message, reason=reason)


def parse_group(url: str) -> BrokerGroup:
    """Read ``url`` as a group of brokers (see the module docstring); a single URL is a group of one
    without failover.  Refusals are ConnectFailed with ``reason`` (spec/vectors/failover_urls.json)."""
    if not isinstance(url, str):
        raise _refuse("bad-broker-url", f"a broker URL must be a string, not {type(url).__name__}")
    text = url.strip()
    if text[:9].lower() == "failover:":
        rest = text[9:].lstrip()
        if rest.startswith("("):
            close = rest.rfind(")")
            if close < 0:
                raise _refuse("unbalanced", f"no ')' closes the broker list of {redacted(url)}")
            inner, tail = rest[1:close], rest[close + 1:].strip()
            if tail and not tail.startswith("?"):
                raise _refuse("unbalanced", f"unexpected {tail[:20]!r} after the broker list of {redacted(url)}; "
                                            f"failover options follow a '?'")
            options = _failover_options(url, tail[1:]) if tail else FailoverOptions()
        else:
            inner, options = rest, FailoverOptions()
        return BrokerGroup(_members(url, inner), options, failover=True)
    if "," in text:
        return BrokerGroup(_members(url, text), FailoverOptions(), failover=True)
    if not text:
        raise _refuse("empty", "the broker URL is empty")
    return BrokerGroup((parse_url(text),))


def _members(url: str, inner: str) -> tuple[StompAddress | VmAddress, ...]:
    if "(" in inner or ")" in inner:
        raise _refuse("unbalanced", f"parentheses inside the broker list of {redacted(url)} "
                                    f"(percent-encode them inside a URL)")
    parts = [part.strip() for part in inner.split(",")]
    if parts == [""]:
        raise _refuse("empty", f"no broker URL in {redacted(url)}")
    brokers: list[StompAddress | VmAddress] = []
    for part in parts:
        if not part:
            raise _refuse("empty", f"an empty broker URL in the list of {redacted(url)}")
        if part[:9].lower() == "failover:":
            raise _refuse("nested-failover", f"a failover URL inside the group {redacted(url)}")
        try:
            address = parse_url(part)
        except ConnectFailed as exc:
            raise _refuse("bad-broker-url", f"in the group {redacted(url)}: {exc}") from None
        if isinstance(address, VmAddress):
            raise _refuse("vm-in-group", f"vm:// cannot be part of a group of brokers ({redacted(url)}): "
                                         f"an in-process broker has nothing to fail over to")
        brokers.append(address)
    return tuple(brokers)


def _failover_options(url: str, query: str) -> FailoverOptions:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise _refuse("bad-value", f"bad failover options in {redacted(url)}: expected name=value&...") from None
    values: dict[str, object] = {}
    kinds = {f.name: f.type for f in fields(FailoverOptions)}
    for key, text in pairs:
        name = FAILOVER_OPTIONS.get(key)
        if name is None:
            raise _refuse("unknown-option", f"unknown failover option {key!r} in {redacted(url)}; options are "
                                            f"{', '.join(FAILOVER_OPTIONS)} (spec/ha.md §4.2)")
        if name in values:
            raise _refuse("duplicate-option", f"failover option {key!r} given twice in {redacted(url)}")
        values[name] = _option_value(url, key, name, kinds[name], text)
    return FailoverOptions(**values)  # type: ignore[arg-type]


def _option_value(url: str, key: str, name: str, kind: object, text: str) -> object:
    if kind in (bool, "bool"):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise _refuse("bad-value", f"{key}={text!r} in {redacted(url)}: expected true or false")
    if kind in (float, "float"):
        low, high = _FLOAT_RANGE[name]
        if _FLOAT_TEXT.fullmatch(text) and low <= float(text) <= high:
            return float(text)
        raise _refuse("bad-value", f"{key}={text!r} in {redacted(url)}: expected a decimal number "
                                   f"from {low:g} to {high:g}")
    low = _INT_MINIMUM[name]
    if _INT_TEXT.fullmatch(text) and low <= int(text) <= _MAX_INT:
        return int(text)
    raise _refuse("bad-value", f"{key}={text!r} in {redacted(url)}: expected a whole number from {low} to {_MAX_INT}")


_VHOST = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_url(url: str) -> Address:
    """Read ``url`` (see the module docstring); refuse anything it does not understand."""
    if not isinstance(url, str):
        raise ConnectFailed(f"a broker URL must be a string, not {type(url).__name__}")
    try:
        parts = urlsplit(url)
        port_text = parts.port
    except ValueError as exc:
        raise ConnectFailed(f"bad URL {redacted(url)}: {exc}") from None
    scheme = parts.scheme.lower()
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    query = _query(url, parts.query)
    if scheme in _PLAIN_SCHEMES or scheme in _TLS_SCHEMES:
        tls_scheme = scheme in _TLS_SCHEMES
        unknown = set(query) - _TLS_KEYS
        if unknown:
            raise ConnectFailed(f"unknown option {sorted(unknown)[0]!r} in URL {redacted(url)}; "
                                f"options are {', '.join(sorted(_TLS_KEYS))} (on stomps:// URLs)")
        if query and not tls_scheme:
            raise ConnectFailed(f"TLS option {sorted(query)[0]!r} on a plain {scheme}:// URL {redacted(url)}; "
                                f"use stomps:// (or stomp+ssl://) for TLS")
        vhost = unquote(parts.path.strip("/")) or None
        if vhost is not None and not _VHOST.fullmatch(vhost):
            raise ConnectFailed(f"a STOMP URL's path is a virtual host name (letters, digits, '_', '-'): "
                                f"{redacted(url)}")
        host = parts.hostname or "127.0.0.1"
        port = port_text if port_text is not None else (DEFAULT_TLS_PORT if tls_scheme else DEFAULT_PORT)
        tls = _tls_options(url, query) if tls_scheme else None
        return StompAddress(host, port, tls, username, password, vhost)
    if scheme == "vm":
        netloc = parts.netloc.rpartition("@")[2]
        name = (netloc or parts.path.lstrip("/")) or "default"
        unknown = set(query) - _VM_KEYS
        if unknown:
            raise ConnectFailed(f"unknown option {sorted(unknown)[0]!r} in URL {redacted(url)}; "
                                f"vm:// options are {', '.join(sorted(_VM_KEYS))}")
        listen = query.get("port")
        if listen is not None and not (listen.isascii() and listen.isdigit() and len(listen) <= 5
                                       and int(listen) <= 65535):
            raise ConnectFailed(f"port={listen!r} in URL {redacted(url)}: expected a TCP port number (0-65535)")
        return VmAddress(name, query, username, password)
    raise ConnectFailed(f"unsupported URL {redacted(url)}: use stomp://host:port, stomps://host:port "
                        f"(TLS) or vm://name")


def _query(url: str, query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConnectFailed(f"bad query string in URL {redacted(url)}: expected name=value&...") from None
    for key, value in pairs:
        if key in out:
            raise ConnectFailed(f"option {key!r} given twice in URL {redacted(url)}")
        out[key] = value
    return out


def _tls_options(url: str, query: dict[str, str]) -> TlsOptions:
    verify: bool | None = None
    text = query.get("verify")
    if text is not None:
        if text.lower() in _TRUE:
            verify = True
        elif text.lower() in _FALSE:
            verify = False
        else:
            raise ConnectFailed(f"verify={text!r} in URL {redacted(url)}: expected true or false")
    for key in ("ca_file", "cert_file", "key_file", "server_hostname"):
        if key in query and not query[key]:
            raise ConnectFailed(f"option {key!r} is empty in URL {redacted(url)}")
    return TlsOptions(ca_file=query.get("ca_file"), cert_file=query.get("cert_file"),
                      key_file=query.get("key_file"), verify=verify,
                      server_hostname=query.get("server_hostname"))


#: the password of every ``scheme://user:password@`` in a text (also inside a group of URLs)
_PASSWORD = re.compile(r"(://[^:/@,()?#\s]*:)[^@,()\s]*@")


def redacted(url: str) -> str:
    """``url`` for an error message, without its passwords (one URL or a whole group)."""
    return repr(_PASSWORD.sub(r"\1***@", url))
