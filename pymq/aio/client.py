"""The asyncio JMS-style API: AsyncConnectionFactory → AsyncConnection → AsyncSession → producers, consumers.

It mirrors :mod:`pymq.client.blocking` object for object and rule for rule; what waits is a coroutine.
The message model (:mod:`pymq.message`), destinations, errors and the STOMP state machine are the shared
ones; only the waiting differs.

Invariants:
* A connection's ``status`` moves CONNECTING → OPEN → CLOSING → CLOSED (or straight to CLOSED when the
  broker is lost); only OPEN accepts new work.  Every task the connection or a session starts (listener
  dispatchers, asynchronous exception listeners, the transport's heart-beat) is owned and ended by
  ``close()``.
* Every wait has a timeout: receipts and DISCONNECT use the factory's ``timeout``, ``receive`` and
  ``request`` take one (``None`` = JMS's wait-forever, the caller's explicit choice).
* A consumer's buffer holds at most ``prefetch`` messages: consumers subscribe with ``client`` or
  ``client-individual`` acks and a ``prefetch-count``, so the broker's credit bounds the buffer
  (``prefetch=0`` asks for no limit).  A browse holds at most the queue's depth at browse time.
* A session belongs to one task at a time: a second task calling into it while the first is suspended
  inside it gets :class:`IllegalStateError` at once (JMS's single-threaded session rule).  Listeners
  run in the session's dispatcher task, one message at a time, and may use their own session.
"""
from __future__ import annotations

import asyncio
import collections
import enum
import functools
import inspect
import itertools
import logging
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Union

from pymq.client.frames import (SessionFactories, ack_upto_frame, range_headers, send_frame,
                                subscribe_headers)
from pymq.client.blocking import (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE,
                                  SESSION_TRANSACTED, _MODE_NAMES, RangeResult)
from pymq.destination import Destination, Queue, Topic, as_destination
from pymq.errors import (ConnectionClosed, IllegalStateError, PymqError,
                         error_from_headers)
from pymq.errors import TimeoutError as PymqTimeout
from pymq.message import NON_PERSISTENT, PERSISTENT, Message, from_frame, make_message
from pymq.protocol.frame import Frame
from pymq.aio.transport import AsyncTransport, transport_for

log = logging.getLogger("pymq.aio")

MessageListener = Callable[[Message], Union[None, Awaitable[None]]]
ExceptionListener = Callable[[PymqError], Union[None, Awaitable[None]]]


