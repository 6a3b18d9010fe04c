"""The revisit policy (p2pcrawl/crawl/refresh.py): Cho and Garcia-Molina's optimal law, the
change-rate estimate, and the schedule after each kind of visit."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from p2pcrawl.crawl.refresh import (
    DECAY_AT,
    KNEE_INTERVAL,
    KNEE_RATE,
    MU_PER_BASE,
    Bounds,
    Estimate,
    Seen,
    estimate_rate,
    law_interval,
    next_visit,
)

B = 10_000  # ms
BOUNDS = Bounds(base=B, low=1_000, high=32 * B, retire_after=3)


def freshness(rate: float, interval: float) -> float:
    """Cho and Garcia-Molina's F(λ, I): the share of time a page visited every I is fresh."""
    x = rate * interval
    return -math.expm1(-x) / x


def test_the_knee_is_the_laws_shortest_interval() -> None:
    rates = [KNEE_RATE / B * k / 100 for k in range(50, 186)]
    shortest = min(law_interval(r, B) for r in rates)
    assert shortest == pytest.approx(KNEE_INTERVAL * B, rel=1e-3)
    assert law_interval(KNEE_RATE / B * 0.999, B) == pytest.approx(KNEE_INTERVAL * B, rel=1e-3)


@pytest.mark.parametrize("rate_per_b", [0.001, 0.01, 0.1, 0.5, 1.0, 1.5, 2.0])
def test_the_law_equalises_the_marginal_freshness_of_a_request(rate_per_b: float) -> None:
    # The optimum's condition: one more visit a second is worth mu to every page.
    rate = rate_per_b / B
    interval = law_interval(rate, B)
    f, df = 1 / interval, 1e-6 / interval

    def value(freq: float) -> float:
        return freshness(rate, 1 / freq)

    marginal = (value(f + df) - value(f - df)) / (2 * df)
    assert marginal == pytest.approx(MU_PER_BASE * B, rel=1e-3)


def test_the_law_is_b_at_one_change_per_b_longer_for_stable_pages_and_held_for_fast_ones() -> None:
    assert law_interval(1 / B, B) == pytest.approx(B, rel=1e-6)
    slow = law_interval(1 / (1000 * B), B)
    assert slow == pytest.approx(math.sqrt(2 * MU_PER_BASE * B * 1000 * B), rel=0.05)
    assert law_interval(100 / B, B) == pytest.approx(KNEE_INTERVAL * B)
    assert law_interval(0.0, B) == math.inf
    intervals = [law_interval(r / (100 * B), B) for r in range(1, 1000)]
    assert all(a >= b for a, b in itertools.pairwise(intervals))  # monotone


def test_the_estimate_matches_the_papers_estimator_for_equal_intervals() -> None:
    n, changed, interval = 400, 100, 2 * B
    est = Estimate(n, changed, changed * interval, (n - changed) * interval)
    paper = -math.log((n - changed) / n) / interval
    assert estimate_rate(est, B) == pytest.approx(paper, rel=0.01)
    # Nothing seen yet: the prior's ln 2 / B; always changed: finite, and fast.
    assert estimate_rate(Estimate(), B) == pytest.approx(math.log(2) / B)
    assert math.isfinite(estimate_rate(Estimate(10, 10, 10 * B, 0), B))


def test_the_counts_are_halved_so_the_estimate_follows_new_habits() -> None:
    est = Estimate()
    for _ in range(3 * DECAY_AT):
        est = est.observe(False, B)
    assert est.visits < DECAY_AT
    for _ in range(DECAY_AT):
        est = est.observe(True, B)
    assert estimate_rate(est, B) > 1 / B  # changing now at every visit: the estimate says so


def step(seen: Seen, interval: int = B, misses: int = 0, est: Estimate | None = None) -> object:
    return next_visit(
        seen, interval=interval, estimate=est or Estimate(), misses=misses, elapsed=B, bounds=BOUNDS
    )


def test_shorter_after_a_change_longer_after_none() -> None:
    est = Estimate(8, 1, B, 7 * B)
    base = next_visit(Seen.UNCHANGED, interval=B, estimate=est, misses=0, elapsed=0, bounds=BOUNDS)
    changed = next_visit(Seen.CHANGED, interval=B, estimate=est, misses=0, elapsed=B, bounds=BOUNDS)
    same = next_visit(Seen.UNCHANGED, interval=B, estimate=est, misses=0, elapsed=B, bounds=BOUNDS)
    assert changed.interval < base.interval < same.interval
    assert changed.estimate.changes == 2 and same.estimate.visits == 9


