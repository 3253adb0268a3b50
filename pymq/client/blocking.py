"""The blocking JMS-style API: ConnectionFactory → Connection → Session → producers, consumers, browsers.

A thin shell over the client core (:mod:`pymq.client._core`), which holds the state, the frames and
the acknowledgement rules; this module adds threads and waiting.

Threading (the JMS rules): a :class:`Connection` is thread-safe; a :class:`Session` and everything it
creates belong to one thread at a time.  Using a session from a second thread while the first is inside
one of its calls raises :class:`IllegalStateError` at once instead of corrupting acknowledgement state;
so does anything done on a closed object.  Message listeners run on the session's own dispatcher thread,
one message at a time.

Acknowledgement over STOMP: consumers always subscribe with broker-side credit (``client-individual``
or ``client`` acks and a prefetch), so a slow consumer holds at most ``prefetch`` messages and never
stalls the connection's reader.  AUTO_ACKNOWLEDGE acks each message when ``receive`` returns it (or the
listener returns); DUPS_OK_ACKNOWLEDGE acks cumulatively in batches; CLIENT_ACKNOWLEDGE acks everything
the session consumed when ``message.acknowledge()`` is called; SESSION_TRANSACTED wraps sends and acks
in a broker transaction that ``commit()`` makes visible at once and ``rollback()`` discards (consumed
messages come back first, in their order, marked redelivered).
"""
from __future__ import annotations

import functools
import logging
import queue as _queue
import ssl
import threading
import time
from typing import TYPE_CHECKING, Concatenate, ParamSpec, Protocol, TypeVar
from collections.abc import Callable, Iterator, Sequence

from pymq.client._core import (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE, SESSION_TRANSACTED,
                               AckMode, BrowseCore, ConnectionCore, ConnectionSettings, ConnectionStatus,
                               ConsumerCore, Headers, ProducerCore, ack_mode_of, RangeResult, SessionCore, browse_queue,
                               EXCLUSIVE_HEADERS, durable_headers, durable_topic, reply_message, request_message,
                               shared_durable_headers, shared_headers, unsubscribe_frame)
from pymq.client.frames import ack_upto_frame, bulk_frame, range_headers
from pymq.client.transport import Transport, transport_for
from pymq.client.url import TlsOptions
from pymq.destination import Destination, Queue, Topic, as_destination
from pymq.errors import ConnectionClosed, IllegalStateError, PymqError, TimeoutError
from pymq.message import NON_PERSISTENT, Message, MessageBody
from pymq.protocol.frame import Frame

if TYPE_CHECKING:
    from pymq.client.admin import QueueManager

log = logging.getLogger("pymq.client")

__all__ = ["ConnectionFactory", "Connection", "Session", "MessageProducer", "MessageConsumer", "QueueBrowser",
           "Requestor", "RangeResult", "connect", "reply", "AckMode", "ConnectionStatus", "AUTO_ACKNOWLEDGE",
           "CLIENT_ACKNOWLEDGE", "DUPS_OK_ACKNOWLEDGE", "SESSION_TRANSACTED"]

MessageListener = Callable[[Message], None]
ExceptionListener = Callable[[PymqError], None]


class _Waiter:
    """One receipt waited for by a thread."""

    __slots__ = ("event", "error", "headers")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: PymqError | None = None
        self.headers: Headers = {}

    def resolve(self, headers: Headers) -> None:
        self.headers = headers
        self.event.set()

    def fail(self, error: PymqError) -> None:
        self.error = error
        self.event.set()


# -- factory and connect ---------------------------------------------------------------------------------

class ConnectionFactory(ConnectionSettings):
    """Connection settings; ``create_connection()`` returns a stopped Connection (JMS semantics).

    ``url`` follows :mod:`pymq.client.url` (``stomp://user:pass@host:port``, ``stomps://...?ca_file=``,
    ``vm://name``); explicit ``username``/``password``/``tls`` win over what the URL says."""

    def create_connection(self, username: str | None = None, password: str | None = None) -> Connection:
        """A new, stopped Connection (call ``start()`` to receive); ``username``/``password`` override the factory's."""
        transport = transport_for(self.address, heartbeat=self.heartbeat, ssl_context=self._ssl_context(),
                                  server_hostname=self._server_hostname())
        user, secret = self._credentials(username, password)
        return Connection(transport, self, user, secret)