class ConnectionStatus(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class _Expired(Exception):
    """Set on one of our own futures when its wait ran out of time (never escapes _wait)."""


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


async def _wait(fut: Awaitable, timeout: float | None) -> bool:
    """Await ``fut`` for at most ``timeout`` seconds (None: no limit); False if the time ran out.

    For a plain future of ours (receipts, arrivals) one timer handle does it: ``wait_for`` would add
    a second future and callbacks on every receipt, the hot path of persistent sends."""
    if timeout is None:
        await fut
        return True
    if isinstance(fut, asyncio.Future) and not isinstance(fut, asyncio.Task):
        if fut.done():
            return True
        handle = fut.get_loop().call_later(timeout, _expire, fut)
        try:
            await fut
        except _Expired:
            return False
        finally:
            handle.cancel()
        return True
    try:
        await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        return False
    return True


# -- factory and connect ---------------------------------------------------------------------------------

class AsyncConnectionFactory:
    """Connection settings; ``await create_connection()`` returns a stopped connection (JMS semantics)."""

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

    async def create_connection(self, username: str | None = None,
                                password: str | None = None) -> "AsyncConnection":
        conn = AsyncConnection(self, transport_for(self.url, heartbeat=self.heartbeat))
        await conn._open(username or self.username, password if password is not None else self.password)
        return conn


class _Connecting:
    """What :func:`connect` returns: await it for the connection, or ``async with`` it to close on exit."""

    __slots__ = ("_factory", "_username", "_password", "_start", "_conn")

    def __init__(self, factory: AsyncConnectionFactory, username, password, start: bool) -> None:
        self._factory, self._username, self._password, self._start = factory, username, password, start
        self._conn: AsyncConnection | None = None

    async def _go(self) -> "AsyncConnection":
        conn = await self._factory.create_connection(self._username, self._password)
        if self._start:
            await conn.start()
        self._conn = conn
        return conn

    def __await__(self):
        return self._go().__await__()

    async def __aenter__(self) -> "AsyncConnection":
        return await self._go()

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()


def connect(url: str = "vm://default", *, username: str | None = None, password: str | None = None,
            client_id: str | None = None, timeout: float = 10.0,
            heartbeat: tuple[int, int] = (10_000, 10_000), prefetch: int = 1000, sync_send: bool = True,
            start: bool = True, host: str | None = None) -> _Connecting:
    """Open a connection (started unless ``start=False``)::

        conn = await pymq.aio.connect("stomp://127.0.0.1:61613")
        async with pymq.aio.connect("vm://default") as conn: ...
    """
    factory = AsyncConnectionFactory(url, client_id=client_id, timeout=timeout, heartbeat=heartbeat,
                                     prefetch=prefetch, sync_send=sync_send, host=host)
    return _Connecting(factory, username, password, start)


# -- connection --------------------------------------------------------------------------------------------

class AsyncConnection:
    """A connection to a broker, shared by any number of tasks of its event loop."""

    def __init__(self, factory: AsyncConnectionFactory, transport: AsyncTransport) -> None:
        self.factory = factory
        self.status = ConnectionStatus.CONNECTING
        self.exception_listener: ExceptionListener | None = None
        self.version = "1.2"
        self.server = ""
        self.client_id = factory.client_id
        self.user: str | None = None
        self._transport = transport
        self._loop = asyncio.get_running_loop()   # made by create_connection, inside its loop
        self._receipts: dict[str, asyncio.Future] = {}
        self._receipt_ids = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._subscriptions: dict[str, Any] = {}      # sub id -> consumer or browse receiver
        self._sessions: list[AsyncSession] = []
        self._started = asyncio.Event()   # also set when the connection ends, to wake every waiter
        self._error: PymqError | None = None
        self._tasks: set[asyncio.Task] = set()
        transport.on_frame = self._on_frame
        transport.on_lost = self._on_lost

    async def _open(self, username: str | None, password: str | None) -> None:
        headers = {"accept-version": "1.0,1.1,1.2", "host": self.factory.host or "/"}
        if username is not None:
            headers["login"] = username
        if password is not None:
            headers["passcode"] = password
        if self.factory.client_id:
            headers["client-id"] = self.factory.client_id
        try:
            connected = await self._transport.connect(headers, self.factory.timeout)
        except BaseException:
            self.status = ConnectionStatus.CLOSED
            raise
        self.version = self._transport.version
        self.server = connected.headers.get("server", "")
        self.user = connected.headers.get("user-name", username)
        if self.status is ConnectionStatus.CONNECTING:   # not lost meanwhile
            self.status = ConnectionStatus.OPEN

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start (or resume) delivery of incoming messages to receivers and listeners."""
        self._check_usable()
        self._started.set()

    async def stop(self) -> None:
        """Pause delivery; ``receive`` waits and listeners are not called until ``start``."""
        self._check_usable()
        self._started.clear()

    async def close(self) -> None:
        """Close every session, say DISCONNECT (waiting for its receipt), close the transport and end
        the tasks this connection owns.  Closing twice is harmless."""
        if self.status in (ConnectionStatus.CLOSING, ConnectionStatus.CLOSED):
            if self.status is ConnectionStatus.CLOSED:
                await self._transport.close()     # a lost connection still releases its socket
                await self._end_tasks()
            return
        self.status = ConnectionStatus.CLOSING
        for session in list(self._sessions):
            await session._close_local(unsubscribe=False)   # DISCONNECT ends the subscriptions
        if self._error is None and not self._transport.closed:
            try:
                await self._request(Frame("DISCONNECT", {}), timeout=min(5.0, self.factory.timeout))
            except PymqError:
                pass
        await self._transport.close()
        self.status = ConnectionStatus.CLOSED
        self._started.set()
        await self._end_tasks()

    async def _end_tasks(self) -> None:
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> "AsyncConnection":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self.status is ConnectionStatus.CLOSED or self._transport.closed

    def _check_open(self) -> None:
        """Frames may flow (also while CLOSING: sessions flush their acknowledgements)."""
        if self._error is not None:
            raise ConnectionClosed(f"the connection failed: {self._error}") from self._error
        if self.status is ConnectionStatus.CLOSED or self._transport.closed:
            raise IllegalStateError("the connection is closed")

    def _check_usable(self) -> None:
        """The application may start new work."""
        self._check_open()
        if self.status is not ConnectionStatus.OPEN:
            raise IllegalStateError(f"the connection is {self.status.value}")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise IllegalStateError("this connection belongs to another event loop; pymq.aio objects "
                                    "are used from the loop that created them")

    # -- sessions ----------------------------------------------------------------------------------
    def create_session(self, transacted: bool = False, ack_mode: int = AUTO_ACKNOWLEDGE) -> "AsyncSession":
        self._check_usable()
        mode = SESSION_TRANSACTED if transacted else ack_mode
        if mode not in _MODE_NAMES:
            raise IllegalStateError(f"unknown acknowledge mode {ack_mode!r}")
        session = AsyncSession(self, mode)
        self._sessions.append(session)
        return session

    # -- frames ------------------------------------------------------------------------------------
    def _send(self, frame: Frame) -> None:
        self._check_open()
        self._transport.send(frame)

    async def _send_flowing(self, frame: Frame) -> None:
        """Send a SEND, first waiting while the broker holds back this connection's producers."""
        if self._transport.paused:
            await self._transport.writable(max(30.0, self.factory.timeout))
        self._send(frame)

    async def _request(self, frame: Frame, timeout: float | None = None) -> dict:
        """Send ``frame`` with a receipt and wait for it; an ERROR answering it raises here."""
        rid = f"r{next(self._receipt_ids)}"
        fut = self._loop.create_future()
        self._receipts[rid] = fut
        headers = dict(frame.headers)
        headers["receipt"] = rid
        try:
            if frame.command == "SEND" and self._transport.paused:
                await self._transport.writable(max(30.0, self.factory.timeout))
            self._send(Frame(frame.command, headers, frame.body))
            timeout = self.factory.timeout if timeout is None else timeout
            if not await _wait(fut, timeout):
                raise PymqTimeout(f"no receipt for {frame.command} within {timeout:g}s")
            return fut.result()
        finally:
            self._receipts.pop(rid, None)

    def _on_frame(self, frame: Frame) -> None:
        # the transport's callback: never waits
        command = frame.command
        if command == "MESSAGE":
            receiver = self._subscriptions.get(frame.headers.get("subscription", ""))
            if receiver is not None:
                receiver._arrived(frame)
        elif command == "RECEIPT":
            fut = self._receipts.pop(frame.headers.get("receipt-id", ""), None)
            if fut is not None and not fut.done():
                fut.set_result(frame.headers)
        elif command == "ERROR":
            rid = frame.headers.get("receipt-id")
            fut = self._receipts.pop(rid, None) if rid is not None else None
            if fut is not None and not fut.done():
                fut.set_exception(error_from_headers(frame.headers, frame.body.decode("utf-8", "replace")))

    def _on_lost(self, error: PymqError) -> None:
        expected = self.status in (ConnectionStatus.CLOSING, ConnectionStatus.CLOSED)
        if not expected:
            self._error = error
            self.status = ConnectionStatus.CLOSED
        receipts, self._receipts = self._receipts, {}
        for fut in receipts.values():
            if not fut.done():
                fut.set_exception(error if not expected else ConnectionClosed("the connection was closed"))
        self._started.set()
        for receiver in list(self._subscriptions.values()):
            receiver._wake()
        for session in list(self._sessions):
            session._wake()
        listener = self.exception_listener
        if listener is not None and not expected:
            try:
                result = listener(error)
            except Exception:
                log.exception("exception listener failed")
                return
            if inspect.isawaitable(result):
                self._own(self._run_listener(result))

    async def _run_listener(self, awaitable: Awaitable) -> None:
        try:
            await awaitable
        except Exception:
            log.exception("exception listener failed")

    def _own(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _register(self, receiver) -> str:
        sub_id = f"s{next(self._sub_ids)}"
        self._subscriptions[sub_id] = receiver
        return sub_id

    def _unregister(self, sub_id: str) -> None:
        self._subscriptions.pop(sub_id, None)


# -- session -------------------------------------------------------------------------------------------

def _guarded(method):
    """Run a coroutine method with its session owned by the calling task (re-entrant for that task)."""

    @functools.wraps(method)
    async def wrapper(self, *args, **kwargs):
        session = self._session
        me = session._enter()
        if me is None:                       # already ours: a listener using its own session
            return await method(self, *args, **kwargs)
        try:
            return await method(self, *args, **kwargs)
        finally:
            session._leave()
    return wrapper


class AsyncSession(SessionFactories):
    """A single-task context for producing and consuming (see the module docstring)."""

    def __init__(self, connection: AsyncConnection, ack_mode: int) -> None:
        self.connection = connection
        self.ack_mode = ack_mode
        self.transacted = ack_mode == SESSION_TRANSACTED
        self._session = self                 # what _guarded looks up on every guarded object
        self._owner: asyncio.Task | None = None
        self._released: asyncio.Future | None = None   # the dispatcher waiting for the owner to leave
        self._closed = False
        self._consumers: list[AsyncMessageConsumer] = []
        self._producers: list[AsyncMessageProducer] = []
        self._consumed: list[tuple[AsyncMessageConsumer, dict]] = []   # unacked (client ack / transaction)
        self._tx: str | None = None
        self._listener_queue: collections.deque = collections.deque()
        self._dispatch_wakeup: asyncio.Future | None = None
        self._dispatcher: asyncio.Task | None = None
        self._in_listener = False
        if self.transacted:
            self._begin()

    # -- the one-task rule ---------------------------------------------------------------------------
    def _enter(self) -> asyncio.Task | None:
        if self._closed:
            raise IllegalStateError("the session is closed")
        me = asyncio.current_task()
        owner = self._owner
        if owner is me:
            return None
        if owner is not None:
            raise IllegalStateError("the session is in use by another task; a session is used by one "
                                    "task at a time (create one session per task)")
        self._owner = me
        return me

    def _leave(self) -> None:
        self._owner = None
        released = self._released
        if released is not None and not released.done():
            released.set_result(None)

    def _check_owner(self) -> None:
        """For calls that do not wait: refuse while another task is suspended inside the session."""
        self._check()
        owner = self._owner
        if owner is not None and owner is not asyncio.current_task():
            raise IllegalStateError("the session is in use by another task; a session is used by one "
                                    "task at a time (create one session per task)")

    # -- factories -------------------------------------------------------------------------------------
    def create_producer(self, destination: Destination | str | None = None) -> "AsyncMessageProducer":
        self._check()
        producer = AsyncMessageProducer(self, as_destination(destination) if destination is not None else None)
        self._producers.append(producer)
        return producer

    @_guarded
    async def create_consumer(self, destination: Destination | str, selector: str | None = None, *,
                              no_local: bool = False, prefetch: int | None = None) -> "AsyncMessageConsumer":
        return await self._subscribe(as_destination(destination), selector=selector, no_local=no_local,
                                     prefetch=prefetch)

    @_guarded
    async def create_durable_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                      no_local: bool = False,
                                      prefetch: int | None = None) -> "AsyncMessageConsumer":
        """A durable subscription ``name`` (scoped by the connection's client id, else its user)."""
        target = as_destination(topic)
        if not isinstance(target, Topic):
            raise IllegalStateError("durable subscriptions are made on topics")
        return await self._subscribe(target, selector=selector, no_local=no_local, prefetch=prefetch,
                                     extra={"durable-subscription-name": name})

    create_durable_subscriber = create_durable_consumer

    @_guarded
    async def create_shared_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                     prefetch: int | None = None) -> "AsyncMessageConsumer":
        """JMS 2.0 shared non-durable subscription: consumers with the same name share the messages."""
        return await self._subscribe(as_destination(topic), selector=selector, prefetch=prefetch,
                                     extra={"shared-subscription-name": name})

    @_guarded
    async def create_shared_durable_consumer(self, topic: Topic | str, name: str,
                                             selector: str | None = None, *,
                                             prefetch: int | None = None) -> "AsyncMessageConsumer":
        return await self._subscribe(as_destination(topic), selector=selector, prefetch=prefetch,
                                     extra={"durable-subscription-name": name, "shared": "true"})

    @_guarded
    async def unsubscribe(self, name: str, *, shared: bool = False) -> None:
        """Delete durable subscription ``name`` (it must have no active consumer)."""
        headers = {"id": f"unsub-{uuid.uuid4().hex[:8]}", "pymq-durable-name": name}
        if shared:
            headers["shared"] = "true"
        await self.connection._request(Frame("UNSUBSCRIBE", headers))

    def create_browser(self, queue: Queue | str, selector: str | None = None) -> "AsyncQueueBrowser":
        self._check_owner()
        return AsyncQueueBrowser(self, as_destination(queue), selector)

    @_guarded
    async def read_range(self, destination: Destination | str, *, from_seq: int | None = None,
                         to_seq: int | None = None, max_messages: int | None = None,
                         max_bytes: int | None = None, from_timestamp: int | None = None,
                         selector: str | None = None, subscription: str | None = None, source: str | None = None,
                         timeout: float | None = None) -> RangeResult:
        """Messages with ``from_seq <= sequence < to_seq`` without removing them (spec/stomp.md §9):
        from a destination's retained log, a queue, or (``subscription``) a durable subscription."""
        extra = range_headers(from_seq=from_seq, to_seq=to_seq, max_messages=max_messages, max_bytes=max_bytes,
                              from_timestamp=from_timestamp, selector=selector, subscription=subscription,
                              source=source)
        receiver = _BrowseReceiver(self.connection)
        messages = [m async for m in _browse(self, as_destination(destination), extra, timeout, receiver)]
        h = receiver.end or {}
        return RangeResult(messages, int(h.get("pymq-earliest-seq", 0)), int(h.get("pymq-latest-seq", 0)),
                           int(h.get("pymq-next-seq", 0)))

    async def bounds(self, destination: Destination | str, *,
                     subscription: str | None = None) -> tuple[int, int]:
        """(earliest available, latest assigned) sequence numbers of a destination."""
        result = await self.read_range(destination, max_messages=0, subscription=subscription)
        return result.earliest, result.latest

    @_guarded
    async def ack_upto(self, destination: Destination | str, seq: int, *,
                       subscription: str | None = None) -> None:
        """Acknowledge every waiting message below sequence number ``seq`` (a reader that owns the
        queue or durable subscription, acknowledging a committed batch)."""
        await self.connection._request(ack_upto_frame(destination, seq, subscription))

    def create_queue(self, name: str) -> Queue:
        return Queue(name)

    # -- transactions and acknowledgement ----------------------------------------------------------------
    def _begin(self) -> None:
        self._tx = f"tx-{uuid.uuid4().hex[:12]}"
        self.connection._send(Frame("BEGIN", {"transaction": self._tx}))

    @_guarded
    async def commit(self) -> None:
        """Make this transaction's sends visible and its receives acknowledged, atomically."""
        if not self.transacted:
            raise IllegalStateError("commit() needs a transacted session")
        tx = self._tx
        self._consumed.clear()
        await self.connection._request(Frame("COMMIT", {"transaction": tx}))
        self._begin()

    @_guarded
    async def rollback(self) -> None:
        """Discard this transaction's sends; messages it received come back, marked redelivered."""
        if not self.transacted:
            raise IllegalStateError("rollback() needs a transacted session")
        await self._rollback()

    async def _rollback(self) -> None:
        tx = self._tx
        consumed, self._consumed = self._consumed, []
        await self.connection._request(Frame("ABORT", {"transaction": tx}))
        for consumer, ack in consumed:
            consumer._nack(ack)
        self._begin()

    @_guarded
    async def recover(self) -> None:
        """Redeliver every message consumed but not yet acknowledged (non-transacted sessions)."""
        if self.transacted:
            raise IllegalStateError("recover() is for non-transacted sessions; use rollback()")
        consumed, self._consumed = self._consumed, []
        for consumer, ack in consumed:
            consumer._nack(ack)

    async def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message this session has consumed."""
        self._acknowledge_now()

    def _acknowledge_now(self) -> None:
        # also what Message.acknowledge() calls: ACKs need no answer, so this never waits
        self._check()
        if self.ack_mode != CLIENT_ACKNOWLEDGE:
            return
        consumed, self._consumed = self._consumed, []
        last: dict[AsyncMessageConsumer, dict] = {}
        for consumer, ack in consumed:
            last[consumer] = ack          # client acks are cumulative per subscription
        for consumer, ack in last.items():
            consumer._ack(ack)

    # -- lifecycle -------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise IllegalStateError("the session is closed")
        self.connection._check_open()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Roll back an open transaction, close the consumers (unsubscribing) and end the dispatcher."""
        if self._closed:
            return
        if self.transacted and self._tx is not None and not self.connection.closed:
            try:
                await self._rollback()
            except PymqError:
                pass
        await self._close_local(unsubscribe=True)

    async def _close_local(self, unsubscribe: bool) -> None:
        if self._closed:
            return
        for consumer in list(self._consumers):
            await consumer._close(unsubscribe)
        self._closed = True
        self._wake()
        dispatcher = self._dispatcher
        if dispatcher is not None and dispatcher is not asyncio.current_task() and not dispatcher.done():
            # a listener that is running may finish its message, within the connection's timeout;
            # an idle dispatcher (or one waiting for start) just ends
            if not self._in_listener or not await _wait(asyncio.shield(dispatcher),
                                                        self.connection.factory.timeout):
                dispatcher.cancel()
            try:
                await dispatcher
            except (asyncio.CancelledError, PymqError):
                pass
        if self in self.connection._sessions:
            self.connection._sessions.remove(self)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _wake(self) -> None:
        wakeup = self._dispatch_wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)
        for consumer in self._consumers:
            consumer._wake()

    # -- consumers -------------------------------------------------------------------------------------
    async def _subscribe(self, destination: Destination, *, selector: str | None = None,
                         no_local: bool = False, prefetch: int | None = None,
                         extra: dict | None = None) -> "AsyncMessageConsumer":
        self._check()
        conn = self.connection
        consumer = AsyncMessageConsumer(self, destination, selector,
                                        prefetch if prefetch is not None else conn.factory.prefetch)
        headers = subscribe_headers(destination, consumer._sub_id, self.ack_mode, consumer.prefetch,
                                    selector=selector, no_local=no_local, extra=extra)
        try:
            await conn._request(Frame("SUBSCRIBE", headers))
        except BaseException:
            conn._unregister(consumer._sub_id)
            raise
        self._consumers.append(consumer)
        return consumer

    def _consumed_one(self, consumer: "AsyncMessageConsumer", ack: dict) -> None:
        """Acknowledgement bookkeeping when the application gets a message (never waits)."""
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

    # -- listeners ---------------------------------------------------------------------------------------
    def _to_listener(self, consumer: "AsyncMessageConsumer", frame: Frame) -> None:
        self._listener_queue.append((consumer, frame))
        wakeup = self._dispatch_wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def _start_dispatcher(self) -> None:
        if self._dispatcher is None:
            self._dispatcher = self.connection._own(self._dispatch_loop())

    async def _dispatch_loop(self) -> None:
        q = self._listener_queue
        conn = self.connection
        loop = conn._loop
        while True:
            while not q:
                if self._closed or conn.closed:
                    return
                self._dispatch_wakeup = loop.create_future()
                await self._dispatch_wakeup
            if self._closed or conn.closed:
                return
            if not conn._started.is_set():
                await conn._started.wait()
                continue
            consumer, frame = q.popleft()
            if consumer._closed:
                continue
            listener = consumer._listener
            if listener is None:             # the listener was removed: back to receive()
                consumer._inbox.append(frame)
                consumer._wake()
                continue
            message, ack = consumer._to_message(frame)
            while self._owner is not None:   # the application is inside the session: wait its turn
                self._released = loop.create_future()
                await self._released
                if self._closed:
                    return
            self._owner = asyncio.current_task()
            self._in_listener = True
            try:
                try:
                    result = listener(message)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("message listener of %s raised; the message will be redelivered",
                                  consumer.destination)
                    if self.ack_mode in (AUTO_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE):
                        try:
                            consumer._nack(ack)
                        except PymqError as exc:
                            log.warning("returning the message after the listener failed: %s", exc)
                    continue
                try:
                    self._consumed_one(consumer, ack)
                except PymqError as exc:
                    log.warning("acknowledging after the listener returned: %s", exc)
            finally:
                self._in_listener = False
                self._leave()


