"""The asyncio JMS-style API: AsyncConnectionFactory → AsyncConnection → AsyncSession → producers, consumers.

A thin shell over the client core (:mod:`pymq.client._core`), the same one the blocking SDK uses: the
state, the frames and the acknowledgement rules are written once there, and this module adds futures,
tasks and ``await``.

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
import functools
import inspect
import logging
import ssl
from typing import (Any, Concatenate,
                    ParamSpec, Protocol, TypeVar, Union)
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator

from pymq.client._core import (EXCLUSIVE_HEADERS, SESSION_TRANSACTED, AckMode, BrowseCore, ConnectionCore,
                               ConnectionSettings, ConnectionStatus, ConsumerCore, Headers, ProducerCore, RangeResult,
                               SessionCore, ack_mode_of, browse_queue, durable_headers, durable_topic, reply_message,
                               request_message, shared_durable_headers, shared_headers, unsubscribe_frame)
from pymq.client.admin import (AdminCall, AdminInbox, JsonObject, admin_result, alter_call, create_call,
                               destinations_call, drop_call, grant_call, info_call, list_call, metrics_call,
                               purge_call)
from pymq.client.frames import ack_upto_frame, bulk_frame, range_headers
from pymq.client.url import TlsOptions
from pymq.destination import Destination, Queue, Topic, as_destination
from pymq.errors import ConnectionClosed, IllegalStateError, PymqError
from pymq.errors import TimeoutError as PymqTimeout
from pymq.message import NON_PERSISTENT, Message, MessageBody
from pymq.protocol.frame import Frame
from pymq.aio.transport import AsyncTransport, transport_for

log = logging.getLogger("pymq.aio")

MessageListener = Callable[[Message], Union[None, Awaitable[None]]]
ExceptionListener = Callable[[PymqError], Union[None, Awaitable[None]]]
_T = TypeVar("_T")


class _Expired(Exception):
    """Set on one of our own futures when its wait ran out of time (never escapes _wait)."""


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


async def _wait(fut: Awaitable[object], timeout: float | None) -> bool:
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


class _Receipt:
    """One receipt awaited by a task."""

    __slots__ = ("future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[Headers] = loop.create_future()

    def resolve(self, headers: Headers) -> None:
        if not self.future.done():
            self.future.set_result(headers)

    def fail(self, error: PymqError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


# -- factory and connect ---------------------------------------------------------------------------------

class AsyncConnectionFactory(ConnectionSettings):
    """Connection settings; ``await create_connection()`` returns a stopped connection (JMS semantics).

    ``url`` follows :mod:`pymq.client.url`; explicit ``username``/``password``/``tls`` win over the URL."""

    async def create_connection(self, username: str | None = None,
                                password: str | None = None) -> AsyncConnection:
        """A new, stopped connection (``await start()`` to receive); the arguments override the factory's."""
        transport = transport_for(self.address, heartbeat=self.heartbeat, ssl_context=self._ssl_context(),
                                  server_hostname=self._server_hostname())
        conn = AsyncConnection(self, transport)
        await conn._open(*self._credentials(username, password))
        return conn


class _Connecting:
    """What :func:`connect` returns: await it for the connection, or ``async with`` it to close on exit."""

    __slots__ = ("_factory", "_start", "_conn")

    def __init__(self, factory: AsyncConnectionFactory, start: bool) -> None:
        self._factory, self._start = factory, start
        self._conn: AsyncConnection | None = None

    async def _go(self) -> AsyncConnection:
        conn = await self._factory.create_connection()
        if self._start:
            await conn.start()
        self._conn = conn
        return conn

    def __await__(self) -> Generator[Any, None, AsyncConnection]:
        return self._go().__await__()

    async def __aenter__(self) -> AsyncConnection:
        return await self._go()

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()


