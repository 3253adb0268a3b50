"""The JMS-style API, written once: ConnectionFactory → Connection → Session → producers, consumers, browsers.

The asyncio shell (``pymq.aio``) is written in ``pymq/aio/client.py``; the blocking shell (``pymq``,
``pymq/client/blocking.py``) is generated from it by ``tools/unasync.py``, which drops ``async``/``await``
and takes the waiting primitives from :mod:`pymq.client._waiting` (events, queues and threads) instead
of :mod:`pymq.aio._waiting` (futures and tasks); the few lines that differ are marked ``# async:`` /
``# sync:`` in the source.  Both shells sit on the one client core (:mod:`pymq.client._core`),
which holds the state, the frames and the acknowledgement rules; this module adds only the waiting.

Invariants (the blocking shell's words in brackets):

* A connection's ``status`` moves CONNECTING → OPEN → CLOSING → CLOSED (or straight to CLOSED when the
  broker is lost); only OPEN accepts new work.  ``close()`` ends every task (thread) a connection or
  session runs: listener dispatchers, asynchronous exception listeners, the transport's heart-beat.
* Every wait has a timeout: receipts and DISCONNECT use the factory's ``timeout``, ``receive`` and
  ``request`` take one (``None`` = JMS's wait-forever, the caller's explicit choice).
* A consumer's buffer holds at most ``prefetch`` messages: consumers subscribe with ``client`` or
  ``client-individual`` acks and a ``prefetch-count``, so the broker's credit bounds the buffer and a
  slow consumer never stalls the connection's reader (``prefetch=0`` asks for no limit).  AUTO_ACKNOWLEDGE
  acks each message when ``receive`` returns it (or the listener returns); DUPS_OK_ACKNOWLEDGE acks
  cumulatively in batches; CLIENT_ACKNOWLEDGE acks everything the session consumed when
  ``message.acknowledge()`` is called; SESSION_TRANSACTED wraps sends and acks in a broker transaction
  that ``commit()`` makes visible at once and ``rollback()`` discards (consumed messages come back
  first, in their order, marked redelivered).
* A session belongs to one task (thread) at a time: a second one calling into it while the first is
  inside gets :class:`IllegalStateError` at once (JMS's single-threaded session).  Listeners run in the
  session's dispatcher task (thread), one message at a time, and may use their own session.  An
  asyncio connection belongs to its event loop; a blocking one is thread-safe.
"""
from __future__ import annotations

import functools
import logging
import ssl
import time
from typing import Any, TypeVar
from collections.abc import AsyncIterator, Callable, Sequence

from pymq.aio._waiting import (Flag, Guard, ListenerQueue, Lock, Receipt, Wakeup, Worker, call_later, call_listener,
                               check_loop, current_loop, guarded, link_lock, spawn)
from pymq.aio.transport import AsyncTransport, transport_for
from pymq.client._core import (AUTO_ACKNOWLEDGE, CLIENT_ACKNOWLEDGE, DUPS_OK_ACKNOWLEDGE,
                               EXCLUSIVE_HEADERS, SESSION_TRANSACTED, AckMode, BrowseCore, ConnectionCore,
                               ConnectionSettings, ConnectionStatus, ConsumerCore, Headers, ProducerCore, RangeResult,
                               SessionCore, TransportEvent, browse_queue, durable_headers, durable_topic,
                               reply_message, request_message, session_mode, shared_durable_headers, shared_headers,
                               unsubscribe_frame)
from pymq.client.admin import (AdminCall, AdminInbox, JsonObject, admin_result, alter_call, create_call,
                               destinations_call, drop_call, grant_call, info_call, list_call, metrics_call,
                               purge_call)
from pymq.client._failover import is_final, refused_resubscription
from pymq.client.frames import ack_upto_frame, bulk_frame, range_headers
from pymq.client.url import Address, StompAddress, TlsOptions, VmAddress
from pymq.destination import Destination, Queue, Topic, as_destination
from pymq.errors import (ConnectFailed, ConnectionClosed, IllegalStateError, PymqError, TransactionInDoubt,
                         TransactionRolledBack)
from pymq.errors import TimeoutError as PymqTimeout
from pymq.message import NON_PERSISTENT, Message, MessageBody
from pymq.protocol.frame import Frame
# async:
import asyncio
import inspect
from collections.abc import Awaitable, Generator
from typing import Union
# end

log = logging.getLogger("pymq.client")
_T = TypeVar("_T")

__all__ = ["AsyncConnectionFactory", "AsyncConnection", "AsyncSession", "AsyncMessageProducer",
           "AsyncMessageConsumer", "AsyncQueueBrowser", "AsyncRequestor", "AsyncQueueManager", "AsyncPendingReceipt",
           "AsyncPendingRange", "RangeResult", "TransportEvent", "connect", "reply", "start_range", "start_send_arrow",
           "AckMode",
           "ConnectionStatus", "AUTO_ACKNOWLEDGE", "CLIENT_ACKNOWLEDGE", "DUPS_OK_ACKNOWLEDGE", "SESSION_TRANSACTED"]

# async:
MessageListener = Callable[[Message], Union[None, Awaitable[None]]]
ExceptionListener = Callable[[PymqError], Union[None, Awaitable[None]]]
TransportListener = Callable[[TransportEvent], Union[None, Awaitable[None]]]
# sync:
# MessageListener = Callable[[Message], None]
# ExceptionListener = Callable[[PymqError], None]
# TransportListener = Callable[[TransportEvent], None]
# end


# -- factory and connect ---------------------------------------------------------------------------------

class AsyncConnectionFactory(ConnectionSettings):
    """Connection settings; ``create_connection()`` returns a stopped connection (JMS semantics).

    ``url`` follows :mod:`pymq.client.url` (``stomp://user:pass@host:port``, ``stomps://...?ca_file=``,
    ``vm://name``, or a failover group of brokers: ``failover:(stomp://a,stomp://b)?options``, spec/ha.md
    §4); explicit ``username``/``password``/``tls`` win over what the URL says."""

    async def create_connection(self, username: str | None = None,
                                password: str | None = None) -> AsyncConnection:
        """A new, stopped connection (``start()`` it to receive); the arguments override the factory's."""
        conn = AsyncConnection(self)
        await conn._open(username, password)
        return conn


# async:
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
# end


