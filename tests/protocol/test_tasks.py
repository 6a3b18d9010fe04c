"""TaskSet: owned tasks, and a shutdown that waits under a deadline, then cancels."""

from __future__ import annotations

import asyncio

import pytest

from protocol import TaskSet


async def test_aclose_lets_tasks_finish_within_the_timeout() -> None:
    ts = TaskSet("t")
    done = asyncio.Event()

    async def work() -> None:
        await asyncio.sleep(0.01)
        done.set()

    ts.spawn(work(), "work")
    await ts.aclose(timeout=5.0)
    assert done.is_set() and len(ts) == 0


async def test_aclose_cancels_after_the_deadline() -> None:
    ts = TaskSet("t")
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = ts.spawn(forever(), "forever")
    assert task is not None
    await ts.aclose(timeout=0.05)
    assert cancelled.is_set() and task.cancelled() and len(ts) == 0
    assert ts.spawn(forever(), "late") is None  # closed: refused, and the coroutine closed


async def test_a_task_that_ignores_cancellation_does_not_hang_aclose() -> None:
    ts = TaskSet("t")
    release = asyncio.Event()
    running = asyncio.Event()

    async def stubborn() -> None:
        running.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    task = ts.spawn(stubborn(), "stubborn")
    assert task is not None
    await running.wait()  # started: cancelling earlier would kill it before its first line
    await ts.aclose(timeout=0.0, grace=0.05)
    assert not task.done()  # given up on, not waited for forever
    release.set()
    await asyncio.wait({task})


async def test_the_callers_cancellation_wins() -> None:
    ts = TaskSet("t")
    inner_cancelled = asyncio.Event()
    waiting = asyncio.Event()

    async def forever() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            inner_cancelled.set()
            raise

    ts.spawn(forever(), "forever")
    closer = asyncio.ensure_future(ts.aclose(timeout=60.0))
    await waiting.wait()
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    await asyncio.wait_for(inner_cancelled.wait(), 5.0)


async def test_join_waits_for_every_task_without_closing() -> None:
    ts = TaskSet("t")
    seen: list[int] = []

    async def child() -> None:
        await asyncio.sleep(0.01)
        seen.append(2)

    async def parent() -> None:
        seen.append(1)
        ts.spawn(child(), "child")

    ts.spawn(parent(), "parent")
    await ts.join()
    assert seen == [1, 2] and not ts.closed
    await ts.aclose()
