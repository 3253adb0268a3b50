"""One error tree for pymq, with structured fields.

Everything raised on purpose derives from :class:`PymqError`.  Errors that travel on the wire carry a
code in the ERROR frame's ``pymq-code`` header; :data:`ERROR_CODES` maps each code to its class, and
:func:`error_from_headers` rebuilds the exception on the client side, so an application catches the
same class whether it talks to an embedded broker or a remote one.
"""
from __future__ import annotations

from collections.abc import Mapping


class PymqError(Exception):
    """Root of every pymq error."""

    code = "error"

    def __init__(self, message: str = "", **fields: object) -> None:
        super().__init__(message)
        self.message = message
        for key, value in fields.items():
            setattr(self, key, value)


# -- protocol: a peer (or we) broke STOMP -------------------------------------------------------------

class ProtocolError(PymqError):
    """The bytes or frames on a connection break the STOMP profile in spec/stomp.md."""

    code = "protocol"


class MalformedFrame(ProtocolError):
    code = "malformed-frame"


class BadEscape(MalformedFrame):
    code = "bad-escape"


class FrameTooLarge(ProtocolError):
    code = "frame-too-large"

    def __init__(self, message: str = "", size: int = 0, limit: int = 0) -> None:
        super().__init__(message or f"frame of {size} bytes exceeds the limit of {limit} bytes",
                         size=size, limit=limit)


class UnknownCommand(ProtocolError):
    code = "unknown-command"


class MissingHeader(ProtocolError):
    code = "missing-header"


class InvalidHeader(ProtocolError):
    code = "invalid-header"


class FrameTimeout(ProtocolError):
    """A frame was not completed in time: ``frame_timeout_ms`` after its first byte, plus one second per
    ``frame_min_rate`` bytes received of it (a peer trickling a frame cannot hold a connection open)."""

    code = "frame-timeout"


class UnsupportedVersion(ProtocolError):
    code = "unsupported-version"


# -- connection lifecycle ----------------------------------------------------------------------------

class ConnectionClosed(PymqError):
    """The connection is closed (by us, by the broker, or because the peer vanished)."""

    code = "connection-closed"


class ConnectFailed(PymqError):
    code = "connect-failed"


class ConnectionInterrupted(PymqError):
    """A failover connection lost its link while a call waited for the broker's answer, and the call
    cannot be replayed (a browse, a bulk SEND, an admin operation): whether the broker applied it is
    unknown.  The connection itself fails over; the call may be tried again (spec/ha.md §4)."""

    code = "connection-interrupted"


class TlsError(ConnectFailed):
    """The TLS handshake failed: the broker's certificate is not trusted or not for this host name, the
    broker wants a client certificate, or the two ends share no protocol version or cipher.
    ``reason`` is OpenSSL's short reason (``CERTIFICATE_VERIFY_FAILED``), ``verify_message`` the
    certificate check's own words when that is what failed."""

    code = "tls"


class HeartbeatTimeout(ConnectionClosed):
    code = "heartbeat-timeout"


class AuthenticationFailed(PymqError):
    code = "authentication-failed"


class UnknownUser(PymqError):
    """An admin operation named a user the users file does not hold."""

    code = "unknown-user"


class AccessDenied(PymqError):
    """A user lacks a permission on a destination (user, destination and permission are named)."""

    code = "access-denied"


# -- broker-side refusals ----------------------------------------------------------------------------

class DestinationError(PymqError):
    code = "invalid-destination"


class UnknownDestination(DestinationError):
    code = "unknown-destination"


class DestinationExists(DestinationError):
    code = "destination-exists"


class QueueFull(PymqError):
    code = "queue-full"


class SchemaViolation(PymqError):
    code = "schema-violation"


class InvalidSelector(PymqError):
    """A selector or storage rule does not parse: ``position`` is the 0-based offset, ``expected`` says what."""

    code = "invalid-selector"

    def __init__(self, message: str = "", position: int = -1, expected: str = "") -> None:
        super().__init__(message, position=position, expected=expected)


class UnknownSubscription(ProtocolError):
    code = "unknown-subscription"


class UnknownMessage(ProtocolError):
    code = "unknown-message"


class TransactionError(PymqError):
    code = "transaction"


class TransactionRolledBack(TransactionError):
    """``commit()`` rolled the transaction back instead (JMS ``TransactionRolledBackException``): the
    connection failed over while it was open, and the broker rolled back what it had done (spec/ha.md §4.5).
    What it received comes back redelivered; the next transaction starts clean."""

    code = "transaction-rolled-back"


class TransactionInDoubt(TransactionError):
    """The connection was lost after COMMIT was written and before its receipt (JMS
    ``TransactionInDoubtException``): the broker applied the whole transaction or none of it, and the SDK
    cannot know which; COMMIT is never sent again (spec/ha.md §4.5)."""

    code = "transaction-in-doubt"


class ResourceLimit(PymqError):
    code = "resource-limit"


class StorageError(PymqError):
    code = "storage"


class ClusterError(PymqError):
    code = "cluster"


class ConfigError(PymqError):
    code = "config"


class ListenError(PymqError):
    """The broker cannot listen where it is configured to: ``listener`` names which (STOMP, STOMP over
    TLS, WebSocket, admin), ``host`` and ``port`` where."""

    code = "listen"


class DataLoss(PymqError):
    """A replay asked for messages the broker no longer holds (retention dropped them, or others consumed
    them): the Spark connector's ``failOnDataLoss``."""

    code = "data-loss"


# -- client-side misuse ------------------------------------------------------------------------------

class IllegalStateError(PymqError):
    """An object was used after close, or a single-threaded object (Session) from two threads at once."""

    code = "illegal-state"


class MessageFormatError(PymqError):
    """A property or body value of the wrong type, or a message that cannot be decoded."""

    code = "message-format"


class TimeoutError(PymqError):  # noqa: A001 - deliberately our own, also catchable as PymqError
    code = "timeout"


def _all_subclasses(cls: type[PymqError]) -> list[type[PymqError]]:
    out: list[type[PymqError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


#: wire code -> exception class; the single registry both ends use.
_ALL: list[type[PymqError]] = [PymqError, *_all_subclasses(PymqError)]
ERROR_CODES: dict[str, type[PymqError]] = {c.code: c for c in _ALL}


def error_from_headers(headers: Mapping[str, str], body: str = "") -> PymqError:
    """Rebuild the exception an ERROR frame describes (unknown codes become a plain PymqError)."""
    cls = ERROR_CODES.get(headers.get("pymq-code", ""), PymqError)
    message = headers.get("message", "") or body.strip() or "broker error"
    err = cls.__new__(cls)
    PymqError.__init__(err, message)
    for key, value in headers.items():
        if key.startswith("pymq-field-"):
            setattr(err, key[len("pymq-field-"):].replace("-", "_"), value)
    return err


def error_headers(err: PymqError) -> dict[str, str]:
    """Headers that describe ``err`` in an ERROR frame (the inverse of :func:`error_from_headers`)."""
    headers = {"message": _header_text(err.message or str(err)), "pymq-code": err.code}
    for key, value in vars(err).items():
        if key != "message" and isinstance(value, (str, int, float)):
            headers["pymq-field-" + key.replace("_", "-")] = _header_text(str(value))
    return headers


def _header_text(text: str) -> str:
    # a header cannot carry NUL (STOMP has no escape for it): a message that quotes a peer's text (a column
    # name of a bulk SEND, a header value) would otherwise make the ERROR frame itself malformed
    return text.replace("\0", "\ufffd") if "\0" in text else text