def connect(url: str = "vm://default", *, username: str | None = None, password: str | None = None,
            client_id: str | None = None, timeout: float = 10.0, heartbeat: tuple[int, int] = (10_000, 10_000),
            prefetch: int = 1000, sync_send: bool = True, host: str | None = None,
            tls: TlsOptions | ssl.SSLContext | None = None, start: bool = True,
            vhost: str | None = None, coalesce_acks: bool = True) -> _Connecting:
    """Open a connection (started, unless ``start=False``): ``pymq.connect("stomp://127.0.0.1:61613")``;
    in ``pymq.aio``, ``await pymq.aio.connect(url)`` or ``async with pymq.aio.connect(url) as conn``.

    Credentials come from ``username``/``password``, else from the URL (``stomp://user:pass@host``),
    else none (the broker's guest).  TLS: a ``stomps://`` URL with its options, which ``tls=``
    (:class:`~pymq.TlsOptions` or an ``ssl.SSLContext``) overrides.  ``vhost``: the broker's virtual host
    (spec/stomp.md §1), sent as ``host:/<vhost>``: a broker URL's path (``stomp://host:port/shop``, also
    each failover member's) wins for that broker; a member without one enters ``vhost``.
    ``coalesce_acks=False``: AUTO_ACKNOWLEDGE sends one ACK per message as it is taken, instead of
    coalescing them (spec/stomp.md §5)."""
    factory = AsyncConnectionFactory(url, username=username, password=password, client_id=client_id,
                                     timeout=timeout, heartbeat=heartbeat, prefetch=prefetch, sync_send=sync_send,
                                     host=host, tls=tls, vhost=vhost, coalesce_acks=coalesce_acks)
    # async:
    return _Connecting(factory, start)
    # sync:
    # conn = factory.create_connection()
    # if start:
    #     conn.start()
    # return conn
    # end


# -- connection --------------------------------------------------------------------------------------------