def connect(url: str = "vm://default", *, username: str | None = None, password: str | None = None,
            client_id: str | None = None, timeout: float = 10.0, heartbeat: tuple[int, int] = (10_000, 10_000),
            prefetch: int = 1000, sync_send: bool = True, host: str | None = None,
            tls: TlsOptions | ssl.SSLContext | None = None, start: bool = True) -> Connection:
    """Open a connection (started, unless ``start=False``): ``pymq.connect("stomp://127.0.0.1:61613")``.

    Credentials come from ``username``/``password``, else from the URL (``stomp://user:pass@host``),
    else none (the broker's guest).  TLS: a ``stomps://`` URL with its options, which ``tls=``
    (:class:`~pymq.TlsOptions` or an ``ssl.SSLContext``) overrides."""
    factory = ConnectionFactory(url, username=username, password=password, client_id=client_id, timeout=timeout,
                                heartbeat=heartbeat, prefetch=prefetch, sync_send=sync_send, host=host, tls=tls)
    conn = factory.create_connection()
    if start:
        conn.start()
    return conn


# -- connection --------------------------------------------------------------------------------------------

class Connection(ConnectionCore):
    """A connection to a broker; thread-safe.  ``status`` is a :class:`ConnectionStatus`."""

    factory: ConnectionFactory
    _sessions: list[Session]  # type: ignore[assignment]

    def __init__(self, transport: Transport, factory: ConnectionFactory, username: str | None,
                 password: str | None) -> None:
        super().__init__(factory)
        self._transport = transport
        self._lock = threading.Lock()
        self._started = threading.Event()
        self.exception_listener: ExceptionListener | None = None
        self._queue_manager: QueueManager | None = None
        transport.on_frame = self._frame_received
        transport.on_lost = self._on_lost
        try:
            connected = transport.connect(self._connect_headers(username, password), factory.timeout)
        except BaseException:
            self.status = ConnectionStatus.CLOSED
            raise
        self._opened(connected, transport.version, username)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or resume) delivery of incoming messages to receivers and listeners."""
        self._check_usable()
        self._started.set()

    def stop(self) -> None:
        """Pause delivery; ``receive`` calls wait and listeners are not called until ``start``."""
        self._check_usable()
        self._started.clear()

    def close(self) -> None:
        """Close every session, say DISCONNECT (waiting for its receipt) and close the transport."""
        if self.status is ConnectionStatus.CLOSED:
            self._transport.close()          # a lost connection still ends its threads
            return
        if self.status is ConnectionStatus.CLOSING:
            return
        self.status = ConnectionStatus.CLOSING
        for session in list(self._sessions):
            try:
                session._close_local()
            except PymqError:
                pass
        if self._error is None and not self.closed:
            # the DISCONNECT receipt confirms the broker processed every frame sent before it (a
            # producer held back by flow control may need a while): wait the full timeout, and say so
            # when it never comes, since unconfirmed non-persistent sends may then be lost
            try:
                self._request(Frame("DISCONNECT", {}), timeout=self.factory.timeout)
            except TimeoutError:
                log.warning("the broker did not confirm DISCONNECT within %ss; messages sent without a "
                            "receipt may not have reached it", self.factory.timeout)
            except PymqError:
                pass
        self._transport.close()
        self.status = ConnectionStatus.CLOSED
        self._started.set()                  # wakes receivers waiting for start: they see CLOSED

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def queue_manager(self) -> QueueManager:
        """Create, drop, purge and inspect queues; grant and revoke permissions (thread-safe)."""
        self._check_open()
        with self._lock:
            if self._queue_manager is None:
                from pymq.client.admin import QueueManager
                self._queue_manager = QueueManager(self)
            return self._queue_manager

    # -- sessions ---------------------------------------------------------------------------------
    def create_session(self, transacted: bool = False, ack_mode: int = AUTO_ACKNOWLEDGE) -> Session:
        """A session: ``transacted=True``, or one of the acknowledge modes (``pymq.CLIENT_ACKNOWLEDGE``...)."""
        self._check_usable()
        session = Session(self, SESSION_TRANSACTED if transacted else ack_mode_of(ack_mode))
        self._sessions.append(session)
        return session

    # -- frames ------------------------------------------------------------------------------------
    def _send(self, frame: Frame) -> None:
        self._check_open()
        self._transport.send(frame)

    def _request(self, frame: Frame, timeout: float | None = None) -> Headers:
        """Send ``frame`` with a receipt and wait for it; an ERROR for it raises here."""
        return PendingReceipt(self, frame).result(timeout)

    def _on_lost(self, error: PymqError) -> None:
        unexpected = self._lost(error)
        self._started.set()
        listener = self.exception_listener
        if listener is not None and unexpected:
            try:
                listener(error)
            except Exception:
                log.exception("exception listener failed")


# -- the one-thread rule -----------------------------------------------------------------------------------

class _Guard:
    """Single-thread-at-a-time check for a Session (JMS: sessions are not thread-safe)."""

    __slots__ = ("session", "_lock", "_owner")

    def __init__(self, session: Session) -> None:
        self.session = session
        self._lock = threading.Lock()
        self._owner: int | None = None

    def enter(self) -> bool:
        """Own the session for this call; False when this thread owns it already (a listener using
        its own session), which needs no release."""
        if self.session._closed:
            raise IllegalStateError("the session is closed")
        me = threading.get_ident()
        if self._owner == me:
            return False
        if not self._lock.acquire(blocking=False):
            raise IllegalStateError("the session is in use by another thread; a Session is "
                                    "single-threaded (create one session per thread)")
        self._owner = me
        return True

    def enter_waiting(self) -> None:
        """Own the session, waiting for another thread to leave it (the listener dispatcher)."""
        if self.session._closed:
            raise IllegalStateError("the session is closed")
        self._lock.acquire()
        self._owner = threading.get_ident()

    def leave(self) -> None:
        self._owner = None
        self._lock.release()


class _OfSession(Protocol):
    @property
    def _session(self) -> Session: ...


_S = TypeVar("_S", bound=_OfSession)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _guarded(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Run ``method`` with its session owned by the calling thread (re-entrant for that thread)."""

    @functools.wraps(method)
    def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        guard = self._session._guard
        if not guard.enter():
            return method(self, *args, **kwargs)
        try:
            return method(self, *args, **kwargs)
        finally:
            guard.leave()
    return wrapper


