"""The client core under both SDKs: everything a connection, session, producer and consumer *know*,
with no socket and no waiting (asyncpg's protocol core, h11's shape).

The blocking SDK (:mod:`pymq.client.blocking`) and the asyncio SDK (:mod:`pymq.aio.client`) subclass
these classes and add only how they wait: threads and ``threading.Event`` there, futures and tasks
here.  What lives in the core, once:

* the connection's status (:class:`ConnectionStatus`), its CONNECT headers, the receipt registry
  (receipt id -> a shell's :class:`Waiter`), the subscription registry (subscription id -> consumer,
  browse or admin inbox) and the routing of every frame that arrives;
* per session the acknowledge mode's :class:`AckLedger` (what the session owes the broker for the
  messages the application got), the transaction id, and the frames of ``acknowledge``, ``commit``,
  ``rollback`` and ``recover``;
* per consumer the buffer of delivered messages, MESSAGE -> :class:`~pymq.message.Message`, and the
  SUBSCRIBE frame; per producer its defaults and the SEND frame (:mod:`pymq.client.frames`).

The core may hand a frame to the shell's ``_send`` (which never waits) but never waits itself: a
method that must wait for the broker returns the frames and the shell sends the last one with a
receipt.

Order after ``recover()``/``rollback()`` (JMS: redelivered messages come first, in their original
order).  The session returns the messages the application got with NACKs and asks for a receipt.  The
broker puts them back in front of its queue and redelivers them at once (at the latest right after that
receipt, so when some are still missing a second receipt-bearing round trip follows); until then their
copies (known by message id) are held aside (:class:`_Recovery`), then put in front of what each
consumer had already prefetched.  Prefetched messages the application never saw stay where they are and
are not returned, so their delivery count does not grow.  A message the broker dead-letters, delays
(redelivery delay) or gives to another consumer is not waited for.
"""
from __future__ import annotations

import enum
import itertools
import ssl
import threading
import time
import uuid
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol
from collections.abc import Callable

from pymq import enums
from pymq.client._failover import RESUBSCRIPTION, Failover
from pymq.client.frames import ARROW_STREAM, checked_selector, send_frame, subscribe_headers
from pymq.client.url import Address, BrokerGroup, StompAddress, TlsOptions, VmAddress, parse_group, redacted
from pymq.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic, as_destination
from pymq.errors import (ConnectFailed, ConnectionClosed, ConnectionInterrupted, DestinationError, IllegalStateError,
                         PymqError, error_from_headers)
from pymq.message import (PERSISTENT, BytesMessage, MapMessage, MapValue, Message, MessageBody,
                          PropertyValue, TextMessage, from_frame, make_message)
from pymq.protocol.frame import Frame
from pymq.protocol.numbers import header_int

Headers = dict[str, str]


def error_of(frame: Frame) -> PymqError:
    """The exception an ERROR frame describes (``receipt_id`` set when it answers a request of ours)."""
    error = error_from_headers(frame.headers, frame.body.decode("utf-8", "replace"))
    rid = frame.headers.get("receipt-id")
    if rid is not None:
        setattr(error, "receipt_id", rid)      # noqa: B010 - a field of this error only (spec/ha.md §4.3)
    return error


class AckMode(enum.IntEnum):
    """JMS acknowledge modes (the JMS constants' values)."""

    SESSION_TRANSACTED = 0
    AUTO_ACKNOWLEDGE = 1
    CLIENT_ACKNOWLEDGE = 2
    DUPS_OK_ACKNOWLEDGE = 3


SESSION_TRANSACTED = AckMode.SESSION_TRANSACTED
AUTO_ACKNOWLEDGE = AckMode.AUTO_ACKNOWLEDGE
CLIENT_ACKNOWLEDGE = AckMode.CLIENT_ACKNOWLEDGE
DUPS_OK_ACKNOWLEDGE = AckMode.DUPS_OK_ACKNOWLEDGE


def ack_mode_of(value: int) -> AckMode:
    """``value`` as an acknowledge mode, or IllegalStateError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise IllegalStateError(f"an acknowledge mode is one of pymq.AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, "
                                f"DUPS_OK_ACKNOWLEDGE or SESSION_TRANSACTED, not {value!r}")
    try:
        return AckMode(value)
    except ValueError:
        raise IllegalStateError(f"unknown acknowledge mode {value!r}") from None


def session_mode(transacted: bool | int | None, ack_mode: int | None) -> AckMode:
    """What ``create_session(transacted, ack_mode)`` means, read as JMS 2.0 reads its two forms:

    * ``create_session(mode)`` — JMS ``createSession(int sessionMode)``: the first argument is one of the
      constants (``pymq.CLIENT_ACKNOWLEDGE``, ``pymq.SESSION_TRANSACTED``...);
    * ``create_session(transacted, ack_mode)`` — JMS ``createSession(boolean, int)``: a bool, then the
      mode (ignored when transacted, as JMS says);
    * ``create_session(ack_mode=mode)``, and ``create_session()`` for AUTO_ACKNOWLEDGE.

    Refused (IllegalStateError, nothing created): a mode given twice with different values, a
    non-transacted session asked for SESSION_TRANSACTED, and anything that is neither a bool nor a mode."""
    if transacted is None:
        return AckMode.AUTO_ACKNOWLEDGE if ack_mode is None else ack_mode_of(ack_mode)
    if isinstance(transacted, bool):
        if transacted:
            return AckMode.SESSION_TRANSACTED
        mode = AckMode.AUTO_ACKNOWLEDGE if ack_mode is None else ack_mode_of(ack_mode)
        if mode is AckMode.SESSION_TRANSACTED and ack_mode is not None:
            raise IllegalStateError("create_session(False, SESSION_TRANSACTED) asks for a session that is both "
                                    "not transacted and transacted: pass True, or another acknowledge mode")
        return mode
    first = ack_mode_of(transacted)        # JMS createSession(int sessionMode)
    if ack_mode is not None and ack_mode_of(ack_mode) is not first:
        raise IllegalStateError(f"create_session({first.name}, {AckMode(ack_mode).name}) names two different "
                                f"session modes: pass one")
    return first


class ConnectionStatus(enums.Enum):
    """CONNECTING -> OPEN -> CLOSING -> CLOSED, or straight to CLOSED when the broker is lost; with
    failover (spec/ha.md §4) OPEN -> RECONNECTING -> OPEN while another broker of the group is reached.
    OPEN accepts new work; frames still flow while CLOSING (sessions flush their acks); while
    RECONNECTING calls wait for the next link (or keep what they send for it)."""

    CONNECTING = "connecting"
    OPEN = "open"
    RECONNECTING = "reconnecting"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True)
class TransportEvent:
    """What a failover connection's transport listener hears (ActiveMQ's ``TransportListener``):
    ``interrupted`` when a link is lost (``error`` says why) and ``resumed`` when the next one is in use,
    subscriptions and sends restored (``attempts`` it took).  ``broker`` is the broker lost or reached.
    ``temporaries`` (on ``resumed``): this connection's temporary queues and topics the lost links held at
    the broker (subscribed to, or named in a ``reply-to``) whose global names the new link could not take
    back (spec/ha.md §4.7: the broker refused the re-claim, e.g. past ``temporary_reclaim_ms``, or a broker
    that does not re-claim).  Each is made again, empty, under a new global name (at once for one with a
    consumer, else when next named), so a reply sent to the old name is lost.  Empty when the names were
    re-claimed: replies to them reach the new link (on the same broker with what the queues held and what
    was sent meanwhile; after a takeover without: temporary destinations are never persistent)."""

    kind: str
    broker: str
    error: PymqError | None = None
    attempts: int = 0
    temporaries: tuple[Destination, ...] = ()


class Waiter(Protocol):
    """A shell's way to wait for one receipt (an Event for threads, a future for asyncio)."""

    def resolve(self, headers: Headers) -> None: ...

    def fail(self, error: PymqError) -> None: ...


