"""Counters for everything the crawl does, and a short history for rates and charts."""

from __future__ import annotations

import bisect
import time
from collections import Counter, deque
from dataclasses import dataclass, field

__all__ = ["CrawlStats", "EventLog", "Histogram", "RevisitStats"]


class Histogram:
    """Fixed-bucket histogram kept as plain counts (cheap to update on the hot path)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        self.counts[bisect.bisect_left(self.bounds, value)] += 1

    def buckets_cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((repr(bound), float(acc)))
        acc += self.counts[-1]
        out.append(("+Inf", float(acc)))
        return out


@dataclass(slots=True)
class CrawlStats:
    pages_fetched: int = 0  # HTTP responses received (any status), robots.txt excluded
    bytes_fetched: int = 0
    html_parsed: int = 0
    links_extracted: int = 0  # per-page unique links after canonicalisation
    urls_discovered: int = 0  # links that passed scope/depth and the seen cache: routed
    seen_cache_hits: int = 0
    out_of_scope: int = 0
    too_deep: int = 0
    robots_disallowed: int = 0
    robots_fetched: int = 0
    redirects: int = 0
    redirect_limit: int = 0
    truncated: int = 0  # pages archived with a cut body; by reason in truncated_by
    non_html: int = 0
    retries: int = 0
    nofollow_pages: int = 0
    skipped_done: int = 0  # queued URLs found already done before fetching
    # Site signals (docs/signals.md): robots directives met, canonical URLs routed, page
    # requisites routed and fetched (pages_fetched counts the latter too), sitemaps.
    noindex_pages: int = 0
    noarchive_pages: int = 0
    headers_only: int = 0  # noarchive responses archived without their body
    canonical_links: int = 0
    requisites_found: int = 0
    requisites_fetched: int = 0
    sitemaps_read: int = 0  # sitemap files fetched and parsed (indexes included)
    sitemap_urls: int = 0  # page URLs they listed that were taken (before the link filter)
    # Why sitemap content was cut or dropped (malformed, entities, too_large, too_many_urls,
    # cross_host, depth, files, fetch) -> count; never fatal.
    sitemap_bounded: Counter[str] = field(default_factory=Counter)
    status: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    # WARC-Truncated reason (length, time, disconnect) -> pages archived so.
    truncated_by: Counter[str] = field(default_factory=Counter)
    # Parse bound hit (depth, deadline, worker) -> pages; parsed_in_worker: off the loop.
    parse_bounded: Counter[str] = field(default_factory=Counter)
    parsed_in_worker: int = 0
    # URLs not queued because of a budget or a trap rule (host_pages, host_urls,
    # repeating_path, session_id) -> count; session_id counts IDs stripped, not URLs lost.
    budget: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    fetch_hist: Histogram = field(
        default_factory=lambda: Histogram(
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
        )
    )
    history: deque[tuple[float, int, int, int]] = field(default_factory=lambda: deque(maxlen=600))
    # The last fetches: (unix time, URL, HTTP status or 0, error kind or "").
    recent: deque[tuple[float, str, int, str]] = field(default_factory=lambda: deque(maxlen=25))

    def signals(self) -> dict[str, object]:
        """The site-signals section of the status API."""
        return {
            "sitemaps_read": self.sitemaps_read,
            "sitemap_urls": self.sitemap_urls,
            "sitemap_bounded": dict(self.sitemap_bounded),
            "requisites_found": self.requisites_found,
            "requisites_fetched": self.requisites_fetched,
            "nofollow_pages": self.nofollow_pages,
            "noindex_pages": self.noindex_pages,
            "noarchive_pages": self.noarchive_pages,
            "headers_only": self.headers_only,
            "canonical_links": self.canonical_links,
        }

    @property
    def error_total(self) -> int:
        return sum(self.errors.values())

    def sample(self, now: float | None = None) -> None:
        """Called once a second: (time, pages, discovered, bytes) for rates and the chart."""
        t = time.monotonic() if now is None else now
        self.history.append((t, self.pages_fetched, self.urls_discovered, self.bytes_fetched))

    def rate(self, window: float = 10.0) -> tuple[float, float, float]:
        """(pages/s, discovered/s, bytes/s) over the last ``window`` seconds."""
        if len(self.history) < 2:
            return 0.0, 0.0, 0.0
        last = self.history[-1]
        first = last
        for item in reversed(self.history):
            first = item
            if last[0] - item[0] >= window:
                break
        dt = last[0] - first[0]
        if dt <= 0:
            return 0.0, 0.0, 0.0
        return (
            (last[1] - first[1]) / dt,
            (last[2] - first[2]) / dt,
            (last[3] - first[3]) / dt,
        )


@dataclass(slots=True)
class EventLog:
    """Recent lifecycle events (joins, leaves, handoffs, owner changes) for the status page."""

    events: deque[dict[str, object]] = field(default_factory=lambda: deque(maxlen=200))

    def add(self, kind: str, **detail: object) -> None:
        self.events.append({"t": time.time(), "kind": kind, **detail})


@dataclass(slots=True)
class RevisitStats:
    """What the revisits did, for the status page and /metrics."""

    revisits: int = 0  # revisits fetched (any answer)
    not_modified: int = 0  # answered 304
    unchanged: int = 0  # a 200 with the same payload
    changed: int = 0  # a 200 with a new payload: changes detected
    gone: int = 0  # 404 or 410
    failed: int = 0  # no usable answer (errors, robots.txt, refused)
    postponed: int = 0  # due but not fetched this time (a budget, a loan)
    retired: int = 0
    first_visits: int = 0  # histories started (pages finished in continuous mode)
    hinted: int = 0  # made due early by a sitemap's <lastmod>
    # Revisits per minute over the last hour: (minute, count), oldest first.
    minutes: list[list[int]] = field(default_factory=list)

    def count_revisit(self, now: float) -> None:
        self.revisits += 1
        minute = int(now // 60)
        if self.minutes and self.minutes[-1][0] == minute:
            self.minutes[-1][1] += 1
        else:
            self.minutes.append([minute, 1])
            del self.minutes[:-60]

    def per_hour(self, now: float) -> int:
        since = int(now // 60) - 59
        return sum(n for minute, n in self.minutes if minute >= since)
