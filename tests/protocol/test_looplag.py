"""The event-loop lag monitor."""

from __future__ import annotations

import asyncio
import time

import pytest

from protocol import LoopLagMonitor


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


def test_take_returns_the_worst_since_the_last_call_and_stalls_are_reported() -> None:
    stalls: list[float] = []
    mon = LoopLagMonitor(stall_after=0.5, on_stall=stalls.append)
    for lag in (0.01, 0.3, 0.02):
        mon.record(lag)
    assert mon.take() == pytest.approx(0.3)
    assert mon.take() == 0.0
    mon.record(0.7)
    assert stalls == [0.7] and mon.stalls == 1


def test_a_failing_stall_reader_does_not_stop_the_monitor() -> None:
    def broken(lag: float) -> None:
        raise RuntimeError("reader bug")

    mon = LoopLagMonitor(stall_after=0.1, on_stall=broken)
    mon.record(0.2)
    mon.record(0.3)
    assert mon.stalls == 2 and mon.snapshot().samples == 2
