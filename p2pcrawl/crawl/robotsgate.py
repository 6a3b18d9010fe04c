"""robots.txt before a host's first page: fetched once per origin, cached, failures counted.

The policy itself is :mod:`p2pcrawl.crawl.robots` (parsing, caching, expiry); this module is
the fetching side (RFC 9309 §2.3: the origin's ``/robots.txt``, redirects followed up to
five hops, at least 500 KiB read), and what a crawl does while a robots.txt stays
unreachable.
"""

from __future__ import annotations

import time

from p2pcrawl.crawl import politeness, urls
from p2pcrawl.crawl.domains import DomainTable
from p2pcrawl.crawl.fetcher import Fetcher, FetchResult
from p2pcrawl.crawl.frontier import HostQueue, Task
from p2pcrawl.crawl.hostslot import HostSlot
from p2pcrawl.crawl.pacing import Pacer, response_on_wire
from p2pcrawl.crawl.robots import MAX_ROBOTS_BYTES, RobotsCache, RobotsPolicy, policy_from_response
from p2pcrawl.crawl.sitemapgate import SitemapReader
from p2pcrawl.crawl.stats import CrawlStats
from p2pcrawl.crawl.unreachable import UNREACHABLE_ERRORS, Unreachable
from p2pcrawl.settings import CrawlSettings, Partition

__all__ = ["ROBOTS_MAX_REDIRECTS", "RobotsGate"]

ROBOTS_MAX_REDIRECTS = 5  # RFC 9309 §2.3.1.2
# Origins whose consecutive robots.txt failures are remembered, at most.
FAILURE_MEMO_LIMIT = 100_000
PEEK_LIMIT = 1_024  # origins whose policy ``peek`` keeps for itself