class Receiver(Protocol):
    """What a subscription id routes MESSAGE frames to (consumer, browse, admin inbox)."""

    def _arrived(self, frame: Frame) -> None: ...

    def _wake(self) -> None: ...

    def _interrupted(self) -> None:
        """Failover lost the link: what arrived on it is forgotten (it comes again, redelivered)."""

    def _resubscription(self) -> Frame | None:
        """The SUBSCRIBE that makes this receiver live on a new link (None: it cannot be replayed)."""


# -- connection settings ------------------------------------------------------------------------------

class ConnectionSettings:
    """What both SDKs' connection factories hold: the URL (read at once, so a bad one fails here) and
    the connection's options.  Explicit ``username``/``password``/``tls`` win over the URL's, for every
    broker of a failover group (spec/ha.md §4.1); ``address`` is the first broker of the group."""

    def __init__(self, url: str = "vm://default", *, username: str | None = None,
                 password: str | None = None, client_id: str | None = None, timeout: float = 10.0,
                 heartbeat: tuple[int, int] = (10_000, 10_000), prefetch: int = 1000,
                 sync_send: bool = True, host: str | None = None,
                 tls: TlsOptions | ssl.SSLContext | None = None, vhost: str | None = None,
                 coalesce_acks: bool = True) -> None:
        self.url = url
        self.group: BrokerGroup = parse_group(url)
        self.address: Address = self.group.brokers[0]
        self._username, self._password = username, password
        self.username = username if username is not None else self.address.username
        self.password = password if password is not None else self.address.password
        self.client_id = client_id
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.prefetch = prefetch
        self.sync_send = sync_send
        #: AUTO_ACKNOWLEDGE coalesces its ACKs (spec/stomp.md §5: at most AUTO_ACK_BATCH messages or
        #: AUTO_ACK_HOLD_S later, flushed before the session sends or waits); False: one ACK per message
        #: as it is taken (ActiveMQ's optimizeAcknowledge off)
        self.coalesce_acks = coalesce_acks
        self.host = host
        #: the connection's own virtual host setting (spec/stomp.md §1): a member of the URL without a path
        #: is connected to it (:meth:`_vhost_at`); None: the broker's default vhost
        self.vhost = (vhost.strip("/") or None) if vhost else None
        if tls is not None and not isinstance(tls, (TlsOptions, ssl.SSLContext)):
            raise ConnectFailed(f"tls= must be a pymq.TlsOptions or an ssl.SSLContext, not {type(tls).__name__}")
        if tls is not None and not any(isinstance(a, StompAddress) and a.tls is not None for a in self.group.brokers):
            raise ConnectFailed(f"tls= was given for {redacted(url)}, which is not a TLS URL; use stomps://host:port")
        self.tls = tls

    def _credentials(self, username: str | None, password: str | None,
                     address: Address | None = None) -> tuple[str | None, str | None]:
        """The login for ``address`` (the first broker by default): what ``create_connection`` was given,
        else the factory's arguments, else that broker's URL."""
        where = address or self.address
        return (username if username is not None else self._username if self._username is not None
                else where.username,
                password if password is not None else self._password if self._password is not None
                else where.password)

    def _ssl_context(self, address: Address | None = None) -> ssl.SSLContext | None:
        """The SSL context for a TLS broker (None for plain TCP and vm://)."""
        where = address or self.address
        if not isinstance(where, StompAddress) or where.tls is None:
            return None
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        return where.tls.merged(self.tls).context()

    def _server_hostname(self, address: Address | None = None) -> str | None:
        where = address or self.address
        if not isinstance(where, StompAddress) or where.tls is None:
            return None
        explicit = self.tls.server_hostname if isinstance(self.tls, TlsOptions) else None
        return explicit or where.tls.server_hostname or where.host

    def _vhost_at(self, address: Address | None = None) -> str | None:
        """The virtual host a link to ``address`` (the first broker by default) enters (spec/stomp.md §1,
        vectors in spec/vectors/failover_urls.json "vhosts"): its URL's own path, else the ``vhost``
        setting, else None (the broker's default vhost ``/``)."""
        where = address or self.address
        return (where.vhost if isinstance(where, StompAddress) else None) or self.vhost

    @property
    def vm(self) -> VmAddress | None:
        """The ``vm://`` address this factory connects to, or None for a network URL."""
        return self.address if isinstance(self.address, VmAddress) else None


# -- connection ---------------------------------------------------------------------------------------

