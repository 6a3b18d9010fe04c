"""BackupStore: copies held per owner, dedup per (owner, fp), paging for republish."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage import BackupStore, StoredTask

OWNER_1 = b"\x01" * 20
OWNER_2 = b"\x02" * 20
HOST_A = b"a" * 20
HOST_B = b"b" * 20


def task(fp: int, key: bytes = HOST_A) -> StoredTask:
    return StoredTask(url=f"https://h/{fp}", key=key, fp=fp, depth=1, hops=0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[BackupStore]:
    store = await BackupStore.open(tmp_path / "backups.sqlite3")
    yield store
    await store.aclose()


async def test_add_is_unique_per_owner_and_fp(store: BackupStore) -> None:
    assert await store.add(OWNER_1, [task(1), task(2), task(1)]) == 2
    assert await store.add(OWNER_1, [task(2)]) == 0
    assert await store.add(OWNER_2, [task(1)]) == 1  # another owner's copy is separate
    assert await store.add(OWNER_2, []) == 0
    assert await store.count() == 3
    assert await store.owner_counts() == {OWNER_1: 2, OWNER_2: 1}


async def test_remove_only_touches_that_owner(store: BackupStore) -> None:
    await store.add(OWNER_1, [task(1), task(2)])
    await store.add(OWNER_2, [task(1)])
    assert await store.remove(OWNER_1, [1, 99]) == 1
    assert await store.remove(OWNER_1, []) == 0
    assert await store.owner_counts() == {OWNER_1: 1, OWNER_2: 1}
    assert await store.count() == 2


async def test_remove_returning_gives_back_what_went(store: BackupStore) -> None:
    await store.add(OWNER_1, [task(1, HOST_A), task(2, HOST_B), task(3)])
    await store.add(OWNER_2, [task(2, HOST_B)])
    removed = await store.remove_returning(OWNER_1, [3, 2, 2, 42])
    assert removed == [task(2, HOST_B), task(3)]
    assert await store.remove_returning(OWNER_1, [2]) == []
    assert await store.remove_returning(OWNER_1, []) == []
    assert await store.owner_counts() == {OWNER_1: 1, OWNER_2: 1}
    assert await store.count() == 2


async def test_take_owner_all_or_by_host_key(store: BackupStore) -> None:
    await store.add(OWNER_1, [task(1, HOST_A), task(2, HOST_B), task(3, HOST_A)])
    await store.add(OWNER_2, [task(4, HOST_A)])
    taken = await store.take_owner(OWNER_1, [HOST_A])
    assert [t.fp for t in taken] == [1, 3]
    assert await store.owner_counts() == {OWNER_1: 1, OWNER_2: 1}
    assert [t.fp for t in await store.take_owner(OWNER_1)] == [2]
    assert await store.take_owner(OWNER_1) == []
    assert await store.owner_counts() == {OWNER_2: 1}
    assert await store.count() == 1


async def test_page_walks_everything_in_rowid_order(store: BackupStore) -> None:
    await store.add(OWNER_1, [task(i) for i in range(7)])
    await store.add(OWNER_2, [task(100 + i, HOST_B) for i in range(5)])
    seen: list[tuple[bytes, int]] = []
    cursor = 0
    while page := await store.page(cursor, 4):
        assert len(page) <= 4
        seen += [(owner, t.fp) for _, owner, t in page]
        cursor = page[-1][0]
    assert seen == [(OWNER_1, i) for i in range(7)] + [(OWNER_2, 100 + i) for i in range(5)]
    assert await store.page(0, 0) == []


async def test_fields_and_upper_half_fps_round_trip(store: BackupStore) -> None:
    copy = StoredTask(url="https://x/é", key=HOST_B, fp=(1 << 64) - 3, depth=4, hops=2)
    await store.add(OWNER_1, [copy])
    [(_, owner, back)] = await store.page(0, 10)
    assert (owner, back) == (OWNER_1, copy)


async def test_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "backups.sqlite3"
    store = await BackupStore.open(path)
    await store.add(OWNER_1, [task(i) for i in range(4)])
    await store.aclose()
    store = await BackupStore.open(path)
    try:
        assert await store.count() == 4
        assert await store.add(OWNER_1, [task(0)]) == 0
    finally:
        await store.aclose()
