"""The coalescer: concurrent callers share flushes, and each sees only its own results."""

from __future__ import annotations

import asyncio

import pytest

from p2pcrawl.aio import Coalescer


class Store:
    """Records each flush; a flush answers every item with its double after a hop."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.flushes: list[list[int]] = []
        self.lanes: list[str | None] = []
        self.fail_on = fail_on
        self.release = asyncio.Event()
        self.started = asyncio.Event()  # a flush has begun
        self.release.set()

    async def flush(self, lane: str | None, items: list[int]) -> list[int]:
        self.lanes.append(lane)
        self.started.set()
        self.flushes.append(list(items))
        await self.release.wait()
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError("disk said no")
        return [2 * i for i in items]


async def test_callers_in_one_window_share_one_flush() -> None:
    store = Store()
    gc = Coalescer[str | None, int, int](store.flush, window=0.01)
    results = await asyncio.gather(*(gc.submit(None, [i, i + 100]) for i in range(5)))
    assert results == [[2 * i, 2 * (i + 100)] for i in range(5)]
    assert len(store.flushes) == 1 and gc.flushes == 1


async def test_callers_during_a_flush_join_the_next_one() -> None:
    store = Store()
    store.release.clear()
    gc = Coalescer[str | None, int, int](store.flush)
    first = asyncio.ensure_future(gc.submit(None, [1]))
    await store.started.wait()
    assert store.flushes == [[1]]
    later = [asyncio.ensure_future(gc.submit(None, [i])) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    assert not first.done()  # nothing returns before its flush did
    store.release.set()
    assert await first == [2]
    assert [await f for f in later] == [[4], [6], [8]]
    assert store.flushes == [[1], [2, 3, 4]]


async def test_a_failed_flush_fails_its_callers_only() -> None:
    store = Store(fail_on=2)
    gc = Coalescer[str | None, int, int](store.flush)
    a, b = await asyncio.gather(gc.submit(None, [1]), gc.submit(None, [2]), return_exceptions=True)
    assert isinstance(a, ValueError) and isinstance(b, ValueError)
    assert await gc.submit(None, [3]) == [6]


async def test_a_cancelled_caller_does_not_cancel_the_flush() -> None:
    store = Store()
    store.release.clear()
    gc = Coalescer[str | None, int, int](store.flush)
    gone = asyncio.ensure_future(gc.submit(None, [1]))
    stays = asyncio.ensure_future(gc.submit(None, [2]))
    await store.started.wait()
    gone.cancel()
    store.release.set()
    assert await stays == [4]
    assert store.flushes == [[1, 2]]


async def test_aclose_waits_for_queued_items_then_refuses() -> None:
    store = Store()
    gc = Coalescer[str | None, int, int](store.flush, window=0.01)
    pending = asyncio.ensure_future(gc.submit(None, [5]))
    await asyncio.sleep(0)
    await gc.aclose(timeout=5.0)
    assert pending.done() and pending.result() == [10]
    with pytest.raises(RuntimeError):
        await gc.submit(None, [6])


async def test_lanes_flush_apart() -> None:
    store = Store()
    co = Coalescer[str | None, int, int](store.flush, window=0.01)
    a, b, c = await asyncio.gather(co.submit("a", [1]), co.submit("b", [2]), co.submit("a", [3]))
    assert (a, b, c) == ([2], [4], [6])
    assert sorted(store.flushes) == [[1, 3], [2]]
    assert sorted(map(str, store.lanes)) == ["a", "b"]


async def test_max_items_closes_the_window_early() -> None:
    store = Store()
    co = Coalescer[str | None, int, int](store.flush, window=60.0, max_items=3)
    # A window of a minute: only reaching max_items can let this finish within the test.
    both = await asyncio.gather(co.submit(None, [1, 2]), co.submit(None, [3]))
    assert list(both) == [[2, 4], [6]]
    assert store.flushes == [[1, 2, 3]]


async def test_window_each_flush_waits_again_after_a_flush() -> None:
    store = Store()
    store.release.clear()
    co = Coalescer[str | None, int, int](store.flush, window=0.05, window_each_flush=True)
    first = asyncio.ensure_future(co.submit(None, [1]))
    await store.started.wait()
    later = asyncio.ensure_future(co.submit(None, [2]))
    store.release.set()
    assert await first == [2]
    assert not later.done()  # a second window opened after the first flush
    assert await later == [4]
    assert store.flushes == [[1], [2]]


async def test_aclose_cancels_what_does_not_flush_in_time() -> None:
    store = Store()
    store.release.clear()  # the flush never returns by itself
    co = Coalescer[str | None, int, int](store.flush)
    stuck = asyncio.ensure_future(co.submit(None, [1]))
    await store.started.wait()
    await co.aclose(timeout=0.05)
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert co.pending == 0


async def test_spaced_flushes_go_at_once_when_quiet_and_batch_under_load() -> None:
    """With a spacing, the first item of a quiet lane does not wait for company; what
    arrives while the lane is spaced goes out in one flush, no sooner than the spacing."""
    store = Store()
    gc = Coalescer[str | None, int, int](store.flush, spacing=60.0, max_items=3)
    assert await asyncio.wait_for(gc.submit("a", [1]), 5) == [2]  # not held for 60 s
    assert await asyncio.wait_for(gc.submit("b", [1]), 5) == [2]  # lanes are spaced apart
    spaced = [asyncio.ensure_future(gc.submit("a", [i])) for i in (2, 3)]
    await asyncio.sleep(0.05)
    assert store.flushes == [[1], [1]]  # held: lane "a" flushed less than 60 s ago
    kicked = asyncio.ensure_future(gc.submit("a", [4]))  # the third item fills the batch
    assert [await f for f in (*spaced, kicked)] == [[4], [6], [8]]
    assert store.flushes == [[1], [1], [2, 3, 4]]
    # An urgent item does not wait out the spacing, and takes what waits along.
    held = asyncio.ensure_future(gc.submit("a", [5]))
    await asyncio.sleep(0.05)
    assert not held.done()
    assert await asyncio.wait_for(gc.submit("a", [6], urgent=True), 5) == [12]
    assert await held == [10]
    assert store.flushes[-1] == [5, 6]
    with pytest.raises(ValueError, match="not both"):
        Coalescer[str | None, int, int](store.flush, window=0.1, spacing=0.1)


async def test_a_lane_spacing_can_be_stretched_per_lane() -> None:
    """``spacing_of`` holds one lane back for longer; the others keep the base spacing."""
    store = Store()
    gc = Coalescer[str | None, int, int](
        store.flush, spacing=0.01, spacing_of=lambda lane: 60.0 if lane == "slow" else 0.01
    )
    assert await gc.submit("slow", [1]) == [2]  # a quiet lane still goes at once
    held = asyncio.ensure_future(gc.submit("slow", [2]))
    assert await asyncio.wait_for(gc.submit("fast", [1]), 5) == [2]
    assert await asyncio.wait_for(gc.submit("fast", [3]), 5) == [6]  # spaced 10 ms, not 60 s
    await asyncio.sleep(0.05)
    assert not held.done()
    gc.kick()
    assert await held == [4]
    with pytest.raises(ValueError, match="needs a spacing"):
        Coalescer[str | None, int, int](store.flush, spacing_of=lambda lane: 1.0)


async def test_items_within_a_time_are_not_held_by_a_stretched_spacing() -> None:
    """An item ``within`` a time leaves no later than that after the lane's last flush,
    taking along what waits; without it, the stretched spacing holds."""
    store = Store()
    gc = Coalescer[str | None, int, int](store.flush, spacing=0.01, spacing_of=lambda _: 60.0)
    assert await gc.submit("a", [1]) == [2]
    held = asyncio.ensure_future(gc.submit("a", [2]))
    await asyncio.sleep(0.05)
    assert not held.done()  # held by the 60 s spacing
    assert await asyncio.wait_for(gc.submit("a", [3], within=0.02), 5) == [6]
    assert await held == [4]
    assert store.flushes == [[1], [2, 3]]
    # Right after a flush: it waits for its time, not for the spacing.
    assert await asyncio.wait_for(gc.submit("a", [4], within=0.1), 5) == [8]
    # A later flush is spaced from that one again.
    again = asyncio.ensure_future(gc.submit("a", [5]))
    await asyncio.sleep(0.05)
    assert not again.done()
    gc.kick()
    assert await again == [10]
    assert store.flushes == [[1], [2, 3], [4], [5]]


async def test_posted_items_go_in_the_lane_s_next_flush_without_a_waiting_caller() -> None:
    store = Store()
    store.release.clear()
    gc = Coalescer[str | None, int, int](store.flush)
    waiting = asyncio.ensure_future(gc.submit("a", [1]))
    await store.started.wait()
    gc.post("a", [2, 3])  # returns at once, during the flush under way
    assert gc.pending == 3  # still counted until flushed: "finished" waits for it
    store.release.set()
    assert await waiting == [2]
    await gc.drain()
    assert store.flushes == [[1], [2, 3]] and gc.pending == 0