class ConnectionCore:
    """A connection's state and frame routing; the shell owns the transport and the waiting."""

    def __init__(self, factory: ConnectionSettings) -> None:
        self.factory = factory
        self.status = ConnectionStatus.CONNECTING
        self.version = "1.2"
        self.server = ""
        self.apptx_table_prefix: str | None = None
        self.client_id = factory.client_id
        self.user: str | None = None
        self._error: PymqError | None = None
        self._receipts: dict[str, Waiter] = {}
        self._receipt_ids = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._subscriptions: dict[str, Receiver] = {}
        self._sessions: list[SessionCore] = []
        #: STOMP names of the temporary destinations this connection deleted (JMS: unusable afterwards)
        self._deleted: set[str] = set()
        #: failover (spec/ha.md §4, pymq/client/_failover.py): None for a single broker
        self._failover: Failover | None = Failover(factory.group) if factory.group.failover else None
        #: the number of the link in use (links are numbered from 0); a frame that names something of a
        #: link (an ACK's ack id, a transaction) is sent on that link only.  Ordering, for threads: a
        #: failover replaces every consumer's buffer and then counts the next link (:meth:`_interrupt`);
        #: a receiver reads the link and then the buffer, so a frame it takes from an old buffer is never
        #: acknowledged on a new link (at worst a new frame's ACK is dropped and it comes again)
        self._link = 0
        #: what a reconnection and the application's threads must not interleave (the blocking shell's
        #: re-entrant lock; nothing in the asyncio shell, where they cannot)
        self._link_lock: AbstractContextManager[object] = nullcontext()
        self.transport_listener: Callable[[TransportEvent], object] | None = None
        #: failover: the temporary destinations this link made at the broker (STOMP name -> destination),
        #: and those of the links lost since the last ``resumed`` (:class:`TransportEvent`); at most the
        #: broker's max_temporary_destinations_per_connection each
        self._temporaries: dict[str, Destination] = {}
        self._temporaries_lost: dict[str, Destination] = {}
        #: failover: the token the broker's CONNECTED gave (``pymq-reclaim-token``), offered by the next link's
        #: CONNECT so that its temporaries keep their global names (spec/ha.md §4.7); secret: never logged
        self._reclaim_token: str | None = None
        #: a link since the last ``resumed`` got new global names (its re-claim was refused)
        self._names_lost = False

    # -- what the shell provides -------------------------------------------------------------------
    def _send(self, frame: Frame) -> None:
        """Hand ``frame`` to the transport (never waits).  With failover, while the link is down, a frame
        is kept for the next link or dropped as :meth:`Failover.while_down` says."""
        raise NotImplementedError

    def _send_on(self, frame: Frame, link: int) -> None:
        """Send ``frame`` on link ``link`` only: it names something of that link (an ack id, a
        transaction), so on any other it is dropped (spec/ha.md §4.5)."""
        raise NotImplementedError

    def _window_freed(self) -> None:
        """A receipt made room in the failover window of SENDs (the transport's thread: never waits)."""

    def _acks_held(self, consumer: ConsumerCore, delay: float) -> None:
        """AUTO_ACKNOWLEDGE began holding back an ACK of ``consumer``: the shell calls
        ``consumer._flush_held_ack()`` ``delay`` seconds from now (its loop's timer, or a timer thread),
        so an acknowledgement is never held longer, whatever the application does next."""

    # -- status ------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once the connection is closed (deliberately or because it was lost)."""
        return self.status is ConnectionStatus.CLOSED

    @property
    def error(self) -> PymqError | None:
        """Why the connection failed (None while it is open, or after a deliberate close)."""
        return self._error

    def _check_open(self) -> None:
        """Frames may flow (also while CLOSING)."""
        if self._error is not None:
            raise ConnectionClosed(f"the connection failed: {self._error}") from self._error
        if self.status is ConnectionStatus.CLOSED:
            raise IllegalStateError("the connection is closed")

    def _check_usable(self) -> None:
        """The application may start new work (also while a failover reconnects: it waits or is kept
        for the next link)."""
        self._check_open()
        if self.status is not ConnectionStatus.OPEN and self.status is not ConnectionStatus.RECONNECTING:
            raise IllegalStateError(f"the connection is {self.status.value}")

    def _connect_headers(self, username: str | None, password: str | None,
                         address: Address | None = None) -> Headers:
        vhost = self.factory._vhost_at(address)
        headers = {"accept-version": "1.0,1.1,1.2",
                   "host": "/" + vhost if vhost else self.factory.host or "/"}
        if username is not None:
            headers["login"] = username
        if password is not None:
            headers["passcode"] = password
        if self.factory.client_id:
            headers["client-id"] = self.factory.client_id
        if self._failover is not None and self._reclaim_token:
            headers["pymq-reclaim"] = self._reclaim_token
        return headers

    def _opened(self, connected: Frame, version: str, username: str | None) -> None:
        self.version = version
        self.server = connected.headers.get("server", "")
        self.user = connected.headers.get("user-name", username)
        #: the table prefix of the broker's SQL device that claims app-transaction rows (spec/storage.md
        #: "SQL device"): ``producer.send(..., transaction=conn)`` writes its pending row there
        self.apptx_table_prefix = connected.headers.get("pymq-apptx-table-prefix") or None
        self._reclaim_token = connected.headers.get("pymq-reclaim-token") or None
        if self.status is ConnectionStatus.CONNECTING:   # not lost meanwhile
            self.status = ConnectionStatus.OPEN

    def _lost(self, error: PymqError) -> bool:
        """The transport ended: fail every receipt, wake every waiter.  True when it was not our own
        close (then the exception listener hears of it)."""
        expected = self.status in (ConnectionStatus.CLOSING, ConnectionStatus.CLOSED)
        if not expected:
            self._error = error
        # the status changes before the receipts are taken: a receipt registered after the swap
        # sees CLOSED when it sends (see _expect)
        self.status = ConnectionStatus.CLOSED
        receipts, self._receipts = self._receipts, {}
        failure = error if not expected else ConnectionClosed("the connection was closed")
        for waiter in receipts.values():
            waiter.fail(failure)
        for receiver in list(self._subscriptions.values()):
            receiver._wake()
        for session in list(self._sessions):
            session._wake()
        return not expected

    def _delete_temporary(self, destination: Destination) -> None:
        """JMS ``TemporaryQueue.delete()``: refused while one of this connection's consumers reads it;
        otherwise UNSUBSCRIBE with ``pymq-delete-temporary`` (spec/stomp.md §3), which needs no answer:
        the broker applies it before anything this connection sends later."""
        self._check_open()
        name = destination.stomp_name
        readers = sum(1 for session in self._sessions for consumer in session._consumers
                      if not consumer._closed and consumer.destination.stomp_name == name)
        if readers:
            raise IllegalStateError(f"{name} has {readers} open consumer(s) on this connection: close them "
                                    f"before deleting it (JMS)")
        self._send(Frame("UNSUBSCRIBE", {"id": "pymq-delete-temporary", "pymq-delete-temporary": name}))
        self._deleted.add(name)
        self._temporaries.pop(name, None)

    def _made_temporary(self, name: str) -> None:
        """Failover: this link made (or used) the connection's own temporary destination ``name`` (a
        ``/temp-queue/`` or ``/temp-topic/`` name local to the connection, not another's ``tmp.`` one)."""
        if self._failover is None or not name.startswith(("/temp-queue/", "/temp-topic/")):
            return
        if name.partition("/")[2].partition("/")[2].startswith("tmp.") or name in self._temporaries:
            return
        self._temporaries[name] = as_destination(name)

    def _relinked(self, connected: Frame) -> None:
        """A failover link is connected (``connected``: its CONNECTED): did it take back the global names of
        the lost link's temporaries (``pymq-reclaimed``), and the token for the next one."""
        if connected.headers.get("pymq-reclaimed") != "true":
            self._names_lost = True
        self._reclaim_token = connected.headers.get("pymq-reclaim-token") or None

    def _temporaries_resumed(self) -> tuple[Destination, ...]:
        """The temporaries the links lost since the last ``resumed`` held and that have new global names now
        (none when every link since re-claimed the names); the others are the new link's again."""
        lost, self._temporaries_lost = self._temporaries_lost, {}
        if not self._names_lost:
            for name, destination in lost.items():
                self._temporaries.setdefault(name, destination)
            return ()
        self._names_lost = False
        return tuple(lost.values())

    def _check_not_deleted(self, destination: Destination | str) -> None:
        name = destination if isinstance(destination, str) else destination.stomp_name
        if name in self._deleted:
            raise DestinationError(f"temporary destination {name} was deleted", destination=name)

    # -- failover ------------------------------------------------------------------------------------
    def _kept(self, frame: Frame, failed: bool = False, link: int | None = None) -> bool:
        """The link is down (RECONNECTING, or ``failed``: the transport refused ``frame``): True when
        failover took ``frame`` (kept for the next link, or dropped as belonging to the lost one).
        ``link``: the link ``frame`` belongs to (:meth:`_send_on`)."""
        failover = self._failover
        if failover is None:
            return False
        with self._link_lock:
            status = self.status
            if status in (ConnectionStatus.CLOSING, ConnectionStatus.CLOSED):
                return False
            if status is not ConnectionStatus.RECONNECTING and not failed:
                return False                  # the next link is up meanwhile: send it there
            if link is not None and (failed or link != self._link):
                return True                   # it belongs to a link that is gone (or going): dropped
            failover.while_down(frame, link)
            return True

    def _interrupt(self) -> None:
        """A failover link is lost: from now on nothing of it is acknowledged, and what it delivered and
        nobody took yet is forgotten (the broker redelivers it)."""
        with self._link_lock:
            self.status = ConnectionStatus.RECONNECTING
            for receiver in list(self._subscriptions.values()):
                receiver._interrupted()
            for session in list(self._sessions):
                session._recovery = None
            self._link += 1
            self._temporaries_lost.update(self._temporaries)
            self._temporaries = {}

    def _replay(self) -> list[Frame]:
        """What a new link is told before it is used (spec/ha.md §4.3-4.5), in order: every live
        subscription again under its id, a BEGIN for each open transaction, the receipted frames of the
        lost link that go again (SENDs with their dedup ids), and what was kept meanwhile.  The callers of
        the other receipted frames are answered here.  Run with the link lock held."""
        failover = self._failover
        assert failover is not None
        live: dict[str, Frame] = {}
        for sub_id, receiver in self._subscriptions.items():
            again = receiver._resubscription()
            if again is not None:
                self._made_temporary(again.headers.get("destination", ""))
                # with a receipt nobody waits for: a refusal then names it (see _failover.is_final)
                live[sub_id] = Frame(again.command, {**again.headers,
                                                     "receipt": f"{RESUBSCRIPTION}{self._link}:{sub_id}"})
        resend: list[Frame] = []
        ended: set[str] = set()                 # transactions whose COMMIT the loss cut off
        for rid, frame in list(failover.inflight.items()):
            outcome = failover.outcome(frame, set(live))
            if outcome == "resend":
                if frame.command == "SUBSCRIBE":
                    live[frame.headers["id"]] = frame       # its caller waits for this receipt
                else:
                    resend.append(frame)
                continue
            if frame.command == "COMMIT":
                ended.add(frame.headers.get("transaction", ""))
            failover.answered(rid)
            waiter = self._receipts.pop(rid, None)
            if waiter is not None:
                if outcome == "resolve":
                    waiter.resolve({})
                else:
                    waiter.fail(failover.failure(frame, rid))
        failover.unsent.clear()
        frames = list(live.values())
        begun: set[str] = set()
        for session in self._sessions:
            tx = session._tx
            if session.transacted and not session._closed and tx is not None and tx not in ended:
                if session._tx_begun_link != self._link:
                    frames.append(Frame("BEGIN", {"transaction": tx}))
                    session._tx_begun_link = self._link
                begun.add(tx)
        frames.extend(resend)
        failover.resent += sum(1 for frame in resend if frame.command == "SEND")
        for frame, link in failover.held:
            tx = frame.headers.get("transaction")
            if (link is None or link == self._link) and (tx is None or tx in begun):
                frames.append(frame)
        failover.held.clear()
        return frames

    # -- receipts and subscriptions ------------------------------------------------------------------
    def _expect(self, frame: Frame, waiter: Waiter, windowed: bool = False) -> tuple[str, Frame]:
        """Register ``waiter`` for a receipt and return ``frame`` asking for it.  The shell must send
        it through ``_send`` (which checks the status after the registration) or ``_forget`` it."""
        rid = f"r{next(self._receipt_ids)}"
        self._receipts[rid] = waiter
        headers = dict(frame.headers)
        headers["receipt"] = rid
        framed = Frame(frame.command, headers, frame.body)
        if self._failover is not None:
            self._failover.sent(rid, framed, windowed)
        return rid, framed

    def _forget(self, rid: str) -> None:
        self._receipts.pop(rid, None)
        if self._failover is not None:
            self._failover.answered(rid)

    def _register(self, receiver: Receiver) -> str:
        sub_id = f"s{next(self._sub_ids)}"
        self._subscriptions[sub_id] = receiver
        return sub_id

    def _unregister(self, sub_id: str) -> None:
        self._subscriptions.pop(sub_id, None)

    def _frame_received(self, frame: Frame) -> None:
        """Route one frame from the transport (its thread or callback: never waits)."""
        command = frame.command
        if command == "MESSAGE":
            receiver = self._subscriptions.get(frame.headers.get("subscription", ""))
            if receiver is not None:
                receiver._arrived(frame)
        elif command == "RECEIPT":
            receipt = frame.headers.get("receipt-id", "")
            waiter = self._receipts.pop(receipt, None)
            if waiter is not None:
                waiter.resolve(frame.headers)
            if self._failover is not None and self._failover.answered(receipt):
                self._window_freed()
        elif command == "ERROR":
            rid = frame.headers.get("receipt-id")
            if rid is not None:
                waiter = self._receipts.pop(rid, None)
                if waiter is not None:
                    waiter.fail(error_of(frame))