# -- session ---------------------------------------------------------------------------------------------

class Session(SessionCore):
    """A single-threaded context for producing and consuming (not thread-safe, see module doc)."""

    connection: Connection
    _consumers: list[MessageConsumer]  # type: ignore[assignment]

    def __init__(self, connection: Connection, ack_mode: int) -> None:
        super().__init__(connection, ack_mode)
        self._guard = _Guard(self)
        self._producers: list[MessageProducer] = []
        self._dispatch_queue: _queue.SimpleQueue[MessageConsumer | None] | None = None
        self._dispatcher: threading.Thread | None = None
        if self.transacted:
            self._begin()

    @property
    def _session(self) -> Session:
        return self

    # -- factories -----------------------------------------------------------------------------------
    def create_producer(self, destination: Destination | str | None = None) -> MessageProducer:
        """A producer for ``destination`` (or for any, named at each ``send``)."""
        self._check()
        producer = MessageProducer(self, as_destination(destination) if destination is not None else None)
        self._producers.append(producer)
        return producer

    @_guarded
    def create_consumer(self, destination: Destination | str, selector: str | None = None, *,
                        no_local: bool = False, prefetch: int | None = None,
                        exclusive: bool = False) -> MessageConsumer:
        """A consumer of ``destination``, optionally filtered by a JMS ``selector``.  ``exclusive``: of
        the exclusive consumers of a queue only the first (in subscription order) receives; the next
        takes over when it leaves (spec/stomp.md §4)."""
        return self._subscribe(as_destination(destination), selector, no_local=no_local, prefetch=prefetch,
                               extra=EXCLUSIVE_HEADERS if exclusive else None)

    @_guarded
    def create_durable_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                no_local: bool = False, prefetch: int | None = None) -> MessageConsumer:
        """A durable subscription ``name`` (scoped by the connection's client id, else its user)."""
        return self._subscribe(durable_topic(topic), selector, no_local=no_local, prefetch=prefetch,
                               extra=durable_headers(name))

    create_durable_subscriber = create_durable_consumer

    @_guarded
    def create_shared_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                               prefetch: int | None = None) -> MessageConsumer:
        """JMS 2.0 shared non-durable subscription: consumers with the same name share the messages."""
        return self._subscribe(as_destination(topic), selector, prefetch=prefetch, extra=shared_headers(name))

    @_guarded
    def create_shared_durable_consumer(self, topic: Topic | str, name: str, selector: str | None = None,
                                       *, prefetch: int | None = None) -> MessageConsumer:
        """JMS 2.0 shared durable subscription ``name`` (scoped globally)."""
        return self._subscribe(as_destination(topic), selector, prefetch=prefetch,
                               extra=shared_durable_headers(name))

    @_guarded
    def unsubscribe(self, name: str, *, shared: bool = False) -> None:
        """Delete durable subscription ``name`` (it must have no active consumer)."""
        self.connection._request(unsubscribe_frame(name, shared))

    @_guarded
    def create_browser(self, queue: Queue | str, selector: str | None = None) -> QueueBrowser:
        """A browser of ``queue``'s waiting messages (nothing is removed)."""
        return QueueBrowser(self, browse_queue(queue), selector)

    @_guarded
    def read_range(self, destination: Destination | str, *, from_seq: int | None = None,
                   to_seq: int | None = None, max_messages: int | None = None,
                   max_bytes: int | None = None, from_timestamp: int | None = None,
                   selector: str | None = None, subscription: str | None = None, source: str | None = None,
                   timeout: float | None = None, frames: bool = False, arrow: bool = False) -> RangeResult:
        """Messages with ``from_seq <= sequence < to_seq`` without removing them (spec/stomp.md §9):
        from a destination's retained log, a queue, or (``subscription``) a durable subscription.

        ``frames=True`` leaves each message as the broker sent it, a ``(headers, body)`` pair in
        ``RangeResult.frames`` (``messages`` is then empty): the seam for readers that decode many
        messages at once without making a Message of each (the Spark connector's Arrow decoder).
        ``arrow=True`` asks the broker for one Arrow frame (spec/spark.md §6): its IPC stream is then in
        ``RangeResult.arrow``; a broker without Arrow answers per message as usual."""
        extra = range_headers(from_seq=from_seq, to_seq=to_seq, max_messages=max_messages, max_bytes=max_bytes,
                              from_timestamp=from_timestamp, selector=selector, subscription=subscription,
                              source=source, arrow=arrow)
        return _browse(self, as_destination(destination), extra, timeout, frames)

    @_guarded
    def send_arrow(self, destination: Destination | str, data: bytes, *,
                   timeout: float | None = None) -> Headers:
        """A bulk SEND (spec/spark.md §7): ``data`` is an Arrow IPC stream of rows, which the broker
        appends as a unit; returns the receipt's headers (``pymq-first-seq``, ``pymq-count``,
        ``pymq-duplicates``) once the rows are durable.  Not inside a transaction."""
        return start_send_arrow(self, destination, data).result(timeout)

    def bounds(self, destination: Destination | str, *, subscription: str | None = None,
               source: str | None = None) -> tuple[int, int]:
        """(earliest available, latest assigned) sequence numbers of a destination."""
        result = self.read_range(destination, max_messages=0, subscription=subscription, source=source)
        return result.earliest, result.latest

    @_guarded
    def ack_upto(self, destination: Destination | str, seq: int, *, subscription: str | None = None) -> None:
        """Acknowledge every waiting message below sequence number ``seq`` (a reader that owns the
        queue or durable subscription, acknowledging a committed batch)."""
        self.connection._request(ack_upto_frame(destination, seq, subscription))

    def create_queue(self, name: str, **config: object) -> Queue:
        """A Queue; with settings (QueueConfig fields, see QueueManager.create) it is also created on
        the broker, owned by this user: the same settings again are a no-op, different ones raise
        DestinationExists."""
        self._check()
        if config:
            from pymq.client.admin import create_call
            return self.connection.queue_manager()._run(create_call(name, None, dict(config)))
        return Queue(name)

    # -- transactions and acknowledgement ------------------------------------------------------------
    @_guarded
    def commit(self) -> None:
        """Make this transaction's sends visible and its receives acknowledged, atomically."""
        self.connection._request(self._commit_frame())
        self._begin()

    @_guarded
    def rollback(self) -> None:
        """Discard this transaction's sends; the messages it received come back first, in their
        original order, marked redelivered."""
        self._recover(rollback=True)

    @_guarded
    def recover(self) -> None:
        """Redeliver every message consumed but not yet acknowledged, first and in their original
        order (non-transacted sessions)."""
        self._recover(rollback=False)

    def _recover(self, rollback: bool) -> None:
        frames = self._recovery_frames(rollback)
        if not frames:
            return
        conn = self.connection
        try:
            for frame in frames[:-1]:
                conn._send(frame)
            conn._request(frames[-1])       # the receipt: every NACK is applied
            settle = self._recovery_settle_frames()
            if settle:                      # ... and what they released is dispatched before this one
                for frame in settle[:-1]:
                    conn._send(frame)
                conn._request(settle[-1])
        finally:
            self._end_recovery()

    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message this session has consumed."""
        self._acknowledge_now()

    # -- lifecycle -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Roll back an open transaction, close the consumers and end the listener dispatcher."""
        if self._closed:
            return
        if self.transacted and self._tx is not None and not self.connection.closed:
            try:
                # what the transaction received returns when the consumers unsubscribe below
                self.connection._send(Frame("ABORT", {"transaction": self._tx}))
            except PymqError:
                pass
        self._close_local()

    def _close_local(self) -> None:
        if self._closed:
            return
        for consumer in list(self._consumers):
            try:
                consumer.close()
            except PymqError:
                consumer._closed = True
        self._closed = True
        self._wake()
        if self in self.connection._sessions:
            self.connection._sessions.remove(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        if self._dispatch_queue is not None:
            self._dispatch_queue.put(None)

    # -- consumers ---------------------------------------------------------------------------------
    def _subscribe(self, destination: Destination, selector: str | None, *, no_local: bool = False,
                   prefetch: int | None = None, extra: Headers | None = None) -> MessageConsumer:
        self._check()
        conn = self.connection
        consumer = MessageConsumer(self, destination, selector,
                                   prefetch if prefetch is not None else conn.factory.prefetch)
        try:
            conn._request(self._subscribe_frame(consumer, no_local=no_local, extra=extra))
        except PymqError:
            conn._unregister(consumer._sub_id)
            raise
        self._consumers.append(consumer)
        return consumer

    def _start_dispatcher(self) -> _queue.SimpleQueue[MessageConsumer | None]:
        if self._dispatch_queue is None:
            self._dispatch_queue = _queue.SimpleQueue()
            self._dispatcher = threading.Thread(target=self._dispatch_loop, name="pymq-session-dispatch",
                                                daemon=True)
            self._dispatcher.start()
        return self._dispatch_queue

    def _dispatch_loop(self) -> None:
        q = self._dispatch_queue
        assert q is not None
        conn = self.connection
        guard = self._guard
        while True:
            consumer = q.get()                # one entry per message that arrived for a listener
            if consumer is None:
                if self._closed or conn.closed:
                    return
                continue
            while not conn._started.wait(0.5):
                if self._closed or conn.closed:
                    return
            if consumer._closed or consumer._listener is None:
                continue
            # a listener runs when the session is free: wait for a thread inside it to finish
            # (JMS: the session serialises its listeners with the application's own use of it)
            try:
                guard.enter_waiting()
            except IllegalStateError:
                return                        # the session closed while the message waited
            try:
                listener = consumer._listener
                if consumer._closed or listener is None or not consumer._buffer or conn.closed:
                    continue
                consumer._dispatch(consumer._buffer.popleft(), listener)
            finally:
                guard.leave()


# -- producer ---------------------------------------------------------------------------------------------

class MessageProducer(ProducerCore):
    """Sends messages; created by a Session and used from its thread."""

    _session: Session

    @_guarded
    def send(self, message: MessageBody, destination: Destination | str | None = None, *,
             delivery_mode: int | None = None, priority: int | None = None,
             time_to_live: int | None = None, delivery_delay: int | None = None,
             transaction: object = None) -> Message:
        """Send ``message`` (a Message, or str/bytes/dict made into one); returns the Message sent.

        Persistent messages outside a transaction wait for the broker's receipt, which comes once
        the message is durable (disable with ``ConnectionFactory(sync_send=False)``).
        ``transaction``: the application's SQLAlchemy ``Connection`` or ``Session``; the message is
        written in that database transaction and seen only if it commits (spec/storage.md, "SQL device").
        """
        if transaction is not None:
            self._check()
            from pymq.client.apptx import send_in_transaction
            return send_in_transaction(self, message, destination, transaction, delivery_mode=delivery_mode,
                                       priority=priority, time_to_live=time_to_live)
        msg, frame, confirm = self._prepare(message, destination, delivery_mode=delivery_mode, priority=priority,
                                            time_to_live=time_to_live, delivery_delay=delivery_delay)
        conn = self._session.connection
        if confirm:
            msg.message_id = conn._request(frame).get("message-id")
        else:
            conn._send(frame)
        return msg

    def close(self) -> None:
        """Close the producer; further sends raise IllegalStateError (nothing on the broker to release)."""
        self._closed = True

    def __enter__(self) -> MessageProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- consumer ---------------------------------------------------------------------------------------------

class MessageConsumer(ConsumerCore):
    """Receives from one destination; created by a Session and used from its thread."""

    _session: Session
    _listener: MessageListener | None

    def __init__(self, session: Session, destination: Destination, selector: str | None, prefetch: int) -> None:
        super().__init__(session, destination, selector, prefetch)
        # a waiting receive sleeps on this queue; a wake-up is one token (a C-level queue: a
        # threading.Event costs several Python calls per arrival, measurable on the receive path)
        self._wakeup: _queue.SimpleQueue[None] = _queue.SimpleQueue()

    # the transport's thread: never blocks
    def _notify(self) -> None:
        if self._listener is not None:
            queue = self._session._dispatch_queue
            if queue is not None:
                queue.put(self)
                return
        if self._waiting:
            self._waiting = False            # one token per wait; a stale one only costs a re-check
            self._wakeup.put(None)

    def _wake(self) -> None:
        self._wakeup.put(None)

    @_guarded
    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever); None on timeout."""
        if self._closed or self._listener is not None:
            self._check_receive()
        conn = self._session.connection
        buffer = self._buffer
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not conn._started.is_set():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                conn._started.wait(remaining)
                continue
            if buffer:
                return self._take(buffer.popleft())
            if self._closed:
                raise IllegalStateError("the consumer is closed")
            conn._check_open()
            self._before_wait()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._waiting = True              # read by _notify after it appends: no lost wake-up
            try:
                if not buffer and not self._closed:
                    self._wakeup.get(timeout=remaining)
            except _queue.Empty:
                pass
            finally:
                self._waiting = False

    def receive_no_wait(self) -> Message | None:
        """The next message if one is already here, else None (``receive(timeout=0)``)."""
        return self.receive(timeout=0)

    def __iter__(self) -> Iterator[Message]:
        """Messages until the consumer or connection closes."""
        while True:
            try:
                message = self.receive()
            except (IllegalStateError, ConnectionClosed):
                return
            if message is not None:
                yield message

    @property
    def message_listener(self) -> MessageListener | None:
        """Where messages go (None: the application calls ``receive``); setting it is ``set_message_listener``."""
        return self._listener

    @message_listener.setter
    def message_listener(self, listener: MessageListener | None) -> None:
        self.set_message_listener(listener)

    def set_message_listener(self, listener: MessageListener | None) -> None:
        """Deliver messages to ``listener`` on the session's dispatcher thread (one at a time)."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        queue = self._session._start_dispatcher()
        self._listener = listener
        if listener is not None:
            for _ in range(len(self._buffer)):   # messages that arrived before go to it, in order
                queue.put(self)

    def _dispatch(self, frame: Frame, listener: MessageListener) -> None:
        """Run ``listener`` for ``frame`` (the dispatcher thread, owning the session)."""
        message, delivery = self._for_listener(frame)
        try:
            listener(message)
        except Exception:
            log.exception("message listener of %s raised; the message will be redelivered", self.destination)
            self._listener_done(delivery, failed=True)
            return
        try:
            self._listener_done(delivery, failed=False)
        except PymqError as exc:
            log.warning("acknowledging after the listener returned: %s", exc)

    def close(self) -> None:
        """End the subscription (UNSUBSCRIBE, waiting for its receipt); unacknowledged messages return."""
        if self._closed:
            return
        conn = self._session.connection
        self._closing()
        if not conn.closed:
            try:
                conn._request(Frame("UNSUBSCRIBE", {"id": self._sub_id}))
            except PymqError:
                pass
        conn._unregister(self._sub_id)

    def __enter__(self) -> MessageConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- browsing -----------------------------------------------------------------------------------------------

