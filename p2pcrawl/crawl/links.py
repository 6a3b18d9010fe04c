"""Which discovered links become tasks: depth, scope, patterns, the recently-seen cache,
budgets.

This runs for each of the ~50 links of every page, most of them repeats, so the depth test
(the same for all of a page's links) is made once, scope is looked up by host key, and only
survivors become tasks with their fingerprint and DHT key.

Crawler traps (an endless calendar, a relative link that nests a path forever, a session
ID minted for every visit) produce unique URLs without end. Two rules catch their usual
shapes, as Heritrix's path-repetition filter and session-ID canonicalisation do: a path
that repeats one segment more than :data:`MAX_SEGMENT_REPEATS` times is dropped, and
session-ID parameters are stripped so every visit's spelling is one URL. Whatever is left
of a trap is bounded by the per-host URL budget (``max_urls_per_host``). Both rules look at
a URL only when a cheap test says it could match, so ordinary links pay a ``count`` or an
``in``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from p2pcrawl.aio import Memo
from p2pcrawl.crawl import urls
from p2pcrawl.crawl.domains import DomainTable
from p2pcrawl.crawl.frontier import Task
from p2pcrawl.crawl.parse import PageRules
from p2pcrawl.crawl.patterns import UrlPatterns
from p2pcrawl.crawl.robots import ua_token
from p2pcrawl.crawl.scope import Scope, is_forbidden_address
from p2pcrawl.crawl.seen import SeenCache
from p2pcrawl.crawl.sites import queue_of, site_of
from p2pcrawl.crawl.stats import CrawlStats
from p2pcrawl.settings import CrawlSettings, Partition
from protocol import key_for

__all__ = ["LinkFilter", "make_task", "repeats_a_segment", "strip_session_ids"]

# Per-host memo sizes: a crawl touching more hosts than this starts the memo again.
MEMO_LIMIT = 100_000
MAX_SEGMENT_REPEATS = 3
# "http://" has two slashes; a path with a segment more than MAX_SEGMENT_REPEATS times has
# at least one more slash than that.
_DEEP_PATH_SLASHES = 2 + MAX_SEGMENT_REPEATS
# Session IDs in a query (name=value) or a path parameter (;jsessionid=...).
_SESSION_ID = re.compile(
    r"(?i)(?:(?<=[?&])|;)(?:jsessionid|phpsessid|aspsessionid[a-z]*|cfid|cftoken|sid|"
    r"sessionid|session_id|sessid)=[^&#;/?]*&?"
)


def strip_session_ids(url: str) -> str:
    """``url`` without session-ID parameters (and without a ``?`` or ``&`` left dangling)."""
    out = _SESSION_ID.sub("", url)
    if out.endswith(("?", "&")):
        out = out.rstrip("?&")
    return out.replace("?&", "?")


def repeats_a_segment(url: str, limit: int = MAX_SEGMENT_REPEATS) -> bool:
    """The path has one segment more than ``limit`` times (``/a/b/a/b/a/b/a/b``)."""
    start = url.find("/", url.find("://") + 3)
    if start < 0:
        return False
    path = url[start:].partition("?")[0]
    counts = Counter(seg for seg in path.split("/") if seg)
    return bool(counts) and max(counts.values()) > limit


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

    def __init__(
        self,
        settings: CrawlSettings,
        partition: Partition,
        stats: CrawlStats,
        domains: DomainTable | None = None,
    ) -> None:
        self.settings = settings
        self.partition: Partition = partition
        self.stats = stats
        self.seen = SeenCache(settings.seen_cache_size)
        sc = settings.scope
        self.patterns = UrlPatterns(sc.include, sc.exclude)
        # The [domains."…"] tables: their include/exclude apply beside the flags'.
        self.domains = domains if domains is not None else DomainTable(settings.domains)
        self.scope = Scope(
            sc.allow_domains, allow_private=sc.allow_private, allow_loopback=sc.allow_loopback
        )
        # No --allow-domain: the scope is the seeds' hosts, widened as the network tells.
        self.scope_from_seeds = not settings.scope.allow_domains
        self._key_cache: Memo[str, bytes] = Memo(MEMO_LIMIT)
        # Host key ("host[:port]") -> in scope; cleared whenever the scope grows.
        self._in_scope: Memo[str, bool] = Memo(MEMO_LIMIT)
        # Host key -> URLs this peer admitted for it (the per-host URL budget). One int per
        # host this peer has seen links to, which the task store holds anyway.
        self.admitted: Counter[str] = Counter()
        sig = settings.signals
        self.page_rules = PageRules(
            agent=ua_token(settings.effective_user_agent()),
            obey_nofollow=sig.robots_meta,
            follow_rel_nofollow=sig.follow_rel_nofollow,
            max_requisites=0 if sig.requisites == "off" else sig.max_requisites_per_page,
        )

    def queue_of(self, url: str) -> str:
        """The frontier queue ``url`` waits in (its host, or its site under the domain
        partition)."""
        return queue_of(url, self.partition)

    def key_of(self, url: str, host: str | None = None) -> bytes:
        """The DHT key of ``url``; ``host``, if given, is ``urls.host_of(url)``."""
        if self.partition == "url":
            return key_for(url)
        if self.partition == "domain":
            host = site_of(url)
        elif host is None:
            host = urls.host_of(url)
        k = self._key_cache.get(host)
        if k is None:
            k = self._key_cache.remember(host, key_for(host))
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
        domains = self.domains if self.domains else None
        outside = repeats = 0
        budget = self.stats.budget
        admitted = self.admitted
        per_host = self.settings.scope.max_urls_per_host
        for url in links:
            host = host_of(url)
            ok = in_scope.get(host)
            if ok is None:
                ok = self._host_in_scope(host, url)
            if not ok or (patterns is not None and not patterns.allows(url)):
                outside += 1
                continue
            if domains is not None:
                own = domains.patterns_at(host, url)
                if own is not None and not own.allows(url):
                    outside += 1
                    continue
            if url.count("/") > _DEEP_PATH_SLASHES and repeats_a_segment(url):
                budget["repeating_path"] += 1
                continue
            if ("?" in url or ";" in url) and "=" in url:
                stripped = strip_session_ids(url)
                if stripped != url:
                    budget["session_id"] += 1
                    url = stripped
            fp = fingerprint(url)
            if seen(fp):
                repeats += 1
                continue
            if per_host:
                if admitted[host] >= per_host:
                    budget["host_urls"] += 1
                    continue
                admitted[host] += 1
            out.append(Task(url, fp, self.key_of(url, host), depth, hops))
        self.stats.out_of_scope += outside
        self.stats.seen_cache_hits += repeats
        return out

    def requisite_tasks(self, links: list[str], depth: int, hops: int) -> list[Task]:
        """Page requisites as tasks (``hops`` marks them embedded): no depth limit, their
        own scope rule (``--requisites``), the seen cache and the per-host URL budget."""
        if not links or self.settings.signals.requisites == "off":
            return []
        out: list[Task] = []
        seen = self.seen.check_and_add
        budget = self.stats.budget
        per_host = self.settings.scope.max_urls_per_host
        outside = 0
        for url in links:
            if not self.requisite_allowed(url):
                outside += 1
                continue
            fp = urls.fingerprint(url)
            if seen(fp):
                continue
            host = urls.host_of(url)
            if per_host:
                if self.admitted[host] >= per_host:
                    budget["host_urls"] += 1
                    continue
                self.admitted[host] += 1
            out.append(Task(url, fp, self.key_of(url, host), depth, hops))
        self.stats.out_of_scope += outside
        self.stats.requisites_found += len(out)
        return out

    def in_scope(self, url: str) -> bool:
        """Whether a link to ``url``'s host would be followed (``--allow-domain``)."""
        host = urls.host_of(url)
        ok = self._in_scope.get(host)
        return self._host_in_scope(host, url) if ok is None else ok

    def requisite_allowed(self, url: str) -> bool:
        """``--requisites any``: any host the address guard allows, minus ``--exclude``;
        ``scope``: what a link would need; ``off``: nothing."""
        mode = self.settings.signals.requisites
        if mode == "scope":
            return self.in_scope(url) and (not self.patterns or self.patterns.allows(url))
        if mode == "off":
            return False
        if any(p.search(url) for p in self.patterns.exclude):
            return False
        scope = self.scope
        if scope.allow_private:
            return True
        return not is_forbidden_address(
            urls.hostname_of(url).strip("[]"), allow_loopback=scope.allow_loopback
        )

    def _host_in_scope(self, host: str, url: str) -> bool:
        return self._in_scope.remember(host, self.scope.allows_host(urls.hostname_of(url)))
