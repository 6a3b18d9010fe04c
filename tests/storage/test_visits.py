"""VisitStore: upsert, due order, merge of handed-over rows, the wire form, persistence."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from storage import StoreCorrupt, TaskStore, Visit, VisitStore, pack_visits, unpack_visits

HOST_A = b"a" * 20
HOST_B = b"b" * 20
NOW = 1_700_000_000_000


def visit(fp: int, due: int = NOW, key: bytes = HOST_A, **kw: object) -> Visit:
    fields: dict[str, object] = {
        "url": f"http://h.example/{fp}",
        "key": key,
        "fp": fp,
        "depth": 1,
        "due": due,
        "fetched": NOW - 5000,
        "status": 200,
        "interval": 5000,
    }
    fields.update(kw)
    return Visit(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[VisitStore]:
    store = await VisitStore.open(tmp_path / "visits.sqlite3")
    yield store
    await store.aclose()


async def test_record_replaces_and_add_missing_keeps(store: VisitStore) -> None:
    assert await store.record([visit(1), visit(2, etag='"x"')]) == 2
    assert await store.record([visit(1, status=304)]) == 0  # replaced, not new
    assert await store.add_missing([visit(2, status=0), visit(3)]) == 1
    got = await store.get([(HOST_A, 1), (HOST_A, 2), (HOST_A, 3), (HOST_B, 1)])
    assert [v.status if v else None for v in got] == [304, 200, 200, None]
    assert got[1] is not None and got[1].etag == '"x"'
    assert await store.count() == 3


async def test_every_field_round_trips_with_the_full_fp_range(store: VisitStore) -> None:
    rich = visit(
        (1 << 64) - 1,
        captured=NOW - 9000,
        digest=bytes(range(20)),
        etag='W/"abc"',
        lastmod=1_600_000_000,
        visits=7,
        changes=2,
        changed_ms=12_000,
        unchanged_ms=30_000,
        changes_seen=5,
        misses=1,
        url="http://h.example/ü?q=1",
    )
    await store.record([rich, visit(1 << 63, key=HOST_B)])
    assert await store.get([(HOST_A, rich.fp)]) == [rich]


async def test_due_reads_only_due_rows_oldest_first(store: VisitStore) -> None:
    await store.record([visit(1, NOW + 10), visit(2, NOW - 10), visit(3, NOW), visit(4, NOW - 50)])
    assert [v.fp for v in await store.due(NOW, 10)] == [4, 2, 3]
    assert [v.fp for v in await store.due(NOW, 2)] == [4, 2]
    assert await store.due(NOW, 0) == []
    first, due_now, soonest, after = await store.schedule(NOW, 2, count_upto=100)
    assert (first, due_now, [v.fp for v in soonest], after) == (NOW - 50, 3, [4, 2], NOW + 10)
    assert (await store.schedule(NOW, 2, count_upto=2))[1] == 2  # the count is bounded


async def test_advance_moves_only_stale_later_rows(store: VisitStore) -> None:
    await store.record([visit(1, NOW + 60_000), visit(2, NOW + 60_000), visit(3, NOW - 1)])
    # 1 changed after its fetch: due now; 2 changed before its fetch: kept; 3 is due sooner.
    moved = await store.advance(
        [(HOST_A, 1, NOW, NOW - 1000), (HOST_A, 2, NOW, NOW - 9000), (HOST_A, 3, NOW, NOW)]
    )
    assert moved == 1
    assert [v.fp for v in await store.due(NOW, 10)] == [3, 1]


async def test_take_keys_and_merge_move_a_keys_history(tmp_path: Path) -> None:
    old = await VisitStore.open(tmp_path / "old.sqlite3")
    new = await VisitStore.open(tmp_path / "new.sqlite3")
    try:
        await old.record([visit(1), visit(2), visit(3, key=HOST_B)])
        await new.record([visit(2, fetched=NOW, status=304)])  # newer news here already
        assert [v.fp for v in await old.visits_for_keys([HOST_A])] == [1, 2]
        moving = await old.take_keys([HOST_A])
        assert sorted(v.fp for v in moving) == [1, 2]
        assert await old.count() == 1
        assert await old.get([(HOST_A, 1)]) == [None]
        assert await new.merge(unpack_visits(pack_visits(moving))) == 1
        got = await new.get([(HOST_A, 1), (HOST_A, 2)])
        assert got[0] == visit(1)
        assert got[1] is not None and got[1].status == 304  # the later visit won
        # A later visit from elsewhere brings a visit forward, never puts it off.
        later = dataclasses.replace(visit(1), fetched=NOW + 5, due=NOW + 10**9, status=304)
        sooner = dataclasses.replace(visit(2), fetched=NOW + 5, due=NOW - 5)
        assert await new.merge([later, sooner]) == 0
        got = await new.get([(HOST_A, 1), (HOST_A, 2)])
        assert got[0] == dataclasses.replace(later, due=visit(1).due)
        assert got[1] == sooner
    finally:
        await old.aclose()
        await new.aclose()


async def test_remove_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "visits.sqlite3"
    store = await VisitStore.open(path)
    await store.record([visit(1), visit(2)])
    assert await store.remove([(HOST_A, 1), (HOST_B, 2)]) == 1
    await store.aclose()
    store = await VisitStore.open(path)
    try:
        assert await store.count() == 1
        assert [v.fp for v in await store.due(NOW, 10)] == [2]
    finally:
        await store.aclose()


async def test_another_stores_file_is_refused(tmp_path: Path) -> None:
    tasks = await TaskStore.open(tmp_path / "x.sqlite3")
    await tasks.aclose()
    with pytest.raises(StoreCorrupt, match="application_id"):
        await VisitStore.open(tmp_path / "x.sqlite3")


def test_bad_rows_fail_where_they_are_made() -> None:
    for bad in (
        {"key": b"short"},
        {"url": ""},
        {"etag": "x" * 129},
        {"digest": b"x" * 7},
        {"interval": 0},
        {"due": -5},
        {"status": "200"},
    ):
        with pytest.raises(ValueError):
            visit(1, **bad)
    with pytest.raises(ValueError):
        visit(-1)


def test_wire_form_is_compact_and_exact() -> None:
    rows = [
        visit(i, NOW + i, captured=NOW - 1, digest=b"d" * 20, etag=f'"{i}"', changes_seen=i)
        for i in range(100)
    ] + [visit(7, key=HOST_B, fetched=0)]
    data = pack_visits(rows)
    assert unpack_visits(data) == rows
    url_bytes = sum(len(v.url) for v in rows)
    assert (len(data) - url_bytes) / len(rows) < 70  # fields cost bytes, not the URL's size
    assert unpack_visits(pack_visits([])) == []


@pytest.mark.parametrize(
    "doc",
    [
        [2, 0, []],
        [1, "0", []],
        [1, 0, [[HOST_A, [[1, 2]]]]],
        [1, 0, [[b"k", [list(dataclasses.astuple(visit(1)))[0:1] + [0] * 16]]]],
        [1, 0, [[HOST_A, [["u", 1, 1, None, None, 200, 0, None, b"", "", 0] + [0] * 6]]]],
        {"not": "a list"},
    ],
)
def test_malformed_wire_batches_are_refused(doc: object) -> None:
    with pytest.raises(ValueError):
        unpack_visits(msgspec.msgpack.encode(doc))
    with pytest.raises(ValueError):
        unpack_visits(b"\xc1garbage")
