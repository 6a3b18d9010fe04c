"""One peer per data directory: an exclusive ``flock`` held for the peer's whole life.

Two peers on one data directory would share a node ID, a task store and a backup store: the
second one's graceful leave would hand off the live peer's work. SQLite's own locking does not
prevent this (both open the WAL fine), so the directory is locked as a whole.

``flock`` (not a PID file checked by hand) because the kernel drops the lock when its holder
dies, SIGKILL included: a crashed peer never leaves a stale lock behind. The holder writes its
PID into the lock file so the next one can say who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_FILE", "DataDirLocked", "DirLock"]

LOCK_FILE = "peer.lock"


class DataDirLocked(Exception):
    """Another live process holds the data directory; ``holder_pid`` is its PID (or None)."""

    def __init__(self, path: Path, holder_pid: int | None) -> None:
        self.path = path
        self.holder_pid = holder_pid
        who = f"process {holder_pid}" if holder_pid is not None else "another process"
        super().__init__(
            f"data directory {path.parent} is in use by {who} ({path} is locked); "
            "stop that peer first, or give this one its own --data directory"
        )


class DirLock:
    """``acquire()`` takes the lock or raises ``DataDirLocked``; ``release()`` drops it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DataDirLocked(self.path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the lock holds without the PID; only the error message would lack it
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            # Emptied first: a reader that opens the file after we close must not name a
            # process that no longer holds it.
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