def connect(url: str = "vm://default", *, username: str | None = None, password: str | None = None,
            client_id: str | None = None, timeout: float = 10.0,
            heartbeat: tuple[int, int] = (10_000, 10_000), prefetch: int = 1000, sync_send: bool = True,
            host: str | None = None, tls: TlsOptions | ssl.SSLContext | None = None,
            start: bool = True) -> _Connecting:
    """Open a connection (started unless ``start=False``)::

        conn = await pymq.aio.connect("stomp://127.0.0.1:61613")
        async with pymq.aio.connect("vm://default") as conn: ...

    Credentials come from ``username``/``password``, else from the URL (``stomp://user:pass@host``),
    else none (the broker's guest).  TLS: a ``stomps://`` URL with its options, which ``tls=``
    (:class:`~pymq.TlsOptions` or an ``ssl.SSLContext``) overrides.
    """
    factory = AsyncConnectionFactory(url, username=username, password=password, client_id=client_id,
                                     timeout=timeout, heartbeat=heartbeat, prefetch=prefetch, sync_send=sync_send,
                                     host=host, tls=tls)
    return _Connecting(factory, start)


# -- connection --------------------------------------------------------------------------------------------

class AsyncConnection(ConnectionCore):
    """A connection to a broker, shared by any number of tasks of its event loop."""

    factory: AsyncConnectionFactory
    _sessions: list[AsyncSession]  # type: ignore[assignment]

    def __init__(self, factory: AsyncConnectionFactory, transport: AsyncTransport) -> None:
        super().__init__(factory)
        self.exception_listener: ExceptionListener | None = None
        self._transport = transport
        self._loop = asyncio.get_running_loop()   # made by create_connection, inside its loop
        self._started = asyncio.Event()   # also set when the connection ends, to wake every waiter
        self._tasks: set[asyncio.Task[Any]] = set()
        self._queue_manager: AsyncQueueManager | None = None
        transport.on_frame = self._frame_received
        transport.on_lost = self._on_lost

    async def _open(self, username: str | None, password: str | None) -> None:
        try:
            connected = await self._transport.connect(self._connect_headers(username, password),
                                                      self.factory.timeout)
        except BaseException:
            self.status = ConnectionStatus.CLOSED
            raise
        self._opened(connected, self._transport.version, username)

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

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once the connection is closed (deliberately or because it was lost)."""
        return self.status is ConnectionStatus.CLOSED or self._transport.closed

    def _check_open(self) -> None:
        super()._check_open()
        if self._transport.closed:
            raise IllegalStateError("the connection is closed")

    def _check_usable(self) -> None:
        super()._check_usable()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise IllegalStateError("this connection belongs to another event loop; pymq.aio objects "
                                    "are used from the loop that created them")

    def queue_manager(self) -> AsyncQueueManager:
        """Create, drop, purge and inspect queues; grant and revoke permissions (``await`` each)."""
        self._check_open()
        if self._queue_manager is None:
            self._queue_manager = AsyncQueueManager(self)
        return self._queue_manager

    # -- sessions ----------------------------------------------------------------------------------
    def create_session(self, transacted: bool = False, ack_mode: int = AckMode.AUTO_ACKNOWLEDGE) -> AsyncSession:
        """A session: ``transacted=True``, or one of the acknowledge modes (``pymq.CLIENT_ACKNOWLEDGE``...)."""
        self._check_usable()
        session = AsyncSession(self, SESSION_TRANSACTED if transacted else ack_mode_of(ack_mode))
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

    async def _request(self, frame: Frame, timeout: float | None = None) -> Headers:
        """Send ``frame`` with a receipt and wait for it; an ERROR answering it raises here."""
        waiter = _Receipt(self._loop)
        rid, framed = self._expect(frame, waiter)
        try:
            if frame.command == "SEND" and self._transport.paused:
                await self._transport.writable(max(30.0, self.factory.timeout))
            self._send(framed)
            timeout = self.factory.timeout if timeout is None else timeout
            if not await _wait(waiter.future, timeout):
                raise PymqTimeout(f"no receipt for {frame.command} within {timeout:g}s")
            return waiter.future.result()
        finally:
            self._forget(rid)

    def _on_lost(self, error: PymqError) -> None:
        unexpected = self._lost(error)
        self._started.set()
        listener = self.exception_listener
        if listener is not None and unexpected:
            try:
                result = listener(error)
            except Exception:
                log.exception("exception listener failed")
                return
            if inspect.isawaitable(result):
                self._own(self._run_listener(result))

    async def _run_listener(self, awaitable: Awaitable[None]) -> None:
        try:
            await awaitable
        except Exception:
            log.exception("exception listener failed")

    def _own(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


# -- the one-task rule ------------------------------------------------------------------------------------

class _OfSession(Protocol):
    @property
    def _session(self) -> AsyncSession: ...


_S = TypeVar("_S", bound=_OfSession)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _guarded(method: Callable[Concatenate[_S, _P], Awaitable[_R]]
             ) -> Callable[Concatenate[_S, _P], Coroutine[object, None, _R]]:
    """Run a coroutine method with its session owned by the calling task (re-entrant for that task)."""

    @functools.wraps(method)
    async def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        session = self._session
        if not session._enter():             # already ours: a listener using its own session
            return await method(self, *args, **kwargs)
        try:
            return await method(self, *args, **kwargs)
        finally:
            session._leave()
    return wrapper


# -- session -------------------------------------------------------------------------------------------

class AsyncSession(SessionCore):
    """A single-task context for producing and consuming (see the module docstring)."""

    connection: AsyncConnection
    _consumers: list[AsyncMessageConsumer]  # type: ignore[assignment]

    def __init__(self, connection: AsyncConnection, ack_mode: int) -> None:
        super().__init__(connection, ack_mode)
        self._owner: asyncio.Task[Any] | None = None
        self._released: asyncio.Future[None] | None = None   # the dispatcher waiting for the owner to leave
        self._producers: list[AsyncMessageProducer] = []
        self._listener_queue: collections.deque[AsyncMessageConsumer] = collections.deque()
        self._dispatch_wakeup: asyncio.Future[None] | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._in_listener = False
        if self.transacted:
            self._begin()

    @property
    def _session(self) -> AsyncSession:
        return self

    # -- the one-task rule ---------------------------------------------------------------------------
    def _enter(self) -> bool:
        """Own the session for the calling task; False when it owns it already."""
        if self._closed:
            raise IllegalStateError("the session is closed")
        me = asyncio.current_task()
        owner = self._owner
        if owner is me:
            return False
        if owner is not None:
            raise IllegalStateError("the session is in use by another task; a session is used by one "
                                    "task at a time (create one session per task)")
        self._owner = me
        return True

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
    def create_producer(self, destination: Destination | str | None = None) -> AsyncMessageProducer:
        """A producer for ``destination`` (or for any, named at each ``send``)."""
        self._check()
        producer = AsyncMessageProducer(self, as_destination(destination) if destination is not None else None)
        self._producers.append(producer)
        return producer

    @_guarded
    async def create_consumer(self, destination: Destination | str, selector: str | None = None, *,
                              no_local: bool = False, prefetch: int | None = None,
                              exclusive: bool = False) -> AsyncMessageConsumer:
        """A consumer of ``destination``, optionally filtered by a JMS ``selector``.  ``exclusive``: of
        the exclusive consumers of a queue only the first (in subscription order) receives; the next
        takes over when it leaves (spec/stomp.md §4)."""
        return await self._subscribe(as_destination(destination), selector, no_local=no_local, prefetch=prefetch,
                                     extra=EXCLUSIVE_HEADERS if exclusive else None)

    @_guarded
    async def create_durable_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                      no_local: bool = False,
                                      prefetch: int | None = None) -> AsyncMessageConsumer:
        """A durable subscription ``name`` (scoped by the connection's client id, else its user)."""
        return await self._subscribe(durable_topic(topic), selector, no_local=no_local, prefetch=prefetch,
                                     extra=durable_headers(name))

    create_durable_subscriber = create_durable_consumer

    @_guarded
    async def create_shared_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                     prefetch: int | None = None) -> AsyncMessageConsumer:
        """JMS 2.0 shared non-durable subscription: consumers with the same name share the messages."""
        return await self._subscribe(as_destination(topic), selector, prefetch=prefetch,
                                     extra=shared_headers(name))

    @_guarded
    async def create_shared_durable_consumer(self, topic: Topic | str, name: str,
                                             selector: str | None = None, *,
                                             prefetch: int | None = None) -> AsyncMessageConsumer:
        """JMS 2.0 shared durable subscription ``name`` (scoped globally)."""
        return await self._subscribe(as_destination(topic), selector, prefetch=prefetch,
                                     extra=shared_durable_headers(name))

    @_guarded
    async def unsubscribe(self, name: str, *, shared: bool = False) -> None:
        """Delete durable subscription ``name`` (it must have no active consumer)."""
        await self.connection._request(unsubscribe_frame(name, shared))

    def create_browser(self, queue: Queue | str, selector: str | None = None) -> AsyncQueueBrowser:
        """A browser of ``queue``'s waiting messages (``async for``; nothing is removed)."""
        self._check_owner()
        return AsyncQueueBrowser(self, browse_queue(queue), selector)

    @_guarded
    async def read_range(self, destination: Destination | str, *, from_seq: int | None = None,
                         to_seq: int | None = None, max_messages: int | None = None,
                         max_bytes: int | None = None, from_timestamp: int | None = None,
                         selector: str | None = None, subscription: str | None = None,
                         source: str | None = None, timeout: float | None = None,
                         frames: bool = False, arrow: bool = False) -> RangeResult:
        """Messages with ``from_seq <= sequence < to_seq`` without removing them (spec/stomp.md §9):
        from a destination's retained log, a queue, or (``subscription``) a durable subscription.
        ``frames=True``: each message's ``(headers, body)`` in ``RangeResult.frames`` instead;
        ``arrow=True``: the broker's one Arrow frame in ``RangeResult.arrow`` when it answers in Arrow
        (spec/spark.md §6)."""
        extra = range_headers(from_seq=from_seq, to_seq=to_seq, max_messages=max_messages, max_bytes=max_bytes,
                              from_timestamp=from_timestamp, selector=selector, subscription=subscription,
                              source=source, arrow=arrow)
        browse = _AsyncBrowse(self.connection, as_destination(destination), extra, raw=frames)
        await _collect(self, browse, timeout)
        return browse.result()

    async def bounds(self, destination: Destination | str, *, subscription: str | None = None,
                     source: str | None = None) -> tuple[int, int]:
        """(earliest available, latest assigned) sequence numbers of a destination."""
        result = await self.read_range(destination, max_messages=0, subscription=subscription, source=source)
        return result.earliest, result.latest

    @_guarded
    async def ack_upto(self, destination: Destination | str, seq: int, *,
                       subscription: str | None = None) -> None:
        """Acknowledge every waiting message below sequence number ``seq`` (a reader that owns the
        queue or durable subscription, acknowledging a committed batch)."""
        await self.connection._request(ack_upto_frame(destination, seq, subscription))

    @_guarded
    async def send_arrow(self, destination: Destination | str, data: bytes, *,
                         timeout: float | None = None) -> Headers:
        """A bulk SEND (spec/spark.md §7): ``data`` is an Arrow IPC stream of rows, which the broker
        appends as a unit; returns the receipt's headers (``pymq-first-seq``, ``pymq-count``,
        ``pymq-duplicates``) once the rows are durable.  Not inside a transaction."""
        if self.transacted:
            raise IllegalStateError("a bulk SEND is its own unit: send it from a session that is not transacted")
        return await self.connection._request(bulk_frame(destination, data), timeout)

    async def create_queue(self, name: str, **config: object) -> Queue:
        """A Queue; with settings (QueueConfig fields, see :meth:`AsyncQueueManager.create`) it is also
        created on the broker, owned by this user: the same settings again are a no-op, different ones
        raise DestinationExists.  (A coroutine because with settings it waits for the broker.)"""
        self._check()
        if config:
            return await self.connection.queue_manager()._run(create_call(name, None, dict(config)))
        return Queue(name)

    # -- transactions and acknowledgement ----------------------------------------------------------------
    @_guarded
    async def commit(self) -> None:
        """Make this transaction's sends visible and its receives acknowledged, atomically."""
        await self.connection._request(self._commit_frame())
        self._begin()

    @_guarded
    async def rollback(self) -> None:
        """Discard this transaction's sends; the messages it received come back first, in their
        original order, marked redelivered."""
        await self._recover(rollback=True)

    @_guarded
    async def recover(self) -> None:
        """Redeliver every message consumed but not yet acknowledged, first and in their original
        order (non-transacted sessions)."""
        await self._recover(rollback=False)

    async def _recover(self, rollback: bool) -> None:
        frames = self._recovery_frames(rollback)
        if not frames:
            return
        conn = self.connection
        try:
            for frame in frames[:-1]:
                conn._send(frame)
            await conn._request(frames[-1])    # the receipt: every NACK is applied
            settle = self._recovery_settle_frames()
            if settle:                         # ... and what they released is dispatched before this one
                for frame in settle[:-1]:
                    conn._send(frame)
                await conn._request(settle[-1])
        finally:
            self._end_recovery()

    async def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message this session has consumed."""
        self._acknowledge_now()

    # -- lifecycle -------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Roll back an open transaction, close the consumers (unsubscribing) and end the dispatcher."""
        if self._closed:
            return
        if self.transacted and self._tx is not None and not self.connection.closed:
            try:
                # what the transaction received returns when the consumers unsubscribe below
                self.connection._send(Frame("ABORT", {"transaction": self._tx}))
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

    async def __aenter__(self) -> AsyncSession:
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
    async def _subscribe(self, destination: Destination, selector: str | None, *, no_local: bool = False,
                         prefetch: int | None = None, extra: Headers | None = None) -> AsyncMessageConsumer:
        self._check()
        conn = self.connection
        consumer = AsyncMessageConsumer(self, destination, selector,
                                        prefetch if prefetch is not None else conn.factory.prefetch)
        try:
            await conn._request(self._subscribe_frame(consumer, no_local=no_local, extra=extra))
        except BaseException:
            conn._unregister(consumer._sub_id)
            raise
        self._consumers.append(consumer)
        return consumer

    # -- listeners ---------------------------------------------------------------------------------------
    def _to_listener(self, consumer: AsyncMessageConsumer) -> None:
        self._listener_queue.append(consumer)
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
            consumer = q.popleft()            # one entry per message that arrived for a listener
            if consumer._closed or consumer._listener is None:
                consumer._wake()              # the listener was removed: receive() takes it
                continue
            while self._owner is not None:   # the application is inside the session: wait its turn
                self._released = loop.create_future()
                await self._released
                if self._closed:
                    return
            listener = consumer._listener
            if consumer._closed or listener is None or not consumer._buffer:
                continue
            self._owner = asyncio.current_task()
            self._in_listener = True
            try:
                await consumer._dispatch(consumer._buffer.popleft(), listener)
            finally:
                self._in_listener = False
                self._leave()


