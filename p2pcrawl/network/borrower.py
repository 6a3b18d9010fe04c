"""The borrower's side of lending (``network.lending``): asking for a busy owner's host.

A peer whose fetchers would idle asks the peer with the largest backlog it has heard of for
a lease (LEND); a peer whose fetchers have work asks once a second when some peer is well
ahead of it. It queues a loan's tasks under their host and crawls them with its own
fetchers, robots.txt cache and politeness, archives the pages in its own WARC files and
routes their links to their owners; ``reporting`` tells the lender what it finished, and the
loan book (``loanbook``) is where the engine settles each borrowed task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from p2pcrawl.crawl import Task, policy_from_lent, urls
from p2pcrawl.network.lender import MIN_LEND
from p2pcrawl.network.loanbook import Borrowed, LoanBook
from p2pcrawl.network.ports import FrontierView
from p2pcrawl.network.reporting import Reports
from protocol import (
    MAX_LOANS,
    MAX_WANT,
    KeyBatch,
    LentRobots,
    Loan,
    PeerRef,
    PeerTimeout,
    RemoteError,
    TaskSet,
)

__all__ = ["Borrower", "BorrowingCrawl", "Members"]

# How long a peer that had nothing to lend is not asked again: an idle network of N peers
# costs each idle peer at most (N - 1) / ASK_AGAIN_S small requests a second.
ASK_AGAIN_S = 5.0
ASK_BUSY_AGAIN_S = 0.5  # the shortest wait before asking a peer again
# A known backlog older than this is a guess, not a reason to ask first.
BACKLOG_FRESH_S = 5.0
# A busy peer asks for a host to even out backlogs at most this often: one small request a
# second per crawling peer, which also keeps what it knows of the others' backlogs fresh.
BALANCE_S = 1.0

LendCall = Callable[[PeerRef, int, int | None, int], Awaitable[Loan]]


class Members(Protocol):
    def peers(self) -> list[PeerRef]: ...

    def is_member(self, peer_id: bytes) -> bool: ...


class BorrowingCrawl(FrontierView, Protocol):
    """What the borrower asks of its own crawler (``crawl.Engine``)."""

    @property
    def tasks_queued(self) -> int: ...

    @property
    def exhausted(self) -> bool: ...

    @property
    def failure(self) -> BaseException | None: ...

    def adopt_hosts(self, hostnames: list[str]) -> None: ...

    def queue_of(self, url: str) -> str: ...


class Borrower:
    def __init__(
        self,
        crawl: BorrowingCrawl,
        book: LoanBook,
        reports: Reports,
        members: Members,
        *,
        lend: LendCall,
        decode: Callable[[list[KeyBatch]], dict[bytes, list[Task]]],
        active: Callable[[], bool],
        trusted: bool,
        enabled: bool,
        strained: Callable[[], bool] = lambda: False,
    ) -> None:
        """``lend``: LEND to a peer (``CrawlNode.lend``); ``decode``: a loan's tasks, checked
        as any sent to us (``handlers.PeerHandler.decode``); ``trusted``: we trust the
        network with our scope (a keyed network, or one on loopback), and so with a
        lender's robots.txt; ``enabled``: not ``--no-lend``, and not the URL partition;
        ``strained``: our own health is in doubt (``CrawlNode.strained``)."""
        self.crawl = crawl
        self.book = book
        self.loans = book.loans
        self.reports = reports
        self.members = members
        self._lend = lend
        self._decode = decode
        self._active = active
        self.trusted = trusted
        self.enabled = enabled
        self._strained = strained
        self._backlog: dict[bytes, tuple[int, float]] = {}  # peer id -> (backlog, when heard)
        self._asked: dict[bytes, float] = {}  # peer id -> when it last had nothing to lend
        self._misses: dict[bytes, int] = {}  # peer id -> answers in a row with no backlog
        self._tasks = TaskSet("borrower")
        self._borrowing: asyncio.Task[None] | None = None
        self._asked_behind = -1e9  # when we last asked because we were behind
        self.borrowed_total = 0
        self.borrowed_behind = 0  # of which borrowed while our own fetchers had work
        self.robots_adopted = 0  # loans whose robots.txt policy we took from the lender
        self.loans_taken = 0  # LEND answers that lent us something (one or more hosts)

    def hungry(self) -> bool:
        """Whether our fetchers would idle without a loan (and we may take one)."""
        if not self._may_borrow():
            return False
        # Idle fetchers, and too few hosts to keep them busy: one server is fetched one
        # request at a time, so tasks queued on a few hosts do not fill the fetchers.
        crawl = self.crawl
        conc = crawl.settings.concurrency
        if len(crawl.in_flight) >= conc or crawl.tasks_queued >= 8 * conc:
            return False
        return crawl.frontier.hosts_with_work(conc) < conc

    def _may_borrow(self) -> bool:
        crawl = self.crawl
        if not self._active() or crawl.paused or crawl.exhausted:
            return False
        if self._strained():
            # A peer that is flooded or whose loop stalls fetches a loan slower than its
            # owner would: a peer flooded 3 s before borrowed the 50 ms Crawl-delay host, the
            # crawl's longest, and fetched it at 8-20 pages a second against 18-19 at an
            # unflooded peer (a trace of chaos seed 4). It borrows again once its health
            # has recovered.
            return False
        # As many loans as fetchers: at a crawl's end a busy owner's queue is mostly hosts of
        # one page, a loan each. Held to a quarter of the fetchers, the idle peers of an
        # 8-peer crawl fetched 10-20 pages a second in its last seconds, against 26 on a
        # full link (cluster benchmark, web request log).
        return crawl.failure is None and len(self.loans) < crawl.settings.concurrency

    def backlog(self) -> int:
        """Tasks queued here for our own fetchers, as a lender counts its backlog: our
        own not lent out and borrowed ones, neither under way."""
        return max(0, self.crawl.tasks_queued - len(self.book.lent))

    def behind(self, now: float) -> PeerRef | None:
        """The peer to ask for a host now because its backlog is well above ours, though
        our fetchers have work; or one whose backlog we have not heard lately, to hear it.
        Waiting until our fetchers idle moves work only at the end of a crawl, when the
        busiest owner's remaining hosts are few and long (cluster benchmark, 8 peers: the
        busiest peer fetched 1.27x the mean)."""
        if now - self._asked_behind < BALANCE_S or not self._may_borrow():
            return None
        have = self.backlog()
        self._asked_behind = now
        largest: tuple[int, PeerRef] | None = None
        stalest: tuple[float, PeerRef] | None = None
        for p in self.members.peers():
            backlog, heard = self._backlog.get(p.id, (0, -1e9))
            if now - heard < BACKLOG_FRESH_S and (largest is None or backlog > largest[0]):
                largest = (backlog, p)
            if stalest is None or heard < stalest[0]:
                stalest = (heard, p)
        if largest is not None and largest[0] - have >= 2 * MIN_LEND:
            return largest[1]
        return stalest[1] if stalest is not None else None

    def _lender(self) -> PeerRef | None:
        """The peer most worth asking: the largest recent backlog first, then one not asked
        lately, so an idle network costs one small request per peer every ASK_AGAIN_S."""
        now = time.monotonic()
        best: tuple[float, PeerRef] | None = None
        for p in self.members.peers():
            backlog, heard = self._backlog.get(p.id, (0, -1e9))
            # A peer with a backlog may have a host free to lend soon; one without is asked
            # again after a wait that doubles up to ASK_AGAIN_S while it stays without.
            misses = self._misses.get(p.id, 0) if backlog < MIN_LEND else 0
            again = min(ASK_AGAIN_S, ASK_BUSY_AGAIN_S * 2**misses)
            if now - self._asked.get(p.id, -1e9) < again:
                continue
            score = backlog if now - heard < BACKLOG_FRESH_S else 0.5
            if best is None or score > best[0]:
                best = (score, p)
        return best[1] if best is not None else None

    def borrow_soon(self, lender: PeerRef | None = None) -> None:
        """Ask for a loan in the background, one request at a time: a lender may hold its
        answer until the request under way to the host it lends has ended. ``lender``: ask
        that peer because we are behind it (``behind``), not because we are idle."""
        if self._borrowing is None or self._borrowing.done():
            self._borrowing = self._tasks.spawn(self.borrow(lender), "borrow")

    async def borrow(self, behind: PeerRef | None = None) -> None:
        lender = behind or self._lender()
        if lender is None:
            return
        want = min(MAX_WANT, 4 * self.crawl.settings.concurrency)
        have = self.backlog() if behind is not None else None
        # Idle, we take as many hosts as we have fetchers without a loan, in one answer: at a
        # crawl's end they are mostly hosts of a page or two.
        hosts = 1 if behind is not None else self._loans_wanted()
        try:
            loan = await self._lend(lender, want, have, hosts)
        except (PeerTimeout, RemoteError, OSError):
            self._asked[lender.id] = time.monotonic()
            # Heard nothing, not a backlog: probed last, not again first.
            self._backlog[lender.id] = (0, time.monotonic())
            return
        self._backlog[lender.id] = (loan.backlog, time.monotonic())
        if loan.backlog < MIN_LEND:
            self._misses[lender.id] = min(16, self._misses.get(lender.id, 0) + 1)
        else:
            self._misses.pop(lender.id, None)
        if loan.batch is None:
            self._asked[lender.id] = time.monotonic()
            return
        self.loans_taken += 1
        for one in (loan, *loan.more):
            await self._take(one, lender, behind is not None)

    def _loans_wanted(self) -> int:
        return max(1, min(MAX_LOANS, self.crawl.settings.concurrency - len(self.loans)))

    async def _take(self, loan: Loan, lender: PeerRef, behind: bool) -> None:
        """Queue a loan's tasks under their host, or give it straight back if it came too
        late (we stopped, the lender left) or holds nothing usable."""
        batch = loan.batch
        if batch is None:
            return  # nothing lent
        tasks = self._decode([batch]).get(batch.key, [])
        if not tasks or not self._active() or not self.members.is_member(lender.id):
            # Straight back, so the owner need not wait for the lease to lapse.
            await self.reports.report(Borrowed(loan.lease, lender, "", batch.key, set()))
            return
        crawl = self.crawl
        host = crawl.queue_of(tasks[0].url)
        crawl.adopt_hosts([urls.hostname_of(tasks[0].url)])  # links within it are in scope
        if loan.robots is not None:
            self._adopt_robots(loan.robots, tasks[0].url)
        held = Borrowed(loan.lease, lender, host, batch.key, {t.fp for t in tasks})
        self.loans[loan.lease] = held
        for t in tasks:
            t.lease = loan.lease
            crawl.frontier.push(host, t)
        self.borrowed_total += len(tasks)
        if behind:
            self.borrowed_behind += len(tasks)
        self.book.recount()

    def _adopt_robots(self, lent: LentRobots, url: str) -> None:
        """The lender's robots.txt policy for the loan's origin, unless we hold one: taken
        only from a network we trust with our scope (a keyed one, or one on loopback), where
        a member is one of ours; a stranger's word could lift a site's Disallow rules."""
        if not self.trusted or lent.origin != urls.origin_of(url):
            return
        now = time.monotonic()
        robots = self.crawl.robots
        if robots.get(lent.origin, now) is not None:
            return
        policy = policy_from_lent(lent.body, lent.ttl, now, self.crawl.settings.politeness)
        robots.put(lent.origin, policy)
        self.robots_adopted += 1

    def lender_gone(self, peer_id: bytes) -> None:
        """A peer left the routing table: what we heard of its backlog goes too."""
        self._backlog.pop(peer_id, None)
        self._asked.pop(peer_id, None)
        self._misses.pop(peer_id, None)

    def give_back_if_stopped(self) -> None:
        crawl = self.crawl
        if self.loans and (crawl.exhausted or crawl.failure):
            # We fetch no more (a page limit, a full disk, a dead WARC writer): what we
            # hold on loan and have not started goes back, or its owner would keep
            # waiting for a lease we keep alive.
            self.reports.give_back_unstarted()

    async def aclose(self) -> None:
        await self._tasks.aclose(timeout=1.0)