def test_intervals_stay_within_the_bounds() -> None:
    est = Estimate()
    short = Bounds(base=B, low=1_000, high=4 * B)
    for _ in range(200):
        nxt = next_visit(
            Seen.UNCHANGED, interval=B, estimate=est, misses=0, elapsed=short.high, bounds=short
        )
        est = nxt.estimate
    assert nxt.interval == short.high  # a page that never changes ends at the longest
    tight = Bounds(base=B, low=2 * B, high=3 * B)
    for seen in Seen:
        got = next_visit(seen, interval=B, estimate=Estimate(), misses=0, elapsed=B, bounds=tight)
        assert 2 * B <= got.interval <= 3 * B


def test_a_gone_page_backs_off_then_retires_and_a_page_back_starts_over() -> None:
    first = next_visit(
        Seen.GONE, interval=B, estimate=Estimate(), misses=0, elapsed=B, bounds=BOUNDS
    )
    second = next_visit(
        Seen.FAILED,
        interval=first.interval,
        estimate=Estimate(),
        misses=1,
        elapsed=B,
        bounds=BOUNDS,
    )
    third = next_visit(
        Seen.GONE, interval=second.interval, estimate=Estimate(), misses=2, elapsed=B, bounds=BOUNDS
    )
    assert (first.interval, second.interval) == (2 * B, 4 * B)
    assert not first.retire and not second.retire and third.retire
    back = next_visit(
        Seen.CHANGED, interval=4 * B, estimate=Estimate(), misses=2, elapsed=B, bounds=BOUNDS
    )
    assert back.misses == 0 and not back.retire


def test_new_and_postponed() -> None:
    est = Estimate(5, 2, 3, 4)
    assert next_visit(
        Seen.NEW, interval=7 * B, estimate=est, misses=2, elapsed=B, bounds=BOUNDS
    ) == next_visit(Seen.NEW, interval=1, estimate=Estimate(), misses=0, elapsed=0, bounds=BOUNDS)
    kept = next_visit(
        Seen.POSTPONED, interval=7 * B, estimate=est, misses=1, elapsed=B, bounds=BOUNDS
    )
    assert (kept.interval, kept.estimate, kept.misses) == (7 * B, est, 1)


def simulate(
    rates: list[float], adaptive: bool, interval: float, horizon: float, seed: int
) -> tuple[float, int]:
    """Average freshness and requests of one policy over pages changing as Poisson
    processes (the paper's model), in units of B."""
    rng = random.Random(seed)
    bounds = Bounds(base=1000, low=1000, high=32_000)
    fresh = 0.0
    requests = 0
    for rate in rates:
        t, est, gap = 0.0, Estimate(), interval
        next_change = rng.expovariate(rate)
        while t < horizon:
            end = min(t + gap, horizon)
            fresh += min(end, next_change) - t
            if end >= horizon:
                break
            changed = next_change <= end
            while next_change <= end:
                next_change += rng.expovariate(rate)
            requests += 1
            t = end
            if adaptive:
                nxt = next_visit(
                    Seen.CHANGED if changed else Seen.UNCHANGED,
                    interval=int(gap * 1000),
                    estimate=est,
                    misses=0,
                    elapsed=int(gap * 1000),
                    bounds=bounds,
                )
                est, gap = nxt.estimate, nxt.interval / 1000
    return fresh / (len(rates) * horizon), requests


def test_adaptive_beats_uniform_at_equal_requests_in_the_papers_model() -> None:
    # Rates lognormal about one change per 100 B (heavy-tailed, as benchmarks/revisit.py).
    rng = random.Random(7)
    rates = [1 / (100 * math.exp(rng.gauss(0, 2.0))) for _ in range(300)]
    horizon = 200.0
    adaptive, requests = simulate(rates, True, 1.0, horizon, seed=1)
    uniform_interval = len(rates) * horizon / requests
    uniform, uniform_requests = simulate(rates, False, uniform_interval, horizon, seed=1)
    assert abs(uniform_requests - requests) < 0.02 * requests
    assert adaptive > uniform + 0.005
