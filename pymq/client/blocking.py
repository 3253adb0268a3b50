"""The blocking JMS-style API: ConnectionFactory → Connection → Session → producers, consumers, browsers.

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
messages come back, marked redelivered).
"""
from __future__ import annotations

import itertools
import logging
import queue as _queue
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from pymq.destination import Destination, Queue, Topic, as_destination
from pymq.errors import (ConnectionClosed, IllegalStateError, PymqError, TimeoutError,
                         error_from_headers)
from pymq.message import NON_PERSISTENT, PERSISTENT, Message, from_frame, make_message
from pymq.protocol.frame import Frame
from pymq.client.frames import (SessionFactories, ack_upto_frame, range_headers, send_frame,
                                subscribe_headers)
from pymq.client.transport import Transport, transport_for

log = logging.getLogger("pymq.client")

SESSION_TRANSACTED = 0
AUTO_ACKNOWLEDGE = 1
CLIENT_ACKNOWLEDGE = 2
DUPS_OK_ACKNOWLEDGE = 3
_MODE_NAMES = {0: "SESSION_TRANSACTED", 1: "AUTO_ACKNOWLEDGE", 2: "CLIENT_ACKNOWLEDGE",
               3: "DUPS_OK_ACKNOWLEDGE"}

_CLOSED = object()   # wakes a blocked receive when its consumer or connection closes


class _Waiter:
    __slots__ = ("event", "error", "headers")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: PymqError | None = None
        self.headers: dict | None = None


class ConnectionFactory:
    """Connection settings; ``create_connection()`` returns a stopped Connection (JMS semantics)."""

    def __init__(self, url: str = "vm://default", *, username: str | None = None,
                 password: str | None = None, client_id: str | None = None, timeout: float = 10.0,
                 heartbeat: tuple[int, int] = (10_000, 10_000), prefetch: int = 1000,
                 sync_send: bool = True, host: str | None = None) -> None:
        self.url = url
        self.username = username
        self.password = password
        self.client_id = client_id
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.prefetch = prefetch
        self.sync_send = sync_send
        self.host = host

    def create_connection(self, username: str | None = None, password: str | None = None) -> "Connection":
        transport = transport_for(self.url, heartbeat=self.heartbeat)
        return Connection(transport, self, username or self.username,
                          password if password is not None else self.password)


def connect(url: str = "vm://default", *, start: bool = True, **options: Any) -> "Connection":
    """Open a connection (started, unless ``start=False``): ``pymq.connect("stomp://127.0.0.1:61613")``."""
    username = options.pop("username", None)
    password = options.pop("password", None)
    conn = ConnectionFactory(url, **options).create_connection(username, password)
    if start:
        conn.start()
    return conn


