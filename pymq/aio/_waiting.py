"""How the asyncio shell waits: the few primitives :mod:`pymq.aio.client` is written against.

The client shell is written once, in :mod:`pymq.aio.client`; ``tools/unasync.py`` makes the blocking
shell (:mod:`pymq.client.blocking`) from it by removing ``async``/``await`` and renaming these
primitives' module to :mod:`pymq.client._waiting`, which offers the same names for threads.  Everything
that differs between tasks and threads is here, side by side with its twin (psycopg 3's ``_acompat``).

Every primitive is used on the connection's event loop only (the transports call back on it).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar
from collections.abc import Awaitable, Callable, Coroutine

from pymq.errors import IllegalStateError, PymqError

Headers = dict[str, str]
_T = TypeVar("_T")


class _Expired(Exception):
    """Set on one of our own futures when its wait ran out of time (never escapes :func:`wait`)."""


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


async def wait(fut: Awaitable[object], timeout: float | None) -> bool:
    """Await ``fut`` for at most ``timeout`` seconds (None: no limit); False if the time ran out.

    For a plain future of ours (receipts, arrivals) one timer handle does it: ``wait_for`` would add
    a second future and callbacks on every receipt, the hot path of persistent sends."""
    if timeout is None:
        await fut
        return True
    if isinstance(fut, asyncio.Future) and not isinstance(fut, asyncio.Task):
        if fut.done():
            return True
        handle = fut.get_loop().call_later(max(0.0, timeout), _expire, fut)
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


def current_loop() -> asyncio.AbstractEventLoop:
    """The loop the connection belongs to (the blocking twin has none)."""
    return asyncio.get_running_loop()


def check_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """Refuse a call from outside the connection's event loop."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not loop:
        raise IllegalStateError("this connection belongs to another event loop; pymq.aio objects "
                                "are used from the loop that created them")


def link_lock() -> AbstractContextManager[object]:
    """What a failover's reconnection and the application must not interleave: on one event loop they
    cannot (none of those steps awaits), so nothing (the blocking twin is a re-entrant lock)."""
    return nullcontext()


class Receipt:
    """One receipt awaited by a task (the core's ``Waiter``)."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[Headers] = asyncio.get_running_loop().create_future()

    def resolve(self, headers: Headers) -> None:
        if not self.future.done():
            self.future.set_result(headers)

    def fail(self, error: PymqError) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    async def wait(self, timeout: float | None) -> bool:
        """True once answered (or failed), False when ``timeout`` passed first."""
        return await wait(self.future, timeout)

    def result(self) -> Headers:
        """The RECEIPT's headers, or the ERROR that answered it raised."""
        return self.future.result()


class Flag:
    """A flag tasks wait for (``asyncio.Event`` with a timeout that answers False, as threading's)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout: float | None = None) -> bool:
        """True once set, False when ``timeout`` seconds passed first."""
        if self._set:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await wait(fut, timeout)
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)


class Wakeup:
    """What a waiting ``receive`` sleeps on: one future per wait, resolved by an arrival or a close."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        fut = self._future
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        fut = self._future = asyncio.get_running_loop().create_future()
        try:
            await wait(fut, timeout)
        finally:
            self._future = None


class ListenerQueue(Generic[_T]):
    """The consumers whose messages wait for the session's listener dispatcher (None: re-check)."""

    __slots__ = ("_items", "_wakeup")

    def __init__(self) -> None:
        self._items: deque[_T | None] = deque()
        self._wakeup: asyncio.Future[None] | None = None

    def put(self, item: _T | None) -> None:
        self._items.append(item)
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def get(self) -> _T | None:
        items = self._items
        while not items:
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None
        return items.popleft()


class Lock:
    """Serialises tasks (``async with lock``)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()


class Worker:
    """A task the connection owns (a session's listener dispatcher)."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task

    @property
    def current(self) -> bool:
        """True when called from inside this worker."""
        return self.task is asyncio.current_task()

    async def stop(self, grace: float) -> None:
        """End it: a running listener may finish within ``grace`` seconds, then it is cancelled."""
        task = self.task
        if task.done() or self.current:
            return
        if grace <= 0 or not await wait(asyncio.shield(task), grace):
            task.cancel()
        try:
            await task
        except (asyncio.CancelledError, PymqError):
            pass


def spawn(function: Callable[[], Coroutine[Any, Any, None]], name: str) -> Worker:
    """Run ``function()`` as a task on the running loop."""
    return Worker(asyncio.get_running_loop().create_task(function(), name=name))


def call_later(loop: asyncio.AbstractEventLoop, delay: float, function: Callable[[], None]) -> None:
    """Call ``function()`` once, ``delay`` seconds from now, on the connection's loop."""
    loop.call_later(delay, function)


async def call_listener(listener: Callable[[_T], object], value: _T) -> None:
    """Call a message or exception listener; a coroutine function's result is awaited."""
    result = listener(value)
    if inspect.isawaitable(result):
        await result


# -- one task at a time in a session ----------------------------------------------------------------------

class Guard:
    """A session's owner: the one task inside it (JMS's single-threaded session, for tasks).  A second
    task calling in while the first is suspended inside gets IllegalStateError at once; the listener
    dispatcher waits its turn instead."""

    __slots__ = ("_owner", "_released", "_closed")

    def __init__(self, closed: Callable[[], bool]) -> None:
        self._owner: asyncio.Task[Any] | None = None
        self._released: asyncio.Future[None] | None = None
        self._closed = closed

    def enter(self) -> bool:
        """Own the session for the calling task; False when it owns it already (no release needed)."""
        if self._closed():
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

    def check(self) -> None:
        """For calls that do not wait: refuse while another task is suspended inside the session."""
        owner = self._owner
        if owner is not None and owner is not asyncio.current_task():
            raise IllegalStateError("the session is in use by another task; a session is used by one "
                                    "task at a time (create one session per task)")

    async def enter_waiting(self) -> bool:
        """Own the session once the task inside it leaves (the listener dispatcher); False when the
        session closed meanwhile."""
        while self._owner is not None:
            self._released = asyncio.get_running_loop().create_future()
            await self._released
        if self._closed():
            return False
        self._owner = asyncio.current_task()
        return True

    def leave(self) -> None:
        self._owner = None
        released = self._released
        if released is not None and not released.done():
            released.set_result(None)


class _HasGuard(Protocol):
    _guard: Guard


class _OfSession(Protocol):
    @property
    def _session(self) -> _HasGuard: ...


_S = TypeVar("_S", bound=_OfSession)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def guarded(method: Callable[Concatenate[_S, _P], Awaitable[_R]]
            ) -> Callable[Concatenate[_S, _P], Coroutine[object, None, _R]]:
    """Run a coroutine method with its session owned by the calling task (re-entrant for that task)."""

    @functools.wraps(method)
    async def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        guard = self._session._guard
        if not guard.enter():             # already ours: a listener using its own session
            return await method(self, *args, **kwargs)
        try:
            return await method(self, *args, **kwargs)
        finally:
            guard.leave()
    return wrapper
