"""One peer per data directory: the flock, its error, and its release on death."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage import DataDirLocked, DirLock
from storage.lock import LOCK_FILE

HOLDER = """
import sys, time
from pathlib import Path
from storage.lock import DirLock
lock = DirLock(Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def hold_in_child(directory: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    return child


def stop(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait()
    assert child.stdout is not None
    child.stdout.close()


def test_a_second_holder_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    child = hold_in_child(tmp_path)
    try:
        with pytest.raises(DataDirLocked) as info:
            DirLock(tmp_path).acquire()
        assert info.value.holder_pid == child.pid
        assert f"process {child.pid}" in str(info.value)
        assert str(tmp_path) in str(info.value)
    finally:
        stop(child)


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    child = hold_in_child(tmp_path)
    stop(child)  # SIGKILL: no cleanup code runs, the kernel drops the flock
    lock = DirLock(tmp_path)
    lock.acquire()
    assert lock.held
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()


def test_release_lets_the_next_peer_in_and_clears_the_pid(tmp_path: Path) -> None:
    first = DirLock(tmp_path)
    first.acquire()
    with pytest.raises(DataDirLocked):
        DirLock(tmp_path).acquire()  # a second descriptor in the same process is refused too
    first.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""
    with DirLock(tmp_path) as second:
        assert second.held
    assert not second.held


def test_the_directory_is_created(tmp_path: Path) -> None:
    with DirLock(tmp_path / "new" / "dir") as lock:
        assert lock.path.exists()