class Connection:
    """A connection to a broker; thread-safe."""

    def __init__(self, transport: Transport, factory: ConnectionFactory, username: str | None,
                 password: str | None) -> None:
        self.factory = factory
        self._transport = transport
        self._lock = threading.Lock()
        self._receipts: dict[str, _Waiter] = {}
        self._receipt_ids = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._subscriptions: dict[str, "MessageConsumer"] = {}
        self._sessions: list[Session] = []
        self._started = threading.Event()
        self._closed = False
        self._closing = False
        self._error: PymqError | None = None
        self.exception_listener: Callable[[PymqError], None] | None = None
        self._queue_manager = None
        transport.on_frame = self._on_frame
        transport.on_lost = self._on_lost
        headers = {"accept-version": "1.0,1.1,1.2", "host": factory.host or "/"}
        if username is not None:
            headers["login"] = username
        if password is not None:
            headers["passcode"] = password
        if factory.client_id:
            headers["client-id"] = factory.client_id
        connected = transport.connect(headers, factory.timeout)
        self.version = transport.version
        self.server = connected.headers.get("server", "")
        self.client_id = factory.client_id
        self.user = connected.headers.get("user-name", username)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or resume) delivery of incoming messages to receivers and listeners."""
        self._check_open()
        self._started.set()

    def stop(self) -> None:
        """Pause delivery; ``receive`` calls wait and listeners are not called until ``start``."""
        self._check_open()
        self._started.clear()

    def close(self) -> None:
        """Close every session, say DISCONNECT (waiting for its receipt) and close the transport."""
        if self._closed:
            return
        self._closing = True
        for session in list(self._sessions):
            try:
                session._close_local()
            except PymqError:
                pass
        if self._error is None:
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
        self._closed = True
        self._transport.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._error is not None:
            raise ConnectionClosed(f"the connection failed: {self._error}") from self._error
        if self._closed:
            raise IllegalStateError("the connection is closed")

    def queue_manager(self):
        """Create, drop, purge and inspect queues; grant and revoke permissions (thread-safe)."""
        self._check_open()
        with self._lock:
            if self._queue_manager is None:
                from pymq.client.admin import QueueManager
                self._queue_manager = QueueManager(self)
            return self._queue_manager

    # -- sessions ---------------------------------------------------------------------------------
    def create_session(self, transacted: bool = False, ack_mode: int = AUTO_ACKNOWLEDGE) -> "Session":
        self._check_open()
        mode = SESSION_TRANSACTED if transacted else ack_mode
        if mode not in _MODE_NAMES:
            raise IllegalStateError(f"unknown acknowledge mode {ack_mode!r}")
        session = Session(self, mode)
        with self._lock:
            self._sessions.append(session)
        return session

    # -- frames ------------------------------------------------------------------------------------
    def _send(self, frame: Frame) -> None:
        self._check_open()
        self._transport.send(frame)

    def _request(self, frame: Frame, timeout: float | None = None) -> dict:
        """Send ``frame`` with a receipt and wait for it; an ERROR for it raises here."""
        rid = f"r{next(self._receipt_ids)}"
        waiter = _Waiter()
        with self._lock:
            self._receipts[rid] = waiter
        headers = dict(frame.headers)
        headers["receipt"] = rid
        try:
            self._send(Frame(frame.command, headers, frame.body))
        except PymqError:
            with self._lock:
                self._receipts.pop(rid, None)
            raise
        timeout = self.factory.timeout if timeout is None else timeout
        if not waiter.event.wait(timeout):
            with self._lock:
                self._receipts.pop(rid, None)
            raise TimeoutError(f"no receipt for {frame.command} within {timeout}s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.headers or {}

    def _on_frame(self, frame: Frame) -> None:
        # reader thread: never blocks
        command = frame.command
        if command == "MESSAGE":
            consumer = self._subscriptions.get(frame.headers.get("subscription", ""))
            if consumer is not None:
                consumer._arrived(frame)
        elif command == "RECEIPT":
            with self._lock:
                waiter = self._receipts.pop(frame.headers.get("receipt-id", ""), None)
            if waiter is not None:
                waiter.headers = frame.headers
                waiter.event.set()
        elif command == "ERROR":
            rid = frame.headers.get("receipt-id")
            if rid is not None:
                with self._lock:
                    waiter = self._receipts.pop(rid, None)
                if waiter is not None:
                    waiter.error = error_from_headers(frame.headers, frame.body.decode("utf-8", "replace"))
                    waiter.event.set()

    def _on_lost(self, error: PymqError) -> None:
        expected = self._closing
        if not expected:
            self._error = error
        self._closed = True
        with self._lock:
            waiters = list(self._receipts.values())
            self._receipts.clear()
        for waiter in waiters:
            waiter.error = error if not expected else ConnectionClosed("the connection was closed")
            waiter.event.set()
        for consumer in list(self._subscriptions.values()):
            consumer._wake()
        for session in list(self._sessions):
            session._wake()
        listener = self.exception_listener
        if listener is not None and not expected:
            try:
                listener(error)
            except Exception:
                log.exception("exception listener failed")

    def _register(self, consumer: "MessageConsumer") -> str:
        sub_id = f"s{next(self._sub_ids)}"
        self._subscriptions[sub_id] = consumer
        return sub_id

    def _unregister(self, sub_id: str) -> None:
        self._subscriptions.pop(sub_id, None)


class _Guard:
    """Single-thread-at-a-time check for a Session (JMS: sessions are not thread-safe)."""

    __slots__ = ("session", "_lock", "_owner")

    def __init__(self, session: "Session") -> None:
        self.session = session
        self._lock = threading.Lock()
        self._owner: int | None = None

    def __enter__(self) -> None:
        session = self.session
        if session._closed:
            raise IllegalStateError("the session is closed")
        me = threading.get_ident()
        if self._owner == me:          # re-entrant: a listener using its own session
            raise _Reentrant()
        if not self._lock.acquire(blocking=False):
            raise IllegalStateError("the session is in use by another thread; a Session is "
                                    "single-threaded (create one session per thread)")
        self._owner = me

    def __exit__(self, *exc: object) -> None:
        self._owner = None
        self._lock.release()

    def waiting(self):
        """Enter the session, waiting for another thread to leave it (the listener dispatcher)."""
        guard = self

        class _Waiting:
            def __enter__(self_inner):
                if guard.session._closed:
                    raise IllegalStateError("the session is closed")
                guard._lock.acquire()
                guard._owner = threading.get_ident()

            def __exit__(self_inner, *exc):
                guard._owner = None
                guard._lock.release()

        return _Waiting()


class _Reentrant(Exception):
    pass


def _guarded(method):
    def wrapper(self, *args, **kwargs):
        session = self if isinstance(self, Session) else self._session
        guard = session._guard
        try:
            guard.__enter__()
        except _Reentrant:
            return method(self, *args, **kwargs)
        try:
            return method(self, *args, **kwargs)
        finally:
            guard.__exit__()
    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


class Session(SessionFactories):
    """A single-threaded context for producing and consuming (not thread-safe, see module doc)."""

    def __init__(self, connection: Connection, ack_mode: int) -> None:
        self.connection = connection
        self.ack_mode = ack_mode
        self.transacted = ack_mode == SESSION_TRANSACTED
        self._guard = _Guard(self)
        self._closed = False
        self._consumers: list[MessageConsumer] = []
        self._producers: list[MessageProducer] = []
        self._consumed: list[tuple[MessageConsumer, dict]] = []   # unacked (client ack / transaction)
        self._tx: str | None = None
        self._listener_queue: _queue.SimpleQueue | None = None
        self._dispatcher: threading.Thread | None = None
        if self.transacted:
            self._begin()

    # -- factories -----------------------------------------------------------------------------------
    def create_producer(self, destination: Destination | str | None = None) -> "MessageProducer":
        self._check()
        producer = MessageProducer(self, as_destination(destination) if destination is not None else None)
        self._producers.append(producer)
        return producer

    @_guarded
    def create_consumer(self, destination: Destination | str, selector: str | None = None, *,
                        no_local: bool = False, prefetch: int | None = None) -> "MessageConsumer":
        return self._subscribe(as_destination(destination), selector=selector, no_local=no_local,
                               prefetch=prefetch)

    @_guarded
    def create_durable_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                no_local: bool = False, prefetch: int | None = None) -> "MessageConsumer":
        """A durable subscription ``name`` (scoped by the connection's client id, else its user)."""
        topic = as_destination(topic)
        if not isinstance(topic, Topic):
            raise IllegalStateError("durable subscriptions are made on topics")
        return self._subscribe(topic, selector=selector, no_local=no_local, prefetch=prefetch,
                               extra={"durable-subscription-name": name})

    create_durable_subscriber = create_durable_consumer

    @_guarded
    def create_shared_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                               prefetch: int | None = None) -> "MessageConsumer":
        """JMS 2.0 shared non-durable subscription: consumers with the same name share the messages."""
        return self._subscribe(as_destination(topic), selector=selector, prefetch=prefetch,
                               extra={"shared-subscription-name": name})

    @_guarded
    def create_shared_durable_consumer(self, topic: Topic | str, name: str, selector: str | None = None,
                                       *, prefetch: int | None = None) -> "MessageConsumer":
        return self._subscribe(as_destination(topic), selector=selector, prefetch=prefetch,
                               extra={"durable-subscription-name": name, "shared": "true"})

    @_guarded
    def unsubscribe(self, name: str, *, shared: bool = False) -> None:
        """Delete durable subscription ``name`` (it must have no active consumer)."""
        headers = {"id": f"unsub-{uuid.uuid4().hex[:8]}", "pymq-durable-name": name}
        if shared:
            headers["shared"] = "true"
        self.connection._request(Frame("UNSUBSCRIBE", headers))

    @_guarded
    def create_browser(self, queue: Queue | str, selector: str | None = None) -> "QueueBrowser":
        return QueueBrowser(self, as_destination(queue), selector)

    @_guarded
    def read_range(self, destination: Destination | str, *, from_seq: int | None = None,
                   to_seq: int | None = None, max_messages: int | None = None,
                   max_bytes: int | None = None, from_timestamp: int | None = None,
                   selector: str | None = None, subscription: str | None = None, source: str | None = None,
                   timeout: float | None = None, frames: bool = False) -> RangeResult:
        """Messages with ``from_seq <= sequence < to_seq`` without removing them (spec/stomp.md §9):
        from a destination's retained log, a queue, or (``subscription``) a durable subscription.

        ``frames=True`` leaves each message as the broker sent it, a ``(headers, body)`` pair in
        ``RangeResult.frames`` (``messages`` is then empty): the seam for readers that decode many
        messages at once without making a Message of each (the Spark connector's Arrow decoder)."""
        extra = range_headers(from_seq=from_seq, to_seq=to_seq, max_messages=max_messages, max_bytes=max_bytes,
                              from_timestamp=from_timestamp, selector=selector, subscription=subscription,
                              source=source)
        return _browse(self, as_destination(destination), extra, timeout, frames)

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

    def create_queue(self, name: str, **config: Any) -> Queue:
        """A Queue; with settings (QueueConfig fields, see QueueManager.create) it is also created on
        the broker, owned by this user: the same settings again are a no-op, different ones raise
        DestinationExists."""
        if config:
            return self.connection.queue_manager().create(name, **config)
        return Queue(name)

    # -- transactions and acknowledgement ------------------------------------------------------------
    def _begin(self) -> None:
        self._tx = f"tx-{uuid.uuid4().hex[:12]}"
        self.connection._send(Frame("BEGIN", {"transaction": self._tx}))

    @_guarded
    def commit(self) -> None:
        """Make this transaction's sends visible and its receives acknowledged, atomically."""
        if not self.transacted:
            raise IllegalStateError("commit() needs a transacted session")
        tx = self._tx
        self._consumed.clear()
        self.connection._request(Frame("COMMIT", {"transaction": tx}))
        self._begin()

    @_guarded
    def rollback(self) -> None:
        """Discard this transaction's sends; messages it received come back, marked redelivered."""
        if not self.transacted:
            raise IllegalStateError("rollback() needs a transacted session")
        tx = self._tx
        consumed, self._consumed = self._consumed, []
        self.connection._request(Frame("ABORT", {"transaction": tx}))
        for consumer, ack in consumed:
            consumer._nack(ack)
        self._begin()

    @_guarded
    def recover(self) -> None:
        """Redeliver every message consumed but not yet acknowledged (non-transacted sessions)."""
        if self.transacted:
            raise IllegalStateError("recover() is for non-transacted sessions; use rollback()")
        consumed, self._consumed = self._consumed, []
        for consumer, ack in consumed:
            consumer._nack(ack)

    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message this session has consumed."""
        self._check()
        if self.ack_mode != CLIENT_ACKNOWLEDGE:
            return
        consumed, self._consumed = self._consumed, []
        last: dict[MessageConsumer, dict] = {}
        for consumer, ack in consumed:
            last[consumer] = ack          # client acks are cumulative per subscription
        for consumer, ack in last.items():
            consumer._ack(ack)

    # -- lifecycle -------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise IllegalStateError("the session is closed")
        self.connection._check_open()

    def close(self) -> None:
        if self._closed:
            return
        if self.transacted and self._tx is not None and not self.connection.closed:
            try:
                self.rollback()
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
        if self._listener_queue is not None:
            self._listener_queue.put(None)
        with self.connection._lock:
            if self in self.connection._sessions:
                self.connection._sessions.remove(self)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        if self._listener_queue is not None:
            self._listener_queue.put(None)

    # -- consumers ---------------------------------------------------------------------------------
    def _subscribe(self, destination: Destination, *, selector: str | None = None, no_local: bool = False,
                   prefetch: int | None = None, extra: dict | None = None) -> "MessageConsumer":
        self._check()
        consumer = MessageConsumer(self, destination, selector,
                                   prefetch if prefetch is not None else self.connection.factory.prefetch)
        headers = subscribe_headers(destination, consumer._sub_id, self.ack_mode, consumer.prefetch,
                                    selector=selector, no_local=no_local, extra=extra)
        try:
            self.connection._request(Frame("SUBSCRIBE", headers))
        except PymqError:
            self.connection._unregister(consumer._sub_id)
            raise
        self._consumers.append(consumer)
        return consumer

    def _consumed_one(self, consumer: "MessageConsumer", ack: dict) -> None:
        """Acknowledgement bookkeeping when the application gets a message."""
        mode = self.ack_mode
        if mode == AUTO_ACKNOWLEDGE:
            consumer._ack(ack)
        elif mode == DUPS_OK_ACKNOWLEDGE:
            consumer._pending_ack = ack
            consumer._pending_count += 1
            if consumer._pending_count >= max(1, consumer.prefetch // 4):
                consumer._flush_ack()
        elif mode == CLIENT_ACKNOWLEDGE:
            self._consumed.append((consumer, ack))
        else:  # transacted: ack inside the transaction now; COMMIT applies it
            headers = dict(ack)
            headers["transaction"] = self._tx
            self.connection._send(Frame("ACK", headers))
            self._consumed.append((consumer, ack))

    def _start_dispatcher(self) -> None:
        if self._dispatcher is None:
            self._listener_queue = _queue.SimpleQueue()
            self._dispatcher = threading.Thread(target=self._dispatch_loop, name="pymq-session-dispatch",
                                                daemon=True)
            self._dispatcher.start()

    def _dispatch_loop(self) -> None:
        q = self._listener_queue
        conn = self.connection
        while True:
            item = q.get()
            if item is None:
                if self._closed or conn.closed:
                    return
                continue
            consumer, frame = item
            while not conn._started.wait(0.5):
                if self._closed or conn.closed:
                    return
            if consumer._closed:
                continue
            listener = consumer._listener
            message, ack = consumer._to_message(frame)
            # a listener runs when the session is free: wait for a thread inside it to finish
            # (JMS: the session serialises its listeners with the application's own use of it)
            try:
                entered = self._guard.waiting()
                entered.__enter__()
            except IllegalStateError:
                return                      # the session closed while the message waited
            try:
                try:
                    listener(message)
                except Exception:
                    log.exception("message listener of %s raised; the message will be redelivered",
                                  consumer.destination)
                    if self.ack_mode in (AUTO_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE):
                        consumer._nack(ack)
                    continue
                try:
                    self._consumed_one(consumer, ack)
                except PymqError as exc:
                    log.warning("acknowledging after the listener failed: %s", exc)
            finally:
                entered.__exit__(None, None, None)


class MessageProducer:
    """Sends messages; created by a Session and used from its thread."""

    def __init__(self, session: Session, destination: Destination | None) -> None:
        self._session = session
        self.destination = destination
        self.delivery_mode = PERSISTENT
        self.priority = 4
        self.time_to_live = 0          # ms, 0 = forever
        self.delivery_delay = 0        # ms (JMS 2.0)
        self._closed = False

    @_guarded
    def send(self, message: Any, destination: Destination | str | None = None, *,
             delivery_mode: int | None = None, priority: int | None = None,
             time_to_live: int | None = None, delivery_delay: int | None = None,
             transaction: Any = None) -> Message:
        """Send ``message`` (a Message, or str/bytes/dict made into one); returns the Message sent.

        Persistent messages outside a transaction wait for the broker's receipt, which comes once
        the message is durable (disable with ``ConnectionFactory(sync_send=False)``).
        """
        if self._closed:
            raise IllegalStateError("the producer is closed")
        session = self._session
        session._check()
        if transaction is not None:
            from pymq.client.apptx import send_in_transaction
            return send_in_transaction(self, message, destination, transaction, delivery_mode=delivery_mode,
                                       priority=priority, time_to_live=time_to_live)
        msg, frame = send_frame(self, message, destination, delivery_mode=delivery_mode, priority=priority,
                                time_to_live=time_to_live, delivery_delay=delivery_delay)
        headers = frame.headers
        mode = msg.delivery_mode
        conn = session.connection
        if session.transacted:
            headers["transaction"] = session._tx
            conn._send(frame)
        elif mode == PERSISTENT and conn.factory.sync_send:
            receipt = conn._request(frame)
            msg.message_id = receipt.get("message-id")
        else:
            conn._send(frame)
        return msg

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "MessageProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MessageConsumer:
    """Receives from one destination; created by a Session and used from its thread."""

    def __init__(self, session: Session, destination: Destination, selector: str | None, prefetch: int) -> None:
        self._session = session
        self.destination = destination
        self.selector = selector
        self.prefetch = prefetch
        self._inbox: _queue.SimpleQueue = _queue.SimpleQueue()
        self._listener: Callable[[Message], None] | None = None
        self._closed = False
        self._pending_ack: dict | None = None
        self._pending_count = 0
        self._sub_id = session.connection._register(self)

    # reader thread
    def _arrived(self, frame: Frame) -> None:
        if self._listener is not None:
            self._session._listener_queue.put((self, frame))
        else:
            self._inbox.put(frame)

    def _wake(self) -> None:
        self._inbox.put(_CLOSED)

    def _to_message(self, frame: Frame) -> tuple[Message, dict]:
        h = frame.headers
        message = from_frame(h, frame.body)
        if self._session.connection.version == "1.2":
            ack = {"id": h.get("ack", "")}
        else:
            ack = {"message-id": h.get("message-id", ""), "subscription": self._sub_id}
        session = self._session
        if session.ack_mode == CLIENT_ACKNOWLEDGE:
            message._acknowledge = session.acknowledge
        return message, ack

    def _ack(self, ack: dict) -> None:
        self._session.connection._send(Frame("ACK", ack))

    def _nack(self, ack: dict) -> None:
        if self._session.connection.version == "1.0":
            return  # 1.0 has no NACK: the message returns when the subscription ends
        self._session.connection._send(Frame("NACK", ack))

    def _flush_ack(self) -> None:
        if self._pending_ack is not None:
            ack, self._pending_ack = self._pending_ack, None
            self._pending_count = 0
            self._ack(ack)

    @_guarded
    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever); None on timeout."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if self._listener is not None:
            raise IllegalStateError("receive() cannot be used on a consumer with a message listener")
        conn = self._session.connection
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not conn._started.is_set():
                if not conn._started.wait(remaining if remaining is not None else 3600):
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                    continue
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                frame = self._inbox.get_nowait()
            except _queue.Empty:
                # about to wait: let the broker refill credit held by batched (dups-ok) acks
                self._flush_ack()
                if remaining == 0.0:
                    return None
                try:
                    frame = self._inbox.get(timeout=remaining)
                except _queue.Empty:
                    return None
            if frame is _CLOSED:
                if self._closed or conn.closed:
                    conn._check_open()
                    raise IllegalStateError("the consumer is closed")
                continue
            message, ack = self._to_message(frame)
            self._session._consumed_one(self, ack)
            return message

    def receive_no_wait(self) -> Message | None:
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
    def message_listener(self) -> Callable[[Message], None] | None:
        return self._listener

    @message_listener.setter
    def message_listener(self, listener: Callable[[Message], None] | None) -> None:
        self.set_message_listener(listener)

    def set_message_listener(self, listener: Callable[[Message], None] | None) -> None:
        """Deliver messages to ``listener`` on the session's dispatcher thread (one at a time)."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        session = self._session
        session._start_dispatcher()
        self._listener = listener
        if listener is not None:
            # messages that arrived before the listener was set go to it, in order
            while True:
                try:
                    frame = self._inbox.get_nowait()
                except _queue.Empty:
                    break
                if frame is not _CLOSED:
                    session._listener_queue.put((self, frame))

    def close(self) -> None:
        if self._closed:
            return
        conn = self._session.connection
        try:
            self._flush_ack()
        except PymqError:
            pass
        self._closed = True
        self._inbox.put(_CLOSED)
        if not conn.closed:
            try:
                conn._request(Frame("UNSUBSCRIBE", {"id": self._sub_id}))
            except PymqError:
                pass
        conn._unregister(self._sub_id)
        if self in self._session._consumers:
            self._session._consumers.remove(self)

    def __enter__(self) -> "MessageConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class QueueBrowser:
    """Looks at a queue's messages in delivery order without removing them."""

    def __init__(self, session: Session, queue: Destination, selector: str | None) -> None:
        if isinstance(queue, Topic):
            raise IllegalStateError("browsers read queues, not topics")
        self._session = session
        self.queue = queue
        self.selector = selector

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def messages(self, timeout: float | None = None) -> list[Message]:
        """A snapshot of the messages waiting now (each call takes a new one)."""
        return _browse(self._session, self.queue, {"selector": self.selector} if self.selector else {},
                       timeout).messages

    get_enumeration = messages

    def close(self) -> None:
        pass

    def __enter__(self) -> "QueueBrowser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RangeResult:
    """What a range read returned: the messages (with ``.sequence``) and the destination's bounds; with
    ``read_range(frames=True)``, the messages' ``(headers, body)`` pairs in ``frames`` instead."""

    __slots__ = ("messages", "earliest", "latest", "next_seq", "frames")

    def __init__(self, messages: list, earliest: int, latest: int, next_seq: int,
                 frames: list[tuple[dict, bytes]] | None = None) -> None:
        self.messages = messages
        self.earliest = earliest      # first sequence number still available
        self.latest = latest          # last sequence number the destination assigned
        self.next_seq = next_seq      # where the next read continues
        self.frames = frames if frames is not None else []

    def __repr__(self) -> str:
        return (f"RangeResult({len(self.messages) or len(self.frames)} messages, earliest={self.earliest}, "
                f"latest={self.latest}, next_seq={self.next_seq})")


