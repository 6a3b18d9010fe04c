"""Token buckets per source, in a bounded table: how many requests a sender may make.

A UDP peer cannot refuse a datagram, only decline to act on it. What these limits protect is the
work a request causes (parsing, a handler, a reply, an admission challenge). A source that
exceeds its rate is dropped silently: an answer would itself be traffic an attacker could aim
at a third party.

The table keeps at most ``max_sources`` buckets, least recently used first out. A source that is
pushed out starts again with a full bucket, so callers combine a per-source limit with a limit
on a wider key (an IP across its ports) or a global one, which no churn of sources can reset.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["Rate", "SourceLimits", "TokenBucket"]


@dataclass(frozen=True, slots=True)
class Rate:
    per_s: float
    burst: float


class TokenBucket:
    """Tokens refill at ``rate.per_s`` up to ``rate.burst``; work takes them out. The one
    bucket of the project: requests per source here, bytes per second in the crawler's
    pacing (``--max-rate``), which lets a bucket go into debt and waits for it to clear."""

    __slots__ = ("_stamp", "rate", "tokens")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self.tokens = rate.burst
        self._stamp = now

    def refill(self, now: float) -> float:
        """Add what ``now`` brings since the last look (never beyond the burst); the level."""
        rate = self.rate
        self.tokens = min(rate.burst, self.tokens + (now - self._stamp) * rate.per_s)
        self._stamp = now
        return self.tokens

    def take(self, now: float, n: float = 1.0) -> bool:
        """Take ``n`` tokens if there are that many; False (nothing taken) if not."""
        rate = self.rate  # inline refill: this runs for every datagram received
        self.tokens = min(rate.burst, self.tokens + (now - self._stamp) * rate.per_s)
        self._stamp = now
        if self.tokens < n:
            return False
        self.tokens -= n
        return True

    def charge(self, now: float, n: float) -> None:
        """Take ``n`` tokens after the fact, into debt if need be (a cost known only once
        the work is done); a negative ``n`` gives tokens back."""
        self.refill(now)
        self.tokens -= n

    def wait(self, level: float = 0.0) -> float:
        """Seconds from the last look until the bucket holds ``level`` tokens again."""
        short = level - self.tokens
        if short <= 0:
            return 0.0
        return short / self.rate.per_s if self.rate.per_s > 0 else float("inf")


class SourceLimits:
    """One ``TokenBucket`` per key, at most ``max_sources`` of them."""

    def __init__(
        self,
        rate: Rate,
        max_sources: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.max_sources = max_sources
        self._clock = clock
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, key: Hashable, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_sources:
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = TokenBucket(self.rate, now)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def allow(self, key: Hashable, n: float = 1.0) -> bool:
        now = self._clock()
        return self._bucket(key, now).take(now, n)

    def charge(self, key: Hashable, n: float) -> None:
        now = self._clock()
        self._bucket(key, now).charge(now, n)
