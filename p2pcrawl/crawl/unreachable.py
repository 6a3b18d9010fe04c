"""Hosts that do not answer: how long to keep trying, and when to give their URLs up.

A host that refuses connections, times out before answering, or whose name does not
resolve cannot be crawled, and a crawl that waits for it never ends: robots.txt of such a
host used to be asked again every ``robots_error_ttl`` (10 minutes), each page retried with
a backoff that grew to ``max_delay``, and ``--exit-when-finished`` waited all that time. So
each origin (RFC 9309 §2.3: scheme, host and port, the unit robots.txt is fetched for)
counts its failures to answer in a row, of robots.txt and of pages alike. The next try waits
``RETRY_BASE_S`` x 2^(n-1) seconds; past ``max_retries`` failures in a row the origin is
*given up*: every URL of it that comes up is finished as an error (``host_unreachable``)
without a request, and the origin is listed, with its last error and how many URLs it cost,
in the status API and the exit summary. A closed port or an unknown name is given up after
about 15 seconds, a host that times out on every connection after about a minute.

Given up is not forever: ``retry_after`` seconds after its last failure (the robots.txt
error TTL) an origin gets one request again, and any answer (even an error status) makes it
reachable. Seeding its URLs with ``--recrawl`` fetches them once it answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from p2pcrawl.aio import backoff_delay

__all__ = ["RETRY_BASE_S", "UNREACHABLE_ERRORS", "DeadOrigin", "Unreachable"]

# Failures that mean the host did not answer at all (no HTTP status).
UNREACHABLE_ERRORS = frozenset({"connect", "dns", "timeout"})
RETRY_BASE_S = 2.0
# Origins whose failures are remembered at most; the oldest go first.
MEMO_LIMIT = 100_000
# Origins listed in the status API and the summary at most (the count covers them all).
SHOWN = 20


@dataclass(slots=True)
class DeadOrigin:
    failures: int = 0
    last_failure: float = 0.0  # monotonic
    error: str = ""
    given_up_at: float = 0.0  # wall clock, when it crossed the limit; 0 while not given up
    urls: int = 0  # URLs finished without a request because the origin was given up


class Unreachable:
    def __init__(self, retries: int, retry_after: float) -> None:
        self.retries = retries
        self.retry_after = retry_after
        self._origins: dict[str, DeadOrigin] = {}
        self.urls_given_up = 0

    @property
    def tracking(self) -> bool:
        """Any origin failed lately: the per-URL checks are worth their lookup."""
        return bool(self._origins)

    def failures(self, origin: str) -> int:
        entry = self._origins.get(origin)
        return entry.failures if entry is not None else 0

    def failed(self, origin: str, error: str, now: float | None = None) -> DeadOrigin:
        """The origin did not answer (``error`` is the fetcher's kind)."""
        now = time.monotonic() if now is None else now
        entry = self._origins.pop(origin, None) or DeadOrigin()
        self._origins[origin] = entry  # most recent last
        if len(self._origins) > MEMO_LIMIT:
            del self._origins[next(iter(self._origins))]
        entry.failures += 1
        entry.last_failure, entry.error = now, error
        if entry.failures > self.retries and not entry.given_up_at:
            entry.given_up_at = time.time()
        return entry

    def answered(self, origin: str) -> None:
        """The origin answered (any HTTP status): it is reachable again."""
        self._origins.pop(origin, None)

    def wait(self, origin: str) -> float:
        """How long the next try at ``origin`` waits after its last failure."""
        n = self.failures(origin)
        if n > self.retries:
            return self.retry_after
        return backoff_delay(n, RETRY_BASE_S, self.retry_after)

    def given_up(self, origin: str, now: float | None = None) -> bool:
        """Past its retries, and its last failure recent enough that nobody tries again."""
        entry = self._origins.get(origin)
        if entry is None or entry.failures <= self.retries:
            return False
        now = time.monotonic() if now is None else now
        return now - entry.last_failure < self.retry_after

    def give_up_url(self, origin: str) -> None:
        entry = self._origins.get(origin)
        if entry is not None:
            entry.urls += 1
        self.urls_given_up += 1

    def report(self) -> dict[str, object]:
        """For the status API and the summary: the given-up origins, most recent first."""
        dead = [(o, e) for o, e in self._origins.items() if e.given_up_at]
        dead.sort(key=lambda oe: oe[1].given_up_at, reverse=True)
        return {
            "hosts_unreachable": len(dead),
            "urls_unreachable": self.urls_given_up,
            "unreachable": [
                {
                    "origin": origin,
                    "error": e.error,
                    "failures": e.failures,
                    "urls": e.urls,
                    "since": round(e.given_up_at, 3),
                }
                for origin, e in dead[:SHOWN]
            ],
        }
