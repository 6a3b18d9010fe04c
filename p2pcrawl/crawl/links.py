"""Which discovered links become tasks: depth, scope and the recently-seen cache.

This runs for each of the ~50 links of every page, most of them repeats, so the depth test
(the same for all of a page's links) is made once, scope is looked up by host key, and only
survivors become tasks with their fingerprint and DHT key.
"""

from __future__ import annotations

from collections.abc import Iterable

from p2pcrawl.crawl import urls
from p2pcrawl.crawl.frontier import Task
from p2pcrawl.crawl.patterns import UrlPatterns
from p2pcrawl.crawl.scope import Scope
from p2pcrawl.crawl.seen import SeenCache
from p2pcrawl.crawl.stats import CrawlStats
from p2pcrawl.settings import CrawlSettings, Partition
from protocol import key_for

__all__ = ["LinkFilter", "make_task"]

# Per-host memo sizes: a crawl touching more hosts than this starts the memo again.
MEMO_LIMIT = 100_000


def make_task(url: str, depth: int, partition: Partition, hops: int = 0) -> Task:
    return Task(
        url=url,
        fp=urls.fingerprint(url),
        key=key_for(urls.partition_key(url, partition)),
        depth=depth,
        hops=hops,
    )


class LinkFilter:
    """The scope, the seen cache and the key of every URL this engine handles."""

    def __init__(self, settings: CrawlSettings, partition: Partition, stats: CrawlStats) -> None:
        self.settings = settings
        self.partition: Partition = partition
        self.stats = stats
        self.seen = SeenCache(settings.seen_cache_size)
        self.scope = Scope(settings.scope.allow_domains, allow_private=settings.scope.allow_private)
        self.patterns = UrlPatterns(settings.scope.include, settings.scope.exclude)
        # No --allow-domain: the scope is the seeds' hosts, widened as the network tells.
        self.scope_from_seeds = not settings.scope.allow_domains
        self._key_cache: dict[str, bytes] = {}
        # Host key ("host[:port]") -> in scope; cleared whenever the scope grows.
        self._in_scope: dict[str, bool] = {}

    def key_of(self, url: str) -> bytes:
        if self.partition == "url":
            return key_for(url)
        host = urls.host_of(url)
        k = self._key_cache.get(host)
        if k is None:
            if len(self._key_cache) > MEMO_LIMIT:
                self._key_cache.clear()
            k = self._key_cache[host] = key_for(host)
        return k

    def seed_task(self, raw: str) -> Task:
        url = urls.canonicalize(raw, max_length=self.settings.fetch.max_url_length)
        if url is None:
            raise ValueError(f"not a crawlable URL: {raw!r}")
        if self.scope_from_seeds:
            self.adopt_hosts([urls.hostname_of(url)])
        t = make_task(url, 0, self.partition)
        t.key = self.key_of(url)
        return t

    def adopt_hosts(self, hostnames: Iterable[str]) -> None:
        """Widen a seeds-derived scope with hosts the network says are in it."""
        if not self.scope_from_seeds:
            return
        grew = [h for h in hostnames if self.scope.add(h)]
        if grew:
            self._in_scope.clear()

    def tasks(self, links: list[str], depth: int, hops: int) -> list[Task]:
        """The links that pass depth, scope and the seen cache, as tasks."""
        if not links:
            return []
        if depth > self.settings.scope.max_depth:
            self.stats.too_deep += len(links)
            return []
        out: list[Task] = []
        in_scope = self._in_scope
        host_of = urls.host_of
        fingerprint = urls.fingerprint
        seen = self.seen.check_and_add
        patterns = self.patterns if self.patterns else None
        outside = repeats = 0
        for url in links:
            host = host_of(url)
            ok = in_scope.get(host)
            if ok is None:
                ok = self._host_in_scope(host, url)
            if not ok or (patterns is not None and not patterns.allows(url)):
                outside += 1
                continue
            fp = fingerprint(url)
            if seen(fp):
                repeats += 1
                continue
            out.append(Task(url, fp, self.key_of(url), depth, hops))
        self.stats.out_of_scope += outside
        self.stats.seen_cache_hits += repeats
        return out

    def _host_in_scope(self, host: str, url: str) -> bool:
        if len(self._in_scope) > MEMO_LIMIT:
            self._in_scope.clear()
        ok = self._in_scope[host] = self.scope.allows_host(urls.hostname_of(url))
        return ok
