"""Reading a host's sitemaps: by its owner, once, right after its robots.txt.

When this peer fetches a host's robots.txt for a task it owns (not one it borrowed), the
host's sitemaps are queued: the ``Sitemap:`` lines of robots.txt, or ``/sitemap.xml`` when
it names none (``--no-sitemaps``: neither). They are then fetched one per request slot of
the host, before its next page, with the host's politeness gap after each (they are
requests to the host like any other, and robots.txt rules apply to them). Index files add
their sitemaps, up to ``sitemap_index_depth`` levels and ``max_sitemap_files`` files.

What a sitemap lists goes to its owner like any discovered link (scope, depth 1, the
per-host budgets), minus the cross-host rule of sitemaps.org: a sitemap lists URLs of the
host whose robots.txt named it (or where it lives, for ``/sitemap.xml``); anything else is
dropped and counted. At most ``max_sitemap_urls`` are taken per host. ``<lastmod>`` values
are kept in :attr:`SitemapReader.lastmod`, a bounded per-URL record; in continuous mode
(docs/freshness.md) a page whose ``<lastmod>`` is newer than its last visit is made due now.

Once a host's sitemaps are read, a mark goes into the done record under the host's key
(the fingerprint of ``sitemaps <origin>``), so the key's next owner (a hand-off, a crash)
does not read them again (in continuous mode they are read again each time robots.txt is,
for their news); an owner lends a host whose sitemaps it has not read yet only with
one of its tasks kept back (:meth:`SitemapReader.settled`), so it reads them itself when the
loan ends and a borrower never has to. The sitemaps are read, not archived, like robots.txt.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from p2pcrawl.crawl import politeness, urls
from p2pcrawl.crawl.fetcher import Fetcher
from p2pcrawl.crawl.frontier import HostQueue, Task
from p2pcrawl.crawl.hostslot import HostSlot
from p2pcrawl.crawl.ledger import Ledger
from p2pcrawl.crawl.links import LinkFilter
from p2pcrawl.crawl.pacing import Pacer
from p2pcrawl.crawl.ports import Router
from p2pcrawl.crawl.revisit import Revisits
from p2pcrawl.crawl.robots import RobotsCache, RobotsPolicy
from p2pcrawl.crawl.sitemaps import MAX_SITEMAP_BYTES, SitemapParser
from p2pcrawl.crawl.stats import CrawlStats
from p2pcrawl.settings import CrawlSettings, Partition

__all__ = ["SitemapCrawl", "SitemapReader", "sitemap_mark"]

MAX_HOSTS = 10_000  # hosts whose sitemaps are being read at once, at most
MAX_LASTMOD = 100_000  # <lastmod> values kept (the most recent ones)
MAX_LISTED = 50  # Sitemap: lines of one robots.txt taken
SITEMAP_DEPTH = 1  # what a sitemap lists is one hop from its host's root
ROUTE_BATCH = 1000
# A sitemap may be 50 MB parsed as it arrives: its fetch may take longer than a page's.
SITEMAP_TIMEOUT_S = 300.0


class SitemapCrawl(Protocol):
    """What reading sitemaps asks of the crawler (``crawl.Engine``): which links it takes,
    where they go, and the done record that says a host's sitemaps were read."""

    @property
    def links(self) -> LinkFilter: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def router(self) -> Router: ...

    async def finish(self, tasks: list[Task], *, hurry: bool = False) -> None: ...

    @property
    def revisits(self) -> Revisits | None: ...


def sitemap_mark(origin: str, key: bytes) -> Task:
    """The done-record entry saying ``origin``'s sitemaps were read (never fetched)."""
    return Task(url=origin + "/", fp=urls.fingerprint("sitemaps " + origin), key=key, depth=0)


@dataclass(slots=True)
class _Host:
    key: bytes
    origin: str
    queue: collections.deque[tuple[str, int]] = field(default_factory=collections.deque)
    checked: bool = False  # the done record was asked whether this host was read before
    files: int = 0
    taken: int = 0
    read: int = 0  # files that answered 2xx