def _browse(session: "Session", destination: Destination, extra: dict, timeout: float | None,
            frames: bool = False) -> RangeResult:
    """One browse subscription (spec/stomp.md §9); the broker ends it after ``browser:end``."""
    conn = session.connection
    consumer = MessageConsumer(session, destination, None, 0)
    headers = {"destination": destination.stomp_name, "id": consumer._sub_id, "browser": "true",
               "ack": "auto"}
    headers.update({k: str(v) for k, v in extra.items() if v is not None})
    out: list = []          # Messages, or (headers, body) pairs with frames=True
    try:
        conn._request(Frame("SUBSCRIBE", headers))
        deadline = time.monotonic() + (timeout if timeout is not None else conn.factory.timeout)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the browse did not finish in time")
            try:
                frame = consumer._inbox.get(timeout=remaining)
            except _queue.Empty:
                continue
            if frame is _CLOSED:
                conn._check_open()
                raise IllegalStateError("the connection closed during the browse")
            if frame.headers.get("browser") == "end":
                h = frame.headers
                bounds = (int(h.get("pymq-earliest-seq", 0)), int(h.get("pymq-latest-seq", 0)),
                          int(h.get("pymq-next-seq", 0)))
                return RangeResult([], *bounds, frames=out) if frames else RangeResult(out, *bounds)
            out.append((frame.headers, frame.body) if frames else from_frame(frame.headers, frame.body))
    finally:
        conn._unregister(consumer._sub_id)


