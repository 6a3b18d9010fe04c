"""How a store fails: a damaged file, a file that cannot be written, a store used after close.

Kept apart from ``storage.db`` so that the stores, the data-directory checks and their
callers name the failure without the worker that meets it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
from pathlib import Path

__all__ = [
    "StoreClosed",
    "StoreCorrupt",
    "StoreUnwritable",
    "check_synchronous",
    "unwritable",
]

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class StoreCorrupt(Exception):
    """The file is not a usable store: not SQLite, damaged, or another store's file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StoreUnwritable(OSError):
    """The store cannot be created or written: the disk is full, the file system is
    read-only, or permissions forbid it. Not damage: the same files work with room."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot write {path}: {reason}")
        self.path = path
        self.reason = reason


# SQLite primary result codes that mean "cannot write here" rather than "damaged file".
_UNWRITABLE_CODES = frozenset({3, 8, 10, 13, 14})  # PERM, READONLY, IOERR, FULL, CANTOPEN


def unwritable(path: Path, exc: sqlite3.Error) -> StoreUnwritable | None:
    """A :class:`StoreUnwritable` saying why, if ``exc`` is a write failure, else None."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or code & 0xFF not in _UNWRITABLE_CODES:
        return None
    directory = path.parent
    reason = str(exc)
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(directory).free
        if free < 1 << 20:
            reason = f"the disk is full ({free} bytes free on {directory})"
    if not os.access(directory, os.W_OK):
        reason = f"{directory} is not writable ({errno.errorcode[errno.EACCES]})"
    with contextlib.suppress(OSError):
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            reason = f"{directory} is on a read-only file system"
    return StoreUnwritable(path, reason)


class StoreClosed(RuntimeError):
    """The store was used after ``aclose()``."""


def check_synchronous(value: str) -> str:
    mode = value.upper()
    if mode not in _SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {', '.join(_SYNCHRONOUS)}, got {value!r}")
    return mode