class RobotsGate:
    def __init__(
        self,
        settings: CrawlSettings,
        fetcher: Fetcher,
        stats: CrawlStats,
        pacer: Pacer,
        unreachable: Unreachable | None = None,
        partition: Partition = "host",
        domains: DomainTable | None = None,
    ) -> None:
        """``domains``: the per-domain rules, whose User-Agent a host's robots.txt is read
        for (``excludes``)."""
        self.domains = domains
        self.settings = settings
        self.fetcher = fetcher
        self.stats = stats
        # --max-rate: robots.txt does not wait its turn (one small request per host, and a
        # host's exploration waits on it), but what it carried is counted.
        self.pacer = pacer
        self.cache = RobotsCache()
        # Origins that did not answer at all (refused, timed out, a name that does not
        # resolve) are the engine's, shared with the page fetches; this counts the ones that
        # answered robots.txt with a server error (or a broken or endless redirect).
        self.unreachable = unreachable or Unreachable(
            settings.politeness.max_retries, settings.politeness.robots_error_ttl
        )
        self._failures: dict[str, int] = {}  # origin -> consecutive robots.txt failures
        # Told of each robots.txt fetched: the host's sitemaps are read next.
        self.sitemaps = SitemapReader(settings, fetcher, stats, self.cache, pacer, partition)
        # Policies read by ``peek``, apart from ``cache``: ``policy_for`` takes one over at
        # the host's first page, and tells the sitemap reader then.
        self._peeked = RobotsCache(PEEK_LIMIT)

    async def peek(self, origin: str, user_agent: str | None = None) -> RobotsPolicy | None:
        """``origin``'s robots policy, its robots.txt read now if no policy is held, for a
        question about a host this peer may not crawl (``network.vouching``); None when it
        gave no answer. One request per origin while the policy lasts; its connection waits
        for the host's page fetch, if one is under way (one connection per host)."""
        now = time.monotonic()
        policy = self.cache.get(origin, now) or self._peeked.get(origin, now)
        if policy is not None:
            return policy
        status, body, *_ = await self._read(origin, user_agent)
        if status is None:
            return None
        policy = policy_from_response(status, body, time.monotonic(), self.settings.politeness)
        self._peeked.put(origin, policy)
        return policy

    async def excludes(self, url: str) -> bool:
        """Whether ``url``'s robots.txt keeps it out, as ``attempt`` would find it (read now
        if no policy is held: ``peek``); False when it did not answer."""
        ruled = self.domains.for_host(urls.hostname_of(url)) if self.domains else None
        agent = (ruled[1].user_agent if ruled is not None else None) or self.fetcher.user_agent
        policy = await self.peek(urls.origin_of(url), agent)
        return policy is not None and policy.kind == "rules" and not policy.allowed(url, agent)

    def unreachable_too_long(self, url: str) -> bool:
        """robots.txt of ``url``'s origin failed more often than a page may be retried."""
        origin = urls.origin_of(url)
        return self._failures.get(origin, 0) > self.settings.politeness.max_retries

    async def policy_for(
        self, slot: HostSlot, task: Task, user_agent: str | None = None
    ) -> RobotsPolicy | None:
        """The host's robots policy, or None when robots.txt had to be fetched first: the
        request used the host's slot, and ``task`` waits on the host's queue behind it."""
        now = time.monotonic()
        origin = urls.origin_of(task.url)  # RFC 9309 §2.3: scheme, host and port
        policy = self.cache.get(origin, now)
        if policy is None and (policy := self._peeked.take(origin, now)) is not None:
            # Read for a check (``peek``) before this host's first page: not read again.
            self.cache.put(origin, policy)
            self.sitemaps.found_robots(origin, policy, task)
        if policy is not None:
            if slot.hq.polite.robots_from is not policy:
                # A host queue made after its robots.txt was fetched (the host drained and
                # was forgotten, or it arrived on loan): its Crawl-delay still holds.
                self._read_delay(slot.hq, policy, user_agent)
            return policy
        status, body, res, url, elapsed = await self._read(origin, user_agent)
        if status is None and res.error:
            self.stats.errors[res.error] += 1
        if res.error == "forbidden" and url != origin + "/robots.txt":
            # A robots.txt that redirects into an address the guard refuses (a cloud
            # metadata endpoint, say) was never fetched from there. The file is unavailable,
            # which RFC 9309 §2.3.1.3 treats as a 4xx: no rules.
            self.stats.errors["robots_redirect_refused"] += 1
            status, body = 404, None
        no_answer = status is None and res.status == 0 and res.error in UNREACHABLE_ERRORS
        if no_answer:
            self.unreachable.failed(origin, res.error or "")
        elif status is None or status >= 500:
            if len(self._failures) > FAILURE_MEMO_LIMIT:
                self._failures.clear()
            self._failures[origin] = self._failures.get(origin, 0) + 1
        else:
            self._failures.pop(origin, None)
        if not no_answer:
            self.unreachable.answered(origin)
        if res.error == "forbidden" and url == origin + "/robots.txt":
            # The SSRF guard refuses the host itself, so robots.txt can never be fetched:
            # holding its URLs until it is (RFC 9309 §2.3.1.4) would stall the crawl forever.
            # Let each page fetch be refused and counted instead.
            ttl = self.settings.politeness.robots_error_ttl
            policy = RobotsPolicy("allow_all", time.monotonic() + ttl)
        elif no_answer:
            # RFC 9309 §2.3.1.4: complete disallow while unreachable; asked again soon, so
            # that a host that never answers is given up in seconds, not in ten minutes.
            policy = RobotsPolicy("disallow_all", time.monotonic() + self.unreachable.wait(origin))
        else:
            policy = policy_from_response(status, body, time.monotonic(), self.settings.politeness)
        self.cache.put(origin, policy)
        self.sitemaps.found_robots(origin, policy, task)
        hq = slot.hq
        self._read_delay(hq, policy, user_agent)
        gap = politeness.next_gap(self.settings.politeness, hq.polite.robots_delay, elapsed)
        slot.requeue(task)
        slot.after(elapsed, gap)
        return None

    async def _read(
        self, origin: str, user_agent: str | None
    ) -> tuple[int | None, bytes | None, FetchResult, str, float]:
        """``origin``'s robots.txt, redirects followed (RFC 9309 §2.3.1.2): its status and
        body when whole enough to go by (else None and None), the last response, its URL,
        and the seconds the requests took."""
        url = origin + "/robots.txt"
        status: int | None = None
        body: bytes | None = None
        elapsed = 0.0
        for _ in range(ROBOTS_MAX_REDIRECTS + 1):
            res = await self.fetcher.fetch(url, max_body=MAX_ROBOTS_BYTES, user_agent=user_agent)
            elapsed += res.elapsed
            if self.pacer.enabled and res.status:
                self.pacer.count(response_on_wire(len(res.body), res.headers))
            if res.is_redirect and res.location:
                nxt = urls.resolve(url, res.location)
                if nxt is None:
                    break
                url = nxt
                continue
            if res.status and res.truncated in ("", "length"):
                # A robots.txt cut by a timeout or a broken connection may have lost the
                # very rules that matter: it counts as unreachable, not as the whole file.
                # Past 500 KiB (RFC 9309 §2.5) the rest may be ignored.
                status, body = res.status, res.body
            break
        self.stats.robots_fetched += 1
        return status, body, res, url, elapsed

    def _read_delay(
        self, hq: HostQueue, policy: RobotsPolicy, user_agent: str | None = None
    ) -> None:
        """The host's Crawl-delay from ``policy``, and which policy it was read from."""
        hq.polite.robots_from = policy
        hq.polite.robots_delay = policy.crawl_delay(user_agent or self.fetcher.user_agent)