class QueueBrowser:
    """Looks at a queue's messages in delivery order without removing them."""

    def __init__(self, session: Session, queue: Destination, selector: str | None) -> None:
        self._session = session
        self.queue = queue
        self.selector = selector
        self._closed = False

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def messages(self, timeout: float | None = None) -> list[Message]:
        """A snapshot of the messages waiting now (each call takes a new one)."""
        if self._closed:
            raise IllegalStateError("the browser is closed")
        return _browse(self._session, self.queue, {"selector": self.selector or None}, timeout).messages

    get_enumeration = messages

    def close(self) -> None:
        """Close the browser (each iteration browses anew, so there is nothing on the broker to release)."""
        self._closed = True

    def __enter__(self) -> QueueBrowser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Browse(BrowseCore):
    def __init__(self, connection: Connection, destination: Destination, extra: dict[str, object], *,
                 raw: bool = False) -> None:
        super().__init__(connection, destination, extra, raw=raw)
        self.event = threading.Event()

    def _notify(self) -> None:
        self.event.set()


class PendingReceipt:
    """A frame sent with a receipt, waited for later: :meth:`result` returns the RECEIPT's headers, or
    raises the ERROR the broker answered it with (or pymq's TimeoutError).  An abandoned one leaves
    nothing behind once its receipt arrives (or the connection goes)."""

    __slots__ = ("_command", "_conn", "_rid", "_waiter")

    def __init__(self, conn: Connection, frame: Frame) -> None:
        self._conn = conn
        self._command = frame.command
        self._waiter = _Waiter()
        self._rid, framed = conn._expect(frame, self._waiter)
        try:
            conn._send(framed)
        except PymqError:
            conn._forget(self._rid)
            raise

    def result(self, timeout: float | None = None) -> Headers:
        waiter = self._waiter
        timeout = self._conn.factory.timeout if timeout is None else timeout
        if not waiter.event.wait(timeout):
            self._conn._forget(self._rid)
            raise TimeoutError(f"no receipt for {self._command} within {timeout:g}s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.headers


def start_send_arrow(session: Session, destination: Destination | str, data: bytes) -> PendingReceipt:
    """:meth:`Session.send_arrow` in two halves, for writers that build the next bulk SEND while the
    broker appends (and makes durable) the one before (the Spark connector's sink): the frame is sent
    now, ``.result()`` waits for its receipt.  Call it from the thread that uses the session."""
    session._check()
    if session.transacted:
        raise IllegalStateError("a bulk SEND is its own unit: send it from a session that is not transacted")
    return PendingReceipt(session.connection, bulk_frame(destination, data))


class PendingRange:
    """A range read asked for and not yet collected (:func:`start_range`): the SUBSCRIBE is on the wire,
    and the broker answers it while the caller does other work.  :meth:`result` waits for the receipt and
    the ``browser:end`` marker.  An abandoned one leaves nothing behind: the browse unregisters itself
    when its end marker arrives, and an unwaited receipt is dropped."""

    __slots__ = ("_browse", "_conn", "_destination", "_subscribed")

    def __init__(self, session: Session, destination: Destination, extra: dict[str, object],
                 frames: bool = False) -> None:
        conn = self._conn = session.connection
        self._destination = destination
        self._browse = _Browse(conn, destination, extra, raw=frames)
        try:
            self._subscribed = PendingReceipt(conn, self._browse.subscribe)
        except PymqError:
            self._browse._close()
            raise

    def result(self, timeout: float | None = None) -> RangeResult:
        """The answer (raises pymq's TimeoutError when the receipt or the end marker does not come)."""
        conn, browse = self._conn, self._browse
        limit = conn.factory.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        try:
            self._subscribed.result(limit)
            while True:
                if browse._collect():
                    continue
                if browse.end is not None:
                    return browse.result()
                conn._check_open()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the browse of {self._destination} did not finish within {limit:g}s")
                browse.event.clear()
                if not browse.frames and browse.end is None:
                    browse.event.wait(remaining)
        finally:
            browse._close()


def start_range(session: Session, destination: Destination | str, *, from_seq: int | None = None,
                to_seq: int | None = None, max_messages: int | None = None, max_bytes: int | None = None,
                from_timestamp: int | None = None, selector: str | None = None, subscription: str | None = None,
                source: str | None = None, frames: bool = False, arrow: bool = False,
                columns: Sequence[str] | None = None) -> PendingRange:
    """:meth:`Session.read_range` in two halves, for readers that keep the next range in flight while
    they process the current one (the Spark connector's tasks): the request is sent now, the answer is
    taken with ``.result()``.  Answers come in the order asked.  Call it from the thread that uses the
    session, as every session call.  ``columns``: with ``arrow``, the message batch columns the answer
    should carry (spec/spark.md §6; a broker that predates it sends them all)."""
    session._check()
    extra = range_headers(from_seq=from_seq, to_seq=to_seq, max_messages=max_messages, max_bytes=max_bytes,
                          from_timestamp=from_timestamp, selector=selector, subscription=subscription,
                          source=source, arrow=arrow, columns=columns)
    return PendingRange(session, as_destination(destination), extra, frames)


def _browse(session: Session, destination: Destination, extra: dict[str, object],
            timeout: float | None, frames: bool = False) -> RangeResult:
    """One browse subscription (spec/stomp.md §9); the broker ends it after ``browser:end``.  With
    ``frames`` the result holds each message's ``(headers, body)`` instead of a Message."""
    return PendingRange(session, destination, extra, frames).result(timeout)


# -- request/reply ------------------------------------------------------------------------------------------

class Requestor:
    """Request/reply over a temporary queue: ``Requestor(session, Queue("svc")).request(msg, timeout)``."""

    def __init__(self, session: Session, destination: Destination | str) -> None:
        self.session = session
        self.destination = as_destination(destination)
        self.reply_queue = session.create_temporary_queue()
        self._consumer = session.create_consumer(self.reply_queue)
        self._producer = session.create_producer(self.destination)

    def request(self, message: MessageBody, timeout: float | None = 10.0) -> Message:
        """Send ``message`` and wait for its reply (raises pymq's TimeoutError when none comes)."""
        msg = request_message(message, self.reply_queue)
        self._producer.send(msg, delivery_mode=NON_PERSISTENT)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no reply from {self.destination} within {timeout}s")
            answer = self._consumer.receive(remaining)
            if answer is not None and answer.correlation_id == msg.correlation_id:
                return answer
            # None, or a late reply to an earlier, timed-out request: drop it

    def close(self) -> None:
        """Close the reply consumer and the producer."""
        self._consumer.close()
        self._producer.close()

    def __enter__(self) -> Requestor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reply(session: Session, request: Message, response: MessageBody) -> Message:
    """Answer ``request`` on its reply-to destination, copying its correlation id."""
    msg, to = reply_message(request, response)
    return session.create_producer(to).send(msg, delivery_mode=NON_PERSISTENT)
