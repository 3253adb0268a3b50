"""The one URL grammar of both SDKs (blocking ``pymq`` and ``pymq.aio``).

::

    stomp://[user[:password]@]host[:port]                  plain TCP (``tcp://`` is the same), port 61613
    stomps://[user[:password]@]host[:port][?tls options]   TLS (``stomp+ssl://`` and ``ssl://`` too), port 61614
    vm://[user[:password]@]name[?data_dir=...&port=...]    the embedded broker ``name`` in this process

TLS options (query parameters): ``ca_file`` (PEM file of the certificate authorities to trust; without
it the system's default ones), ``cert_file`` and ``key_file`` (a client certificate for mutual TLS; the
key may sit in ``cert_file``), ``verify`` (``true``/``false``: check the broker's certificate and host
name; default true) and ``server_hostname`` (the name to check the certificate against and to send
as SNI, when it differs from the host connected to).  Percent-encode reserved characters in user
names, passwords and paths (``%40`` for ``@``).

An unknown option, a TLS option on a plain ``stomp://`` URL or a bad value is refused with
:class:`~pymq.errors.ConnectFailed` naming it, before anything is connected: a typo must not silently
turn verification off or drop a credential.

Precedence: what the application passes explicitly (``username=``, ``password=``, ``tls=``) wins over
the URL; the URL wins over the defaults.  Explicit TLS options are merged field by field
(:meth:`TlsOptions.merged`), and an :class:`ssl.SSLContext` passed as ``tls`` is used as it is.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass, field, replace
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


def parse_url(url: str) -> Address:
    """Read ``url`` (see the module docstring); refuse anything it does not understand."""
    if not isinstance(url, str):
        raise ConnectFailed(f"a broker URL must be a string, not {type(url).__name__}")
    try:
        parts = urlsplit(url)
        port_text = parts.port
    except ValueError as exc:
        raise ConnectFailed(f"bad URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    query = _query(url, parts.query)
    if scheme in _PLAIN_SCHEMES or scheme in _TLS_SCHEMES:
        tls_scheme = scheme in _TLS_SCHEMES
        unknown = set(query) - _TLS_KEYS
        if unknown:
            raise ConnectFailed(f"unknown option {sorted(unknown)[0]!r} in URL {_safe(url)}; "
                                f"options are {', '.join(sorted(_TLS_KEYS))} (on stomps:// URLs)")
        if query and not tls_scheme:
            raise ConnectFailed(f"TLS option {sorted(query)[0]!r} on a plain {scheme}:// URL {_safe(url)}; "
                                f"use stomps:// (or stomp+ssl://) for TLS")
        if parts.path not in ("", "/"):
            raise ConnectFailed(f"a STOMP URL has no path: {_safe(url)}")
        host = parts.hostname or "127.0.0.1"
        port = port_text if port_text is not None else (DEFAULT_TLS_PORT if tls_scheme else DEFAULT_PORT)
        tls = _tls_options(url, query) if tls_scheme else None
        return StompAddress(host, port, tls, username, password)
    if scheme == "vm":
        netloc = parts.netloc.rpartition("@")[2]
        name = (netloc or parts.path.lstrip("/")) or "default"
        unknown = set(query) - _VM_KEYS
        if unknown:
            raise ConnectFailed(f"unknown option {sorted(unknown)[0]!r} in URL {_safe(url)}; "
                                f"vm:// options are {', '.join(sorted(_VM_KEYS))}")
        listen = query.get("port")
        if listen is not None and not (listen.isascii() and listen.isdigit() and len(listen) <= 5
                                       and int(listen) <= 65535):
            raise ConnectFailed(f"port={listen!r} in URL {_safe(url)}: expected a TCP port number (0-65535)")
        return VmAddress(name, query, username, password)
    raise ConnectFailed(f"unsupported URL {_safe(url)}: use stomp://host:port, stomps://host:port "
                        f"(TLS) or vm://name")


def _query(url: str, query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConnectFailed(f"bad query string in URL {_safe(url)}: expected name=value&...") from None
    for key, value in pairs:
        if key in out:
            raise ConnectFailed(f"option {key!r} given twice in URL {_safe(url)}")
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
            raise ConnectFailed(f"verify={text!r} in URL {_safe(url)}: expected true or false")
    for key in ("ca_file", "cert_file", "key_file", "server_hostname"):
        if key in query and not query[key]:
            raise ConnectFailed(f"option {key!r} is empty in URL {_safe(url)}")
    return TlsOptions(ca_file=query.get("ca_file"), cert_file=query.get("cert_file"),
                      key_file=query.get("key_file"), verify=verify,
                      server_hostname=query.get("server_hostname"))


def _safe(url: str) -> str:
    """``url`` for an error message, without its password."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return repr(url)
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
        return repr(parts._replace(netloc=netloc).geturl())
    except ValueError:
        return "(unreadable URL)"
