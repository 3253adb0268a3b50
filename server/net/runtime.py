"""The broker core's view of the event loop: time, timers and worker threads (asyncio-backed)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable


class AsyncioRuntime:
    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int = 4, cpu_workers: int = 2) -> None:
        self.loop = loop
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                              thread_name_prefix="pymq-worker")
        # password hashes: a pool of their own, so a burst of logins never waits in front of storage's
        # syncs (and a storage stall never holds logins); scrypt releases the GIL while it runs
        self.cpu_executor = concurrent.futures.ThreadPoolExecutor(max_workers=cpu_workers,
                                                                  thread_name_prefix="pymq-hash")

    #: the bare C function (queue statistics read the clock twice per message)
    time = staticmethod(time.monotonic)

    def call_later(self, delay: float, fn: Callable, *args):
        return self.loop.call_later(delay, fn, *args)

    def call_soon(self, fn: Callable, *args):
        return self.loop.call_soon(fn, *args)

    def run_in_thread(self, work: Callable, done: Callable) -> None:
        """Run ``work()`` in a worker thread, then ``done(result, error)`` back on the loop."""
        self._run(self.executor, work, done)

    def run_cpu_bound(self, work: Callable, done: Callable) -> None:
        """As :meth:`run_in_thread`, in the pool for CPU-bound work (password hashes)."""
        self._run(self.cpu_executor, work, done)

    def _run(self, executor: concurrent.futures.Executor, work: Callable, done: Callable) -> None:
        future = self.loop.run_in_executor(executor, work)

        def finished(fut: asyncio.Future) -> None:
            if fut.cancelled():
                done(None, asyncio.CancelledError())
                return
            exc = fut.exception()
            done(None if exc else fut.result(), exc)

        future.add_done_callback(finished)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)
        self.cpu_executor.shutdown(wait=True, cancel_futures=True)
