"""The per-file worker thread: group commit, corruption checks, draining, isolation."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from storage import BackupStore, DoneRecord, StoreClosed, StoreCorrupt, StoredTask, TaskStore
from storage.db import SqliteWorker

Opener = Callable[[Path], Awaitable[TaskStore | BackupStore | DoneRecord]]
OPENERS: dict[str, Opener] = {
    "tasks": TaskStore.open,
    "backups": BackupStore.open,
    "done": DoneRecord.open,
}


def task(i: int) -> StoredTask:
    return StoredTask(url=f"https://example.com/{i}", key=b"k" * 20, fp=i, depth=0)


async def open_worker(path: Path, **kwargs: object) -> SqliteWorker:
    worker = SqliteWorker(
        path,
        schema=["CREATE TABLE IF NOT EXISTS t(x INTEGER PRIMARY KEY)"],
        application_id=0x7E57,
        **kwargs,  # type: ignore[arg-type]
    )
    await worker.start()
    return worker


async def test_group_commit_batches_concurrent_adds(tmp_path: Path) -> None:
    store = await TaskStore.open(tmp_path / "tasks.sqlite3")
    try:
        before = store.commits
        results = await asyncio.gather(*(store.add([task(i)]) for i in range(200)))
        assert results == [[True]] * 200
        commits = store.commits - before
        assert 1 <= commits <= 20, commits
        assert await store.count() == 200
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", sorted(OPENERS))
async def test_garbage_file_raises_store_corrupt(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.sqlite3"
    path.write_bytes(b"this is not an sqlite database, just some bytes\n" * 200)
    with pytest.raises(StoreCorrupt) as info:
        await OPENERS[kind](path)
    assert info.value.path == path
    assert "not a database" in info.value.reason


async def test_damaged_pages_raise_store_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    store = await TaskStore.open(path)
    await store.add([task(i) for i in range(2_000)])
    await store.aclose()
    data = bytearray(path.read_bytes())
    assert len(data) > 3 * 4096
    data[2 * 4096 : 3 * 4096] = b"\xff" * 4096  # scribble over a whole b-tree page
    path.write_bytes(bytes(data))
    with pytest.raises(StoreCorrupt):
        await TaskStore.open(path)


async def test_another_stores_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    await (await TaskStore.open(path)).aclose()
    with pytest.raises(StoreCorrupt) as info:
        await DoneRecord.open(path)
    assert "application_id" in info.value.reason


async def test_files_are_in_wal_mode(tmp_path: Path) -> None:
    for kind, opener in OPENERS.items():
        store = await opener(tmp_path / f"{kind}.sqlite3")
        await store.aclose()
        with sqlite3.connect(tmp_path / f"{kind}.sqlite3") as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_synchronous_full_is_accepted_and_nonsense_refused(tmp_path: Path) -> None:
    store = await TaskStore.open(tmp_path / "full.sqlite3", synchronous="FULL")
    assert await store.add([task(1)]) == [True]
    await store.aclose()
    with pytest.raises(ValueError):
        await TaskStore.open(tmp_path / "x.sqlite3", synchronous="NORMAL; DROP TABLE tasks")


async def test_aclose_drains_pending_work(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    store = await TaskStore.open(path)
    pending = [asyncio.create_task(store.add([task(i)])) for i in range(300)]
    await asyncio.sleep(0)  # let every add reach the worker's queue
    await store.aclose()
    assert [t.result() for t in pending] == [[True]] * 300
    with pytest.raises(StoreClosed):
        await store.add([task(1_000)])
    await store.aclose()  # idempotent

    reopened = await TaskStore.open(path)
    assert await reopened.count() == 300
    await reopened.aclose()


async def test_a_failing_job_does_not_undo_its_batch_mates(tmp_path: Path) -> None:
    worker = await open_worker(tmp_path / "w.sqlite3")
    gate = threading.Event()
    holding = threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        holding.set()
        gate.wait(10)  # keeps the worker busy so the next jobs share one batch

    def insert(x: int) -> Callable[[sqlite3.Connection], int]:
        def job(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO t VALUES (?)", (x,))
            return x

        return job

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (99)")
        raise RuntimeError("boom")

    try:
        held = asyncio.create_task(worker.run(hold))
        assert await asyncio.to_thread(holding.wait, 10)  # the worker is inside hold()
        jobs = [worker.run(insert(1)), worker.run(broken), worker.run(insert(2))]
        gathered = asyncio.gather(*jobs, return_exceptions=True)
        await asyncio.sleep(0)
        gate.set()
        results = await gathered
        await held
        assert results[0] == 1 and results[2] == 2
        assert isinstance(results[1], RuntimeError)

        def rows(conn: sqlite3.Connection) -> list[int]:
            return [r[0] for r in conn.execute("SELECT x FROM t ORDER BY x")]

        assert await worker.run(rows, write=False) == [1, 2]  # 99 was rolled back
    finally:
        await worker.aclose()


async def test_the_event_loop_runs_while_a_job_works(tmp_path: Path) -> None:
    # The job only finishes once the loop has run other code: a blocked loop would hang.
    worker = await open_worker(tmp_path / "w.sqlite3")
    loop_ran = threading.Event()
    try:
        job = asyncio.create_task(worker.run(lambda conn: loop_ran.wait(10), write=False))
        for _ in range(3):
            await asyncio.sleep(0)
        loop_ran.set()
        assert await job is True
    finally:
        await worker.aclose()


async def test_on_commit_runs_before_the_caller_resumes(tmp_path: Path) -> None:
    worker = await open_worker(tmp_path / "w.sqlite3")
    seen: list[int] = []
    try:
        value = await worker.run(
            lambda conn: conn.execute("INSERT INTO t VALUES (7)").rowcount, on_commit=seen.append
        )
        assert value == 1 and seen == [1]
    finally:
        await worker.aclose()


async def test_cancelled_caller_does_not_wedge_the_worker(tmp_path: Path) -> None:
    store = await TaskStore.open(tmp_path / "tasks.sqlite3")
    try:
        doomed = asyncio.create_task(store.add([task(1)]))
        await asyncio.sleep(0)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        # The job was already queued, so it still commits; the store keeps working.
        assert await store.add([task(1), task(2)]) == [False, True]
    finally:
        await store.aclose()
