"""The crawl engine: workers take ready hosts from the frontier, fetch, parse and route.

Every discovered link leaves the engine through one seam, ``Router.route``: a lone peer
queues it locally, a networked peer hands it to the URL's owner (DESIGN.md, ownership).
The engine only crawls what it was given; it never decides ownership.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from p2pcrawl import politeness, urls
from p2pcrawl.fetcher import Fetcher, FetchResult
from p2pcrawl.frontier import Frontier, HostQueue, Task
from p2pcrawl.ledger import Ledger
from p2pcrawl.parse import extract_links
from p2pcrawl.robots import RobotsCache, RobotsPolicy, policy_from_response
from p2pcrawl.scope import Scope
from p2pcrawl.seen import SeenCache
from p2pcrawl.settings import CrawlSettings, Partition
from p2pcrawl.stats import CrawlStats
from p2pcrawl.warc import FetchRecord, WarcWriteError, WarcWriter
from protocol.ownership import key_for
from protocol.tasks import TaskSet

__all__ = ["CrawlSummary", "Engine", "LocalRouter", "Router", "crawl", "make_task"]

log = logging.getLogger(__name__)

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 §2.5: parse at least 500 KiB
ROBOTS_MAX_REDIRECTS = 5  # RFC 9309 §2.3.1.2
# Parsing a page this large would hold the event loop for tens of milliseconds.
PARSE_IN_THREAD_BYTES = 1 << 20
RETRYABLE_ERRORS = frozenset({"timeout", "connect", "protocol"})
# Page tails (archive, parse, route, finish) allowed per fetch slot. Each holds one fetched
# body, so this bounds the pages in memory at (1 + TAILS_PER_FETCH) x concurrency.
TAILS_PER_FETCH = 2


class Router(Protocol):
    async def route(self, tasks: list[Task]) -> None:
        """Hand newly discovered tasks to their owners (durably accepted on return)."""


def make_task(url: str, depth: int, partition: Partition, hops: int = 0) -> Task:
    return Task(
        url=url,
        fp=urls.fingerprint(url),
        key=key_for(urls.partition_key(url, partition)),
        depth=depth,
        hops=hops,
    )


class Engine:
    def __init__(
        self,
        settings: CrawlSettings,
        ledger: Ledger,
        *,
        warc: WarcWriter | None,
        partition: Partition = "host",
        router: Router | None = None,
        on_finished: Callable[[list[Task]], Awaitable[None]] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.warc = warc
        self.partition: Partition = partition
        self.router: Router = router or LocalRouter(self)
        self.on_finished = on_finished
        self.on_failure = on_failure
        # Why this engine stopped fetching for good (its output failed), or None.
        self.failure: BaseException | None = None
        self.stats = CrawlStats()
        self.frontier = Frontier(settings)
        self.fetcher = Fetcher(settings)
        self.robots = RobotsCache()
        self.seen = SeenCache(settings.seen_cache_size)
        self.scope = Scope(settings.scope.allow_domains, allow_private=settings.scope.allow_private)
        self.scope_from_seeds = not settings.scope.allow_domains
        self.in_flight: dict[int, Task] = {}
        self.paused = False  # no new fetches (leaving)
        self._ua = self.fetcher.user_agent
        self._tasks = TaskSet("engine")
        self._refill = asyncio.Event()
        self._progress = asyncio.Event()
        self._key_cache: dict[str, bytes] = {}
        # Host key ("host[:port]") -> in scope; cleared whenever the scope grows.
        self._in_scope: dict[str, bool] = {}
        self._excluded_keys: set[bytes] = set()
        self._host_window = max(2, settings.host_queue_window)
        # Host key -> (host, seq): a host that had a full window when the store cursor passed
        # its tasks; they are read by key after that seq (see _refill_loop).
        self._overflow: dict[bytes, tuple[str, int]] = {}
        # Host key -> seq: read by key up to here; the store cursor skips those.
        self._loaded_upto: dict[bytes, int] = {}
        self._robots_failures: dict[str, int] = {}  # origin -> consecutive robots.txt failures
        self._started = False
        self._fetching = 0  # page fetches under way, reserved against max_pages
        # Fetched pages waiting for (or in) their tail: the tail waits on the WARC writer and
        # the stores, so with only one per fetch slot the fetchers sat idle behind them.
        self._tail_slots = asyncio.Semaphore(TAILS_PER_FETCH * settings.concurrency)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        await self.fetcher.start()
        self._spawn(self._refill_loop(), "refill")
        self._spawn(self._housekeeping_loop(), "housekeeping")
        for i in range(self.settings.concurrency):
            self._spawn(self._worker(), f"worker-{i}")
        self._started = True
        self._refill.set()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.spawn(coro, name)

    async def stop_fetching(self, timeout: float) -> list[Task]:
        """Stop taking work, wait up to ``timeout`` for in-flight fetches; returns the rest."""
        self.paused = True
        self.frontier.wake_all()
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._progress.wait()
        return list(self.in_flight.values())

    async def aclose(self) -> None:
        await self._tasks.aclose()
        await self.fetcher.aclose()

    # -- state -------------------------------------------------------------------------

    @property
    def tasks_queued(self) -> int:
        return max(0, self.ledger.queued - len(self.in_flight))

    @property
    def idle(self) -> bool:
        return not self.in_flight and self.ledger.queued == 0

    @property
    def exhausted(self) -> bool:
        mp = self.settings.scope.max_pages
        # Fetches under way count too, or workers passing this check together overshoot.
        return bool(mp) and self.stats.pages_fetched + self._fetching >= mp

    def key_of(self, url: str) -> bytes:
        if self.partition == "url":
            return key_for(url)
        host = urls.host_of(url)
        k = self._key_cache.get(host)
        if k is None:
            if len(self._key_cache) > 100_000:
                self._key_cache.clear()
            k = self._key_cache[host] = key_for(host)
        return k

    def wake(self) -> None:
        """New tasks were stored: refill the frontier window."""
        self._refill.set()

    async def wait_progress(self, timeout: float) -> None:
        self._progress.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._progress.wait()

    # -- seeds and the frontier window ---------------------------------------------------

    def seed_tasks(self, seeds: Iterable[str]) -> list[Task]:
        out = []
        for raw in seeds:
            url = urls.canonicalize(raw, max_length=self.settings.fetch.max_url_length)
            if url is None:
                raise ValueError(f"not a crawlable URL: {raw!r}")
            if self.scope_from_seeds:
                self.scope.add(urls.hostname_of(url))
                self._in_scope.clear()
            t = make_task(url, 0, self.partition)
            t.key = self.key_of(url)
            out.append(t)
        return out

    def adopt_hosts(self, hostnames: Iterable[str]) -> None:
        """Widen a seeds-derived scope with hosts the network says are in it.

        With no ``--allow-domain`` the scope is the seeds' hosts, but seeds arrive through
        one peer: the others learn them from the hosts they are handed as owners and from
        the scope the seeding peer published in the DHT.
        """
        if not self.scope_from_seeds:
            return
        grew = [h for h in hostnames if self.scope.add(h)]
        if grew:
            self._in_scope.clear()

    async def add_seeds(self, seeds: Iterable[str]) -> int:
        tasks = self.seed_tasks(seeds)
        for t in tasks:
            self.seen.check_and_add(t.fp)
        await self.router.route(tasks)
        return len(tasks)

    def exclude_keys(self, keys: Iterable[bytes]) -> list[Task]:
        """Stop crawling these keys (moved to another peer); returns their window tasks."""
        keys = set(keys)
        self._excluded_keys |= keys
        for key in keys:
            self._overflow.pop(key, None)
            self._loaded_upto.pop(key, None)
        hosts = [
            h for h, hq in self.frontier.hosts.items() if hq.tasks and hq.tasks[0][1].key in keys
        ]
        if self.partition == "host":
            return self.frontier.remove_hosts(hosts)
        return []

    def include_keys(self, keys: Iterable[bytes]) -> None:
        self._excluded_keys -= set(keys)

    async def _refill_loop(self) -> None:
        """Keep the frontier window filled from the task store.

        The store is read in order through one cursor, but no host gets more than
        ``host_queue_window`` URLs of the window: when a host is full, its tasks are skipped
        by the cursor and it gets a cursor of its own (``_overflow``), read by its key once
        its queue is half empty. Otherwise one host with a long queue at the front of the
        store would fill the window, and the crawl would run one connection at a time while
        the other hosts waited in the store (seed 004: every host queue has work).
        """
        window = self.settings.frontier_window
        while True:
            await self._refill.wait()
            self._refill.clear()
            while True:
                room = window - len(self.frontier) - len(self.in_flight)
                if room <= 0:
                    break
                room -= await self._refill_overflowing(room)
                if room <= 0:
                    break
                want = min(room, 2000)
                batch = await self.ledger.load(want)
                for seq, t in batch:
                    if t.key in self._excluded_keys or t.fp in self.in_flight:
                        continue
                    if t.key in self._overflow:
                        continue  # its own cursor will reach it
                    upto = self._loaded_upto.get(t.key)
                    if upto is not None and seq <= upto:
                        continue  # loaded by its own cursor already
                    host = urls.host_of(t.url)
                    if self._host_full(host):
                        self._overflow[t.key] = (host, seq - 1)
                        continue
                    self.frontier.push(host, t)
                if self._loaded_upto:
                    cursor = self.ledger.cursor
                    for key in [k for k, upto in self._loaded_upto.items() if upto <= cursor]:
                        del self._loaded_upto[key]
                if len(batch) < want:
                    break

    async def _refill_overflowing(self, room: int) -> int:
        """Load the hosts that overflowed the window and have room again; returns how many."""
        loaded = 0
        for key, (host, after) in list(self._overflow.items()):
            if room - loaded <= 0:
                break
            hq = self.frontier.hosts.get(host)
            queued = len(hq.tasks) if hq is not None else 0
            if queued > self._host_window // 2:
                continue
            want = min(self._host_window - queued, room - loaded)
            rows = await self.ledger.load_key(key, after, want)
            if key not in self._overflow or key in self._excluded_keys:
                continue  # handed away while the store was read
            for _, t in rows:
                if t.fp not in self.in_flight:
                    self.frontier.push(host, t)
            loaded += len(rows)
            last = rows[-1][0] if rows else after
            if len(rows) < want:
                # Caught up with the store: new tasks of this key come after the main
                # cursor, which must only skip what was loaded here.
                del self._overflow[key]
                self._loaded_upto[key] = last
            else:
                self._overflow[key] = (host, last)
        return loaded

    def _host_full(self, host: str) -> bool:
        if self.partition != "host":
            return False  # a key per URL: nothing to read by host
        hq = self.frontier.hosts.get(host)
        return hq is not None and len(hq.tasks) >= self._host_window

    async def _housekeeping_loop(self) -> None:
        while True:
            self.stats.sample()
            self.frontier.prune()
            if len(self.frontier) < self.settings.frontier_window // 2 or self._overflow:
                self._refill.set()
            await asyncio.sleep(1.0)

    # -- the worker ----------------------------------------------------------------------

    async def _worker(self) -> None:
        """Fetch, one host at a time; each fetched page's tail (archive, parse, route,
        finish) runs as its own task, so ``concurrency`` is the number of fetches under way
        rather than of pages anywhere between request and done."""
        while True:
            if self.paused or self.exhausted:
                self._progress.set()
                await asyncio.sleep(0.2)
                continue
            hq = await self.frontier.acquire()
            if self.paused or self.exhausted:
                self.frontier.release(hq, response_time=0.0, gap=0.0)
                continue
            task = self.frontier.pop_task(hq)
            if task is None:
                self.frontier.release(hq, response_time=0.0, gap=0.0)
                continue
            self.in_flight[task.fp] = task
            handed_over = False
            try:
                res = await self._crawl_one(hq, task)
                if res is not None:
                    await self._tail_slots.acquire()
                    handed_over = self._tasks.spawn(self._tail(task, res), "tail") is not None
                    if not handed_over:
                        self._tail_slots.release()  # shutting down: the URL stays queued
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if hq.polite.busy:
                    self.frontier.release(hq, response_time=0.0, gap=0.0)
                await self._failed(task, exc)
            finally:
                if not handed_over:
                    self._done_with(task)

    async def _tail(self, task: Task, res: FetchResult) -> None:
        try:
            await self._page_tail(task, res)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._failed(task, exc)
        finally:
            self._tail_slots.release()
            self._done_with(task)

    async def _failed(self, task: Task, exc: Exception) -> None:
        if isinstance(exc, WarcWriteError):
            # The page is not archived, so it is not done: its URL stays queued, and this
            # peer stops fetching pages it could not keep.
            self._fail(exc)
            return
        # A bug on one page must not kill a worker; the task is recorded as failed.
        log.error("crawling %s failed", task.url, exc_info=exc)
        self.stats.errors["internal"] += 1
        await self._finish([task])

    def _done_with(self, task: Task) -> None:
        self.in_flight.pop(task.fp, None)
        self._progress.set()
        if len(self.frontier) < self.settings.frontier_window // 2 or task.key in self._overflow:
            self._refill.set()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is not None:
            return
        log.error("stopped fetching: %s", exc)
        self.failure = exc
        self.paused = True
        self.frontier.wake_all()
        self._progress.set()
        if self.on_failure is not None:
            self.on_failure(exc)

    async def _robots_for(self, hq: HostQueue, task: Task) -> RobotsPolicy | None:
        """The host's robots policy, or None when it had to be fetched first (slot used)."""
        now = time.monotonic()
        origin = urls.origin_of(task.url)  # RFC 9309 §2.3: scheme, host and port
        policy = self.robots.get(origin, now)
        if policy is not None:
            return policy
        url = origin + "/robots.txt"
        status: int | None = None
        body: bytes | None = None
        elapsed = 0.0
        for _ in range(ROBOTS_MAX_REDIRECTS + 1):
            res = await self.fetcher.fetch(url, max_body=ROBOTS_MAX_BYTES)
            elapsed += res.elapsed
            if res.is_redirect and res.location:
                nxt = urls.resolve(url, res.location)
                if nxt is None:
                    break
                url = nxt
                continue
            if res.status:
                status, body = res.status, res.body
            break
        self.stats.robots_fetched += 1
        if status is None and res.error:
            self.stats.errors[res.error] += 1
        if status is None or status >= 500:
            if len(self._robots_failures) > 100_000:
                self._robots_failures.clear()
            self._robots_failures[origin] = self._robots_failures.get(origin, 0) + 1
        else:
            self._robots_failures.pop(origin, None)
        if res.error == "forbidden" and url == origin + "/robots.txt":
            # The SSRF guard refuses the host itself, so robots.txt can never be fetched:
            # holding its URLs until it is (RFC 9309 §2.3.1.4) would stall the crawl forever.
            # Let each page fetch be refused and counted instead.
            ttl = self.settings.politeness.robots_error_ttl
            policy = RobotsPolicy("allow_all", time.monotonic() + ttl)
        else:
            policy = policy_from_response(status, body, time.monotonic(), self.settings.politeness)
        self.robots.put(origin, policy)
        hq.polite.robots_delay = policy.crawl_delay(self._ua)
        gap = politeness.next_gap(self.settings.politeness, hq.polite.robots_delay, elapsed)
        self.frontier.push(hq.host, task)
        self.frontier.release(hq, response_time=elapsed, gap=gap)
        return None

    async def _crawl_one(self, hq: HostQueue, task: Task) -> FetchResult | None:
        """Fetch ``task`` (robots.txt first if need be); the response when there is a page
        for :meth:`_page_tail`, None when the task was settled or requeued here."""
        if self.ledger.done.maybe_contains(task.fp) and (await self.ledger.is_done([task]))[0]:
            # Finished elsewhere meanwhile (history handed over after a restart or a move).
            self.stats.skipped_done += 1
            self.frontier.release(hq, response_time=0.0, gap=0.0)
            await self.ledger.drop_done([task.fp])
            if self.on_finished is not None:
                await self.on_finished([task])
            return None
        policy = await self._robots_for(hq, task)
        if policy is None:
            return None  # requeued behind the robots.txt request
        if policy.kind == "disallow_all":
            origin = urls.origin_of(task.url)
            if self._robots_failures.get(origin, 0) > self.settings.politeness.max_retries:
                # RFC 9309 §2.3.1.4 lets a crawler treat a robots.txt that stays
                # unreachable as unavailable; for a crawl that must end, its URLs end as
                # errors rather than wait for a host that does not answer.
                self.stats.errors["robots_unreachable"] += 1
                self.frontier.release(hq, response_time=0.0, gap=0.0)
                await self._finish([task])
                return None
            # robots.txt was unreachable (RFC 9309 §2.3.1.4): wait for it, keep the URL.
            self.frontier.push(hq.host, task)
            wait = max(0.0, policy.expires_at - time.monotonic())
            self.frontier.release(hq, response_time=0.0, gap=wait)
            return None
        if not policy.allowed(task.url, self._ua):
            self.stats.robots_disallowed += 1
            self.frontier.release(hq, response_time=0.0, gap=0.0)
            await self._finish([task])
            return None
        if self.exhausted:
            # max-pages was reached while this URL waited: keep it queued for a later run.
            self.frontier.push(hq.host, task)
            self.frontier.release(hq, response_time=0.0, gap=0.0)
            return None
        self._fetching += 1
        try:
            res = await self.fetcher.fetch(task.url)
        finally:
            self._fetching -= 1
        pset = self.settings.politeness
        gap = politeness.next_gap(pset, hq.polite.robots_delay, res.elapsed)
        hq.est.observe(None, res.elapsed)
        self.stats.fetch_hist.observe(res.elapsed)
        if res.status == 0:
            self.stats.errors[res.error or "unknown"] += 1
            retry = res.error in RETRYABLE_ERRORS and task.tries < pset.max_retries
            if retry:
                task.tries += 1
                self.stats.retries += 1
                gap = max(gap, politeness.backoff_seconds(task.tries, 1.0, pset.max_delay))
                self.frontier.push(hq.host, task)
            self.frontier.release(hq, response_time=res.elapsed, gap=gap)
            if not retry:
                await self._finish([task])
            return None
        if res.status in (429, 503) and task.tries < pset.max_retries:
            wait = politeness.retry_after_seconds(
                res.retry_after, time.time(), pset.default_retry_after, pset.max_delay
            )
            task.tries += 1
            self.stats.retries += 1
            self.stats.status[res.status] += 1
            self.frontier.push(hq.host, task)
            self.frontier.release(hq, response_time=res.elapsed, gap=max(gap, wait))
            return None
        self.frontier.release(hq, response_time=res.elapsed, gap=gap)
        self.stats.pages_fetched += 1
        self.stats.bytes_fetched += len(res.body)
        self.stats.status[res.status] += 1
        if res.truncated:
            self.stats.truncated += 1
        return res

    async def _page_tail(self, task: Task, res: FetchResult) -> None:
        # The record is written while the page is parsed and its links routed; the page
        # counts as done only once the record is on disk.
        archived = await self.warc.submit(_record(res)) if self.warc is not None else None
        # A redirect target is the same document moved: it keeps the source's depth.
        fresh = self._filter(self._links_of(task, res), task.depth, task.hops + 1)
        if res.is_html and 200 <= res.status < 300:
            fresh += self._filter(await self._parse(task, res), task.depth + 1, 0)
        elif 200 <= res.status < 300:
            self.stats.non_html += 1
        if fresh:
            self.stats.urls_discovered += len(fresh)
            await self.router.route(fresh)
        if archived is not None:
            await archived
        await self._finish([task])

    def _links_of(self, task: Task, res: FetchResult) -> list[str]:
        if not res.is_redirect or res.location is None:
            return []
        self.stats.redirects += 1
        target = urls.resolve(task.url, res.location, max_length=self.settings.fetch.max_url_length)
        if target is None:
            self.stats.errors["bad_redirect"] += 1
            return []
        if task.hops + 1 > self.settings.fetch.max_redirects:
            self.stats.redirect_limit += 1
            return []
        return [target]

    async def _parse(self, task: Task, res: FetchResult) -> list[str]:
        limits = self.settings.fetch
        if len(res.body) > PARSE_IN_THREAD_BYTES:
            page = await asyncio.to_thread(
                extract_links,
                res.body,
                task.url,
                encoding=res.charset,
                max_links=limits.max_links_per_page,
                max_url_length=limits.max_url_length,
            )
        else:
            page = extract_links(
                res.body,
                task.url,
                encoding=res.charset,
                max_links=limits.max_links_per_page,
                max_url_length=limits.max_url_length,
            )
        self.stats.html_parsed += 1
        self.stats.links_extracted += len(page.links)
        if page.nofollow:
            self.stats.nofollow_pages += 1
        return page.links

    def _filter(self, links: list[str], depth: int, hops: int) -> list[Task]:
        """Depth, scope and the seen cache; a task, fingerprint and key for each survivor.

        This runs for each of the ~50 links of every page, most of them repeats, so the
        depth test (the same for all of a page's links) is made once, scope is looked up
        by host key, and only survivors become tasks.
        """
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
        outside = repeats = 0
        for url in links:
            host = host_of(url)
            ok = in_scope.get(host)
            if ok is None:
                ok = self._host_in_scope(host, url)
            if not ok:
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
        if len(self._in_scope) > 100_000:
            self._in_scope.clear()
        ok = self._in_scope[host] = self.scope.allows_host(urls.hostname_of(url))
        return ok

    async def _finish(self, tasks: list[Task]) -> None:
        await self.ledger.finish(tasks)
        if self.on_finished is not None:
            await self.on_finished(tasks)


