"""The borrower's side of lending (``network.lending``): crawling a busy owner's host.

A peer whose fetchers would idle asks the peer with the largest backlog it has heard of for
a lease (LEND); it queues the tasks under their host, crawls them with its own fetchers,
robots.txt cache and politeness, archives the pages in its own WARC files, routes their
links to their owners, and reports what it finished (GIVE_BACK). A borrowed page's tail
ends only once the owner has recorded it, and a loan has at most ``MAX_UNSETTLED`` pages
between their fetch and that word: what a crash of either side can cost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from p2pcrawl.aio import Coalescer
from p2pcrawl.crawl import Task, urls
from p2pcrawl.crawl.robots import policy_from_lent
from p2pcrawl.network.lender import MIN_LEND, contact, is_member, lending_enabled
from protocol import KeyBatch, PeerRef, PeerTimeout, RemoteError, TaskSet
from protocol.lending import (
    KEEPALIVE_S,
    LEASE_S,
    MAX_LOANS,
    MAX_REPORTS,
    MAX_WANT,
    GiveBack,
    LentRobots,
    Loan,
)

if TYPE_CHECKING:
    from p2pcrawl.crawl import Engine
    from p2pcrawl.network.peer import Peer

__all__ = ["MAX_UNSETTLED", "TICK_S", "Borrowed", "Borrower"]

log = logging.getLogger(__name__)

TICK_S = 0.1
# A borrower reports finished tasks this often: what a crash of it can cost to fetch again.
REPORT_S = 0.1
# Reports to one lender due within this share a GIVE_BACK; a borrowed page waits this much
# longer for its lender's word, which a peer with idle fetchers can spare.
REPORT_WINDOW_S = 0.05
# How long a peer that had nothing to lend is not asked again: an idle network of N peers
# costs each idle peer at most (N - 1) / ASK_AGAIN_S small requests a second.
ASK_AGAIN_S = 5.0
ASK_BUSY_AGAIN_S = 0.5  # the shortest wait before asking a peer again
# A known backlog older than this is a guess, not a reason to ask first.
BACKLOG_FRESH_S = 5.0
# A busy peer asks for a host to even out backlogs at most this often: one small request a
# second per crawling peer, which also keeps what it knows of the others' backlogs fresh.
BALANCE_S = 1.0
# A loan's pages between their fetch and the lender's word, at most. Should the lender die,
# its successor cannot know of them and fetches them again: this bounds what a lender's
# crash costs per loan. The word comes within about a report interval, so in a healthy
# network a loan seldom has this many pages waiting.
MAX_UNSETTLED = 4


@dataclass(slots=True)
class Borrowed:
    """What the borrower holds: ``held`` not yet finished; ``done``/``back`` not yet reported."""

    lease: int
    lender: PeerRef
    host: str
    key: bytes
    held: set[int]
    done: list[int] = field(default_factory=list)
    back: list[int] = field(default_factory=list)
    reported: float = field(default_factory=time.monotonic)
    # Not fetched while the lender does not answer: it may be dead, and then its successor
    # crawls them from the replicas' copies.
    parked: list[Task] = field(default_factory=list)
    # Pages finished here wait (their tails do) until the lender has recorded them, as a
    # page waits until its links are durable at their owners: a crash of either side then
    # costs what was under way, no more.
    acks: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    # One report at a time per loan; the loans' reports run side by side, since an owner
    # whose link is full answers each in a few hundred ms and a loan's pages wait for it.
    reporting: asyncio.Lock = field(default_factory=asyncio.Lock)
    report_task: asyncio.Task[None] | None = None

    def release(self, fps: list[int] | None = None) -> None:
        for fp in list(self.acks) if fps is None else fps:
            fut = self.acks.pop(fp, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    @property
    def final(self) -> bool:
        return not self.held


class Borrower:
    def __init__(self, peer: Peer, wake: asyncio.Event) -> None:
        self.peer = peer
        self.loans: dict[int, Borrowed] = {}
        self._backlog: dict[bytes, tuple[int, float]] = {}  # peer id -> (backlog, when heard)
        self._asked: dict[bytes, float] = {}  # peer id -> when it last had nothing to lend
        self._misses: dict[bytes, int] = {}  # peer id -> answers in a row with no backlog
        self._wake = wake  # the lending loop's: a finished page is reported soon
        self._tasks = TaskSet("borrower")
        self._borrowing: asyncio.Task[None] | None = None
        self._asked_behind = -1e9  # when we last asked because we were behind
        self.borrowed_total = 0
        self.borrowed_behind = 0  # of which borrowed while our own fetchers had work
        self.robots_adopted = 0  # loans whose robots.txt policy we took from the lender
        self.loans_taken = 0  # LEND answers that lent us something (one or more hosts)
        self.reports_sent = 0  # GIVE_BACK flushes (each reports on one or more loans)
        # Lanes of reports by (lender, lease), lease 0 for the last reports of loans: those
        # to one lender that fall due within REPORT_WINDOW_S of each other share a GIVE_BACK
        # (a loan of one page is reported as soon as it is fetched, and the loans of one
        # answer are fetched at about the same time).
        self._reports: Coalescer[tuple[PeerRef, int], GiveBack, tuple[bool, bool]] = Coalescer(
            self._send_reports, window=REPORT_WINDOW_S, max_items=MAX_REPORTS, name="give-back"
        )

    @property
    def enabled(self) -> bool:
        return lending_enabled(self.peer)

    def _member(self, peer: PeerRef) -> bool:
        return is_member(self.peer, peer)

    def hungry(self) -> bool:
        """Whether our fetchers would idle without a loan (and we may take one)."""
        engine = self.peer.engine
        if engine is None or not self._may_borrow():
            return False
        # Idle fetchers, and too few hosts to keep them busy: one server is fetched one
        # request at a time, so tasks queued on a few hosts do not fill the fetchers.
        conc = engine.settings.concurrency
        if len(engine.in_flight) >= conc or engine.tasks_queued >= 8 * conc:
            return False
        hosts = 0
        for hq in engine.frontier.hosts.values():
            hosts += bool(hq.tasks) or hq.polite.busy
            if hosts >= conc:
                return False
        return True

    def _may_borrow(self) -> bool:
        peer, engine = self.peer, self.peer.engine
        if engine is None or peer.state != "active" or engine.paused or engine.exhausted:
            return False
        # As many loans as fetchers: at a crawl's end a busy owner's queue is mostly hosts of
        # one page, a loan each. Held to a quarter of the fetchers, the idle peers of an
        # 8-peer crawl fetched 10-20 pages a second in its last seconds, against 26 on a
        # full link (cluster benchmark, web request log).
        return engine.failure is None and len(self.loans) < engine.settings.concurrency

    def backlog(self) -> int:
        """Tasks queued here for our own fetchers, as a lender counts its backlog: our
        own not lent out and borrowed ones, neither under way."""
        engine = self.peer.engine
        assert engine is not None
        return max(0, engine.tasks_queued - len(engine.lent))

    def behind(self, now: float) -> PeerRef | None:
        """The peer to ask for a host now because its backlog is well above ours, though
        our fetchers have work; or one whose backlog we have not heard lately, to hear it.
        Waiting until our fetchers idle moves work only at the end of a crawl, when the
        busiest owner's remaining hosts are few and long (cluster benchmark, 8 peers: the
        busiest peer fetched 1.27x the mean)."""
        node = self.peer.node
        if node is None or now - self._asked_behind < BALANCE_S or not self._may_borrow():
            return None
        have = self.backlog()
        self._asked_behind = now
        largest: tuple[int, PeerRef] | None = None
        stalest: tuple[float, PeerRef] | None = None
        for p in node.peers():
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
        node = self.peer.node
        assert node is not None
        now = time.monotonic()
        best: tuple[float, PeerRef] | None = None
        for p in node.peers():
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
        engine, node = self.peer.engine, self.peer.node
        assert engine is not None and node is not None
        lender = behind or self._lender()
        if lender is None:
            return
        want = min(MAX_WANT, 4 * engine.settings.concurrency)
        have = self.backlog() if behind is not None else None
        # Idle, we take as many hosts as we have fetchers without a loan, in one answer: at a
        # crawl's end they are mostly hosts of a page or two.
        hosts = 1 if behind is not None else self._loans_wanted()
        try:
            loan = await node.lend(lender, want, have, hosts)
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
        engine = self._engine()
        return max(1, min(MAX_LOANS, engine.settings.concurrency - len(self.loans)))

    async def _take(self, loan: Loan, lender: PeerRef, behind: bool) -> None:
        """Queue a loan's tasks under their host, or give it straight back if it came too
        late (we stopped, the lender left) or holds nothing usable."""
        peer, engine = self.peer, self._engine()
        assert loan.batch is not None
        tasks = peer.handler.decode([loan.batch]).get(loan.batch.key, [])
        if not tasks or peer.state != "active" or not self._member(lender):
            # Straight back, so the owner need not wait for the lease to lapse.
            await self._report_safely(Borrowed(loan.lease, lender, "", loan.batch.key, set()))
            return
        host = engine.links.queue_of(tasks[0].url)
        engine.adopt_hosts([urls.hostname_of(tasks[0].url)])  # links within it are in scope
        if loan.robots is not None:
            self._adopt_robots(loan.robots, tasks[0].url)
        held = Borrowed(loan.lease, lender, host, loan.batch.key, {t.fp for t in tasks})
        self.loans[loan.lease] = held
        for t in tasks:
            t.lease = loan.lease
            engine.frontier.push(host, t)
        self.borrowed_total += len(tasks)
        if behind:
            self.borrowed_behind += len(tasks)
        self._count_held()

    def _adopt_robots(self, lent: LentRobots, url: str) -> None:
        """The lender's robots.txt policy for the loan's origin, unless we hold one: taken
        only from a network we trust with our scope (a keyed one, or one on loopback), where
        a member is one of ours; a stranger's word could lift a site's Disallow rules."""
        engine = self._engine()
        sync = self.peer.scope_sync
        if sync is None or not sync.trusted or lent.origin != urls.origin_of(url):
            return
        now = time.monotonic()
        if engine.robots.get(lent.origin, now) is not None:
            return
        policy = policy_from_lent(lent.body, lent.ttl, now, engine.settings.politeness)
        engine.robots.put(lent.origin, policy)
        self.robots_adopted += 1

    def may_fetch(self, task: Task) -> bool:
        """``Engine.may_fetch_borrowed``: the loan has fewer than ``MAX_UNSETTLED`` other
        pages fetched (or being fetched) and not yet recorded by its lender."""
        in_flight = self._engine().in_flight
        return sum(1 for t in in_flight.values() if t.lease == task.lease) <= MAX_UNSETTLED

    async def settle_and_wait(self, tasks: list[Task], finished: bool) -> None:
        """``Engine.settle_borrowed``: borrowed tasks finished (or given back) here; a
        finished one returns once its lender has recorded it (or the loan was dropped)."""
        fut = self.settle(tasks, finished)
        if fut is not None:
            await fut

    def settle(self, tasks: list[Task], finished: bool) -> asyncio.Future[None] | None:
        fut: asyncio.Future[None] | None = None
        for t in tasks:
            held = self.loans.get(t.lease)
            if held is None or t.fp not in held.held:
                if finished and t.key:  # its loan was dropped while it was under way
                    self._forward(t.key, [t.fp])
                continue
            held.held.discard(t.fp)
            (held.done if finished else held.back).append(t.fp)
            if finished:
                fut = fut or asyncio.get_running_loop().create_future()
                held.acks[t.fp] = fut
        self._count_held()
        self._wake.set()
        return fut

    def _count_held(self) -> None:
        engine = self.peer.engine
        if engine is not None:
            engine.borrowed = sum(len(b.held) for b in self.loans.values())

    async def _send_reports(
        self, lane: tuple[PeerRef, int], reports: list[GiveBack]
    ) -> list[tuple[bool, bool]]:
        """One flush of a lane: reports to one lender due together, in one GIVE_BACK."""
        node = self.peer.node
        assert node is not None
        self.reports_sent += 1
        return await node.give_back(lane[0], reports)

    async def _report(self, held: Borrowed) -> None:
        # The lender's address as our routing table knows it now: a lender restarted with
        # its data directory keeps its ID on a new port, is never declared dead, and would
        # never answer at the old one (it answers "unknown lease" at the new).
        held.lender = contact(self.peer, held.lender) or held.lender
        done, back, final = list(held.done), list(held.back), held.final
        # A loan still under way reports in a lane of its own, at once, side by side with
        # the others: its next pages wait for the answer every MAX_UNSETTLED pages, and a
        # lender whose link is full answers in a few hundred ms. The last reports of loans
        # share their lender's lane, and wait for each other unless there is no other.
        lane = (held.lender, 0 if final else held.lease)
        alone = final and all(
            b is held or b.lender.id != held.lender.id for b in self.loans.values()
        )
        ((known, recall),) = await self._reports.submit(
            lane, [GiveBack(held.lease, done, back, final)], urgent=not final or alone
        )
        held.reported = time.monotonic()
        del held.done[: len(done)]
        del held.back[: len(back)]
        held.release(done)
        if not known:
            # Revoked (the key moved) or lapsed: what we finished goes to whoever owns the
            # key now, as done history; the rest is dropped.
            self._forward(held.key, done)
            self._drop(held)
        elif final:
            self._drop(held)
        elif recall:
            self._give_back(held)
        elif held.parked:  # the lender answers again
            parked, held.parked = held.parked, []
            for t in parked:
                self._engine().frontier.push(held.host, t)

    async def _report_safely(self, held: Borrowed) -> None:
        """One report. A silent lender may be dead: what of its loan is not started waits
        (parked) until it answers again or is declared dead; an odd one is asked again."""
        try:
            async with held.reporting:
                await self._report(held)
        except PeerTimeout as exc:
            log.debug("report to %s failed: %s", held.lender, exc)
            held.parked += self._unqueue(held)
            replication = self.peer.replication
            if held.done and replication is not None:
                # Its successor would crawl these again from the replicas' copies, before
                # our forward of them (after we too declare the lender dead) could arrive.
                done = list(held.done)
                self._tasks.spawn(replication.finished_for(held.lender.id, held.key, done), "tell")
        except (RemoteError, OSError) as exc:
            log.debug("report to %s failed: %s", held.lender, exc)

    def _engine(self) -> Engine:
        engine = self.peer.engine
        assert engine is not None
        return engine

    def _unqueue(self, held: Borrowed) -> list[Task]:
        """Take the loan's tasks that are not under way out of the frontier."""
        return self._engine().frontier.take_tasks(held.host, lambda t: t.lease == held.lease)

    def _drop(self, held: Borrowed) -> None:
        """Forget a loan; what of it is still queued here is not fetched."""
        self.loans.pop(held.lease, None)
        if held.held and held.host:
            self._unqueue(held)
        held.held.clear()
        held.parked.clear()
        held.release()
        self._count_held()

    def on_stall(self) -> None:
        """Our loop stood still: the lenders may have declared us dead and crawled our
        loans themselves. Nothing borrowed is fetched until each lender has answered a
        report (``known`` again, or not: then what we finished goes to the key's owner)."""
        for held in self.loans.values():
            held.parked += self._unqueue(held)
            held.reported = 0.0  # report at the next tick
        self._wake.set()

    def lender_removed(self, peer_id: bytes) -> None:
        """A peer left the routing table: its loans are dropped."""
        for held in [b for b in self.loans.values() if b.lender.id == peer_id]:
            # Its replicas hold these tasks and its successor crawls them; what we finished
            # and could not report goes to that successor as done history.
            self._forward(held.key, list(held.done))
            self._drop(held)
        self._backlog.pop(peer_id, None)
        self._asked.pop(peer_id, None)
        self._misses.pop(peer_id, None)

    def give_back_if_stopped(self) -> None:
        engine = self.peer.engine
        if self.loans and engine is not None and (engine.exhausted or engine.failure):
            # We fetch no more (a page limit, a full disk, a dead WARC writer): what we
            # hold on loan and have not started goes back, or its owner would keep
            # waiting for a lease we keep alive.
            self.give_back_unstarted()

    def report_due(self, now: float) -> None:
        """Start the reports that are due, each loan's in a task of its own."""
        for held in list(self.loans.values()):
            if held.report_task is not None and not held.report_task.done():
                continue
            # Finished tasks gather for REPORT_S; a silent loan is kept alive well
            # before it lapses; a loan with nothing left is reported at once.
            wait = REPORT_S if held.done or held.back else KEEPALIVE_S
            if held.final or now - held.reported >= wait:
                held.report_task = self._tasks.spawn(self._report_safely(held), "report")

    def _forward(self, key: bytes, fps: list[int]) -> None:
        if fps:
            self._tasks.spawn(self._forward_done(key, fps), "forward")

    async def _forward_done(self, key: bytes, fps: list[int]) -> None:
        """Finished tasks of a dead lender's loan, as done history to the key's new owner,
        offered again while it refuses (it may not have declared the lender dead yet)."""
        peer, node = self.peer, self.peer.node
        assert node is not None
        if peer.ledger is not None:
            # Fetched and archived here. The key's new owner got these tasks queued with the
            # key, and may lend them to us before this history reaches it (it is offered to
            # the old owner until we count the new one); found in our done record, they are
            # then reported done, not fetched again.
            await peer.ledger.done.add([(key, fp) for fp in fps])
        delay, deadline = TICK_S, time.monotonic() + LEASE_S
        while time.monotonic() < deadline:
            owner = node.closest_local(key, 1)
            try:
                if not owner or owner[0].id == node.me.id:
                    await peer.intake([], {key: fps})
                    return
                result = await node.store_task(owner[0], [KeyBatch(key, [], fps)])
                if not result.refused_keys:
                    return
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.debug("forwarding done history to %s failed: %s", owner[0], exc)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)

    def give_back_unstarted(self) -> None:
        """Return every borrowed task not yet started (those under way finish)."""
        for held in list(self.loans.values()):
            self._give_back(held)

    def _give_back(self, held: Borrowed) -> None:
        parked, held.parked = held.parked, []
        back = parked + self._unqueue(held)
        if back:
            self.settle(back, finished=False)

    async def flush(self, timeout: float) -> None:
        """Leaving: report everything, for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.loans and time.monotonic() < deadline:
            for held in list(self.loans.values()):
                if held.held:
                    # Under way still (the engine stopped): the owner crawls them again.
                    self.settle([self._placeholder(held, fp) for fp in held.held], False)
            # Side by side: the reports to one lender share its GIVE_BACKs.
            await asyncio.gather(*(self._report_safely(h) for h in list(self.loans.values())))
            if self.loans:
                await asyncio.sleep(TICK_S)
        for held in list(self.loans.values()):
            self._drop(held)

    async def aclose(self) -> None:
        await self._tasks.aclose(timeout=1.0)
        await self._reports.aclose(timeout=1.0)

    @staticmethod
    def _placeholder(held: Borrowed, fp: int) -> Task:
        return Task("", fp, b"", 0, lease=held.lease)

    def status(self) -> dict[str, int]:
        return {
            "tasks_borrowed": sum(len(b.held) for b in self.loans.values()),
            "loans_in": len(self.loans),
            "borrowed_total": self.borrowed_total,
            "borrowed_behind": self.borrowed_behind,
            "robots_adopted": self.robots_adopted,
            "loans_taken": self.loans_taken,
            "reports_sent": self.reports_sent,
        }
