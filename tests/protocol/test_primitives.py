"""The small shared primitives, each said once: backoff, the periodic loop, the bounded memo,
the token bucket and the log throttle."""

from __future__ import annotations

import asyncio
import logging

import pytest

from protocol import Backoff, Memo, Rate, Throttle, TokenBucket, backoff_delay, every


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- backoff --------------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_delay(n, 2.0, 30.0) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    assert backoff_delay(0, 2.0, 30.0) == 0.0
    assert backoff_delay(10_000, 2.0, 30.0) == 30.0  # no float overflow


def test_a_backoff_resets_after_a_success() -> None:
    b = Backoff(0.2, 1.0)
    assert [b.next() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.2
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)


# --- the periodic loop ----------------------------------------------------------------------


async def test_every_runs_on_after_a_failing_run_and_stops_when_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[int] = []
    four = asyncio.Event()

    async def job() -> None:
        runs.append(len(runs))
        if len(runs) == 2:
            raise RuntimeError("one odd round")
        if len(runs) == 4:
            four.set()

    loop = asyncio.create_task(every(0.01, job, first=0.0))
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(four.wait(), 5.0)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert "one odd round" in caplog.text
    stopped = len(runs)
    await asyncio.sleep(0.05)
    assert len(runs) == stopped


async def test_every_waits_an_interval_before_the_first_run_by_default() -> None:
    runs: list[None] = []

    async def job() -> None:
        runs.append(None)

    loop = asyncio.create_task(every(10.0, job))
    await asyncio.sleep(0.05)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert runs == []


# --- the bounded memo -----------------------------------------------------------------------


def test_a_memo_reads_as_a_dict_and_empties_when_full() -> None:
    memo: Memo[str, int] = Memo(3)
    for i, k in enumerate("abc"):
        assert memo.remember(k, i) == i
    assert memo.get("b") == 1 and "c" in memo and len(memo) == 3
    memo.remember("d", 3)  # full: forgotten all at once, then stored
    assert dict(memo) == {"d": 3}
    with pytest.raises(ValueError):
        Memo(0)


# --- the token bucket -----------------------------------------------------------------------


def test_a_token_bucket_refills_up_to_its_burst() -> None:
    bucket = TokenBucket(Rate(per_s=10.0, burst=2.0), now=0.0)
    assert bucket.take(0.0) and bucket.take(0.0)
    assert not bucket.take(0.0)
    assert bucket.take(0.1)  # one token back after 1/10 s
    assert bucket.refill(100.0) == 2.0  # never beyond the burst


def test_a_token_bucket_goes_into_debt_and_says_when_it_clears() -> None:
    bucket = TokenBucket(Rate(per_s=100.0, burst=50.0), now=0.0)
    bucket.charge(0.0, 80.0)
    assert bucket.tokens == -30.0
    assert bucket.wait() == pytest.approx(0.3)
    assert bucket.wait(-40.0) == 0.0
    bucket.charge(0.3, -10.0)  # a negative charge gives back
    assert bucket.tokens == pytest.approx(10.0)
    assert TokenBucket(Rate(per_s=0.0, burst=0.0), 0.0).wait(1.0) == float("inf")


# --- the log throttle -----------------------------------------------------------------------


def test_a_throttle_lets_a_burst_through_per_window_and_counts_the_rest() -> None:
    clock = Clock()
    t = Throttle(burst=2, window=10.0, clock=clock)
    assert [t.admit("k") for _ in range(5)] == [0, 0, None, None, None]
    assert t.admit("other") == 0  # kinds are counted apart
    clock.now = 10.0
    assert t.admit("k") == 3  # the first line of the next window tells what was held back
    assert t.admit("k") == 0
    assert t.held_total == 3


def test_a_throttle_forgets_kinds_beyond_its_bound() -> None:
    t = Throttle(burst=1, window=10.0, max_keys=2, clock=Clock())
    for k in ("a", "b"):
        assert t.admit(k) == 0
        assert t.admit(k) is None
    assert t.admit("c") == 0  # full: every kind forgotten, "c" starts a window
    assert t.admit("a") == 0