# -- producer ---------------------------------------------------------------------------------------------

class AsyncMessageProducer:
    """Sends messages; created by a session and used from its task."""

    def __init__(self, session: AsyncSession, destination: Destination | None) -> None:
        self._session = session
        self.destination = destination
        self.delivery_mode = PERSISTENT
        self.priority = 4
        self.time_to_live = 0          # ms, 0 = forever
        self.delivery_delay = 0        # ms (JMS 2.0)
        self._closed = False

    @_guarded
    async def send(self, message: Any, destination: Destination | str | None = None, *,
                   delivery_mode: int | None = None, priority: int | None = None,
                   time_to_live: int | None = None, delivery_delay: int | None = None,
                   transaction: Any = None) -> Message:
        """Send ``message`` (a Message, or str/bytes/dict made into one); returns the Message sent.

        Persistent messages outside a transaction wait for the broker's receipt, which comes once
        the message is durable (disable with ``sync_send=False``).
        """
        if self._closed:
            raise IllegalStateError("the producer is closed")
        session = self._session
        session._check()
        if transaction is not None:
            raise IllegalStateError("application (database) transactions are not supported by pymq.aio; "
                                    "use a transacted session")
        msg, frame = send_frame(self, message, destination, delivery_mode=delivery_mode, priority=priority,
                                time_to_live=time_to_live, delivery_delay=delivery_delay)
        headers = frame.headers
        mode = msg.delivery_mode
        conn = session.connection
        if session.transacted:
            headers["transaction"] = session._tx
            await conn._send_flowing(frame)
        elif mode == PERSISTENT and conn.factory.sync_send:
            receipt = await conn._request(frame)
            msg.message_id = receipt.get("message-id")
        else:
            await conn._send_flowing(frame)
        return msg

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> "AsyncMessageProducer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# -- consumer ---------------------------------------------------------------------------------------------

