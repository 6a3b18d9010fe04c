"""The event-loop lag monitor."""

from __future__ import annotations

import asyncio
import time

import pytest

from p2pcrawl.aio.looplag import LoopLagMonitor


def test_p99_and_max_over_the_window() -> None:
    mon = LoopLagMonitor(window=200)
    for i in range(200):
        mon.record(0.001 * (i + 1))
    snap = mon.snapshot()
    assert snap.samples == 200
    assert snap.max == pytest.approx(0.2)
    assert snap.p99 == pytest.approx(0.198)
    # Old samples leave the window; the all-time max stays.
    for _ in range(200):
        mon.record(0.0)
    snap = mon.snapshot()
    assert snap.p99 == 0.0 and snap.max == 0.0 and snap.max_ever == pytest.approx(0.2)


async def test_a_blocked_loop_shows_as_lag() -> None:
    mon = LoopLagMonitor(interval=0.01)
    mon.start()
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # noqa: ASYNC251 - holding the loop, as a long parse would, is the point
        await asyncio.sleep(0.05)
        assert mon.snapshot().max >= 0.25
    finally:
        await mon.aclose()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        LoopLagMonitor(interval=0)
    with pytest.raises(ValueError):
        LoopLagMonitor(window=0)
