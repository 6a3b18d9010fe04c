"""When to revisit a page: its estimated change rate, and the interval that rate deserves.

The policy is the optimal one of Cho and Garcia-Molina, "Effective page refresh policies
for web crawlers" (ACM TODS, 2003), §4: a page that changes as a Poisson process of rate
``λ`` and is visited every ``I`` is fresh a share ``F = (1 - e^-λI) / (λI)`` of the time,
and the visits that maximise the average freshness for a given number of requests give
every page the interval at which one more visit a second is worth the same, ``μ``, to each:
``∂F/∂f = μ`` with ``f = 1/I``, which works out to

    1 - (1 + x) e^-x = μ λ,    I = x / λ.

A page that rarely changes gets a long interval (about ``sqrt(2μ/λ)``, not ``1/λ``: it is
fresh most of the time anyway); a page that changes about once per ``--revisit`` gets
``--revisit``; and a page that changes much faster than the crawler could follow gets no
more visits than one at the policy's shortest interval (the paper's optimum gives it fewer
still, even none: we hold it there, so the pages that change most are never the ones
revisited least). ``μ`` is set from ``--revisit`` (``B``): ``μ = (1 - 2/e) B``, the value
for which a page changing once per ``B`` is revisited every ``B``. The shortest interval
the law gives is ``0.885 B``, at ``λ = 2.03 / B``; so ``--revisit B`` spends at most about
one request per page per ``B``, and much less on a web of mostly stable pages.

Naive adaptive schedules (Nutch's ``AdaptiveFetchSchedule``: shorten the interval by a
factor after a change, lengthen it after none) converge to intervals proportional to
``1/λ``, the proportional policy of §4.3, which the paper shows to be worse than visiting
every page equally often; benchmarks/revisit.py measures ours against the uniform policy.

The rate is estimated from the page's own history, as in Cho and Garcia-Molina,
"Estimating frequency of change" (ACM TOIT, 2003), §5 (irregular access): the maximum
likelihood estimate for visits ``I_j`` apart, of which those that found a change cover
``C`` in all and the others ``U``, is ``λ = (X / C) ln(1 + C / U)`` when the changed
intervals are taken at their mean (with equal intervals it is the paper's
``-ln((n - X) / n) / I``). Half a changed and half an unchanged visit of ``B`` are added
as a prior, which keeps the estimate finite (the paper's +0.5 bias correction), and the
counts are halved every ``DECAY_AT`` visits, so a page whose habits change is followed.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = [
    "DECAY_AT",
    "KNEE_INTERVAL",
    "KNEE_RATE",
    "MU_PER_BASE",
    "Bounds",
    "Estimate",
    "Next",
    "Seen",
    "estimate_rate",
    "law_interval",
    "next_visit",
]

MU_PER_BASE = 1 - 2 / math.e  # g(1): a page changing once per B is revisited every B
# The law's shortest interval and the rate at which it is reached, in units of B (1/B).
KNEE_INTERVAL = 0.88545
KNEE_RATE = 2.0253
DECAY_AT = 32  # visits counted before the estimate's counts are halved
_PRIOR = 0.5  # half a visit of each kind, of length B


class Seen(enum.Enum):
    """What a visit found, as the schedule sees it."""

    NEW = "new"  # the first capture here
    CHANGED = "changed"
    UNCHANGED = "unchanged"  # 304, or the same payload digest
    GONE = "gone"  # 404 or 410
    FAILED = "failed"  # no usable page: no response, an error status, robots.txt said no
    POSTPONED = "postponed"  # not visited this time (a host budget, fetched elsewhere)


@dataclass(frozen=True, slots=True)
class Bounds:
    """The schedule's settings in milliseconds: start at ``base``, stay within
    ``low``..``high``; a page gone ``retire_after`` visits in a row is dropped."""

    base: int
    low: int
    high: int
    retire_after: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high or self.base <= 0 or self.retire_after < 1:
            raise ValueError(f"bad revisit bounds {self}")


@dataclass(frozen=True, slots=True)
class Estimate:
    """Visits and changes counted (halved now and then), and the time they covered."""

    visits: int = 0
    changes: int = 0
    changed_ms: int = 0
    unchanged_ms: int = 0

    def observe(self, changed: bool, elapsed: int) -> Estimate:
        visits, changes = self.visits + 1, self.changes + changed
        cms = self.changed_ms + (elapsed if changed else 0)
        ums = self.unchanged_ms + (0 if changed else elapsed)
        if visits >= DECAY_AT:
            visits, changes, cms, ums = visits // 2, changes // 2, cms // 2, ums // 2
        return Estimate(visits, changes, cms, ums)


@dataclass(frozen=True, slots=True)
class Next:
    """The schedule after a visit: the interval, the estimate and the misses in a row;
    ``retire``: drop the page instead (gone too many times)."""

    interval: int
    estimate: Estimate
    misses: int
    retire: bool = False


def estimate_rate(est: Estimate, base: float) -> float:
    """Changes per unit of time (the unit of ``base``), from the page's visits."""
    changes = est.changes + _PRIOR
    changed = est.changed_ms + _PRIOR * base
    unchanged = est.unchanged_ms + _PRIOR * base
    return changes / changed * math.log1p(changed / unchanged)


def _g(x: float) -> float:
    return -math.expm1(-x) - x * math.exp(-x)  # 1 - (1 + x) e^-x, exact near 0


def law_interval(rate: float, base: float) -> float:
    """The interval Cho and Garcia-Molina's optimum gives a page changing at ``rate``, in
    the unit of ``base``, held at the law's shortest one for pages that change faster."""
    if rate <= 0:
        return math.inf
    if rate >= KNEE_RATE / base:
        return KNEE_INTERVAL * base
    target = MU_PER_BASE * base * rate  # below g's supremum of 1, as rate < 1 / mu
    lo, hi = 0.0, 64.0
    for _ in range(60):  # bisection: g is increasing; 60 halvings reach a double's precision
        mid = (lo + hi) / 2
        if _g(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2 / rate


def next_visit(
    seen: Seen,
    *,
    interval: int,
    estimate: Estimate,
    misses: int,
    elapsed: int,
    bounds: Bounds,
) -> Next:
    """The schedule after a visit that found ``seen``, ``elapsed`` ms after the previous
    one (0 when unknown), given the page's current ``interval``, ``estimate`` and
    ``misses``. A pure function: the whole policy, as the tests drive it."""
    if seen is Seen.NEW:
        return Next(_clamp(bounds.base, bounds), Estimate(), 0)
    if seen is Seen.POSTPONED:
        return Next(_clamp(interval, bounds), estimate, misses)
    if seen in (Seen.GONE, Seen.FAILED):
        # Back off while it stays away, and give up after a bounded number of looks.
        misses += 1
        return Next(_clamp(interval * 2, bounds), estimate, misses, misses >= bounds.retire_after)
    if elapsed > 0:
        estimate = estimate.observe(seen is Seen.CHANGED, elapsed)
    law = law_interval(estimate_rate(estimate, bounds.base), bounds.base)
    return Next(_clamp(law, bounds), estimate, 0)


def _clamp(interval: float, bounds: Bounds) -> int:
    return int(min(bounds.high, max(bounds.low, interval)))
