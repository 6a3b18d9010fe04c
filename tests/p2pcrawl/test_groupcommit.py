"""Group commit: concurrent callers share flushes, and each sees only its own results."""

from __future__ import annotations

import asyncio

import pytest

from p2pcrawl.aio import GroupCommit


class Store:
    """Records each flush; a flush answers every item with its double after a hop."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.flushes: list[list[int]] = []
        self.fail_on = fail_on
        self.release = asyncio.Event()
        self.release.set()

    async def flush(self, items: list[int]) -> list[int]:
        self.flushes.append(list(items))
        await self.release.wait()
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError("disk said no")
        return [2 * i for i in items]


async def test_callers_in_one_window_share_one_flush() -> None:
    store = Store()
    gc = GroupCommit(store.flush, window=0.01)
    results = await asyncio.gather(*(gc.submit([i, i + 100]) for i in range(5)))
    assert results == [[2 * i, 2 * (i + 100)] for i in range(5)]
    assert len(store.flushes) == 1 and gc.flushes == 1


async def test_callers_during_a_flush_join_the_next_one() -> None:
    store = Store()
    store.release.clear()
    gc = GroupCommit(store.flush)
    first = asyncio.ensure_future(gc.submit([1]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert store.flushes == [[1]]
    later = [asyncio.ensure_future(gc.submit([i])) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    assert not first.done()  # nothing returns before its flush did
    store.release.set()
    assert await first == [2]
    assert [await f for f in later] == [[4], [6], [8]]
    assert store.flushes == [[1], [2, 3, 4]]


async def test_a_failed_flush_fails_its_callers_only() -> None:
    store = Store(fail_on=2)
    gc = GroupCommit(store.flush)
    a, b = await asyncio.gather(gc.submit([1]), gc.submit([2]), return_exceptions=True)
    assert isinstance(a, ValueError) and isinstance(b, ValueError)
    assert await gc.submit([3]) == [6]


async def test_a_cancelled_caller_does_not_cancel_the_flush() -> None:
    store = Store()
    store.release.clear()
    gc = GroupCommit(store.flush)
    gone = asyncio.ensure_future(gc.submit([1]))
    stays = asyncio.ensure_future(gc.submit([2]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    gone.cancel()
    store.release.set()
    assert await stays == [4]
    assert store.flushes == [[1, 2]]


async def test_aclose_waits_for_queued_items_then_refuses() -> None:
    store = Store()
    gc = GroupCommit(store.flush, window=0.01)
    pending = asyncio.ensure_future(gc.submit([5]))
    await asyncio.sleep(0)
    await gc.aclose()
    assert pending.done() and pending.result() == [10]
    with pytest.raises(RuntimeError):
        await gc.submit([6])