class SitemapReader:
    def __init__(
        self,
        settings: CrawlSettings,
        fetcher: Fetcher,
        stats: CrawlStats,
        robots: RobotsCache,
        pacer: Pacer,
        partition: Partition = "host",
    ) -> None:
        self.settings = settings
        self.pacer = pacer
        # With a key per URL no peer owns a host: the owner of its root page reads its
        # sitemaps, when it fetches that page (``root_page``).
        self.by_root = partition == "url"
        self._roots_seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.robots = robots
        self.signals = settings.signals
        self.fetcher = fetcher
        self.stats = stats
        self._hosts: collections.OrderedDict[str, _Host] = collections.OrderedDict()
        # fingerprint -> <lastmod> (Unix time) of URLs sitemaps listed, newest entries kept.
        self.lastmod: collections.OrderedDict[int, float] = collections.OrderedDict()

    # -- called by the robots gate and the lender -------------------------------------------

    def found_robots(self, origin: str, policy: RobotsPolicy, task: Task) -> None:
        """robots.txt of ``origin`` was fetched for ``task``: queue the host's sitemaps."""
        if not self.signals.sitemaps or task.lease or policy.kind == "disallow_all":
            return
        if self.by_root and task.url != origin + "/":
            return
        listed: list[str] = []
        if policy.parser is not None:
            for raw in policy.parser.sitemaps:
                url = urls.resolve(origin + "/", raw)
                if url is not None and url not in listed:
                    listed.append(url)
                if len(listed) >= MAX_LISTED:
                    break
        host = _Host(task.key, origin)
        host.queue.extend((url, 0) for url in (listed or [origin + "/sitemap.xml"]))
        self._hosts[origin] = host
        self._hosts.move_to_end(origin)
        while len(self._hosts) > MAX_HOSTS:
            self._hosts.popitem(last=False)

    def pending(self, task: Task, policy: RobotsPolicy) -> bool:
        """Whether sitemaps of ``task``'s host wait to be read before it."""
        if self.by_root and task.url.endswith("/") and not task.lease:
            origin = urls.origin_of(task.url)
            if task.url == origin + "/" and origin not in self._roots_seen:
                self._roots_seen[origin] = None
                if len(self._roots_seen) > MAX_HOSTS:
                    self._roots_seen.popitem(last=False)
                self.found_robots(origin, policy, task)
        return bool(self._hosts) and not task.lease and urls.origin_of(task.url) in self._hosts

    def settled(self, hq: HostQueue) -> bool:
        """Whether all of ``hq``'s queue may be lent: its sitemaps were read (or need not
        be). If not, its owner keeps one task back, which reads them when it comes up."""
        if not self.signals.sitemaps or not hq.tasks:
            return True
        origin = urls.origin_of(hq.tasks[0][1].url)
        cached = self.robots.get(origin, time.monotonic()) is not None
        return cached and origin not in self._hosts

    # -- the work, one request per host slot -------------------------------------------------

    async def step(
        self, engine: SitemapCrawl, slot: HostSlot, task: Task, policy: RobotsPolicy, agent: str
    ) -> bool:
        """Fetch the host's next sitemap in ``slot`` (``task`` goes back on the queue behind
        it) as ``agent`` (the domain's user agent, if its rules name one); False when
        nothing was fetched and the task may go ahead."""
        origin = urls.origin_of(task.url)
        host = self._hosts.get(origin)
        if host is None:
            return False
        if not host.checked:
            host.checked = True
            if not engine.links.in_scope(task.url):
                # A host only requisites are fetched from (a CDN): its pages are not ours.
                del self._hosts[origin]
                return False
            # Read by an earlier owner of the key; in continuous mode the sitemaps are read
            # again whenever robots.txt is (its cache expired), for their <lastmod>.
            if (
                engine.revisits is None
                and (await engine.ledger.is_done([sitemap_mark(origin, host.key)]))[0]
            ):
                del self._hosts[origin]
                return False
        while host.queue:
            url, depth = host.queue.popleft()
            # robots.txt rules apply to the sitemaps on its own origin (the others were
            # named by it).
            if urls.origin_of(url) != origin or policy.allowed(url, agent):
                await self._read(engine, slot, host, url, depth, agent)
                slot.requeue(task)
                if not host.queue:
                    await self._finish(engine, host)
                return True
            self.stats.sitemap_bounded["robots"] += 1
        await self._finish(engine, host)
        return False

    async def _finish(self, engine: SitemapCrawl, host: _Host) -> None:
        self._hosts.pop(host.origin, None)
        if host.read and engine.revisits is None:  # continuous mode reads them again
            await engine.finish([sitemap_mark(host.origin, host.key)])

    async def _read(
        self, engine: SitemapCrawl, slot: HostSlot, host: _Host, url: str, depth: int, agent: str
    ) -> None:
        sig = self.signals
        parser = SitemapParser(max_urls=max(1, sig.max_sitemap_urls - host.taken))

        async def sink(chunk: bytes) -> bool:
            ok = parser.feed(chunk)
            while ok and parser.pending:  # a gzip chunk inflating to megabytes
                await asyncio.sleep(0)
                ok = parser.feed(b"")
            return ok

        started = time.monotonic()
        res = await self.fetcher.fetch(
            url,
            max_body=MAX_SITEMAP_BYTES + 1,
            sink=sink,
            total_timeout=max(SITEMAP_TIMEOUT_S, self.settings.fetch.total_timeout),
            user_agent=agent,
        )
        elapsed = time.monotonic() - started
        host.files += 1
        pacer = self.pacer
        if pacer.enabled and res.status:
            pacer.count(parser.fed + 1024)
        gap = politeness.next_gap(self.settings.politeness, slot.hq.polite.robots_delay, elapsed)
        slot.after(elapsed, gap)
        if res.is_redirect and res.location:
            moved = urls.resolve(url, res.location)
            if moved is None or urls.host_of(moved) not in (
                urls.host_of(host.origin),
                urls.host_of(url),
            ):
                self.stats.sitemap_bounded["cross_host"] += 1
            elif host.files + len(host.queue) < sig.max_sitemap_files:
                host.queue.appendleft((moved, depth))
            return
        if not 200 <= res.status < 300:
            if res.status not in (404, 410):
                self.stats.sitemap_bounded["fetch"] += 1
            return
        doc = parser.close()
        host.read += 1
        self.stats.sitemaps_read += 1
        if doc.bound is not None:
            self.stats.sitemap_bounded[doc.bound] += 1
        elif res.truncated:  # cut by a timeout or a broken connection: what came is kept
            self.stats.sitemap_bounded[res.truncated] += 1
        if not doc.kind:
            self.stats.sitemap_bounded["not_a_sitemap"] += 1
        own = urls.host_of(host.origin)
        home = urls.host_of(url)  # a sitemap robots.txt named may live on another host
        for child in doc.sitemaps:
            child_url = urls.resolve(url, child)
            if child_url is None or urls.host_of(child_url) not in (own, home):
                self.stats.sitemap_bounded["cross_host"] += 1
            elif depth >= sig.sitemap_index_depth:
                self.stats.sitemap_bounded["depth"] += 1
            elif host.files + len(host.queue) >= sig.max_sitemap_files:
                self.stats.sitemap_bounded["files"] += 1
            else:
                host.queue.append((child_url, depth + 1))
        await self._route(engine, host, own, doc.urls)

    async def _route(
        self, engine: SitemapCrawl, host: _Host, own: str, listed: list[tuple[str, float | None]]
    ) -> None:
        """Route what a sitemap listed, :data:`ROUTE_BATCH` URLs at a time: a file of 50,000
        would otherwise hold the event loop for a second."""
        for start in range(0, len(listed), ROUTE_BATCH):
            if start:
                await asyncio.sleep(0)
            if not await self._route_batch(engine, host, own, listed[start : start + ROUTE_BATCH]):
                break

    async def _route_batch(
        self,
        engine: SitemapCrawl,
        host: _Host,
        own: str,
        listed: Iterable[tuple[str, float | None]],
    ) -> bool:
        found: list[str] = []
        changed: list[tuple[str, float]] = []
        cap = self.signals.max_sitemap_urls
        max_length = self.settings.fetch.max_url_length
        more = True
        for raw, lastmod in listed:
            url = urls.canonicalize(raw, max_length=max_length)
            if url is None:
                continue
            if urls.host_of(url) != own:
                self.stats.sitemap_bounded["cross_host"] += 1
                continue
            if host.taken >= cap:
                self.stats.sitemap_bounded["host_urls"] += 1
                more = False
                break
            host.taken += 1
            found.append(url)
            if lastmod is not None:
                self._note_lastmod(url, lastmod)
                changed.append((url, lastmod))
        self.stats.sitemap_urls += len(found)
        if changed and engine.revisits is not None:
            # Continuous mode: a page the sitemap says changed since its last visit is due.
            await engine.revisits.hint_changed(changed)
        tasks = engine.links.tasks(found, SITEMAP_DEPTH, 0)
        if tasks:
            self.stats.urls_discovered += len(tasks)
            await engine.router.route(tasks, found=True)
        return more

    def _note_lastmod(self, url: str, lastmod: float) -> None:
        fp = urls.fingerprint(url)
        self.lastmod[fp] = lastmod
        self.lastmod.move_to_end(fp)
        if len(self.lastmod) > MAX_LASTMOD:
            self.lastmod.popitem(last=False)
