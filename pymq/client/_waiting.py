"""How the blocking shell waits: the threading twins of :mod:`pymq.aio._waiting`.

:mod:`pymq.client.blocking` is generated from :mod:`pymq.aio.client` by ``tools/unasync.py``, which
removes ``async``/``await`` and imports these names from here instead of from ``pymq.aio._waiting``.
Each primitive has the same name, methods and meaning as its asyncio twin; only how it waits differs
(threads, ``threading.Event``, ``queue.SimpleQueue``).  The transports call back on their own threads, so
everything a callback touches here is safe to call from another thread and never blocks.
"""
from __future__ import annotations

import functools
import queue
import threading
from contextlib import AbstractContextManager
from typing import Concatenate, Generic, ParamSpec, Protocol, TypeVar
from collections.abc import Callable

from pymq.errors import IllegalStateError, PymqError

Headers = dict[str, str]
_T = TypeVar("_T")


def current_loop() -> object:
    """The blocking shell has no event loop (the asyncio twin returns the running one): None."""
    return None


def check_loop(loop: object) -> None:
    """Any thread may use a blocking connection."""


def link_lock() -> AbstractContextManager[object]:
    """What a failover's reconnection (its own thread) and the application's threads must not interleave
    (pymq/client/_core.py ``ConnectionCore._link_lock``): re-entrant, since a step that holds it may send."""
    return threading.RLock()


class Receipt:
    """One receipt waited for by a thread (the core's ``Waiter``)."""

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

    def wait(self, timeout: float | None) -> bool:
        """True once answered (or failed), False when ``timeout`` passed first."""
        return self.event.wait(timeout)

    def result(self) -> Headers:
        """The RECEIPT's headers, or the ERROR that answered it raised."""
        if self.error is not None:
            raise self.error
        return self.headers


class Flag(threading.Event):
    """A flag threads wait for: ``wait(timeout)`` answers False when the time ran out."""


class Wakeup:
    """What a waiting ``receive`` sleeps on: a token per wake-up in a C-level queue (a
    ``threading.Event`` costs several Python calls per arrival, measurable on the receive path).  A
    stale token only costs the receiver one more look at its buffer."""

    __slots__ = ("_tokens",)

    def __init__(self) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()

    def set(self) -> None:
        self._tokens.put(None)

    def wait(self, timeout: float | None) -> None:
        try:
            self._tokens.get(timeout=None if timeout is None else max(0.0, timeout))
        except queue.Empty:
            pass


class ListenerQueue(Generic[_T]):
    """The consumers whose messages wait for the session's listener dispatcher (None: re-check)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[_T | None] = queue.SimpleQueue()

    def put(self, item: _T | None) -> None:
        self._items.put(item)

    def get(self) -> _T | None:
        return self._items.get()


class Lock:
    """Serialises threads (``with lock``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class Worker:
    """A thread the connection owns (a session's listener dispatcher); daemonic, it ends on its own
    once woken with its session closed."""

    __slots__ = ("thread",)

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread

    @property
    def current(self) -> bool:
        """True when called from inside this worker."""
        return self.thread is threading.current_thread()

    def stop(self, grace: float) -> None:
        """Let a running listener finish within ``grace`` seconds (a thread cannot be cancelled)."""
        if grace > 0 and not self.current:
            self.thread.join(grace)


def spawn(function: Callable[[], None], name: str) -> Worker:
    """Run ``function()`` on a new daemon thread."""
    thread = threading.Thread(target=function, name=name, daemon=True)
    thread.start()
    return Worker(thread)


def call_listener(listener: Callable[[_T], object], value: _T) -> None:
    """Call a message or exception listener."""
    listener(value)


def call_later(loop: object, delay: float, function: Callable[[], None]) -> None:
    """Call ``function()`` once, ``delay`` seconds from now, on a daemon timer thread."""
    timer = threading.Timer(delay, function)
    timer.daemon = True
    timer.start()


# -- one thread at a time in a session --------------------------------------------------------------------

class Guard:
    """A session's owner: the one thread inside it (JMS: a session is single-threaded).  A second thread
    calling in while the first is inside gets IllegalStateError at once, instead of corrupting the
    acknowledgement state; the listener dispatcher waits its turn instead."""

    __slots__ = ("_lock", "_owner", "_closed")

    def __init__(self, closed: Callable[[], bool]) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._closed = closed

    def enter(self) -> bool:
        """Own the session for this call; False when this thread owns it already (a listener using
        its own session), which needs no release."""
        if self._closed():
            raise IllegalStateError("the session is closed")
        me = threading.get_ident()
        if self._owner == me:
            return False
        if not self._lock.acquire(blocking=False):
            raise IllegalStateError("the session is in use by another thread; a Session is "
                                    "single-threaded (create one session per thread)")
        self._owner = me
        return True

    def check(self) -> None:
        """For calls that do not wait: refuse while another thread is inside the session."""
        owner = self._owner
        if owner is not None and owner != threading.get_ident():
            raise IllegalStateError("the session is in use by another thread; a Session is "
                                    "single-threaded (create one session per thread)")

    def enter_waiting(self) -> bool:
        """Own the session once the thread inside it leaves (the listener dispatcher); False when the
        session closed meanwhile."""
        if self._closed():
            return False
        self._lock.acquire()
        if self._closed():
            self._lock.release()
            return False
        self._owner = threading.get_ident()
        return True

    def leave(self) -> None:
        self._owner = None
        self._lock.release()


class _HasGuard(Protocol):
    _guard: Guard


class _OfSession(Protocol):
    @property
    def _session(self) -> _HasGuard: ...


_S = TypeVar("_S", bound=_OfSession)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def guarded(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
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
