"""A separate log for each queue (seed 001: "the system includes a separate log for each message queue ...
the content server can then point to the message queue specific log").

Each queue's events — declared, altered, purged, dropped, a consumer attached or detached, a message
dead-lettered or dropped at its delivery maximum, a message expired — are appended as lines to
``<queue_log_dir>/<file name>.log`` (the queue's name, with every character but letters, digits, ``.``, ``_``
and ``-`` percent-encoded; a long name is cut and given a hash), the path shown by ``queue-info`` as
``log``. A file is made on its queue's first event. Bounded: each file rotates at ``queue_log_max_bytes``
(one older file kept, ``.log.1``), and at most :data:`OPEN_FILES` files are open at once (the least
recently written is closed). A write that fails (a full disk) is counted and logged once, never raised:
a queue's log must not stop its messages.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import IO

log = logging.getLogger("pymq.queue_logs")

#: the most per-queue log files held open at once
OPEN_FILES = 64
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_STEM = 160


def file_name(queue: str) -> str:
    """The log file's name for ``queue`` (a name any file system takes, one per queue)."""
    stem = _SAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), queue)
    if stem.startswith("."):
        stem = "%2E" + stem[1:]
    if len(stem) > _MAX_STEM:
        stem = stem[:_MAX_STEM] + "~" + hashlib.sha256(queue.encode("utf-8")).hexdigest()[:16]
    return stem + ".log"


class QueueLogs:
    def __init__(self, directory: str | None, max_bytes: int = 1 << 20) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._open: OrderedDict[str, IO[str]] = OrderedDict()
        self.failed_writes = 0
        #: high availability (spec/ha.md §2): the files are in the group's shared data directory, so a line
        #: is written only while this process's lease is fresh (a woken former live writes none); None: always
        self.gate: Callable[[], bool] | None = None

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def path_for(self, queue: str) -> str | None:
        """Where ``queue``'s log is (or will be, from its first event); None when queue logs are off."""
        if self.directory is None:
            return None
        return os.path.join(self.directory, file_name(queue))

    def event(self, queue: str, text: str) -> None:
        """Append one line for ``queue``: a UTC timestamp and ``text``."""
        path = self.path_for(queue)
        if path is None:
            return
        gate = self.gate
        if gate is not None and not gate():
            self.failed_writes += 1
            return
        now = time.time()
        line = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z {text}\n"
        try:
            fh = self._file(path)
            fh.write(line)
            fh.flush()
            if fh.tell() >= self.max_bytes:
                self._rotate(path)
        except OSError as exc:
            self.failed_writes += 1
            if self.failed_writes == 1:
                log.warning("queue log %s: %s (further failures are counted, not logged)", path, exc)
            self._close(path)

    def _file(self, path: str) -> IO[str]:
        fh = self._open.get(path)
        if fh is not None:
            self._open.move_to_end(path)
            return fh
        assert self.directory is not None
        os.makedirs(self.directory, exist_ok=True)
        fh = open(path, "a", encoding="utf-8")      # noqa: SIM115 - kept open, closed by _close
        self._open[path] = fh
        while len(self._open) > OPEN_FILES:
            _, oldest = self._open.popitem(last=False)
            oldest.close()
        return fh

    def _rotate(self, path: str) -> None:
        self._close(path)
        os.replace(path, path + ".1")

    def _close(self, path: str) -> None:
        fh = self._open.pop(path, None)
        if fh is not None:
            try:
                fh.close()
            except OSError:
                pass

    def close(self) -> None:
        for path in list(self._open):
            self._close(path)