# -- acknowledgement ledgers ------------------------------------------------------------------------------

class Delivery(NamedTuple):
    """One message the application got: who delivered it, the headers that name it in ACK/NACK, and the
    link it came on (an ACK or NACK goes on that link only: :meth:`ConnectionCore._send_on`)."""

    consumer: ConsumerCore
    ack: Headers
    message_id: str
    link: int = 0


#: an ACK or NACK and the link it belongs to
Bound = tuple[Frame, int]


class AckLedger:
    """What a session owes the broker for delivered messages; one subclass per acknowledge mode.  The
    frames it returns are bound to the link of the delivery they name."""

    #: subscribe with ``ack:client`` (cumulative ACK/NACK) instead of ``client-individual``
    cumulative = False
    #: a message given to a listener is recorded before the listener runs, so ``acknowledge()``,
    #: ``commit()``, ``recover()`` or ``rollback()`` called inside the listener include it
    records_before_listener = False

    def __init__(self) -> None:
        self._unacked: list[Delivery] = []

    def consumed(self, delivery: Delivery, tx: str | None) -> Frame | None:
        """The application got ``delivery``; the frame to send now (on ``delivery.link``), if any."""
        raise NotImplementedError

    def before_wait(self, consumer: ConsumerCore) -> Bound | None:
        """The consumer is about to wait for more: an acknowledgement held back, if any."""
        return None

    def acknowledge(self) -> list[Bound]:
        return []

    def failed(self, delivery: Delivery) -> list[Bound]:
        """A listener raised for ``delivery``."""
        return []

    def take_unacked(self) -> list[Delivery]:
        unacked, self._unacked = self._unacked, []
        return unacked

    def drop(self, consumer: ConsumerCore) -> Bound | None:
        """``consumer`` closes: the broker returns what it still holds, so forget its deliveries (an
        ACK or NACK naming them would be an error); the acknowledgement it held back, if any."""
        if self._unacked:
            self._unacked = [d for d in self._unacked if d.consumer is not consumer]
        return None


