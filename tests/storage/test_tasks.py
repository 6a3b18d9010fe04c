"""TaskStore: dedup, FIFO paging, handoff by host key, persistence."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage import StoredTask, TaskStore

HOST_A = b"a" * 20
HOST_B = b"b" * 20


def task(fp: int, key: bytes = HOST_A, depth: int = 0, hops: int = 0) -> StoredTask:
    return StoredTask(url=f"https://h/{fp}", key=key, fp=fp, depth=depth, hops=hops)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[TaskStore]:
    store = await TaskStore.open(tmp_path / "tasks.sqlite3")
    yield store
    await store.aclose()


async def test_add_dedups_by_fingerprint(store: TaskStore) -> None:
    assert await store.add([task(1), task(2), task(1)]) == [True, True, False]
    assert await store.add([task(2), task(3)]) == [False, True]
    assert await store.add([]) == []
    assert await store.count() == 3


async def test_page_is_fifo_and_resumable(store: TaskStore) -> None:
    fps = [97, 3, 55, 12, 8, 41, 70]
    await store.add([task(fp, depth=i) for i, fp in enumerate(fps)])
    first = await store.page(0, 3)
    assert [t.fp for _, t in first] == fps[:3]
    seqs = [seq for seq, _ in first]
    assert seqs == sorted(seqs)
    rest = await store.page(first[-1][0], 100)
    assert [t.fp for _, t in rest] == fps[3:]
    assert await store.page(rest[-1][0], 100) == []
    assert await store.page(0, 0) == []


async def test_seq_is_never_reused(store: TaskStore) -> None:
    # The engine pages with seq > cursor: a reused seq would hide a new task.
    await store.add([task(1), task(2)])
    last_seq = (await store.page(0, 10))[-1][0]
    assert await store.remove([2]) == 1
    await store.add([task(3)])
    assert [(t.fp) for _, t in await store.page(last_seq, 10)] == [3]


async def test_round_trip_keeps_every_field_and_the_full_fp_range(store: TaskStore) -> None:
    tasks = [
        StoredTask(url="https://x/ü?q=1", key=HOST_A, fp=0, depth=3, hops=2),
        StoredTask(url="https://x/b", key=HOST_B, fp=(1 << 63) - 1, depth=1),
        StoredTask(url="https://x/c", key=HOST_B, fp=1 << 63, depth=0),
        StoredTask(url="https://x/d", key=HOST_A, fp=(1 << 64) - 1, depth=9, hops=5),
    ]
    assert await store.add(tasks) == [True] * 4
    assert [t for _, t in await store.page(0, 10)] == tasks


async def test_remove(store: TaskStore) -> None:
    await store.add([task(i) for i in range(5)])
    assert await store.remove([1, 3, 3, 42]) == 2
    assert await store.remove([]) == 0
    assert [t.fp for _, t in await store.page(0, 10)] == [0, 2, 4]
    assert await store.count() == 3


async def test_take_keys_hands_off_whole_hosts_in_queue_order(store: TaskStore) -> None:
    host_c = b"c" * 20
    await store.add([task(1, HOST_A), task(2, HOST_B), task(3, HOST_A), task(4, host_c)])
    assert await store.key_counts() == {HOST_A: 2, HOST_B: 1, host_c: 1}
    taken = await store.take_keys({HOST_A, host_c})
    assert [t.fp for t in taken] == [1, 3, 4]
    assert await store.key_counts() == {HOST_B: 1}
    assert await store.count() == 1
    assert await store.take_keys([HOST_A]) == []
    assert await store.take_keys([]) == []


async def test_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    store = await TaskStore.open(path)
    await store.add([task(i, depth=i) for i in range(10)])
    await store.remove([0])
    await store.aclose()
    store = await TaskStore.open(path)
    try:
        assert await store.count() == 9
        assert [t.depth for _, t in await store.page(0, 100)] == list(range(1, 10))
        assert await store.add([task(5)]) == [False]
    finally:
        await store.aclose()


def test_stored_task_checks_its_fields() -> None:
    with pytest.raises(ValueError):
        StoredTask(url="u", key=b"short", fp=1, depth=0)
    with pytest.raises(ValueError):
        StoredTask(url="u", key=HOST_A, fp=-1, depth=0)
    with pytest.raises(ValueError):
        StoredTask(url="u", key=HOST_A, fp=1 << 64, depth=0)