class AsyncMessageConsumer:
    """Receives from one destination; created by a session and used from its task."""

    def __init__(self, session: AsyncSession, destination: Destination, selector: str | None,
                 prefetch: int) -> None:
        self._session = session
        self.destination = destination
        self.selector = selector
        self.prefetch = prefetch
        self._inbox: collections.deque = collections.deque()   # bounded by the broker's credit
        self._waiter: asyncio.Future | None = None
        self._listener: MessageListener | None = None
        self._closed = False
        self._pending_ack: dict | None = None
        self._pending_count = 0
        self._sub_id = session.connection._register(self)

    # the transport's callback
    def _arrived(self, frame: Frame) -> None:
        if self._listener is not None:
            self._session._to_listener(self, frame)
            return
        self._inbox.append(frame)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def buffered(self) -> int:
        """Messages delivered by the broker and not yet handed to the application."""
        return len(self._inbox) + sum(1 for c, _ in self._session._listener_queue if c is self)

    def _to_message(self, frame: Frame) -> tuple[Message, dict]:
        h = frame.headers
        message = from_frame(h, frame.body)
        session = self._session
        if session.connection.version == "1.2":
            ack = {"id": h.get("ack", "")}
        else:
            ack = {"message-id": h.get("message-id", ""), "subscription": self._sub_id}
        if session.ack_mode == CLIENT_ACKNOWLEDGE:
            message._acknowledge = session._acknowledge_now
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
    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever); None on timeout."""
        if self._listener is not None:
            raise IllegalStateError("receive() cannot be used on a consumer with a message listener")
        conn = self._session.connection
        loop = conn._loop
        deadline = None if timeout is None else loop.time() + timeout
        inbox = self._inbox
        while True:
            if self._closed:
                raise IllegalStateError("the consumer is closed")
            conn._check_open()
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            if not conn._started.is_set():
                if remaining == 0.0 or not await _wait(conn._started.wait(), remaining):
                    return None
                continue
            if inbox:
                message, ack = self._to_message(inbox.popleft())
                self._session._consumed_one(self, ack)
                return message
            # about to wait: let the broker refill credit held by batched (dups-ok) acks
            self._flush_ack()
            if remaining == 0.0:
                return None
            self._waiter = waiter = loop.create_future()
            try:
                if not await _wait(waiter, remaining):
                    return None
            finally:
                self._waiter = None

    async def receive_no_wait(self) -> Message | None:
        return await self.receive(timeout=0)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        """Messages until the consumer or its connection closes."""
        while True:
            try:
                message = await self.receive()
            except (IllegalStateError, ConnectionClosed):
                if self._closed or self._session._closed or self._session.connection.closed:
                    raise StopAsyncIteration from None
                raise
            if message is not None:
                return message

    @property
    def message_listener(self) -> MessageListener | None:
        return self._listener

    @message_listener.setter
    def message_listener(self, listener: MessageListener | None) -> None:
        self.set_message_listener(listener)

    def set_message_listener(self, listener: MessageListener | None) -> None:
        """Deliver messages to ``listener`` (a function or a coroutine function) in the session's
        dispatcher task, one at a time; ``None`` returns the consumer to ``receive``."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        session = self._session
        session._check_owner()
        self._listener = listener
        if listener is not None:
            session._start_dispatcher()
            # messages that arrived before the listener was set go to it, in order
            while self._inbox:
                session._to_listener(self, self._inbox.popleft())

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        await self._close(unsubscribe=True)

    async def _close(self, unsubscribe: bool) -> None:
        if self._closed:
            return
        conn = self._session.connection
        try:
            self._flush_ack()
        except PymqError:
            pass
        self._closed = True
        self._wake()
        if unsubscribe and not conn.closed:
            try:
                await conn._request(Frame("UNSUBSCRIBE", {"id": self._sub_id}))
            except PymqError:
                pass
        conn._unregister(self._sub_id)
        if self in self._session._consumers:
            self._session._consumers.remove(self)

    async def __aenter__(self) -> "AsyncMessageConsumer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# -- browser ------------------------------------------------------------------------------------------------