# -- producer ---------------------------------------------------------------------------------------------

class AsyncMessageProducer(ProducerCore):
    """Sends messages; created by a session and used from its task."""

    _session: AsyncSession

    @_guarded
    async def send(self, message: MessageBody, destination: Destination | str | None = None, *,
                   delivery_mode: int | None = None, priority: int | None = None,
                   time_to_live: int | None = None, delivery_delay: int | None = None,
                   transaction: object = None) -> Message:
        """Send ``message`` (a Message, or str/bytes/dict made into one); returns the Message sent.

        Persistent messages outside a transaction wait for the broker's receipt, which comes once
        the message is durable (disable with ``sync_send=False``).  ``transaction``: the application's
        SQLAlchemy ``Connection``/``Session`` or ``AsyncConnection``/``AsyncSession``; the message is
        written in that database transaction and seen only if it commits.
        """
        if transaction is not None:
            self._check()
            return await _send_in_transaction(self, message, destination, transaction, delivery_mode=delivery_mode,
                                              priority=priority, time_to_live=time_to_live)
        msg, frame, confirm = self._prepare(message, destination, delivery_mode=delivery_mode, priority=priority,
                                            time_to_live=time_to_live, delivery_delay=delivery_delay)
        conn = self._session.connection
        if confirm:
            msg.message_id = (await conn._request(frame)).get("message-id")
        else:
            await conn._send_flowing(frame)
        return msg

    async def close(self) -> None:
        """Close the producer; further sends raise IllegalStateError (nothing on the broker to release)."""
        self._closed = True

    async def __aenter__(self) -> AsyncMessageProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _send_in_transaction(producer: AsyncMessageProducer, message: MessageBody,
                               destination: Destination | str | None, transaction: object, *,
                               delivery_mode: int | None, priority: int | None,
                               time_to_live: int | None) -> Message:
    from pymq.client.apptx import insert_pending, pending_row
    msg, target, data = pending_row(producer, message, destination, delivery_mode=delivery_mode,
                                    priority=priority, time_to_live=time_to_live)
    run_sync = getattr(transaction, "run_sync", None)
    if run_sync is not None and inspect.iscoroutinefunction(run_sync):
        # SQLAlchemy's AsyncConnection / AsyncSession: the insert runs on their synchronous side
        await run_sync(lambda sync: insert_pending(sync, target, data, persistent=msg.persistent))
    else:
        insert_pending(transaction, target, data, persistent=msg.persistent)
    return msg


