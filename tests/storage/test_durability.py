"""kill -9 in the middle of writes: every acknowledged batch survives, files stay sound."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path

from storage import BackupStore, DoneRecord, StoredTask, TaskStore
from tests.storage.crash_writer import BATCH, OWNER, batch

WRITER = Path(__file__).with_name("crash_writer.py")


async def run_and_kill(directory: Path, start: int, acked_wanted: int) -> set[int]:
    """Start the writer, SIGKILL it (by PID) once enough batches are acknowledged, and
    return every batch number it acknowledged."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WRITER),
        str(directory),
        str(start),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    acked: set[int] = set()
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
        while len(acked) < acked_wanted:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, "writer exited early"
            acked.add(int(line))
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
    # Lines written before the kill are acknowledged too; a torn last line is not.
    rest = await proc.stdout.read()
    await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    lines = rest.split(b"\n")[:-1]  # the part after the last newline is empty or torn
    acked.update(int(line) for line in lines)
    return acked


def batch_number(task: StoredTask) -> int:
    return int(task.url.split("/")[3])


async def present_batches(directory: Path, acked: set[int]) -> tuple[set[int], ...]:
    """Reopen the stores (quick_check runs on open) and list the batches each one holds,
    asserting that every batch is there entirely or not at all (one add, one commit)."""
    for name in ("tasks", "backups", "done"):
        with sqlite3.connect(directory / f"{name}.sqlite3") as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    tasks = await TaskStore.open(directory / "tasks.sqlite3")
    backups = await BackupStore.open(directory / "backups.sqlite3")
    done = await DoneRecord.open(directory / "done.sqlite3", expected=10_000)
    try:
        queued = [t for _, t in await tasks.page(0, 10**9)]
        held = [t for _, owner, t in await backups.page(0, 10**9) if owner == OWNER]
        keys = [bytes([k]) * 20 for k in range(7)]
        done_fps = {fp for fps in (await done.fps_for_keys(keys)).values() for fp in fps}
        # A batch can be committed in one store and not yet in another when the kill
        # lands, and unacknowledged batches may be whole: look a little past the last ack.
        candidates = acked | {batch_number(t) for t in queued + held}
        candidates |= {i + ahead for i in acked for ahead in range(1, 64)}

        def whole(fps: set[int], count: int) -> set[int]:
            out = set()
            for i in candidates:
                have = [t.fp in fps for t in batch(i)]
                assert all(have) or not any(have), f"batch {i} is torn"
                if all(have):
                    out.add(i)
            assert count == BATCH * len(out), "rows outside any whole batch"
            return out

        in_done = whole(done_fps, await done.count())
        for i in in_done:
            b = batch(i)
            assert await done.contains([(t.key, t.fp) for t in b]) == [True] * BATCH
            assert all(done.maybe_contains(t.fp) for t in b)
        return (
            whole({t.fp for t in queued}, await tasks.count()),
            whole({t.fp for t in held}, await backups.count()),
            in_done,
        )
    finally:
        await asyncio.gather(tasks.aclose(), backups.aclose(), done.aclose())


async def test_acknowledged_batches_survive_sigkill(tmp_path: Path) -> None:
    first = await run_and_kill(tmp_path, 0, 40)
    tasks, backups, done = await present_batches(tmp_path, first)
    assert first <= tasks and first <= backups and first <= done

    # A second writer recovers the killed files, writes on and is killed in turn.
    second = await run_and_kill(tmp_path, 10_000_000, 40)
    tasks, backups, done = await present_batches(tmp_path, first | second)
    assert first | second <= tasks and first | second <= backups and first | second <= done


def test_batch_helper_is_stable() -> None:
    # The check above recomputes batches from their number; that must be deterministic.
    assert batch(3) == batch(3)
    assert len({t.fp for i in range(50) for t in batch(i)}) == 50 * BATCH
    assert all(isinstance(t, StoredTask) for t in batch(0))