class _BrowseReceiver:
    """One browse subscription's frames (spec/stomp.md §4 ``browser:true``, §9 ranges); it unregisters
    itself at the broker's ``browser:end``, so an abandoned iteration leaves nothing registered."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        self.frames: collections.deque = collections.deque()
        self.end: dict | None = None          # the end marker's headers (range bounds)
        self.waiter: asyncio.Future | None = None
        self.sub_id = connection._register(self)

    def _arrived(self, frame: Frame) -> None:
        if frame.headers.get("browser") == "end":
            self.end = frame.headers
            self.connection._unregister(self.sub_id)
        else:
            self.frames.append(frame)
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def _browse(session: AsyncSession, destination: Destination, extra: dict, timeout: float | None,
                  receiver: _BrowseReceiver | None = None) -> AsyncIterator[Message]:
    """Subscribe with ``browser:true`` (plus ``extra`` headers) and yield each message as it arrives,
    until the broker's end marker (then ``receiver.end`` holds its headers)."""
    conn = session.connection
    receiver = receiver or _BrowseReceiver(conn)
    headers = {"destination": destination.stomp_name, "id": receiver.sub_id, "browser": "true", "ack": "auto"}
    headers.update({k: str(v) for k, v in extra.items() if v is not None})
    loop = conn._loop
    try:
        await conn._request(Frame("SUBSCRIBE", headers))
        timeout = conn.factory.timeout if timeout is None else timeout
        deadline = loop.time() + timeout
        while True:
            if receiver.frames:
                frame = receiver.frames.popleft()
                yield from_frame(frame.headers, frame.body)
                continue
            if receiver.end is not None:
                return
            conn._check_open()
            remaining = deadline - loop.time()
            receiver.waiter = loop.create_future()
            if remaining <= 0 or not await _wait(receiver.waiter, remaining):
                raise PymqTimeout(f"the browse of {destination} did not finish within {timeout:g}s")
    finally:
        conn._unregister(receiver.sub_id)