# -- consumer ---------------------------------------------------------------------------------------------

class AsyncMessageConsumer(ConsumerCore):
    """Receives from one destination; created by a session and used from its task."""

    _session: AsyncSession
    _listener: MessageListener | None

    def __init__(self, session: AsyncSession, destination: Destination, selector: str | None,
                 prefetch: int) -> None:
        super().__init__(session, destination, selector, prefetch)
        self._waiter: asyncio.Future[None] | None = None

    # the transport's callback
    def _notify(self) -> None:
        if self._listener is not None:
            self._session._to_listener(self)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @_guarded
    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever); None on timeout."""
        if self._listener is not None:
            raise IllegalStateError("receive() cannot be used on a consumer with a message listener")
        conn = self._session.connection
        loop = conn._loop
        deadline = None if timeout is None else loop.time() + timeout
        buffer = self._buffer
        while True:
            if self._closed:
                raise IllegalStateError("the consumer is closed")
            conn._check_open()
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            if not conn._started.is_set():
                if remaining == 0.0 or not await _wait(conn._started.wait(), remaining):
                    return None
                continue
            if buffer:
                return self._take(buffer.popleft())
            self._before_wait()
            if remaining == 0.0:
                return None
            self._waiter = waiter = loop.create_future()
            self._waiting = True
            try:
                if not await _wait(waiter, remaining):
                    return None
            finally:
                self._waiter = None
                self._waiting = False

    async def receive_no_wait(self) -> Message | None:
        """The next message if one is already here, else None (``receive(timeout=0)``)."""
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
        """Where messages go (None: the application calls ``receive``); setting it is ``set_message_listener``."""
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
            for _ in range(len(self._buffer)):   # messages that arrived before go to it, in order
                session._to_listener(self)

    async def _dispatch(self, frame: Frame, listener: MessageListener) -> None:
        """Run ``listener`` for ``frame`` (the dispatcher task, owning the session)."""
        message, delivery = self._for_listener(frame)
        try:
            result = listener(message)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("message listener of %s raised; the message will be redelivered", self.destination)
            try:
                self._listener_done(delivery, failed=True)
            except PymqError as exc:
                log.warning("returning the message after the listener failed: %s", exc)
            return
        try:
            self._listener_done(delivery, failed=False)
        except PymqError as exc:
            log.warning("acknowledging after the listener returned: %s", exc)

    async def close(self) -> None:
        """End the subscription (UNSUBSCRIBE, waiting for its receipt); unacknowledged messages return."""
        await self._close(unsubscribe=True)

    async def _close(self, unsubscribe: bool) -> None:
        if self._closed:
            return
        conn = self._session.connection
        self._closing()
        if unsubscribe and not conn.closed:
            try:
                await conn._request(Frame("UNSUBSCRIBE", {"id": self._sub_id}))
            except PymqError:
                pass
        conn._unregister(self._sub_id)

    async def __aenter__(self) -> AsyncMessageConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# -- browser ------------------------------------------------------------------------------------------------

class _AsyncBrowse(BrowseCore):
    def __init__(self, connection: AsyncConnection, destination: Destination,
                 extra: dict[str, object], *, raw: bool = False) -> None:
        super().__init__(connection, destination, extra, raw=raw)
        self.waiter: asyncio.Future[None] | None = None

    def _notify(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def _browse(session: AsyncSession, browse: _AsyncBrowse, timeout: float | None) -> AsyncIterator[Message]:
    """Subscribe with ``browser:true`` and yield each message as it arrives, until the broker's end
    marker (then ``browse.end`` holds its headers)."""
    conn = session.connection
    loop = conn._loop
    try:
        await conn._request(browse.subscribe)
        limit = conn.factory.timeout if timeout is None else timeout
        deadline = loop.time() + limit
        while True:
            message = browse._next()
            if message is not None:
                yield message
                continue
            if browse.end is not None:
                return
            conn._check_open()
            remaining = deadline - loop.time()
            browse.waiter = loop.create_future()
            if remaining <= 0 or not await _wait(browse.waiter, remaining):
                raise PymqTimeout(f"the browse of {browse.destination} did not finish within {limit:g}s")
    finally:
        browse._close()


async def _collect(session: AsyncSession, browse: _AsyncBrowse, timeout: float | None) -> None:
    """A whole browse into ``browse`` (messages, or pairs when raw), until the broker's end marker."""
    conn = session.connection
    loop = conn._loop
    try:
        await conn._request(browse.subscribe)
        limit = conn.factory.timeout if timeout is None else timeout
        deadline = loop.time() + limit
        while True:
            if browse._collect():
                continue
            if browse.end is not None:
                return
            conn._check_open()
            remaining = deadline - loop.time()
            browse.waiter = loop.create_future()
            if remaining <= 0 or not await _wait(browse.waiter, remaining):
                raise PymqTimeout(f"the browse of {browse.destination} did not finish within {limit:g}s")
    finally:
        browse._close()


