"""Small real disks and real broker processes for the storage-fault tests.

``small_disk`` mounts a tmpfs of a given size (root is available in CI) so a broker meets a real full
disk: the kernel's ENOSPC, ``fallocate`` refusing, a restart on a disk with no room.  Where mounting is
not permitted it skips with the reason — except under CI, where it fails (the rule of
``tests/storage/services.py``: CI never goes green without having run them).

``BrokerProcess`` is a ``pymq-server`` child with its log kept, for SIGTERM, ``kill -9`` and restarts.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .services import in_ci


class SmallDisk:
    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size

    def fill(self, name: str, nbytes: int) -> Path:
        """A ballast file of ``nbytes`` (as much as fits); delete it to give the space back."""
        target = self.path / name
        with open(target, "wb", buffering=0) as fh:       # unbuffered: a full disk stops the write, not close
            chunk = memoryview(b"\0" * 65536)
            written = 0
            try:
                while written < nbytes:
                    written += fh.write(chunk[:min(len(chunk), nbytes - written)])
            except OSError:
                # the last bytes that fit: down to one block, so that no block is left free
                try:
                    fh.write(chunk[:4096])
                except OSError:
                    pass
        return target

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size) -> SmallDisk``: a tmpfs of ``size`` bytes, unmounted afterwards."""
    mounted: list[Path] = []

    def make(size: int) -> SmallDisk:
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            reason = (f"cannot mount a {size}-byte tmpfs for a real full disk "
                      f"({proc.stderr.strip() or 'mount failed'}); run as root (CI does)")
            if in_ci():
                pytest.fail(f"{reason} (CI is set: a missing one is a failure, not a skip)", pytrace=False)
            pytest.skip(reason)
        mounted.append(path)
        return SmallDisk(path, size)

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


class BrokerProcess:
    """A ``pymq-server`` child process; its stderr is collected in ``log``."""

    def __init__(self, data_dir: Path, *args: str, config: str | None = None, cwd: Path | None = None,
                 command: tuple[str, ...] = (sys.executable, "-m", "pymq_server.cli")) -> None:
        # command: another installation's pymq-server (tests/packaging runs one from a clean venv)
        cmd = [*command, "--port", "0", "--data-dir", str(data_dir)]
        if config is not None:
            cmd += ["--config", config]
        self.proc = subprocess.Popen([*cmd, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, cwd=cwd)
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.port = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"pymq-server listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.proc.kill()
            rest = self.proc.stderr.read()
            raise AssertionError("broker did not start:\n" + "".join(self.lines) + rest)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            with self._lock:
                self.lines.append(line)

    @property
    def log(self) -> str:
        with self._lock:
            return "".join(self.lines)

    @property
    def url(self) -> str:
        return f"stomp://127.0.0.1:{self.port}"

    def wait_log(self, pattern: str, timeout: float = 20.0) -> re.Match | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log)
            if m:
                return m
            time.sleep(0.05)
        return None

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError("the broker did not stop on SIGTERM:\n" + self.log) from None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
