"""TLS for the broker's listeners: one server context built from the ``tls:`` settings, and the subject of
a client's verified certificate in the form users are mapped by.

The same :class:`ssl.SSLContext` serves STOMP (``tls_port``), WebSocket (``websocket.tls``) and the admin
HTTP port (``admin_tls``).  It is built before storage opens, so a missing or mismatched certificate
stops ``pymq-server`` before anything is written or listened on, with the setting that names the file.
``reload_certificates`` loads the files again into the same context (SIGHUP): new handshakes get the new
certificate, established connections keep theirs.
"""
from __future__ import annotations

import ssl
from typing import Any

from pymq.errors import ConfigError
from pymq_server.config import TlsConfig

_VERIFY = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}

# OpenSSL's long attribute names (what ssl.getpeercert() gives) -> RFC 4514 / RFC 4519 short names;
# others keep their long name, which is what a user writes for them in certificate_subject.
_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
          "stateOrProvinceName": "ST", "localityName": "L", "domainComponent": "DC", "userId": "UID",
          "streetAddress": "STREET"}


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """A server context with the broker's certificate and the configured client-certificate policy."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    if tls.ciphers:
        try:
            ctx.set_ciphers(tls.ciphers)
        except ssl.SSLError as exc:
            raise ConfigError(f"tls.ciphers = {tls.ciphers!r}: {exc.reason or exc}", key="tls.ciphers") \
                from None
    load_certificates(ctx, tls)
    ctx.verify_mode = _VERIFY[tls.client_certificates]
    return ctx


def load_certificates(ctx: ssl.SSLContext, tls: TlsConfig) -> None:
    """Load (or load again) the certificate chain, key and client CAs into ``ctx``."""
    for key, path in (("tls.cert_file", tls.cert_file), ("tls.key_file", tls.key_file),
                      ("tls.ca_file", tls.ca_file)):
        if path is not None:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise ConfigError(f"{key} = {path!r}: cannot read it: {exc.strerror}", key=key) from None
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file, password=tls.key_password)
    except ssl.SSLError as exc:
        raise ConfigError(f"tls.cert_file = {tls.cert_file!r} with tls.key_file = {tls.key_file!r}: not a "
                          f"PEM certificate and its matching private key ({exc.reason or exc})",
                          key="tls.cert_file") from None
    if tls.ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=tls.ca_file)
        except ssl.SSLError as exc:
            raise ConfigError(f"tls.ca_file = {tls.ca_file!r}: not PEM CA certificates "
                              f"({exc.reason or exc})", key="tls.ca_file") from None


def peer_subject(transport: Any) -> str | None:
    """The RFC 4514 subject of the verified certificate the peer presented, or None (no TLS, no
    certificate, or not verified: ``getpeercert()`` is empty unless the chain was checked)."""
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    return rfc4514(cert.get("subject", ()))


def rfc4514(subject: Any) -> str:
    """``ssl.getpeercert()['subject']`` as an RFC 4514 string: most specific RDN first
    (``CN=alice,O=Example``), as OpenSSL, cryptography and Java print it."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_SHORT.get(name, name)}={_escape(value)}" for name, value in rdn))
    return ",".join(rdns)


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (i == 0 and ch in "# ") or (i == len(value) - 1 and ch == " "):
            out.append("\\" + ch)
        elif ch == "\x00":
            out.append("\\00")
        else:
            out.append(ch)
    return "".join(out)