class _DupsOkLedger(AckLedger):
    """DUPS_OK_ACKNOWLEDGE: cumulative acks every ``prefetch // 4`` messages and before waiting."""

    cumulative = True

    def __init__(self) -> None:
        super().__init__()
        #: consumer -> (ack headers of the latest message taken, messages taken, link, first taken at)
        self._held: dict[ConsumerCore, tuple[Headers, int, int, float]] = {}

    def consumed(self, delivery: Delivery, tx: str | None) -> Frame | None:
        consumer = delivery.consumer
        held = self._held.get(consumer)
        count = 1 if held is None or held[2] != delivery.link else held[1] + 1
        if count >= max(1, consumer.prefetch // 4):
            self._held.pop(consumer, None)
            return Frame("ACK", delivery.ack)
        self._held[consumer] = (delivery.ack, count, delivery.link, 0.0)
        return None

    def before_wait(self, consumer: ConsumerCore) -> Bound | None:
        held = self._held.pop(consumer, None)
        return None if held is None else (Frame("ACK", held[0]), held[2])

    def failed(self, delivery: Delivery) -> list[Bound]:
        # NACK is cumulative here: first acknowledge what the listener processed before this one,
        # so only this message comes back
        held = self.before_wait(delivery.consumer)
        return ([held] if held is not None else []) + [(Frame("NACK", delivery.ack), delivery.link)]

    def drop(self, consumer: ConsumerCore) -> Bound | None:
        return self.before_wait(consumer)


#: AUTO_ACKNOWLEDGE: the most messages one held-back (cumulative) ACK covers, and how long after the
#: first of them it is sent at the latest (seconds; a later take, or the shell's timer)
AUTO_ACK_BATCH = 64
AUTO_ACK_HOLD_S = 0.1


class _AutoLedger(_DupsOkLedger):
    """AUTO_ACKNOWLEDGE: each message is acknowledged once ``receive`` returned it (or its listener
    returned), with acknowledgements coalesced (issue 30): the subscription is STOMP's cumulative
    ``client`` mode, and one ACK naming the latest message taken covers those taken before it.

    The ACK is sent at once whenever the consumer has nothing more buffered, so a consumer that keeps up
    acknowledges each message as it takes it, exactly as one ACK per message did, and nothing is held
    while the application waits.  While more is buffered (a burst the broker wrote in one go) the ACK is
    held until ``AUTO_ACK_BATCH`` messages are taken, or ``AUTO_ACK_HOLD_S`` after the first held one
    (the shell's timer: an application that takes one message and then works for an hour without
    calling ``receive`` still acknowledges it within that time, and a producer its queue blocked goes
    on), or the consumer waits or closes, or a listener raises (then the held ACK goes first and the
    NACK names only the failed message, which comes back).  A crash can therefore bring back the
    messages taken in the last ``AUTO_ACK_HOLD_S`` (at most ``AUTO_ACK_BATCH``, all of one burst), never
    an acknowledged one; a lost link drops the held ACK with the link, and its messages come again
    (spec/ha.md §4.5).  Cumulative acks are safe here because AUTO never reorders deliveries:
    ``recover()`` returns nothing of an AUTO session (the CLIENT ledger's note)."""

    #: False (the connection's ``coalesce_acks=False``): one ACK per message, sent as it is taken
    coalesce = True

    def consumed(self, delivery: Delivery, tx: str | None) -> Frame | None:
        return self.owe(delivery.consumer, delivery.ack, delivery.link)

    def owe(self, consumer: ConsumerCore, ack: Headers, link: int) -> Frame | None:
        """``consumer`` handed the application the message named by ``ack`` (of link ``link``): the
        ACK to send now, or None when it is held back (covered by a later cumulative one)."""
        if not consumer._buffer or not self.coalesce:   # acknowledge now (and what was held)
            if self._held:
                self._held.pop(consumer, None)
            return Frame("ACK", ack)
        held = self._held.get(consumer)
        now = time.monotonic()
        if held is None or held[2] != link:   # a held ACK of a lost link is dropped with it
            self._held[consumer] = (ack, 1, link, now)
            consumer._hold_started()
            return None
        if held[1] + 1 >= AUTO_ACK_BATCH or now - held[3] >= AUTO_ACK_HOLD_S:
            del self._held[consumer]
            return Frame("ACK", ack)
        self._held[consumer] = (ack, held[1] + 1, link, held[3])
        return None


class _ClientLedger(AckLedger):
    """CLIENT_ACKNOWLEDGE: ``acknowledge()`` acknowledges everything the session consumed, one ACK each.

    Not STOMP's cumulative ``client`` acks: after ``recover()`` the redelivered messages go in front of
    what was prefetched before them, so an ACK or NACK naming one would also cover prefetched messages
    the application never saw (acknowledging them unread, or returning them counted as a failed
    delivery, and leaving stale copies whose later ACK the broker calls unknown)."""

    records_before_listener = True

    def consumed(self, delivery: Delivery, tx: str | None) -> Frame | None:
        self._unacked.append(delivery)
        return None

    def acknowledge(self) -> list[Bound]:
        return [(Frame("ACK", d.ack), d.link) for d in self.take_unacked()]


class _TransactedLedger(AckLedger):
    """SESSION_TRANSACTED: each message is acknowledged inside the transaction, which COMMIT applies."""

    records_before_listener = True

    def consumed(self, delivery: Delivery, tx: str | None) -> Frame | None:
        self._unacked.append(delivery)
        headers = dict(delivery.ack)
        headers["transaction"] = tx or ""
        return Frame("ACK", headers)


LEDGERS: dict[AckMode, type[AckLedger]] = {
    AckMode.AUTO_ACKNOWLEDGE: _AutoLedger, AckMode.DUPS_OK_ACKNOWLEDGE: _DupsOkLedger,
    AckMode.CLIENT_ACKNOWLEDGE: _ClientLedger, AckMode.SESSION_TRANSACTED: _TransactedLedger,
}


class _Recovery:
    """Messages handed back by ``recover()``/``rollback()`` whose redelivered copies are held aside
    until the broker confirmed the NACKs, then go in front of each consumer's buffer."""

    __slots__ = ("returning", "held", "seen", "link")

    def __init__(self, returning: set[str], link: int) -> None:
        self.returning = returning
        self.held: dict[ConsumerCore, list[Frame]] = {}
        self.seen = 0
        self.link = link                       # its copies come on this link (a failover drops it)

    def holds(self, consumer: ConsumerCore, frame: Frame) -> bool:
        if frame.headers.get("message-id") in self.returning:
            self.held.setdefault(consumer, []).append(frame)
            self.seen += 1
            return True
        return False

    @property
    def complete(self) -> bool:
        """Every returned message came back (to this session; others may have taken some)."""
        return self.seen >= len(self.returning)


# -- session --------------------------------------------------------------------------------------------

class SessionCore:
    """A session's acknowledgement and transaction state, and its value factories."""

    def __init__(self, connection: ConnectionCore, ack_mode: int) -> None:
        self.connection = connection
        self.ack_mode = AckMode(ack_mode)
        self.transacted = self.ack_mode is AckMode.SESSION_TRANSACTED
        self._closed = False
        self._consumers: list[ConsumerCore] = []
        self._tx: str | None = None
        #: the link the current transaction's BEGIN was (or will be) sent on, and the links on which it
        #: did work: a transaction that did work on a lost link can only roll back (spec/ha.md §4.5)
        self._tx_begun_link = -1
        self._tx_links: set[int] = set()
        self._ledger: AckLedger = LEDGERS[self.ack_mode]()
        if isinstance(self._ledger, _AutoLedger):
            self._ledger.coalesce = connection.factory.coalesce_acks
        self._recovery: _Recovery | None = None

    # -- what the shell provides -------------------------------------------------------------------
    def _wake(self) -> None:
        """The connection ended or the session closed: wake the listener dispatcher."""

    # -- values (no connection needed) ----------------------------------------------------------------
    def create_topic(self, name: str) -> Topic:
        """A Topic value (topics need no creation: a topic exists while someone publishes or subscribes)."""
        return Topic(name)

    def create_temporary_queue(self) -> TemporaryQueue:
        """A queue that lives as long as this connection; only this connection consumes from it."""
        self._check()
        return TemporaryQueue(f"{uuid.uuid4().hex[:16]}", self.connection)

    def create_temporary_topic(self) -> TemporaryTopic:
        """A topic that lives as long as this connection (JMS ``TemporaryTopic``): anyone may publish to
        it (send it as a ``reply_to``), only this connection subscribes."""
        self._check()
        return TemporaryTopic(f"{uuid.uuid4().hex[:16]}", self.connection)

    def create_text_message(self, text: str = "", *, properties: dict[str, PropertyValue] | None = None,
                            correlation_id: str | None = None, reply_to: Destination | str | None = None,
                            type: str | None = None) -> TextMessage:  # noqa: A002 - the JMS name
        """A TextMessage (the JMS factory method; ``TextMessage(...)`` is the same)."""
        return TextMessage(text, properties=properties, correlation_id=correlation_id, reply_to=reply_to,
                           type=type)

    def create_bytes_message(self, data: bytes = b"", *, properties: dict[str, PropertyValue] | None = None,
                             correlation_id: str | None = None, reply_to: Destination | str | None = None,
                             type: str | None = None) -> BytesMessage:  # noqa: A002
        """A BytesMessage (the JMS factory method; ``BytesMessage(...)`` is the same)."""
        return BytesMessage(data, properties=properties, correlation_id=correlation_id, reply_to=reply_to,
                            type=type)

    def create_map_message(self, map: dict[str, MapValue] | None = None, *,  # noqa: A002
                           properties: dict[str, PropertyValue] | None = None,
                           correlation_id: str | None = None, reply_to: Destination | str | None = None,
                           type: str | None = None) -> MapMessage:  # noqa: A002
        """A MapMessage (the JMS factory method; ``MapMessage(...)`` is the same)."""
        return MapMessage(map, properties=properties, correlation_id=correlation_id, reply_to=reply_to,
                          type=type)

    def create_message(self, *, properties: dict[str, PropertyValue] | None = None,
                       correlation_id: str | None = None, reply_to: Destination | str | None = None,
                       type: str | None = None) -> Message:  # noqa: A002
        """A Message with no body, only headers and properties (the JMS factory method)."""
        return Message(properties=properties, correlation_id=correlation_id, reply_to=reply_to, type=type)

    # -- state -----------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once the session is closed (by ``close()``, or with its connection)."""
        return self._closed

    def _check(self) -> None:
        if self._closed:
            raise IllegalStateError("the session is closed")
        self.connection._check_open()

    def _begin(self) -> None:
        """Start the next transaction (BEGIN needs no answer: a refusal closes the connection)."""
        conn = self.connection
        with conn._link_lock:                 # the tx and the link of its BEGIN change together
            self._tx = f"tx-{uuid.uuid4().hex[:12]}"
            self._tx_links = set()
            self._tx_begun_link = link = conn._link
            conn._send_on(Frame("BEGIN", {"transaction": self._tx}), link)

    @property
    def _doomed(self) -> bool:
        """The transaction did work on a link that was lost: the broker rolled that back (failover)."""
        link = self.connection._link
        return any(done != link for done in self._tx_links)

    def _commit_frame(self) -> Frame:
        if not self.transacted:
            raise IllegalStateError("commit() needs a transacted session")
        self._ledger.take_unacked()
        return Frame("COMMIT", {"transaction": self._tx or ""})

    # -- acknowledgement -------------------------------------------------------------------------------
    def _consumed(self, delivery: Delivery) -> None:
        """The application got a message (from ``receive``, or its listener returned)."""
        frame = self._ledger.consumed(delivery, self._tx)
        if frame is not None:
            if self.transacted:
                self._tx_links.add(delivery.link)
            self.connection._send_on(frame, delivery.link)

    def _acknowledge_now(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge everything consumed (what ``Message.acknowledge()`` calls;
        ACKs need no answer, so this never waits).  What came on a lost link is not acknowledged: it
        comes again (spec/ha.md §4.5)."""
        self._check()
        for frame, link in self._ledger.acknowledge():
            self.connection._send_on(frame, link)

    def _flush_held_acks(self) -> None:
        """AUTO_ACKNOWLEDGE: send every ACK this session holds back, now (spec/stomp.md §5): before the
        session sends anything (a reply or a forward made after a message was processed never reaches the
        broker before that message's ACK), before a ``receive`` of the session waits, and on ``stop``,
        ``recover`` and ``close``.  DUPS_OK keeps its looser batching (it flushes only before its own
        consumer waits).  Nothing held: one dict test."""
        ledger = self._ledger
        if not isinstance(ledger, _AutoLedger) or not ledger._held:
            return
        for consumer in list(ledger._held):
            consumer._send_held_ack()

    def _listener_failed(self, delivery: Delivery) -> None:
        if self.connection.version == "1.0":
            return        # 1.0 has no NACK: the message returns when the subscription ends
        for frame, link in self._ledger.failed(delivery):
            self.connection._send_on(frame, link)

    def _recovery_frames(self, rollback: bool) -> tuple[list[Frame], int]:
        """The frames of ``recover()`` (NACKs) or ``rollback()`` (ABORT, NACKs, the next BEGIN), all of the
        link returned with them; the shell sends the last one with a receipt and then calls
        :meth:`_end_recovery`.  Deliveries of a lost link are not named: the loss returned them."""
        if rollback and not self.transacted:
            raise IllegalStateError("rollback() needs a transacted session")
        if not rollback and self.transacted:
            raise IllegalStateError("recover() is for non-transacted sessions; use rollback()")
        self._flush_held_acks()          # what AUTO took is acknowledged, so it does not come again
        conn = self.connection
        with conn._link_lock:
            link = conn._link
            unacked = [d for d in self._ledger.take_unacked() if d.link == link]
            frames: list[Frame] = []
            if rollback:
                frames.append(Frame("ABORT", {"transaction": self._tx or ""}))
            if unacked and conn.version != "1.0":
                if self._ledger.cumulative:
                    last: dict[ConsumerCore, Delivery] = {}
                    for delivery in unacked:
                        last[delivery.consumer] = delivery   # one cumulative NACK per subscription
                    frames.extend(Frame("NACK", d.ack) for d in last.values())
                else:
                    frames.extend(Frame("NACK", d.ack) for d in unacked)
                self._recovery = _Recovery({d.message_id for d in unacked}, link)
            if rollback:
                self._tx = f"tx-{uuid.uuid4().hex[:12]}"
                self._tx_links = set()
                self._tx_begun_link = link
                frames.append(Frame("BEGIN", {"transaction": self._tx}))
        return frames, link

    def _recovery_settle_frames(self) -> list[Frame]:
        """Frames for a second round trip when redelivered copies are still missing after the NACKs'
        receipt: a broker may write that receipt before it dispatches what the NACKs released (pymq
        dispatches at the end of each batch of frames it reads), but never before a later frame's
        receipt.  A throwaway transaction begun and aborted is a request with no other effect."""
        recovery = self._recovery
        if recovery is None or recovery.complete:
            return []
        tx = f"tx-settle-{uuid.uuid4().hex[:8]}"
        return [Frame("BEGIN", {"transaction": tx}), Frame("ABORT", {"transaction": tx})]

    def _end_recovery(self) -> None:
        """The broker confirmed (or the wait ended): redelivered copies held aside go first (unless
        the link was lost meanwhile: the new one delivers them anew)."""
        with self.connection._link_lock:
            recovery, self._recovery = self._recovery, None
            if recovery is None or recovery.link != self.connection._link:
                return
            for consumer, frames in recovery.held.items():
                consumer._buffer.extendleft(reversed(frames))
                for _ in frames:
                    consumer._notify()

    # -- consumers ---------------------------------------------------------------------------------------
    def _subscribe_frame(self, consumer: ConsumerCore, *, no_local: bool = False,
                         extra: Headers | None = None) -> Frame:
        """The consumer's SUBSCRIBE (kept on it: a failover subscribes again with it)."""
        if self.connection._deleted:
            self.connection._check_not_deleted(consumer.destination)
        consumer._subscription = Frame("SUBSCRIBE", subscribe_headers(
            consumer.destination, consumer._sub_id, self._ledger.cumulative, consumer.prefetch,
            selector=consumer.selector, no_local=no_local, extra=extra))
        self.connection._made_temporary(consumer._subscription.headers.get("destination", ""))
        return consumer._subscription

    def _forget_consumer(self, consumer: ConsumerCore) -> None:
        with consumer._ack_lock:
            bound = self._ledger.drop(consumer)
            if bound is not None and not self.connection.closed:
                try:
                    self.connection._send_on(*bound)
                except PymqError:
                    pass
        if consumer in self._consumers:
            self._consumers.remove(consumer)


#: SUBSCRIBE headers of an exclusive consumer (ActiveMQ's spelling, which every STOMP broker of that family reads)
EXCLUSIVE_HEADERS: Headers = {"activemq.exclusive": "true"}


def durable_headers(name: str) -> Headers:
    return {"durable-subscription-name": name}


def shared_headers(name: str) -> Headers:
    return {"shared-subscription-name": name}


def shared_durable_headers(name: str) -> Headers:
    return {"durable-subscription-name": name, "shared": "true"}


def unsubscribe_frame(name: str, shared: bool) -> Frame:
    headers = {"id": f"unsub-{uuid.uuid4().hex[:8]}", "pymq-durable-name": name}
    if shared:
        headers["shared"] = "true"
    return Frame("UNSUBSCRIBE", headers)


def durable_topic(topic: Topic | str) -> Topic:
    target = as_destination(topic)
    if not isinstance(target, Topic):
        raise IllegalStateError("durable subscriptions are made on topics")
    return target


# -- consumer -------------------------------------------------------------------------------------------

def received(message: Message) -> Message:
    """A delivered message as JMS shows it: ``JMSXDeliveryCount`` is a property on every delivery, 1 on
    the first (the broker sends the header only on redeliveries, spec/stomp.md §4; a redelivered one
    without it counts 2)."""
    props = message.properties
    if "JMSXDeliveryCount" not in props:
        if message.redelivered and message.delivery_count < 2:
            message.delivery_count = 2
        props["JMSXDeliveryCount"] = message.delivery_count
    return message


class ConsumerCore:
    """A subscription's buffer and MESSAGE -> Message; the shell adds ``receive`` and listeners."""

    def __init__(self, session: SessionCore, destination: Destination, selector: str | None,
                 prefetch: int) -> None:
        self._session = session
        self.destination = destination
        self.selector = selector
        self.prefetch = prefetch
        #: delivered by the broker, not yet given to the application (bounded by the broker's credit)
        self._buffer: deque[Frame] = deque()
        self._listener: Callable[[Message], object] | None = None
        #: a receive is waiting for the next arrival (set by the shell before it waits, so that an
        #: arrival into a buffer nobody waits on costs no wake-up call)
        self._waiting = False
        self._closed = False
        #: AUTO_ACKNOWLEDGE over STOMP 1.2, the JMS default: each message is acknowledged by its ack id
        #: when it is taken (coalesced: _AutoLedger.owe), with no delivery record (the hot path of receive)
        ledger = session._ledger
        self._auto_ledger = (ledger if isinstance(ledger, _AutoLedger) and session.connection.version == "1.2"
                             else None)
        #: taking a held-back ACK and sending it happen together (the timer of _flush_held_ack runs on
        #: another thread in the blocking shell): cumulative ACKs must reach the wire in order
        self._ack_lock = threading.Lock()
        self._ack_timer = False                   # a _flush_held_ack is scheduled
        self._subscription: Frame | None = None      # the SUBSCRIBE sent (a failover sends it again)
        self._sub_id = session.connection._register(self)

    # -- what the shell provides -------------------------------------------------------------------
    def _notify(self) -> None:
        """One more frame is in the buffer (transport thread or callback: never waits)."""
        raise NotImplementedError

    def _wake(self) -> None:
        """The consumer or its connection closed: wake a waiting ``receive``."""
        raise NotImplementedError

    # -- arrivals ------------------------------------------------------------------------------------
    def _arrived(self, frame: Frame) -> None:
        recovery = self._session._recovery
        if recovery is not None and recovery.holds(self, frame):
            return
        self._buffer.append(frame)
        if self._waiting or self._listener is not None:
            self._notify()

    def _interrupted(self) -> None:
        # a new buffer, not a cleared one: a receive that took the old one in hand keeps its frames,
        # whose acknowledgement the link check then drops (the ordering note at ConnectionCore._link)
        self._buffer = deque()

    def _resubscription(self) -> Frame | None:
        return None if self._closed else self._subscription

    @property
    def closed(self) -> bool:
        """True once the consumer is closed (by ``close()``, or with its session or connection)."""
        return self._closed

    @property
    def buffered(self) -> int:
        """Messages delivered by the broker and not yet given to the application."""
        return len(self._buffer)

    def _check_receive(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if self._listener is not None:
            raise IllegalStateError("receive() cannot be used on a consumer with a message listener")

    def _open(self, frame: Frame, link: int) -> tuple[Message, Delivery]:
        """MESSAGE -> the Message the application gets, and its delivery record (``link``: the link
        the frame came on, read before it was taken from the buffer)."""
        h = frame.headers
        message = received(from_frame(h, frame.body))
        session = self._session
        if session.connection.version == "1.2":
            ack = {"id": h.get("ack", "")}
        else:
            ack = {"message-id": h.get("message-id", ""), "subscription": self._sub_id}
        if session.ack_mode is AckMode.CLIENT_ACKNOWLEDGE:
            message._acknowledge = session._acknowledge_now
        return message, Delivery(self, ack, h.get("message-id", ""), link)

    def _take(self, frame: Frame, link: int) -> Message:
        """``receive`` returns the message of ``frame`` (of link ``link``): acknowledge it as the
        session's mode says."""
        auto = self._auto_ledger
        if auto is not None:
            h = frame.headers
            message = received(from_frame(h, frame.body))
            with self._ack_lock:
                ack = auto.owe(self, {"id": h.get("ack", "")}, link)
                if ack is not None:
                    self._session.connection._send_on(ack, link)
            return message
        message, delivery = self._open(frame, link)
        with self._ack_lock:
            self._session._consumed(delivery)
        return message

    def _hold_started(self) -> None:
        """The AUTO ledger began holding an ACK of this consumer: have it sent within AUTO_ACK_HOLD_S."""
        if not self._ack_timer:
            self._ack_timer = True
            self._session.connection._acks_held(self, AUTO_ACK_HOLD_S)

    def _flush_held_ack(self) -> None:
        """The shell's timer: send the ACK held back for this consumer, if any (AUTO_ACKNOWLEDGE)."""
        self._ack_timer = False
        self._send_held_ack()

    def _send_held_ack(self) -> None:
        """Send the ACK held back for this consumer, if any (AUTO_ACKNOWLEDGE)."""
        session = self._session
        with self._ack_lock:
            bound = session._ledger.before_wait(self)
            if bound is None or session.connection.closed:
                return
            try:
                session.connection._send_on(*bound)
            except PymqError:
                pass                                  # the connection is going: its messages come again

    def _for_listener(self, frame: Frame, link: int) -> tuple[Message, Delivery]:
        """The message of ``frame`` for a listener; CLIENT and transacted sessions record it first,
        so ``acknowledge()``/``commit()``/``recover()``/``rollback()`` inside the listener include it."""
        message, delivery = self._open(frame, link)
        if self._session._ledger.records_before_listener:
            self._session._consumed(delivery)
        return message, delivery

    def _listener_done(self, delivery: Delivery, failed: bool) -> None:
        """The listener returned (or raised).  AUTO/DUPS_OK: acknowledge, or return the message for
        redelivery; CLIENT/transacted (JMS): the message stays with the session's acknowledgement or
        transaction, and the next one is delivered."""
        session = self._session
        if session._ledger.records_before_listener:
            return
        with self._ack_lock:
            if failed:
                session._listener_failed(delivery)
            else:
                session._consumed(delivery)

    def _before_wait(self) -> None:
        """About to wait: let the broker refill credit held by batched (auto, dups-ok) acks; AUTO also
        sends what the session's other consumers hold (the application waits: nothing it did is pending)."""
        self._session._flush_held_acks()
        with self._ack_lock:
            bound = self._session._ledger.before_wait(self)
            if bound is not None:
                self._session.connection._send_on(*bound)

    def _closing(self) -> None:
        """Local bookkeeping of ``close()`` (the shell sends UNSUBSCRIBE)."""
        self._closed = True
        self._session._forget_consumer(self)
        self._wake()


# -- producer -------------------------------------------------------------------------------------------

class ProducerCore:
    """A producer's defaults; the shell adds ``send``."""

    def __init__(self, session: SessionCore, destination: Destination | None) -> None:
        self._session = session
        self.destination = destination
        self.delivery_mode = PERSISTENT
        self.priority = 4
        self.time_to_live = 0          # ms, 0 = forever
        self.delivery_delay = 0        # ms (JMS 2.0)
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once the producer is closed (by ``close()``, or with its session or connection)."""
        return self._closed

    def _check(self) -> None:
        if self._closed:
            raise IllegalStateError("the producer is closed")
        self._session._check()

    def _prepare(self, message: MessageBody, destination: Destination | str | None, *,
                 delivery_mode: int | None, priority: int | None, time_to_live: int | None,
                 delivery_delay: int | None) -> tuple[Message, Frame, SendMode]:
        """The Message, its SEND frame, and how to send it: ``receipt`` (wait for the broker's receipt),
        ``window`` (failover: ask for one and keep the frame until it comes, spec/ha.md §4.4) or
        ``plain``.  Checks that everything is open first; the connection's own check runs when the frame
        is sent.  With failover a SEND outside a transaction carries a ``pymq-dedup-id``."""
        session = self._session
        if self._closed or session._closed:
            self._check()
        session._flush_held_acks()       # the messages taken before this SEND are acknowledged first
        msg, frame = send_frame(self, message, destination, delivery_mode=delivery_mode, priority=priority,
                                time_to_live=time_to_live, delivery_delay=delivery_delay)
        conn = session.connection
        if conn._deleted:
            conn._check_not_deleted(frame.headers["destination"])
        if conn._failover is not None:
            conn._made_temporary(frame.headers.get("reply-to", ""))
            conn._made_temporary(frame.headers["destination"])
        if session.transacted:
            frame.headers["transaction"] = session._tx or ""
            session._tx_links.add(conn._link)
            return msg, frame, "plain"
        confirm = msg.delivery_mode == PERSISTENT and conn.factory.sync_send
        failover = conn._failover
        if failover is None:
            return msg, frame, "receipt" if confirm else "plain"
        frame = failover.stamp(frame)
        msg.dedup_id = frame.headers.get("pymq-dedup-id", msg.dedup_id)
        return msg, frame, "receipt" if confirm else "window"


SendMode = Literal["receipt", "window", "plain"]


# -- browsing and range reads -----------------------------------------------------------------------------

class RangeResult:
    """What a range read returned: the messages (with ``.sequence``) and the destination's bounds; with
    ``read_range(frames=True)``, the messages' ``(headers, body)`` pairs in ``frames`` instead; with
    ``read_range(arrow=True)`` and a broker that answered in Arrow, the answer's Arrow IPC stream in
    ``arrow`` (spec/spark.md §6; ``messages`` and ``frames`` are then empty)."""

    __slots__ = ("messages", "earliest", "latest", "next_seq", "frames", "arrow", "source")

    def __init__(self, messages: list[Message], earliest: int, latest: int, next_seq: int,
                 frames: list[tuple[Headers, bytes]] | None = None, arrow: bytes | None = None,
                 source: str | None = None) -> None:
        self.messages = messages
        self.earliest = earliest      # first sequence number still available
        self.latest = latest          # last sequence number the destination assigned
        self.next_seq = next_seq      # where the next read continues
        self.frames: list[tuple[Headers, bytes]] = frames if frames is not None else []
        self.arrow = arrow
        self.source = source          # "log", "queue" or "none" (nothing to read there); None: not said

    def __repr__(self) -> str:
        return (f"RangeResult({len(self.messages) or len(self.frames)} messages, earliest={self.earliest}, "
                f"latest={self.latest}, next_seq={self.next_seq})")


class BrowseCore:
    """One browse subscription's frames (spec/stomp.md §4 ``browser:true``, §9 ranges).  It unregisters
    itself at the broker's ``browser:end``, so an abandoned browse leaves nothing registered."""

    def __init__(self, connection: ConnectionCore, destination: Destination,
                 extra: dict[str, object] | None = None, *, raw: bool = False) -> None:
        self.connection = connection
        self.destination = destination
        self.raw = raw                           # collect (headers, body) pairs, not Messages
        self.messages: list[Message] = []
        self.pairs: list[tuple[Headers, bytes]] = []
        self.frames: deque[Frame] = deque()
        self.end: Headers | None = None          # the end marker's headers (range bounds)
        self.error: PymqError | None = None      # a failover lost the link under it
        self.arrow: bytes | None = None          # the end marker's body when the broker answered in Arrow
        given = {k: str(v) for k, v in (extra or {}).items() if v is not None}
        if "selector" in given:
            checked_selector(given["selector"])     # before anything is registered or sent
        self.sub_id = connection._register(self)
        headers = {"destination": destination.stomp_name, "id": self.sub_id, "browser": "true", "ack": "auto"}
        headers.update(given)
        self.subscribe = Frame("SUBSCRIBE", headers)

    def _notify(self) -> None:
        raise NotImplementedError

    def _arrived(self, frame: Frame) -> None:
        if frame.headers.get("browser") == "end":
            self.end = frame.headers
            if frame.headers.get("content-type") == ARROW_STREAM:
                self.arrow = frame.body
            self.connection._unregister(self.sub_id)
        else:
            self.frames.append(frame)
        self._notify()

    def _wake(self) -> None:
        self._notify()

    def _interrupted(self) -> None:
        self.error = ConnectionInterrupted(f"the connection to the broker was lost during the browse of "
                                           f"{self.destination} (it fails over: browse again)")
        self.connection._unregister(self.sub_id)
        self._notify()

    def _resubscription(self) -> Frame | None:
        return None

    def _next(self) -> Message | None:
        frame = self.frames.popleft() if self.frames else None
        return None if frame is None else from_frame(frame.headers, frame.body)

    def _collect(self) -> bool:
        """Take every frame that arrived into the result; False when there was none."""
        frames = self.frames
        if not frames:
            return False
        while frames:
            frame = frames.popleft()
            if self.raw:
                self.pairs.append((frame.headers, frame.body))
            else:
                self.messages.append(from_frame(frame.headers, frame.body))
        return True

    @property
    def finished(self) -> bool:
        return self.end is not None and not self.frames

    def _close(self) -> None:
        self.connection._unregister(self.sub_id)

    def result(self) -> RangeResult:
        h = self.end or {}
        return RangeResult(self.messages, _seq(h, "pymq-earliest-seq"), _seq(h, "pymq-latest-seq"),
                           _seq(h, "pymq-next-seq"), self.pairs if self.raw else None, self.arrow,
                           h.get("pymq-source"))


def _seq(headers: Headers, name: str) -> int:
    return header_int(headers, name, 0)


def browse_queue(queue: Queue | str) -> Destination:
    target = as_destination(queue)
    if isinstance(target, Topic):
        raise IllegalStateError("browsers read queues, not topics")
    return target


# -- request/reply -------------------------------------------------------------------------------------

def request_message(message: MessageBody, reply_queue: Destination) -> Message:
    msg = make_message(message)
    msg.reply_to = reply_queue
    msg.correlation_id = uuid.uuid4().hex
    return msg


def reply_message(request: Message, response: MessageBody) -> tuple[Message, Destination]:
    """The reply to ``request`` (its correlation id copied) and where it goes."""
    if request.reply_to is None:
        raise IllegalStateError("the request has no reply-to destination")
    msg = make_message(response)
    msg.correlation_id = request.correlation_id or request.message_id
    return msg, request.reply_to
