"""The crawl engine: workers take ready hosts from the frontier, fetch, and hand pages on.

Every discovered link leaves the engine through one seam, ``Router.route``: a lone peer
queues it locally, a networked peer hands it to the URL's owner (docs/architecture.md,
ownership). The engine only crawls what it was given; it never decides ownership.

The roles around it: :mod:`~p2pcrawl.crawl.attempt` (one request and the retry policy),
:mod:`~p2pcrawl.crawl.robotsgate` (robots.txt), :mod:`~p2pcrawl.crawl.tail` (archive, parse,
route, finish), :mod:`~p2pcrawl.crawl.refill` (the in-RAM window over the task store) and
:mod:`~p2pcrawl.crawl.links` (which links become tasks).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from p2pcrawl.aio import TaskSet, every
from p2pcrawl.archive import WarcWriteError, WarcWriter
from p2pcrawl.crawl import urls
from p2pcrawl.crawl.attempt import Outcome, RefusedHosts, attempt
from p2pcrawl.crawl.disk import NEAR_EVERY_S, DiskBudget
from p2pcrawl.crawl.domains import DomainGate, DomainTable
from p2pcrawl.crawl.fetcher import Fetcher, FetchResult, page_digest
from p2pcrawl.crawl.frontier import Frontier, HostQueue, Task
from p2pcrawl.crawl.ledger import Ledger
from p2pcrawl.crawl.links import LinkFilter
from p2pcrawl.crawl.pacing import Pacer, response_on_wire
from p2pcrawl.crawl.parseproc import ParseWorkers
from p2pcrawl.crawl.pauses import Pauses
from p2pcrawl.crawl.pipeline import Pipeline, Ticket
from p2pcrawl.crawl.ports import NO_LOANS, FinishedHook, LoanPort, LocalRouter, Router
from p2pcrawl.crawl.refill import WindowRefill
from p2pcrawl.crawl.revisit import Revisits
from p2pcrawl.crawl.robots import RobotsCache
from p2pcrawl.crawl.robotsgate import RobotsGate
from p2pcrawl.crawl.scope import Scope
from p2pcrawl.crawl.seen import SeenCache
from p2pcrawl.crawl.stats import CrawlStats
from p2pcrawl.crawl.tail import page_tail
from p2pcrawl.crawl.unreachable import Unreachable
from p2pcrawl.settings import CrawlSettings, Partition

__all__ = ["Engine"]

log = logging.getLogger(__name__)

# Page tails (archive, parse, route, finish) allowed per fetch slot. Each holds one fetched
# body, so this bounds the pages in memory at (1 + TAILS_PER_FETCH) x concurrency.
TAILS_PER_FETCH = 2


class Engine:
    def __init__(
        self,
        settings: CrawlSettings,
        ledger: Ledger,
        *,
        warc: WarcWriter | None,
        partition: Partition = "host",
        router: Router | None = None,
        on_finished: FinishedHook | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        loans: LoanPort = NO_LOANS,
        data_dir: Path | None = None,
        link_bytes: Callable[[], int] | None = None,
        keep_proofs: bool = False,
        pipeline: Pipeline | None = None,  # a crash's window (crawl/pipeline.py); None: none
    ) -> None:
        self.settings = settings
        # Each page's URL and body digest kept beside its done record, for the peers that
        # check this one's word (an open network, docs/security.md); no one else asks.
        self.keep_proofs = keep_proofs
        self.ledger = ledger
        self.warc = warc
        self.partition: Partition = partition
        self.router: Router = router or LocalRouter(ledger, self.wake)
        self.on_finished = on_finished
        self.on_failure = on_failure
        # Why this engine stopped fetching for good (its output failed), or None.
        self.failure: BaseException | None = None
        self.stats = CrawlStats()
        self.frontier = Frontier(settings)
        self.fetcher = Fetcher(settings)
        self.pacer = Pacer(settings.max_rate)
        # What the link carries besides the fetches (the RPCs): --max-rate counts it too.
        if link_bytes is not None and self.pacer.enabled:
            self.pacer.count_also(link_bytes)
        self.unreachable = Unreachable(
            settings.politeness.max_retries, settings.politeness.robots_error_ttl
        )
        self.domains = domains = DomainTable(settings.domains)
        self.robots_gate = RobotsGate(
            settings, self.fetcher, self.stats, self.pacer, self.unreachable, partition, domains
        )
        self.frontier.gate = DomainGate(self.domains.limit_at)
        self.links = LinkFilter(settings, partition, self.stats, self.domains)
        self.in_flight: dict[int, Task] = {}
        self.loans = loans
        self.refill = WindowRefill(
            settings, self.frontier, ledger, self.in_flight, partition, lent=loans.lent
        )
        self._pauses = Pauses()  # why no fetch may start now, by name
        self.revisits = Revisits(self) if settings.revisit.enabled else None  # --revisit
        # Pages that could hold the loop are parsed in processes, under a deadline.
        self.parsers = ParseWorkers(settings.parse_workers, deadline=settings.parse_deadline)
        self._host_pages: collections.Counter[str] = collections.Counter()
        # --max-disk: measured, and estimated between measurements.
        self.disk = DiskBudget(settings.scope.max_disk_bytes, lambda: self.stats.bytes_fetched)
        self.data_dir = data_dir  # measured against max_disk_bytes
        self._tasks = TaskSet("engine")
        self._progress = asyncio.Event()
        self._fetching = 0  # page fetches under way, reserved against max_pages
        self.refused_hosts = RefusedHosts()  # said once each, with how to allow them
        # Set by whoever watches the network's total (--max-network-pages).
        self.network_limit_reached = False
        # Fetched pages in their tails, which wait on the WARC writer and the stores.
        self.tail_slots = TAILS_PER_FETCH * settings.concurrency
        self._tail_slots = asyncio.Semaphore(self.tail_slots)
        self.tails = 0  # tails under way, each holding one of those slots
        self.pipeline = pipeline or Pipeline(pages=None)
        # When a task last left the fetchers (wall clock): when this peer's part was over.
        self.last_task_at: float | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self.revisits is not None:
            await self.revisits.start()
            self._tasks.spawn(self.revisits.run(), "revisits")
        await self.fetcher.start()
        self._tasks.spawn(self.refill.run(), "refill")
        self._tasks.spawn(every(1.0, self._housekeeping, first=0.0), "housekeeping")
        if self.disk.limit and self.data_dir is not None:
            self._tasks.spawn(self.disk.run(self.data_dir, self._progress.set), "disk")
        for i in range(self.settings.concurrency):
            self._tasks.spawn(self._worker(), f"worker-{i}")
        self.refill.wanted.set()

    @property
    def paused(self) -> bool:
        """No new fetch starts: some reason to pause is held."""
        return bool(self._pauses)

    def pause(self, reason: str) -> None:
        """Start no fetch until ``resume(reason)`` and every other reason's."""
        self._pauses.add(reason)

    def resume(self, reason: str) -> None:
        self._pauses.discard(reason)

    async def stop_fetching(self, timeout: float) -> list[Task]:
        """Stop taking work, wait up to ``timeout`` for in-flight fetches; returns the rest."""
        self.pause("stopped")
        self.frontier.wake_all()
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await self.wait_progress(max(0.0, deadline - time.monotonic()))
        return list(self.in_flight.values())

    async def aclose(self) -> None:
        await self._tasks.aclose()
        self.pacer.close()
        await self.fetcher.aclose()
        await self.parsers.aclose()

    # -- state -------------------------------------------------------------------------

    @property
    def scope(self) -> Scope:
        return self.links.scope

    @property
    def scope_from_seeds(self) -> bool:
        return self.links.scope_from_seeds

    @property
    def seen(self) -> SeenCache:
        return self.links.seen

    @property
    def robots(self) -> RobotsCache:
        return self.robots_gate.cache

    @property
    def tasks_queued(self) -> int:
        due = len(self.revisits.pending) if self.revisits else 0
        return max(0, self.ledger.queued + self.loans.borrowed + due - len(self.in_flight))

    @property
    def idle(self) -> bool:
        busy = self.in_flight or self.ledger.queued or self.loans.borrowed
        return not busy and not (self.revisits and self.revisits.pending)

    @property
    def exhausted(self) -> bool:
        if self.network_limit_reached or self.disk.full:
            return True
        mp = self.settings.scope.max_pages
        # Fetches under way count too, or workers passing this check together overshoot.
        return bool(mp) and self.stats.pages_fetched + self._fetching >= mp

    @property
    def held(self) -> bool:
        """No fetch may start now: a limit reached, or the disk full by estimate."""
        return self.exhausted or self.disk.over

    def over_host_budget(self, url: str) -> bool:
        """The URL's host has had its ``max_pages_per_host`` pages."""
        cap = self.settings.scope.max_pages_per_host
        return bool(cap) and self._host_pages[urls.host_of(url)] >= cap

    def count_host_page(self, url: str) -> None:
        if self.settings.scope.max_pages_per_host:
            self._host_pages[urls.host_of(url)] += 1

    def key_of(self, url: str) -> bytes:
        return self.links.key_of(url)

    def queue_of(self, url: str) -> str:
        return self.links.queue_of(url)

    def requisite_allowed(self, url: str) -> bool:
        return self.links.requisite_allowed(url)

    def kept_back(self, hq: HostQueue) -> int:
        """Tasks of ``hq`` a loan leaves here: one while its sitemaps are unread, to read them."""
        return 0 if self.robots_gate.sitemaps.settled(hq) else 1

    def wake(self) -> None:
        """New tasks were stored: refill the frontier window."""
        self.refill.wanted.set()

    async def wait_progress(self, timeout: float) -> None:
        self._progress.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._progress.wait()

    # -- seeds and ownership changes ------------------------------------------------------

    def seed_tasks(self, seeds: Iterable[str]) -> list[Task]:
        return [self.links.seed_task(raw) for raw in seeds]

    def adopt_hosts(self, hostnames: Iterable[str]) -> None:
        """Widen a seeds-derived scope (no ``--allow-domain``) with hosts the network says
        are in it: seeds arrive through one peer, the others learn them as owners."""
        self.links.adopt_hosts(hostnames)

    async def add_seeds(self, seeds: Iterable[str]) -> int:
        tasks = self.seed_tasks(seeds)
        for t in tasks:
            self.seen.check_and_add(t.fp)
        await self.router.route(tasks)
        return len(tasks)

    def exclude_keys(self, keys: Iterable[bytes]) -> list[Task]:
        """Stop crawling these keys (moved to another peer); returns their window tasks.
        Borrowed tasks of those keys stay: they are their lender's, not ours to hand over."""
        keys = self.refill.exclude(keys)
        if self.partition == "url":
            return []
        hosts = [h for h, hq in self.frontier.hosts.items() if hq.key in keys]
        out: list[Task] = []
        for h in hosts:
            out += self.frontier.take_tasks(h, lambda t: not t.lease)
        return self.revisits.release(out) if self.revisits else out

    def include_keys(self, keys: Iterable[bytes]) -> None:
        self.refill.include(keys)

    def excludes(self, key: bytes) -> bool:
        return key in self.refill.excluded_keys  # moving to another peer

    async def _housekeeping(self) -> None:
        self.stats.sample()
        self.frontier.prune()
        if self.refill.low() or self.refill.overflowing:
            self.refill.wanted.set()

    # -- the worker ----------------------------------------------------------------------

    async def fetch_page(
        self,
        url: str,
        priority: float = 0.0,
        user_agent: str | None = None,
        max_body: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> FetchResult:
        """Fetch a page, reserved against max-pages while under way, paced by --max-rate
        (the smallest ``priority`` first)."""
        self._fetching += 1
        try:
            taken = await self.pacer.start(priority)
            size = 0
            try:
                res = await self.fetcher.fetch(
                    url, user_agent=user_agent, max_body=max_body, headers=headers
                )
                if self.pacer.enabled:
                    size = response_on_wire(len(res.body), res.headers)
                return res
            finally:
                self.pacer.settle(taken, size)
        finally:
            self._fetching -= 1

    async def _worker(self) -> None:
        """Fetch, one host at a time; each page's tail runs as its own task, and a page holds
        a ``Pipeline`` ticket from its host's turn to its done record (or a slow fetch's end)."""
        while True:
            if self.paused or self.held:
                self._progress.set()
                await self._pauses.wait(0.2 if self.exhausted else NEAR_EVERY_S)
                continue
            outcome: Outcome | Exception = Outcome.WAITING
            res: FetchResult | None = None
            async with self.frontier.slot() as slot:
                ticket = await self.pipeline.ticket()
                task = None if self.paused or self.held else slot.pop()
                if task is None:
                    ticket.release()
                    continue
                self.in_flight[task.fp] = task
                ticket.started()
                try:
                    outcome, res = await attempt(self, slot, task)
                except asyncio.CancelledError:
                    ticket.release()
                    self._done_with(task)
                    raise
                except Exception as exc:
                    outcome = exc
                ticket.fetched()
            # The host is handed back: what is left of the task does not hold it.
            handed_over = False
            try:
                if outcome is Outcome.PAGE:
                    assert res is not None
                    await self._tail_slots.acquire()
                    tail = self._tail(task, res, ticket)
                    handed_over = self._tasks.spawn(tail, "tail") is not None
                    if handed_over:
                        self.tails += 1
                    else:
                        self._tail_slots.release()  # shutting down: the URL stays queued
                elif outcome is Outcome.FINISH:
                    await self.finish([task])
                elif outcome is Outcome.REFUSED:
                    await self.refuse(task)
                elif outcome is Outcome.DONE_ELSEWHERE:
                    self.stats.skipped_done += 1
                    if task.lease:  # crawled here before, when this peer owned its host
                        await self.finish([task])
                    else:
                        await self.ledger.drop_done([task.fp])
                        if self.on_finished is not None:
                            await self.on_finished([task])
                elif isinstance(outcome, Exception):
                    await self._failed(task, outcome)
            except Exception as exc:  # not CancelledError: the ticket goes, the task stays
                await self._failed(task, exc)
            finally:
                if not handed_over:
                    ticket.release()
                    self._done_with(task)

    async def _tail(self, task: Task, res: FetchResult, ticket: Ticket) -> None:
        try:
            await page_tail(self, task, res)
        except Exception as exc:
            await self._failed(task, exc)
        finally:
            self.tails -= 1
            self._tail_slots.release()
            ticket.release()
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
        await self.finish([task])

    def _done_with(self, task: Task) -> None:
        self.in_flight.pop(task.fp, None)
        self.last_task_at = time.time()
        self._progress.set()
        self.refill.after_task(task.key)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is not None:
            return
        log.error("stopped fetching: %s", exc)
        self.failure = exc
        self.pause("failed")
        self.frontier.wake_all()
        self._progress.set()
        if self.on_failure is not None:
            self.on_failure(exc)

    async def refuse(self, task: Task) -> None:
        """Drop a task this peer's configuration refuses, without recording it done: the
        same URL seeded again once the configuration allows it is crawled."""
        if task.lease:
            await self.loans.settle([task], finished=False)  # its owner may be allowed to
            return
        if self.revisits is not None and await self.revisits.refused(task):
            return
        await self.ledger.drop([task.fp])
        if self.on_finished is not None:
            await self.on_finished([task])  # the replicas drop their copies

    async def finish(
        self, tasks: list[Task], *, hurry: bool = False, body: bytes | None = None
    ) -> None:
        """Record ``tasks`` finished here and tell the replicas; ``hurry``: a borrower's
        report, its sender waits; ``body``: the page fetched here (none: finished without)."""
        if self.loans.borrowed and any(t.lease for t in tasks):
            await self.loans.settle([t for t in tasks if t.lease], finished=True)
            tasks = [t for t in tasks if not t.lease]
            if not tasks:
                return
        if self.revisits is not None:
            # A due page's history is its record (it is done already); a new one gets one.
            tasks = await self.revisits.settle(tasks, elsewhere=hurry)
            if not tasks:
                return
        proofs = self.keep_proofs and (body is not None or not hurry)
        digest = page_digest(body) if proofs and body is not None else b""
        await self.ledger.finish(tasks, {t.fp: digest for t in tasks} if proofs else {})
        if self.on_finished is not None:
            await self.on_finished(tasks, hurry=hurry)

    def after_lent(self, key: bytes) -> None:
        """Lent tasks came back (finished or not): as after a fetch of ours."""
        self._progress.set()
        self.refill.after_task(key)