class AsyncQueueBrowser:
    """Looks at a queue's messages in delivery order without removing them (``async for``)."""

    def __init__(self, session: AsyncSession, queue: Destination, selector: str | None) -> None:
        if isinstance(queue, Topic):
            raise IllegalStateError("browsers read queues, not topics")
        self._session = session
        self.queue = queue
        self.selector = selector
        self._closed = False

    def _browse(self, timeout: float | None) -> AsyncIterator[Message]:
        """Each waiting message once, as it arrives; each browse is a new snapshot.  The broker ends
        the browse subscription itself after its ``browser:end`` marker."""
        if self._closed:
            raise IllegalStateError("the browser is closed")
        self._session._check_owner()
        return _browse(self._session, self.queue, {"selector": self.selector or None}, timeout)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._browse(None)

    async def messages(self, timeout: float | None = None) -> list[Message]:
        """A snapshot of the messages waiting now (each call takes a new one)."""
        return [m async for m in self._browse(timeout)]

    get_enumeration = messages

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> "AsyncQueueBrowser":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# -- request/reply --------------------------------------------------------------------------------------------

class AsyncRequestor:
    """Request/reply over a temporary queue::

        async with AsyncRequestor(session, Queue("svc")) as requestor:
            answer = await requestor.request("ping", timeout=5)
    """

    def __init__(self, session: AsyncSession, destination: Destination | str) -> None:
        self.session = session
        self.destination = as_destination(destination)
        self.reply_queue = session.create_temporary_queue()
        self._producer = session.create_producer(self.destination)
        self._consumer: AsyncMessageConsumer | None = None

    async def request(self, message: Any, timeout: float | None = 10.0) -> Message:
        if self._consumer is None:     # subscribe before the first request can be answered
            self._consumer = await self.session.create_consumer(self.reply_queue)
        msg = make_message(message)
        msg.reply_to = self.reply_queue
        msg.correlation_id = uuid.uuid4().hex
        await self._producer.send(msg, delivery_mode=NON_PERSISTENT)
        loop = self.session.connection._loop
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise PymqTimeout(f"no reply from {self.destination} within {timeout}s")
            reply = await self._consumer.receive(remaining)
            if reply is None:
                continue
            if reply.correlation_id == msg.correlation_id:
                return reply
            # a late reply to an earlier, timed-out request: drop it

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.close()
        await self._producer.close()

    async def __aenter__(self) -> "AsyncRequestor":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def reply(session: AsyncSession, request: Message, response: Any) -> Message:
    """Answer ``request`` on its reply-to destination, copying its correlation id."""
    if request.reply_to is None:
        raise IllegalStateError("the request has no reply-to destination")
    msg = make_message(response)
    msg.correlation_id = request.correlation_id or request.message_id
    producer = session.create_producer(request.reply_to)
    return await producer.send(msg, delivery_mode=NON_PERSISTENT)
