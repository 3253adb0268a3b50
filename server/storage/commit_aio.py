"""Drive a :class:`~.commit.GroupCommit` policy on an asyncio loop, running ``device.sync`` in a thread.

The broker awaits :meth:`CommitDriver.commit` after writing a commit's messages: it flushes the device
(cheap, on the loop thread), registers with the policy and returns once the policy says the writes are
durable.  One background task starts syncs when the policy asks for them; fsync runs in an executor so
the loop keeps serving.  A device that reports ``checkpoint_due`` (the file device) gets its checkpoint
in the executor after a sync's waiters have been released (or, with policy ``never``, whenever it is
due), so receipts never wait for a checkpoint; build such a device with ``checkpoint_in_sync=False``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures

from .commit import GroupCommit
from .device import HoldingDevice


class CommitDriver:
    """One device's group commit on one event loop."""

    def __init__(self, device: HoldingDevice, policy: GroupCommit,
                 executor: concurrent.futures.Executor | None = None) -> None:
        self.device = device
        self.policy = policy
        self._executor = executor
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._checkpoint: asyncio.Future | None = None
        self._closing = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pymq-group-commit")

    async def commit(self) -> None:
        """Flush the device and wait until this commit's writes are durable under the policy."""
        if self._closing:
            raise RuntimeError("commit driver is closed")
        self.start()
        loop = asyncio.get_running_loop()
        self.device.flush()
        done = loop.create_future()

        def fire(error: BaseException | None) -> None:
            # policy callbacks run on the loop thread (sync_done is called from _run)
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

        self.policy.on_commit(fire)
        self._wake.set()
        await done

    async def close(self) -> None:
        """Wait for waiters in flight, then stop the task."""
        self._closing = True
        while self.policy.pending:
            self._wake.set()
            await asyncio.sleep(0.001)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._checkpoint is not None:
            await self._checkpoint

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        policy = self.policy
        while True:
            self._maybe_checkpoint(loop)
            when = policy.next_sync_at(loop.time())
            if when is None:
                await self._wake.wait()
                self._wake.clear()
                continue
            delay = when - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                    self._wake.clear()
                except asyncio.TimeoutError:
                    pass
                continue
            policy.sync_started(loop.time())
            try:
                await loop.run_in_executor(self._executor, self.device.sync)
            except Exception as exc:       # the waiters get it; the driver keeps running
                policy.sync_failed(exc)
            else:
                policy.sync_done()

    def _maybe_checkpoint(self, loop: asyncio.AbstractEventLoop) -> None:
        due = getattr(self.device, "checkpoint_due", False)
        running = self._checkpoint is not None and not self._checkpoint.done()
        if due and not running:
            self._checkpoint = loop.run_in_executor(self._executor, self.device.checkpoint)