class AsyncQueueBrowser:
    """Looks at a queue's messages in delivery order without removing them (``async for``)."""

    def __init__(self, session: AsyncSession, queue: Destination, selector: str | None) -> None:
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
        browse = _AsyncBrowse(self._session.connection, self.queue, {"selector": self.selector or None})
        return _browse(self._session, browse, timeout)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._browse(None)

    async def messages(self, timeout: float | None = None) -> list[Message]:
        """A snapshot of the messages waiting now (each call takes a new one)."""
        return [m async for m in self._browse(timeout)]

    get_enumeration = messages

    async def close(self) -> None:
        """Close the browser (each iteration browses anew, so there is nothing on the broker to release)."""
        self._closed = True

    async def __aenter__(self) -> AsyncQueueBrowser:
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

    async def request(self, message: MessageBody, timeout: float | None = 10.0) -> Message:
        """Send ``message`` and wait for its reply (raises pymq's TimeoutError when none comes)."""
        if self._consumer is None:     # subscribe before the first request can be answered
            self._consumer = await self.session.create_consumer(self.reply_queue)
        msg = request_message(message, self.reply_queue)
        await self._producer.send(msg, delivery_mode=NON_PERSISTENT)
        loop = self.session.connection._loop
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise PymqTimeout(f"no reply from {self.destination} within {timeout}s")
            answer = await self._consumer.receive(remaining)
            if answer is not None and answer.correlation_id == msg.correlation_id:
                return answer
            # None, or a late reply to an earlier, timed-out request: drop it

    async def close(self) -> None:
        """Close the reply consumer and the producer."""
        if self._consumer is not None:
            await self._consumer.close()
        await self._producer.close()

    async def __aenter__(self) -> AsyncRequestor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def reply(session: AsyncSession, request: Message, response: MessageBody) -> Message:
    """Answer ``request`` on its reply-to destination, copying its correlation id."""
    msg, to = reply_message(request, response)
    return await session.create_producer(to).send(msg, delivery_mode=NON_PERSISTENT)