class Requestor:
    """Request/reply over a temporary queue: ``Requestor(session, Queue("svc")).request(msg, timeout)``."""

    def __init__(self, session: Session, destination: Destination | str) -> None:
        self.session = session
        self.destination = as_destination(destination)
        self.reply_queue = session.create_temporary_queue()
        self._consumer = session.create_consumer(self.reply_queue)
        self._producer = session.create_producer(self.destination)

    def request(self, message: Any, timeout: float | None = 10.0) -> Message:
        msg = make_message(message)
        msg.reply_to = self.reply_queue
        msg.correlation_id = uuid.uuid4().hex
        self._producer.send(msg, delivery_mode=NON_PERSISTENT)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no reply from {self.destination} within {timeout}s")
            reply = self._consumer.receive(remaining)
            if reply is None:
                continue
            if reply.correlation_id == msg.correlation_id:
                return reply
            # a late reply to an earlier, timed-out request: drop it

    def close(self) -> None:
        self._consumer.close()
        self._producer.close()


def reply(session: Session, request: Message, response: Any) -> Message:
    """Answer ``request`` on its reply-to destination, copying its correlation id."""
    if request.reply_to is None:
        raise IllegalStateError("the request has no reply-to destination")
    msg = make_message(response)
    msg.correlation_id = request.correlation_id or request.message_id
    producer = session.create_producer(request.reply_to)
    return producer.send(msg, delivery_mode=NON_PERSISTENT)
