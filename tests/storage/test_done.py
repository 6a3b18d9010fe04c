"""DoneRecord: exact on disk, Bloom in front, rebuilt on open, splits finished from disk."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage import DoneRecord

HOST_A = b"a" * 20
HOST_B = b"b" * 20


def fps(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(64) for _ in range(n)]


@pytest.fixture
async def record(tmp_path: Path) -> AsyncIterator[DoneRecord]:
    record = await DoneRecord.open(tmp_path / "done.sqlite3", expected=10_000)
    yield record
    await record.aclose()


async def wait_for_rehash(record: DoneRecord) -> None:
    for _ in range(1_000):
        if not record.splitting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("rehash did not finish")


async def test_add_counts_only_new_pairs(record: DoneRecord) -> None:
    assert await record.add([(HOST_A, 1), (HOST_A, 2), (HOST_A, 1)]) == 2
    assert await record.add([(HOST_A, 2), (HOST_B, 2)]) == 1  # same fp, other host
    assert await record.add([]) == 0
    assert await record.count() == 3


async def test_contains_is_exact_per_host_key(record: DoneRecord) -> None:
    top = (1 << 64) - 1
    await record.add([(HOST_A, 10), (HOST_B, top)])
    assert record.maybe_contains(10) and record.maybe_contains(top)
    assert await record.contains([(HOST_A, 10), (HOST_B, 10), (HOST_B, top), (HOST_A, 11)]) == [
        True,
        False,
        True,
        False,
    ]
    assert await record.contains([]) == []


async def test_unseen_answers_need_no_disk(record: DoneRecord) -> None:
    # With the worker thread held busy, a Bloom-negative query still answers at once.
    await record.add([(HOST_A, fp) for fp in fps(100, seed=1)])
    gate = threading.Event()
    busy = asyncio.create_task(record._worker.run(lambda conn: gate.wait(10), write=False))
    try:
        unseen = [fp for fp in fps(200, seed=2) if not record.maybe_contains(fp)]
        answer = await asyncio.wait_for(record.contains([(HOST_A, fp) for fp in unseen]), 5)
        assert answer == [False] * len(unseen)
        assert not busy.done()
    finally:
        gate.set()
        await busy


async def test_maybe_contains_has_no_false_negatives(record: DoneRecord) -> None:
    seen = fps(5_000, seed=3)
    await record.add([(HOST_A, fp) for fp in seen])
    assert all(record.maybe_contains(fp) for fp in seen)
    unseen = fps(20_000, seed=4)
    assert sum(map(record.maybe_contains, unseen)) < 0.01 * len(unseen)


async def test_fps_for_keys_groups_by_host(record: DoneRecord) -> None:
    await record.add([(HOST_A, 1), (HOST_B, 2), (HOST_A, 1 << 63), (HOST_B, 4)])
    host_c = b"c" * 20
    got = await record.fps_for_keys([HOST_A, host_c, HOST_B])
    assert {k: sorted(v) for k, v in got.items()} == {
        HOST_A: [1, 1 << 63],
        HOST_B: [2, 4],
        host_c: [],
    }


async def test_fps_for_keys_proven_names_only_pages_fetched_here(record: DoneRecord) -> None:
    # 1 fetched with a body, 2 fetched without one (robots.txt kept it out), 3 done on
    # another peer's word, 4 fetched then forgotten (its proof goes with it).
    await record.add(
        [(HOST_A, 1), (HOST_A, 2), (HOST_A, 3), (HOST_B, 4)],
        [
            (HOST_A, 1, "http://a/1", b"12345678"),
            (HOST_A, 2, "http://a/2", b""),
            (HOST_B, 4, "http://b/4", b"87654321"),
        ],
    )
    await record.forget([(HOST_B, 4)])
    got = await record.fps_for_keys([HOST_A, HOST_B], proven=True)
    assert {k: sorted(v) for k, v in got.items()} == {HOST_A: [1, 2], HOST_B: []}
    assert sorted((await record.fps_for_keys([HOST_A]))[HOST_A]) == [1, 2, 3]


async def test_keys_lists_hosts_with_history(record: DoneRecord) -> None:
    assert await record.keys() == []
    await record.add([(HOST_A, 1), (HOST_B, 2), (HOST_A, 3)])
    assert sorted(await record.keys()) == [HOST_A, HOST_B]


async def test_key_counts_counts_each_hosts_history(record: DoneRecord) -> None:
    assert await record.key_counts() == {}
    await record.add([(HOST_A, f) for f in fps(5, 1)] + [(HOST_B, f) for f in fps(2, 2)])
    assert await record.key_counts() == {HOST_A: 5, HOST_B: 2}
    await record.forget([(HOST_A, f) for f in fps(5, 1)])
    assert await record.key_counts() == {HOST_B: 2}


async def test_bad_input_is_refused_before_touching_disk(record: DoneRecord) -> None:
    with pytest.raises(ValueError):
        await record.add([(b"short", 1)])
    with pytest.raises(ValueError):
        await record.add([(HOST_A, -1)])
    with pytest.raises(ValueError):
        await record.add([(HOST_A, 1 << 64)])
    assert await record.count() == 0


async def test_filter_is_rebuilt_from_disk_on_open(tmp_path: Path) -> None:
    path = tmp_path / "done.sqlite3"
    record = await DoneRecord.open(path, expected=2_000)
    seen = fps(3_000, seed=5)
    await record.add([(HOST_A if fp % 2 else HOST_B, fp) for fp in seen])
    await record.aclose()

    record = await DoneRecord.open(path, expected=2_000)
    try:
        assert await record.count() == 3_000
        assert all(record.maybe_contains(fp) for fp in seen)
        # Sized for what is on disk, so the rebuild did not have to split.
        assert record.bloom.height == 1 and record.bloom.pending_rehash == 0
        assert await record.contains([(HOST_A if seen[0] % 2 else HOST_B, seen[0])]) == [True]
    finally:
        await record.aclose()


async def test_splits_are_finished_from_disk_in_the_background(tmp_path: Path) -> None:
    record = await DoneRecord.open(tmp_path / "done.sqlite3", expected=1_024, leaf_capacity=1_024)
    try:
        assert record.bloom.leaves == 1
        items = fps(12_000, seed=6)
        for start in range(0, len(items), 500):
            await record.add([(HOST_A, fp) for fp in items[start : start + 500]])
            assert all(record.maybe_contains(fp) for fp in items[: start + 500])
        await wait_for_rehash(record)
        bloom = record.bloom
        assert bloom.height > 1 and bloom.leaves >= len(items) // 1_024
        assert all(record.maybe_contains(fp) for fp in items)
        # Every old filter was dropped: only leaves hold bits now.
        leaf_bytes = bloom.nbytes // bloom.leaves
        assert bloom.nbytes == bloom.leaves * leaf_bytes
        assert await record.count() == len(items)
    finally:
        await record.aclose()


async def test_survives_reopen_after_growth(tmp_path: Path) -> None:
    path = tmp_path / "done.sqlite3"
    record = await DoneRecord.open(path, expected=1_024, leaf_capacity=1_024)
    items = fps(5_000, seed=7)
    await record.add([(HOST_B, fp) for fp in items])
    await record.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM done").fetchone() == (5_000,)
    record = await DoneRecord.open(path, expected=1_024, leaf_capacity=1_024)
    try:
        assert all(record.maybe_contains(fp) for fp in items)
        assert record.bloom.pending_rehash == 0
        assert await record.add([(HOST_B, items[0])]) == 0
    finally:
        await record.aclose()


async def test_proofs_are_kept_beside_done_pages_and_a_record_from_before_gains_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "done.sqlite3"
    # A record written before proofs existed: its done table alone.
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1882342449")  # "p2D1"
    conn.execute("CREATE TABLE hosts(id INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE)")
    conn.execute(
        "CREATE TABLE done(key_id INTEGER NOT NULL, fp INTEGER NOT NULL,"
        " PRIMARY KEY(key_id, fp)) WITHOUT ROWID"
    )
    conn.execute("INSERT INTO hosts VALUES (1, ?)", (HOST_A,))
    conn.execute("INSERT INTO done VALUES (1, 7)")
    conn.commit()
    conn.close()

    record = await DoneRecord.open(path, expected=1_000)
    try:
        assert await record.contains([(HOST_A, 7)]) == [True]  # nothing lost
        assert await record.proofs([(HOST_A, 7)]) == []  # done on nobody's evidence here
        big = (1 << 64) - 1
        await record.add(
            [(HOST_A, 8), (HOST_B, big), (HOST_B, 9)],
            [(HOST_A, 8, "http://a/8", b"12345678"), (HOST_B, big, "http://b/", b"")],
        )
        with pytest.raises(ValueError):
            await record.add([(HOST_A, 10)], [(HOST_A, 10, "http://a/10", b"123")])
    finally:
        await record.aclose()
    record = await DoneRecord.open(path, expected=1_000)
    try:
        got = await record.proofs([(HOST_A, 8), (HOST_B, big), (HOST_B, 9), (HOST_A, 99)])
        assert got == [(HOST_A, 8, "http://a/8", b"12345678"), (HOST_B, big, "http://b/", b"")]
        await record.forget([(HOST_A, 8)])
        assert await record.proofs([(HOST_A, 8)]) == []
    finally:
        await record.aclose()