def _record(res: FetchResult) -> FetchRecord:
    return FetchRecord(
        url=res.url,
        status=res.status,
        reason=res.reason,
        http_version="1.1",
        request_headers=res.request_headers,
        response_headers=res.headers,
        body=res.body,
        truncated=res.truncated,
        ip=res.ip,
        fetched_at=res.fetched_at,
    )


class LocalRouter:
    """A lone peer owns everything: discovered tasks go straight into its own ledger."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def route(self, tasks: list[Task]) -> None:
        if await self.engine.ledger.accept(tasks):
            self.engine.wake()


@dataclass(slots=True)
class CrawlSummary:
    pages_fetched: int
    elapsed_s: float
    cpu_s: float
    warc_files: list[Path]
    stats: CrawlStats
    done: int
    queued: int
    errors: dict[str, int] = field(default_factory=dict)


async def crawl(
    seeds: list[str],
    settings: CrawlSettings,
    data_dir: Path,
    *,
    partition: Partition = "host",
    node_prefix: str = "local",
    idle_grace: float = 0.0,
) -> CrawlSummary:
    """Crawl from ``seeds`` with one peer until nothing is queued or max-pages is reached."""
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    started, cpu0 = time.monotonic(), time.process_time()
    ledger = await Ledger.open(data_dir / "stores")
    warc: WarcWriter | None = None
    engine: Engine | None = None
    try:
        if settings.warc:
            warc = WarcWriter(
                data_dir / "warc", prefix=node_prefix, max_bytes=settings.warc_max_bytes
            )
            await warc.start()
        engine = Engine(settings, ledger, warc=warc, partition=partition)
        await engine.start()
        await engine.add_seeds(seeds)
        while not (engine.idle or (engine.exhausted and not engine.in_flight)):
            if engine.failure is not None and not engine.in_flight:
                raise engine.failure
            await engine.wait_progress(0.5)
        if idle_grace:
            await asyncio.sleep(idle_grace)
    finally:
        if engine is not None:
            await engine.aclose()
        if warc is not None:
            await warc.aclose()
        await ledger.aclose()
    assert engine is not None
    return CrawlSummary(
        pages_fetched=engine.stats.pages_fetched,
        elapsed_s=time.monotonic() - started,
        cpu_s=time.process_time() - cpu0,
        warc_files=list(warc.files) if warc else [],
        stats=engine.stats,
        done=ledger.done_count,
        queued=ledger.queued,
        errors=dict(engine.stats.errors),
    )
