"""Per-host politeness: one request at a time, and a gap after each one.

Mercator ("Efficient URL Caching for World Wide Web Crawling", §4) never sends two parallel
requests to one server and waits a multiple of the last response time before the next;
"High-performance crawl scheduling" (§3.2) likewise never opens more than one connection per
server. :class:`HostPoliteness` is the per-host state that enforces both; the functions compute
the gaps. Nothing here reads a clock: every call takes ``now``, so tests need no sleeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

from p2pcrawl.aio import backoff_delay
from p2pcrawl.settings import PolitenessSettings

__all__ = [
    "HostPoliteness",
    "next_gap",
    "retry_after_seconds",
]


def next_gap(
    settings: PolitenessSettings, robots_delay: float | None, last_response_time: float
) -> float:
    """Seconds to wait after a response before the next request to the same host.

    The longest of: our own minimum ``delay``, what is left of the site's robots.txt
    Crawl-delay, and ``politeness_factor`` times how long the last response took
    (Mercator: a slow server is a busy server, so back off in proportion). Capped at
    ``max_delay`` so one absurd Crawl-delay cannot park a host forever.

    A Crawl-delay runs from the start of the last request, not its end: the site asks for
    at most one request per that many seconds (Bing's reading, and Scrapy's download
    delay), and one request at a time still holds, since the next never starts before the
    last has ended. Counted from the end, the rate fell with our own load: a peer sharing
    its cores with starting peers took a 50 ms Crawl-delay host at 14-17 pages a second
    against 18-19 when idle (docs/membership.md, "Guarantees, measured"). Our own ``delay``
    and the factor still count from the end (docs/signals.md, "Politeness by site and by
    server").
    """
    response = max(last_response_time, 0.0)
    gap = max(
        settings.delay,
        (robots_delay or 0.0) - response,
        settings.politeness_factor * response,
    )
    return max(0.0, min(gap, settings.max_delay))


def retry_after_seconds(value: str | None, now_epoch: float, default: float, cap: float) -> float:
    """Seconds a ``Retry-After`` header asks us to wait (RFC 9110 §10.2.3), within [0, cap].

    The header is either delay-seconds (``1*DIGIT``) or an HTTP-date; ``now_epoch`` is wall
    clock time (``time.time()``) because the date is. A missing or malformed header yields
    ``default``.
    """
    seconds = default
    text = (value or "").strip()
    if text.isascii() and text.isdigit():
        seconds = float(int(text))
    elif text:
        try:
            when = parsedate_to_datetime(text)
        except (ValueError, TypeError, IndexError, OverflowError):
            pass
        else:
            # RFC 9110 §5.6.7: HTTP-dates are GMT; the asctime form carries no zone at all.
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            seconds = when.timestamp() - now_epoch
    if math.isnan(seconds):
        seconds = default
    return max(0.0, min(seconds, cap))


@dataclass(slots=True)
class HostPoliteness:
    """Politeness state of one host; moves with the host key on join and leave.

    All times are monotonic (``time.monotonic()``) except where a function says otherwise.
    """

    next_allowed: float = 0.0
    busy: bool = False
    last_response_time: float = 0.0
    robots_delay: float | None = None
    # The robots policy ``robots_delay`` was read from: a policy outlives the host's queue (a
    # drained host is forgotten, the policy is cached a day), and a new queue must read it.
    robots_from: object | None = None
    consecutive_errors: int = 0

    def cycle(self, settings: PolitenessSettings) -> float:
        """Seconds between the starts of two requests to this host here: its last response
        time and the gap after it (lending compares it with a loan's pace)."""
        return self.last_response_time + self.gap(settings)

    def gap(self, settings: PolitenessSettings) -> float:
        """Seconds after a response before the next request to this host (``next_gap``)."""
        return next_gap(settings, self.robots_delay, self.last_response_time)

    def ready(self, now: float) -> bool:
        """Whether a request may start now: none in flight, and the gap has passed."""
        return not self.busy and now >= self.next_allowed

    def start(self, now: float) -> None:
        """Mark a request to this host as in flight.

        Raises RuntimeError if one already is: two parallel requests to one server is exactly
        what Mercator and the two-level scheduler forbid, so it is a scheduler bug, not a
        condition to absorb.
        """
        if self.busy:
            raise RuntimeError("a request to this host is already in flight")
        self.busy = True

    def finish(
        self,
        now: float,
        response_time: float,
        settings: PolitenessSettings,
        retry_after: float | None = None,
        *,
        error: bool = False,
    ) -> None:
        """Record the end of the in-flight request and schedule the next one.

        ``retry_after`` is the wait a 429/503 asked for (see :func:`retry_after_seconds`).
        ``error=True`` for a retryable failure (timeout, connection error, 5xx): each one in a
        row doubles the wait, starting at ``settings.delay`` and capped at
        ``settings.max_delay``; any other outcome resets the count.
        """
        if not self.busy:
            raise RuntimeError("finish() without a request in flight")
        self.busy = False
        self.last_response_time = max(response_time, 0.0)
        self.consecutive_errors = self.consecutive_errors + 1 if error else 0
        gap = max(
            next_gap(settings, self.robots_delay, self.last_response_time),
            retry_after or 0.0,
            backoff_delay(self.consecutive_errors, settings.delay, settings.max_delay),
        )
        self.next_allowed = now + gap