class AsyncConnection(ConnectionCore):
    """A connection to a broker; ``status`` is a :class:`ConnectionStatus`.  Thread-safe in the blocking
    SDK; in ``pymq.aio`` shared by any number of tasks of its event loop.  With a failover URL it follows
    the group's brokers (spec/ha.md §4): ``transport_listener`` hears each interruption and resumption,
    the ``exception_listener`` only when every attempt is spent."""

    factory: AsyncConnectionFactory
    _sessions: list[AsyncSession]  # type: ignore[assignment]

    def __init__(self, factory: AsyncConnectionFactory) -> None:
        super().__init__(factory)
        self.exception_listener: ExceptionListener | None = None
        self._loop = current_loop()          # the loop it belongs to (made inside it by create_connection)
        self._started = Flag()               # also set when the connection ends, to wake every waiter
        self._queue_manager: AsyncQueueManager | None = None
        self._transport = self._new_transport(factory.address)
        self._wire: tuple[int, AsyncTransport] = (self._link, self._transport)   # a link and its transport
        self._link_lock = link_lock()
        self._link_up = Flag()               # set while a link is in use, or once the connection ended
        self._window_space = Flag()          # a receipt made room in the failover window
        self._reconnection = _Reconnection(self)
        self._login: tuple[str | None, str | None] = (None, None)
        # async:
        self._tasks: set[asyncio.Task[Any]] = set()   # asynchronous exception and transport listeners
        # end

    def _new_transport(self, address: Address) -> AsyncTransport:
        factory = self.factory
        transport = transport_for(address, heartbeat=factory.heartbeat, ssl_context=factory._ssl_context(address),
                                  server_hostname=factory._server_hostname(address))
        transport.on_frame = self._frame_received
        transport.on_lost = functools.partial(self._link_lost, transport)
        return transport

    async def _open(self, username: str | None, password: str | None) -> None:
        self._login = (username, password)
        try:
            transport, connected = await self._reconnection.first()
        except BaseException:
            self.status = ConnectionStatus.CLOSED
            raise
        self._transport = transport
        self._wire = (self._link, transport)
        self._opened(connected, transport.version, self.factory._credentials(username, password)[0])
        self._link_up.set()

    def _connect_headers_for(self, address: Address) -> Headers:
        return self._connect_headers(*self.factory._credentials(*self._login, address), address)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start (or resume) delivery of incoming messages to receivers and listeners."""
        self._check_usable()
        self._started.set()

    async def stop(self) -> None:
        """Pause delivery; ``receive`` waits and listeners are not called until ``start``.  What AUTO
        sessions took is acknowledged now (their held-back ACKs are sent)."""
        self._check_usable()
        self._started.clear()
        for session in list(self._sessions):
            session._flush_held_acks()

    async def close(self) -> None:
        """Close every session, say DISCONNECT (waiting for its receipt), close the transport and end
        what the connection runs (listener dispatchers, a failover's reconnection).  Closing twice is harmless."""
        if self.status is ConnectionStatus.CLOSING:
            return
        if self.status is ConnectionStatus.CLOSED:
            await self._transport.close()     # a lost connection still releases its socket and reader
            # async:
            await self._end_tasks()
            # end
            return
        linked = self.status is not ConnectionStatus.RECONNECTING
        self.status = ConnectionStatus.CLOSING
        await self._reconnection.stop()
        for session in list(self._sessions):
            await session._close_local(unsubscribe=False)   # DISCONNECT ends the subscriptions
        if linked and self._error is None and not self._transport.closed:
            # the DISCONNECT receipt confirms the broker processed every frame sent before it (a
            # producer held back by flow control may need a while): wait the full timeout, and say so
            # when it never comes, since unconfirmed non-persistent sends may then be lost
            try:
                await self._request(Frame("DISCONNECT", {}), timeout=self.factory.timeout)
            except PymqTimeout:
                log.warning("the broker did not confirm DISCONNECT within %ss; messages sent without a "
                            "receipt may not have reached it", self.factory.timeout)
            except PymqError:
                pass
        await self._transport.close()
        self.status = ConnectionStatus.CLOSED
        self._started.set()                  # wakes receivers waiting for start: they see CLOSED
        self._link_up.set()
        self._window_space.set()
        # async:
        await self._end_tasks()
        # end

    # async:
    async def _end_tasks(self) -> None:
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    # end

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once the connection is closed (deliberately, because it was lost, or because a failover
        spent every attempt)."""
        return self.status is ConnectionStatus.CLOSED or (self._failover is None and self._transport.closed)

    # async:
    def _check_open(self) -> None:
        super()._check_open()
        if self._failover is None and self._transport.closed:
            raise IllegalStateError("the connection is closed")
    # end

    def _check_usable(self) -> None:
        super()._check_usable()
        check_loop(self._loop)

    def queue_manager(self) -> AsyncQueueManager:
        """Create, drop, purge and inspect queues; grant and revoke permissions."""
        self._check_open()
        if self._queue_manager is None:
            self._queue_manager = AsyncQueueManager(self)
        return self._queue_manager

    def set_transport_listener(self, listener: TransportListener | None) -> None:
        """Hear a failover connection's ``interrupted`` and ``resumed`` :class:`TransportEvent` (ActiveMQ's
        ``TransportListener``), from the thread (task) that reconnects; in ``pymq.aio`` a coroutine
        function too.  ``None`` stops it.  (The same as setting ``transport_listener``.)"""
        self.transport_listener = listener

    # -- sessions ----------------------------------------------------------------------------------
    def create_session(self, transacted: bool | int | None = None, ack_mode: int | None = None) -> AsyncSession:
        """A session, as JMS 2.0's two forms say: ``create_session(pymq.CLIENT_ACKNOWLEDGE)`` (a session
        mode: ``pymq.AUTO_ACKNOWLEDGE``, ``CLIENT_ACKNOWLEDGE``, ``DUPS_OK_ACKNOWLEDGE``,
        ``SESSION_TRANSACTED``), or ``create_session(transacted, ack_mode)`` (``True`` for a transacted
        session; the mode is ignored then); ``create_session()`` is AUTO_ACKNOWLEDGE.  What it cannot mean
        (two different modes, ``False`` with SESSION_TRANSACTED, a value that is no mode) raises
        IllegalStateError and creates nothing."""
        self._check_usable()
        session = AsyncSession(self, session_mode(transacted, ack_mode))
        self._sessions.append(session)
        return session

    # -- frames ------------------------------------------------------------------------------------
    def _send(self, frame: Frame) -> None:
        self._check_open()
        if self.status is ConnectionStatus.RECONNECTING and self._kept(frame):
            return
        try:
            self._transport.send(frame)
        except ConnectionClosed:
            if not self._kept(frame, failed=True):
                raise

    def _send_on(self, frame: Frame, link: int) -> None:
        self._check_open()
        wire, transport = self._wire
        if link != wire:
            if link == self._link:
                self._kept(frame, link=link)   # the next link's own, sent once it is up
            return                             # a lost link's: the loss did what it would have
        try:
            transport.send(frame)
        except ConnectionClosed:
            if self._failover is None:
                raise                          # with failover its link is going: dropped with it

    def _window_freed(self) -> None:
        self._window_space.set()

    def _acks_held(self, consumer: ConsumerCore, delay: float) -> None:
        call_later(self._loop, delay, consumer._flush_held_ack)

    async def _send_flowing(self, frame: Frame) -> None:
        """Send a SEND, first waiting while the broker holds back this connection's producers."""
        if self._transport.paused:
            await self._transport.writable(max(30.0, self.factory.timeout))
        self._send(frame)

    async def _send_windowed(self, frame: Frame) -> None:
        """Failover: a SEND nobody waits for asks for a receipt and stays in the window until it comes
        (spec/ha.md §4.4); the sender waits while the window is full."""
        failover = self._failover
        assert failover is not None
        while failover.window_full:
            self._window_space.clear()
            if not failover.window_full:
                break
            await self._until_open()
            if not await self._window_space.wait(self.factory.timeout) and failover.window_full:
                raise PymqTimeout(f"no room in the window of unconfirmed SENDs within {self.factory.timeout:g}s")
            self._check_open()
        if self._transport.paused:
            await self._transport.writable(max(30.0, self.factory.timeout))
        with self._link_lock:
            _, framed = self._expect(frame, _NOBODY, windowed=True)
            self._send(framed)                # while the link is down it stays in the window for the next

    async def _request(self, frame: Frame, timeout: float | None = None) -> Headers:
        """Send ``frame`` with a receipt and wait for it; an ERROR answering it raises here.  With
        failover a request goes on a live link, and a receipt late because the link was lost is
        waited for on the next one."""
        if self.status is ConnectionStatus.RECONNECTING:
            await self._until_open()
        if frame.command == "SEND" and self._transport.paused:
            await self._transport.writable(max(30.0, self.factory.timeout))
        waiter = Receipt()
        with self._link_lock:
            rid, framed = self._expect(frame, waiter)
            try:
                self._send(framed)
            except BaseException:
                self._forget(rid)
                raise
        try:
            return await self._receipt(waiter, frame.command, timeout)
        finally:
            self._forget(rid)

    async def _request_on(self, frame: Frame, link: int) -> Headers:
        """A request that names something of link ``link`` (a recovery's NACK, a transaction's BEGIN):
        nothing to ask once that link is gone, the loss did what it would have."""
        waiter = Receipt()
        with self._link_lock:
            if link != self._link:
                return {}
            rid, framed = self._expect(frame, waiter)
            try:
                self._send_on(framed, link)
            except BaseException:
                self._forget(rid)
                raise
        try:
            return await self._receipt(waiter, frame.command, None)
        finally:
            self._forget(rid)

    async def _receipt(self, waiter: Receipt, command: str, timeout: float | None) -> Headers:
        timeout = self.factory.timeout if timeout is None else timeout
        link = self._link
        while not await waiter.wait(timeout):
            if self._failover is None or (link == self._link and self.status is not ConnectionStatus.RECONNECTING):
                raise PymqTimeout(f"no receipt for {command} within {timeout:g}s")
            link = self._link                 # lost meanwhile: its frame goes again on the next link
            await self._until_open()
        return waiter.result()

    async def _until_open(self) -> None:
        """Wait while a failover reconnects, at most its ``timeout`` option; raise when it gave up."""
        failover = self._failover
        if failover is None:
            return
        limit = failover.options.timeout
        deadline = None if limit < 0 else time.monotonic() + limit / 1000.0
        while self.status is ConnectionStatus.RECONNECTING:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise PymqTimeout(f"the connection did not fail over within timeout={limit} ms")
            await self._link_up.wait(remaining)
        self._check_open()

    # -- a lost link ------------------------------------------------------------------------------
    def _link_lost(self, transport: AsyncTransport, error: PymqError) -> None:
        """``transport`` ended (its thread or callback).  Without failover, or for a refusal no other
        broker mends, the connection ends; with failover a lost link starts the reconnection."""
        if self._failover is None:
            self._on_lost(error)
            return
        with self._link_lock:
            if transport is not self._transport or self.status is ConnectionStatus.RECONNECTING:
                return                        # an attempt's, or a link already replaced: the loop decides
            interrupt = self.status is ConnectionStatus.OPEN and not is_final(error)
            if interrupt:
                self._interrupt()
        if not interrupt:
            self._on_lost(error)
            return
        self._tell(TransportEvent("interrupted", _where(transport), error))
        # a re-subscription refused on the link just resumed: that outage goes on (its back-off, its count)
        self._reconnection.begin(error, self._reconnection.made if refused_resubscription(error) else 0)

    def _interrupt(self) -> None:
        with self._link_lock:
            super()._interrupt()
            self._link_up.clear()

    def _on_lost(self, error: PymqError) -> None:
        unexpected = self._lost(error)
        self._started.set()
        self._link_up.set()
        self._window_space.set()
        listener = self.exception_listener
        if listener is not None and unexpected:
            self._notify_listener(listener, error)

    def _tell(self, event: TransportEvent) -> None:
        listener = self.transport_listener
        if listener is not None:
            self._notify_listener(listener, event)

    def _notify_listener(self, listener: Callable[[_T], object], value: _T) -> None:
    # async:
        try:
            result = listener(value)
        except Exception:
            log.exception("connection listener failed")
            return
        if inspect.isawaitable(result):
            task = self._loop.create_task(self._run_listener(result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_listener(self, awaitable: Awaitable[object]) -> None:
        try:
            await awaitable
        except Exception:
            log.exception("connection listener failed")
    # sync:
    #     try:
    #         listener(value)
    #     except Exception:
    #         log.exception("connection listener failed")
    # end


class _Nobody:
    """The waiter of a windowed SEND's receipt: nobody waits (the window forgets it when it comes)."""

    def resolve(self, headers: Headers) -> None:
        pass

    def fail(self, error: PymqError) -> None:
        pass


_NOBODY = _Nobody()


def _where(where: AsyncTransport | Address) -> str:
    if isinstance(where, (StompAddress, VmAddress)):
        return where.where if isinstance(where, StompAddress) else f"vm://{where.name}"
    return str(getattr(where, "where", "") or getattr(where, "name", ""))


class _Reconnection:
    """A connection's way through its broker group (spec/ha.md §4.2-4.3): the first connect's attempts,
    and after a lost link the attempts, the waits between them, the new link's replay, and giving up."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.stopping = Flag()               # close() asks the reconnection to end
        self.worker: Worker | None = None
        self.cause: PymqError | None = None
        self.continued = 0                   # attempts of the outage already made when it began
        self.made = 0                        # attempts the last outage took to resume

    async def first(self) -> tuple[AsyncTransport, Frame]:
        """The first link: each broker in turn (startupMaxReconnectAttempts passes), or the one broker."""
        conn = self.conn
        failover = conn._failover
        if failover is None:
            connected = await conn._transport.connect(conn._connect_headers_for(conn.factory.address),
                                                      conn.factory.timeout)
            return conn._transport, connected
        error: PymqError = ConnectFailed("no broker to connect to")
        for attempt, address, wait in failover.attempts(after_loss=False):
            if wait > 0:
                await self.stopping.wait(wait)
            transport = conn._transport if attempt == 1 else conn._new_transport(address)
            try:
                connected = await transport.connect(conn._connect_headers_for(address),
                                                    failover.options.attempt_timeout(conn.factory.timeout))
            except PymqError as exc:
                error = exc
                if _refused(exc):
                    break
                continue
            failover.connected_to(address)
            return transport, connected
        raise error

    def begin(self, cause: PymqError, made: int = 0) -> None:
        self.cause, self.continued = cause, made
        self.worker = spawn(self._run, "pymq-failover")

    async def stop(self) -> None:
        self.stopping.set()
        worker = self.worker
        if worker is not None:
            await worker.stop(0)

    async def _run(self) -> None:
        conn = self.conn
        failover = conn._failover
        assert failover is not None
        error = self.cause or ConnectionClosed("the link to the broker was lost")
        for attempt, address, wait in failover.attempts(after_loss=True, made=self.continued):
            if wait > 0 and await self.stopping.wait(wait):
                return
            if conn.status is not ConnectionStatus.RECONNECTING:
                return
            transport = conn._new_transport(address)
            try:
                connected = await transport.connect(conn._connect_headers_for(address),
                                                    failover.options.attempt_timeout(conn.factory.timeout))
            except PymqError as exc:
                error = exc
                if _refused(exc):
                    break
                continue
            except BaseException:             # close() ended the reconnection during the attempt
                await transport.close()
                raise
            self.made = attempt              # before the replay: its refusal may come at once (another thread)
            resumed = self._resume(transport, connected, address)
            if resumed is None:               # closed meanwhile
                await transport.close()
                return
            if resumed:
                conn._tell(TransportEvent("resumed", _where(address), attempts=attempt,
                                          temporaries=conn._temporaries_resumed()))
                return
            error = ConnectionClosed(f"the link to {_where(address)} was lost as it was being resumed")
        if conn.status is ConnectionStatus.RECONNECTING:
            conn._on_lost(error)              # every attempt spent: the connection ends (exception listener)

    def _resume(self, transport: AsyncTransport, connected: Frame, address: Address) -> bool | None:
        """Make ``transport`` the connection's link: replay (subscriptions, transactions, SENDs) and open.
        False when it was lost already (the next attempt follows), None when the connection closed."""
        conn = self.conn
        failover = conn._failover
        assert failover is not None
        with conn._link_lock:
            if conn.status is not ConnectionStatus.RECONNECTING:
                return None
            conn._transport = transport
            conn._wire = (conn._link, transport)
            conn.version = transport.version
            conn.server = connected.headers.get("server", conn.server)
            conn.apptx_table_prefix = connected.headers.get("pymq-apptx-table-prefix") or conn.apptx_table_prefix
            conn._relinked(connected)
            failover.connected_to(address)
            try:
                for frame in conn._replay():
                    transport.send(frame)
            except ConnectionClosed:
                conn._interrupt()             # lost already: what it delivered is forgotten too
                return False
            conn.status = ConnectionStatus.OPEN
            conn._link_up.set()
            conn._window_space.set()
            return True


def _refused(error: PymqError) -> bool:
    """A connection attempt refused for a reason no other attempt mends (a login, a permission); a
    client id the broker still holds for a link it has not seen end (illegal-state) is tried again."""
    return error.code in ("authentication-failed", "access-denied", "unknown-user")


# -- session ---------------------------------------------------------------------------------------------

class AsyncSession(SessionCore):
    """A single-task (single-thread) context for producing and consuming (see the module docstring)."""

    connection: AsyncConnection
    _consumers: list[AsyncMessageConsumer]  # type: ignore[assignment]

    def __init__(self, connection: AsyncConnection, ack_mode: int) -> None:
        super().__init__(connection, ack_mode)
        self._guard = Guard(lambda: self._closed)
        self._producers: list[AsyncMessageProducer] = []
        #: one entry per message that arrived for a listener (None: look at the session's state)
        self._listener_queue: ListenerQueue[AsyncMessageConsumer] = ListenerQueue()
        self._dispatcher: Worker | None = None
        self._in_listener = False
        if self.transacted:
            self._begin()

    @property
    def _session(self) -> AsyncSession:
        return self

    # -- factories -------------------------------------------------------------------------------------
    def create_producer(self, destination: Destination | str | None = None) -> AsyncMessageProducer:
        """A producer for ``destination`` (or for any, named at each ``send``)."""
        self._check()
        producer = AsyncMessageProducer(self, as_destination(destination) if destination is not None else None)
        self._producers.append(producer)
        return producer

    @guarded
    async def create_consumer(self, destination: Destination | str, selector: str | None = None, *,
                              no_local: bool = False, prefetch: int | None = None,
                              exclusive: bool = False) -> AsyncMessageConsumer:
        """A consumer of ``destination``, optionally filtered by a JMS ``selector``.  ``exclusive``: of
        the exclusive consumers of a queue only the first (in subscription order) receives; the next
        takes over when it leaves (spec/stomp.md §4)."""
        return await self._subscribe(as_destination(destination), selector, no_local=no_local, prefetch=prefetch,
                                     extra=EXCLUSIVE_HEADERS if exclusive else None)

    @guarded
    async def create_durable_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                      no_local: bool = False,
                                      prefetch: int | None = None) -> AsyncMessageConsumer:
        """A durable subscription ``name`` (scoped by the connection's client id, else its user)."""
        return await self._subscribe(durable_topic(topic), selector, no_local=no_local, prefetch=prefetch,
                                     extra=durable_headers(name))

    create_durable_subscriber = create_durable_consumer

    @guarded
    async def create_shared_consumer(self, topic: Topic | str, name: str, selector: str | None = None, *,
                                     prefetch: int | None = None) -> AsyncMessageConsumer:
        """JMS 2.0 shared non-durable subscription: consumers with the same name share the messages."""
        return await self._subscribe(as_destination(topic), selector, prefetch=prefetch,
                                     extra=shared_headers(name))

    @guarded
    async def create_shared_durable_consumer(self, topic: Topic | str, name: str,
                                             selector: str | None = None, *,
                                             prefetch: int | None = None) -> AsyncMessageConsumer:
        """JMS 2.0 shared durable subscription ``name`` (scoped globally)."""
        return await self._subscribe(as_destination(topic), selector, prefetch=prefetch,
                                     extra=shared_durable_headers(name))

    @guarded
    async def unsubscribe(self, name: str, *, shared: bool = False) -> None:
        """Delete durable subscription ``name`` (it must have no active consumer)."""
        await self.connection._request(unsubscribe_frame(name, shared))

    def create_browser(self, queue: Queue | str, selector: str | None = None) -> AsyncQueueBrowser:
        """A browser of ``queue``'s waiting messages (nothing is removed)."""
        self._check()
        self._guard.check()
        return AsyncQueueBrowser(self, browse_queue(queue), selector)

    @guarded
    async def read_range(self, destination: Destination | str, *, from_seq: int | None = None,
                         to_seq: int | None = None, max_messages: int | None = None,
                         max_bytes: int | None = None, from_timestamp: int | None = None,
                         selector: str | None = None, subscription: str | None = None,
                         source: str | None = None, timeout: float | None = None,
                         frames: bool = False, arrow: bool = False) -> RangeResult:
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
        return await AsyncPendingRange(self, as_destination(destination), extra, frames).result(timeout)

    async def bounds(self, destination: Destination | str, *, subscription: str | None = None,
                     source: str | None = None) -> tuple[int, int]:
        """(earliest available, latest assigned) sequence numbers of a destination."""
        result = await self.read_range(destination, max_messages=0, subscription=subscription, source=source)
        return result.earliest, result.latest

    @guarded
    async def ack_upto(self, destination: Destination | str, seq: int, *,
                       subscription: str | None = None) -> None:
        """Acknowledge every waiting message below sequence number ``seq`` (a reader that owns the
        queue or durable subscription, acknowledging a committed batch)."""
        await self.connection._request(ack_upto_frame(destination, seq, subscription))

    @guarded
    async def send_arrow(self, destination: Destination | str, data: bytes, *,
                         timeout: float | None = None) -> Headers:
        """A bulk SEND (spec/spark.md §7): ``data`` is an Arrow IPC stream of rows, which the broker
        appends as a unit; returns the receipt's headers (``pymq-first-seq``, ``pymq-count``,
        ``pymq-duplicates``) once the rows are durable.  Not inside a transaction."""
        return await start_send_arrow(self, destination, data).result(timeout)

    async def create_queue(self, name: str, **config: object) -> Queue:
        """A Queue; with settings (QueueConfig fields, see ``QueueManager.create``) it is also created on
        the broker, owned by this user: the same settings again are a no-op, different ones raise
        DestinationExists.  (A coroutine in ``pymq.aio``, since with settings it waits for the broker.)"""
        self._check()
        if config:
            return await self.connection.queue_manager()._run(create_call(name, None, dict(config)))
        return Queue(name)

    # -- transactions and acknowledgement ----------------------------------------------------------------
    @guarded
    async def commit(self) -> None:
        """Make this transaction's sends visible and its receives acknowledged, atomically.  After a
        failover (spec/ha.md §4.5): a transaction that did work on the lost link is rolled back instead
        and raises TransactionRolledBack; one whose COMMIT was cut off raises TransactionInDoubt.  Either
        way the next transaction starts clean."""
        conn = self.connection
        await conn._until_open()
        if self._doomed:
            await self._recover(rollback=True)
            raise TransactionRolledBack("the connection failed over while this transaction was open: the broker "
                                        "rolled back what it did, so the whole transaction is rolled back (what "
                                        "it received comes back redelivered; spec/ha.md §4.5)")
        try:
            await conn._request(self._commit_frame())
        except (TransactionInDoubt, TransactionRolledBack):
            self._begin()
            raise
        self._begin()

    @guarded
    async def rollback(self) -> None:
        """Discard this transaction's sends; the messages it received come back first, in their
        original order, marked redelivered."""
        await self._recover(rollback=True)

    @guarded
    async def recover(self) -> None:
        """Redeliver every message consumed but not yet acknowledged, first and in their original
        order (non-transacted sessions)."""
        await self._recover(rollback=False)

    async def _recover(self, rollback: bool) -> None:
        frames, link = self._recovery_frames(rollback)
        if not frames:
            return
        conn = self.connection
        try:
            for frame in frames[:-1]:
                conn._send_on(frame, link)
            await conn._request_on(frames[-1], link)    # the receipt: every NACK is applied
            settle = self._recovery_settle_frames()
            if settle:                         # ... and what they released is dispatched before this one
                for frame in settle[:-1]:
                    conn._send_on(frame, link)
                await conn._request_on(settle[-1], link)
        finally:
            self._end_recovery()

    async def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message this session has consumed."""
        self._acknowledge_now()

    # -- lifecycle -------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Roll back an open transaction, close the consumers (unsubscribing) and end the listener
        dispatcher (a listener that is running may finish its message, within the connection's timeout)."""
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
        if dispatcher is not None:
            # a running listener may finish its message; an idle dispatcher (or one waiting for start) just ends
            await dispatcher.stop(self.connection.factory.timeout if self._in_listener else 0)
        if self in self.connection._sessions:
            self.connection._sessions.remove(self)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _wake(self) -> None:
        self._listener_queue.put(None)
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
    def _start_dispatcher(self) -> None:
        if self._dispatcher is None:
            self._dispatcher = spawn(self._dispatch_loop, "pymq-session-dispatch")

    async def _dispatch_loop(self) -> None:
        queue = self._listener_queue
        conn = self.connection
        guard = self._guard
        while True:
            consumer = await queue.get()      # one entry per message that arrived for a listener
            if self._closed or conn.closed:
                return
            if consumer is None:
                continue
            while not conn._started.is_set():
                await conn._started.wait(0.5)
                if self._closed or conn.closed:
                    return
            if consumer._closed or consumer._listener is None:
                consumer._wake()              # the listener was removed: receive() takes it
                continue
            # a listener runs when the session is free: wait for the task (thread) inside it to leave
            # (JMS: the session serialises its listeners with the application's own use of it)
            if not await guard.enter_waiting():
                return                        # the session closed while the message waited
            try:
                listener = consumer._listener
                link = conn._link             # before the buffer: see ConnectionCore._link
                buffer = consumer._buffer
                if consumer._closed or listener is None or not buffer or conn.closed:
                    continue
                self._in_listener = True
                await consumer._dispatch(buffer.popleft(), listener, link)
            finally:
                self._in_listener = False
                guard.leave()


# -- producer ---------------------------------------------------------------------------------------------

class AsyncMessageProducer(ProducerCore):
    """Sends messages; created by a session and used from its task (thread)."""

    _session: AsyncSession

    @guarded
    async def send(self, message: MessageBody, destination: Destination | str | None = None, *,
                   delivery_mode: int | None = None, priority: int | None = None,
                   time_to_live: int | None = None, delivery_delay: int | None = None,
                   transaction: object = None) -> Message:
        """Send ``message`` (a Message, or str/bytes/dict made into one); returns the Message sent.

        Persistent messages outside a transaction wait for the broker's receipt, which comes once
        the message is durable (disable with ``ConnectionFactory(sync_send=False)``).
        ``transaction``: the application's SQLAlchemy ``Connection`` or ``Session`` (in ``pymq.aio`` also
        their ``AsyncConnection``/``AsyncSession``); the message is written in that database transaction
        and seen only if it commits (spec/storage.md, "SQL device").
        """
        if transaction is not None:
            self._check()
            return await _send_in_transaction(self, message, destination, transaction, delivery_mode=delivery_mode,
                                              priority=priority, time_to_live=time_to_live)
        msg, frame, mode = self._prepare(message, destination, delivery_mode=delivery_mode, priority=priority,
                                         time_to_live=time_to_live, delivery_delay=delivery_delay)
        conn = self._session.connection
        if mode == "receipt":
            msg.message_id = (await conn._request(frame)).get("message-id")
        elif mode == "window":
            await conn._send_windowed(frame)
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
    producer._session._flush_held_acks()     # the row may commit before a held ACK would leave
    msg, target, data = pending_row(producer, message, destination, delivery_mode=delivery_mode,
                                    priority=priority, time_to_live=time_to_live)
    # the broker's SQL device's tables (its CONNECTED names their prefix), else the default ones
    prefix = producer._session.connection.apptx_table_prefix or "pymq_"
    # async:
    run_sync = getattr(transaction, "run_sync", None)
    if run_sync is not None and inspect.iscoroutinefunction(run_sync):
        # SQLAlchemy's AsyncConnection / AsyncSession: the insert runs on their synchronous side
        await run_sync(lambda sync: insert_pending(sync, target, data, persistent=msg.persistent,
                                                   table_prefix=prefix))
        return msg
    # end
    insert_pending(transaction, target, data, persistent=msg.persistent, table_prefix=prefix)
    return msg


# -- consumer ---------------------------------------------------------------------------------------------

class AsyncMessageConsumer(ConsumerCore):
    """Receives from one destination; created by a session and used from its task (thread)."""

    _session: AsyncSession
    _listener: MessageListener | None

    def __init__(self, session: AsyncSession, destination: Destination, selector: str | None,
                 prefetch: int) -> None:
        super().__init__(session, destination, selector, prefetch)
        self._wakeup = Wakeup()

    # the transport's callback (thread): never waits
    def _notify(self) -> None:
        if self._listener is not None:
            self._session._listener_queue.put(self)
            return
        if self._waiting:
            self._waiting = False            # one wake-up per wait; a stale one only costs a re-check
            self._wakeup.set()

    def _wake(self) -> None:
        self._wakeup.set()

    @guarded
    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever); None on timeout."""
        if self._closed or self._listener is not None:
            self._check_receive()
        conn = self._session.connection
        started = conn._started
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            link = conn._link                 # before the buffer: see ConnectionCore._link
            buffer = self._buffer
            if buffer and started.is_set():
                return self._take(buffer.popleft(), link)
            if self._closed:
                raise IllegalStateError("the consumer is closed")
            conn._check_open()
            remaining = None if deadline is None else deadline - time.monotonic()
            if not started.is_set():
                if remaining is not None and remaining <= 0:
                    return None
                await started.wait(remaining)
                continue
            self._before_wait()
            if remaining is not None and remaining <= 0:
                return None
            self._waiting = True              # read by _notify after it appends: no lost wake-up
            try:
                if not self._buffer and not self._closed:
                    await self._wakeup.wait(remaining)
            finally:
                self._waiting = False

    async def receive_no_wait(self) -> Message | None:
        """The next message if one is already here, else None (``receive(timeout=0)``)."""
        return await self.receive(timeout=0)

    def __aiter__(self) -> AsyncIterator[Message]:
        """Messages until the consumer or its connection closes (``async for`` in ``pymq.aio``)."""
        return self

    async def __anext__(self) -> Message:
        """The next message; the iteration ends when the consumer, its session or connection closes."""
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
        """Deliver messages to ``listener`` in the session's dispatcher task (thread), one at a time (in
        ``pymq.aio`` it may be a coroutine function); ``None`` returns the consumer to ``receive``."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        session = self._session
        # async:
        session._check()
        session._guard.check()
        # end
        self._listener = listener
        if listener is not None:
            session._start_dispatcher()
            for _ in range(len(self._buffer)):   # messages that arrived before go to it, in order
                session._listener_queue.put(self)

    async def _dispatch(self, frame: Frame, listener: MessageListener, link: int) -> None:
        """Run ``listener`` for ``frame`` of link ``link`` (the dispatcher, owning the session)."""
        message, delivery = self._for_listener(frame, link)
        try:
            await call_listener(listener, message)
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


# -- browsing and range reads --------------------------------------------------------------------------------

class _AsyncBrowse(BrowseCore):
    def __init__(self, connection: AsyncConnection, destination: Destination,
                 extra: dict[str, object], *, raw: bool = False) -> None:
        super().__init__(connection, destination, extra, raw=raw)
        self.arrived = Flag()

    def _notify(self) -> None:
        self.arrived.set()


async def _browse(session: AsyncSession, browse: _AsyncBrowse, timeout: float | None) -> AsyncIterator[Message]:
    """Subscribe with ``browser:true`` and yield each message as it arrives, until the broker's end
    marker (then ``browse.end`` holds its headers)."""
    conn = session.connection
    try:
        await conn._request(browse.subscribe)
        limit = conn.factory.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            message = browse._next()
            if message is not None:
                yield message
                continue
            if browse.end is not None:
                return
            if browse.error is not None:
                raise browse.error
            conn._check_open()
            remaining = deadline - time.monotonic()
            browse.arrived.clear()
            if browse.frames or browse.end is not None:
                continue
            if remaining <= 0 or not await browse.arrived.wait(remaining):
                raise PymqTimeout(f"the browse of {browse.destination} did not finish within {limit:g}s")
    finally:
        browse._close()


class AsyncQueueBrowser:
    """Looks at a queue's messages in delivery order without removing them."""

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
        self._session._guard.check()
        browse = _AsyncBrowse(self._session.connection, self.queue, {"selector": self.selector or None})
        return _browse(self._session, browse, timeout)

    def __aiter__(self) -> AsyncIterator[Message]:
        """The waiting messages, each once, as the broker sends them (a new snapshot each time)."""
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


class AsyncPendingReceipt:
    """A frame sent with a receipt, waited for later: :meth:`result` returns the RECEIPT's headers, or
    raises the ERROR the broker answered it with (or pymq's TimeoutError).  An abandoned one leaves
    nothing behind once its receipt arrives (or the connection goes)."""

    __slots__ = ("_command", "_conn", "_rid", "_waiter")

    def __init__(self, conn: AsyncConnection, frame: Frame) -> None:
        self._conn = conn
        self._command = frame.command
        self._waiter = Receipt()
        self._rid, framed = conn._expect(frame, self._waiter)
        try:
            conn._send(framed)
        except PymqError:
            conn._forget(self._rid)
            raise

    async def result(self, timeout: float | None = None) -> Headers:
        """The RECEIPT's headers (the broker's ERROR raised; pymq's TimeoutError when none comes)."""
        waiter = self._waiter
        timeout = self._conn.factory.timeout if timeout is None else timeout
        if not await waiter.wait(timeout):
            self._conn._forget(self._rid)
            raise PymqTimeout(f"no receipt for {self._command} within {timeout:g}s")
        return waiter.result()


def start_send_arrow(session: AsyncSession, destination: Destination | str, data: bytes) -> AsyncPendingReceipt:
    """:meth:`Session.send_arrow` in two halves, for writers that build the next bulk SEND while the
    broker appends (and makes durable) the one before (the Spark connector's sink): the frame is sent
    now, ``.result()`` waits for its receipt.  Call it from the task (thread) that uses the session."""
    session._check()
    if session.transacted:
        raise IllegalStateError("a bulk SEND is its own unit: send it from a session that is not transacted")
    return AsyncPendingReceipt(session.connection, bulk_frame(destination, data))


class AsyncPendingRange:
    """A range read asked for and not yet collected (:func:`start_range`): the SUBSCRIBE is on the wire,
    and the broker answers it while the caller does other work.  :meth:`result` waits for the receipt and
    the ``browser:end`` marker.  An abandoned one leaves nothing behind: the browse unregisters itself
    when its end marker arrives, and an unwaited receipt is dropped."""

    __slots__ = ("_browse", "_conn", "_destination", "_subscribed")

    def __init__(self, session: AsyncSession, destination: Destination, extra: dict[str, object],
                 frames: bool = False) -> None:
        conn = self._conn = session.connection
        self._destination = destination
        self._browse = _AsyncBrowse(conn, destination, extra, raw=frames)
        try:
            self._subscribed = AsyncPendingReceipt(conn, self._browse.subscribe)
        except PymqError:
            self._browse._close()
            raise

    async def result(self, timeout: float | None = None) -> RangeResult:
        """The answer (raises pymq's TimeoutError when the receipt or the end marker does not come)."""
        conn, browse = self._conn, self._browse
        limit = conn.factory.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        try:
            await self._subscribed.result(limit)
            while True:
                if browse._collect():
                    continue
                if browse.end is not None:
                    return browse.result()
                if browse.error is not None:
                    raise browse.error
                conn._check_open()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PymqTimeout(f"the browse of {self._destination} did not finish within {limit:g}s")
                browse.arrived.clear()
                if not browse.frames and browse.end is None:
                    await browse.arrived.wait(remaining)
        finally:
            browse._close()


def start_range(session: AsyncSession, destination: Destination | str, *, from_seq: int | None = None,
                to_seq: int | None = None, max_messages: int | None = None, max_bytes: int | None = None,
                from_timestamp: int | None = None, selector: str | None = None, subscription: str | None = None,
                source: str | None = None, frames: bool = False, arrow: bool = False,
                columns: Sequence[str] | None = None) -> AsyncPendingRange:
    """:meth:`Session.read_range` in two halves, for readers that keep the next range in flight while
    they process the current one (the Spark connector's tasks): the request is sent now, the answer is
    taken with ``.result()``.  Answers come in the order asked.  Call it from the task (thread) that uses
    the session, as every session call.  ``columns``: with ``arrow``, the message batch columns the answer
    should carry (spec/spark.md §6; a broker that predates it sends them all)."""
    session._check()
    extra = range_headers(from_seq=from_seq, to_seq=to_seq, max_messages=max_messages, max_bytes=max_bytes,
                          from_timestamp=from_timestamp, selector=selector, subscription=subscription,
                          source=source, arrow=arrow, columns=columns)
    return AsyncPendingRange(session, as_destination(destination), extra, frames)


# -- request/reply --------------------------------------------------------------------------------------------

class AsyncRequestor:
    """Request/reply over a temporary queue: ``Requestor(session, Queue("svc")).request("ping", timeout=5)``
    (awaited in ``pymq.aio``); a context manager that closes its reply consumer and producer."""

    def __init__(self, session: AsyncSession, destination: Destination | str) -> None:
        self.session = session
        self.destination = as_destination(destination)
        self.reply_queue = session.create_temporary_queue()
        self._producer = session.create_producer(self.destination)
        self._consumer: AsyncMessageConsumer | None = None

    async def request(self, message: MessageBody, timeout: float | None = 10.0) -> Message:
        """Send ``message`` and wait for its reply (raises pymq's TimeoutError when none comes)."""
        if self._consumer is None:     # subscribed before the first request can be answered
            self._consumer = await self.session.create_consumer(self.reply_queue)
        msg = request_message(message, self.reply_queue)
        await self._producer.send(msg, delivery_mode=NON_PERSISTENT)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
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

class _Inbox(AdminInbox):
    """The admin reply subscription, with a flag per request waited for."""

    def __init__(self) -> None:
        super().__init__()
        self.flags: dict[str, Flag] = {}

    def _answered(self, corr: str) -> None:
        flag = self.flags.get(corr)
        if flag is not None:
            flag.set()

    def _wake(self) -> None:
        for flag in list(self.flags.values()):
            flag.set()


class AsyncQueueManager:
    """Queue administration over a connection (seed 001): thread-safe like the blocking connection."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        self._inbox: _Inbox | None = None
        self._subscribing = Lock()

    async def _ensure(self) -> _Inbox:
        async with self._subscribing:
            if self._inbox is None:
                inbox = _Inbox()
                sub_id = self.connection._register(inbox)
                await self.connection._request(inbox.subscribe(sub_id))
                self._inbox = inbox
            return self._inbox

    async def call(self, op: str, timeout: float | None = None, **args: object) -> Any:
        """Run admin operation ``op`` (spec/admin.md) with ``args``; its JSON result, or the broker's
        error raised here.  The methods below are the typed way to the common operations."""
        return await self._run(AdminCall(op, dict(args), lambda value: value), timeout)

    async def _run(self, call: AdminCall[_T], timeout: float | None = None) -> _T:
        """Run ``call``; its result, or the broker's error raised here."""
        conn = self.connection
        await conn._until_open()
        inbox = await self._ensure()
        corr, frame = inbox.request(call)
        answered = inbox.flags[corr] = Flag()
        try:
            conn._send(frame)
            wait = conn.factory.timeout if timeout is None else timeout
            if not await answered.wait(wait):
                raise PymqTimeout(f"no answer to admin operation {call.op!r} within {wait:g}s")
            conn._check_open()
            answer = inbox.answers.get(corr)
        finally:
            inbox.flags.pop(corr, None)
            inbox.answers.pop(corr, None)
        if answer is None:
            raise PymqTimeout(f"no answer to admin operation {call.op!r}")
        return admin_result(call, answer)

    # -- the operations ------------------------------------------------------------------------
    async def create(self, name: Queue | str, *, grants: dict[str, list[str]] | None = None,
                     **config: object) -> Queue:
        """Create queue ``name`` owned by this connection's user with ``config`` (QueueConfig fields:
        max_deliveries, dead_letter, dead_retention_ms, default_expiration_ms, default_priority,
        delivery_timeout_ms, max_depth, overflow, redelivery_delay_ms, redelivery_multiplier,
        redelivery_max_delay_ms, schema, routing_key).  The same config again is a no-op; a different one
        raises DestinationExists.  ``routing_key`` (group | correlation-id | message-id) says which id picks a
        message's node in a cluster (spec/routing.md §2.3)."""
        return await self._run(create_call(name, grants, config))

    async def alter(self, name: Queue | str, **config: object) -> JsonObject:
        """Change some settings of queue ``name`` (the QueueConfig fields of :meth:`create`); the others
        keep their values.  Only its owner or an administrator may.  The answer says what changed
        (``changes``) and describes the queue; which settings reach messages already waiting is
        spec/admin.md "Altering a queue".  Kept across restarts."""
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