# -- queue administration --------------------------------------------------------------------------------------

class _FutureInbox(AdminInbox):
    def __init__(self) -> None:
        super().__init__()
        self.futures: dict[str, asyncio.Future[None]] = {}

    def _answered(self, corr: str) -> None:
        fut = self.futures.get(corr)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _wake(self) -> None:
        for fut in list(self.futures.values()):
            if not fut.done():
                fut.set_result(None)


class AsyncQueueManager:
    """Queue administration over an :class:`AsyncConnection` (the blocking ``QueueManager``'s operations)."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        self._inbox: _FutureInbox | None = None
        self._subscribing: asyncio.Lock = asyncio.Lock()

    async def _ensure(self) -> _FutureInbox:
        async with self._subscribing:
            if self._inbox is None:
                inbox = _FutureInbox()
                sub_id = self.connection._register(inbox)
                await self.connection._request(inbox.subscribe(sub_id))
                self._inbox = inbox
            return self._inbox

    async def call(self, op: str, timeout: float | None = None, **args: object) -> Any:
        """Run admin operation ``op`` (spec/admin.md) with ``args``; its JSON result, or the broker's
        error raised here.  The methods below are the typed way to the common operations."""
        return await self._run(AdminCall(op, dict(args), lambda value: value), timeout)

    async def _run(self, call: AdminCall[_T], timeout: float | None = None) -> _T:
        inbox = await self._ensure()
        conn = self.connection
        corr, frame = inbox.request(call)
        fut = inbox.futures[corr] = conn._loop.create_future()
        try:
            conn._send(frame)
            wait = conn.factory.timeout if timeout is None else timeout
            if not await _wait(fut, wait):
                raise PymqTimeout(f"no answer to admin operation {call.op!r} within {wait:g}s")
            conn._check_open()
            answer = inbox.answers.get(corr)
        finally:
            inbox.futures.pop(corr, None)
            inbox.answers.pop(corr, None)
        if answer is None:
            raise PymqTimeout(f"no answer to admin operation {call.op!r}")
        return admin_result(call, answer)

    async def create(self, name: Queue | str, *, grants: dict[str, list[str]] | None = None,
                     **config: object) -> Queue:
        """Create queue ``name`` (see the blocking ``QueueManager.create`` for the settings)."""
        return await self._run(create_call(name, grants, config))

    async def alter(self, name: Queue | str, **config: object) -> JsonObject:
        """Change some settings of queue ``name`` (see the blocking ``QueueManager.alter``)."""
        return await self._run(alter_call(name, config))

    alter_queue = alter     # the name seed 001's queue manager gives it

    async def drop(self, name: Queue | str, *, force: bool = False) -> int:
        """Delete queue ``name`` and its messages; how many it held.  With consumers attached it is refused
        (IllegalStateError) unless ``force``, which detaches them."""
        return await self._run(drop_call(name, force))

    async def purge(self, name: Queue | str) -> int:
        """Remove every waiting message; how many there were."""
        return await self._run(purge_call(name))

    async def list(self) -> list[JsonObject]:
        """Every queue, one JSON object each: name, destination, declared, owner and its metrics."""
        return await self._run(list_call())

    async def info(self, name: Queue | str) -> JsonObject:
        """Queue ``name``: its settings (``config``), ``acl``, ``metrics`` and ``rates``, as a JSON object."""
        return await self._run(info_call(name))

    async def metrics(self, name: Queue | str) -> JsonObject:
        """Queue ``name``'s metrics (depth, added, removed, expired, delivered, acknowledged...), as a JSON object."""
        return await self._run(metrics_call(name))

    async def destinations(self) -> JsonObject:
        """The broker's destinations: ``queues``, ``topics`` and retained ``logs``, each a sorted list."""
        return await self._run(destinations_call())

    async def grant(self, destination: Destination | str, principal: str, *permissions: str) -> JsonObject:
        """Give ``principal`` ``permissions`` (produce, consume, browse) on ``destination``; its new ACL."""
        return await self._run(grant_call("grant", destination, principal, permissions))

    async def revoke(self, destination: Destination | str, principal: str, *permissions: str) -> JsonObject:
        """Take ``permissions`` on ``destination`` away from ``principal``; its new ACL."""
        return await self._run(grant_call("revoke", destination, principal, permissions))
