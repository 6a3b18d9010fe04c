"""The owner's side of lending (``network.lending``): leases on one host's queued tasks.

The owner keeps every lent task in its task store and in the loan book's ``lent``: its queue
still counts them, refill skips them, and they are finished (done record, DELETE_BACKUP)
only when the borrower reports them. The host is marked busy while the lease runs, so the
owner does not fetch it meanwhile: one server is still fetched by one peer at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from p2pcrawl.crawl import HostQueue, Task, urls
from p2pcrawl.network.loanbook import LoanBook, loan_page_s
from p2pcrawl.network.ports import FrontierView
from protocol import (
    LEASE_S,
    LEND_REPLY_BUDGET,
    LOAN_BYTES_MOST,
    MAX_LENT_ROBOTS,
    MAX_ROBOTS_TTL,
    MAX_WANT,
    GiveBack,
    GiveBackArgs,
    GiveBackReply,
    KeyBatch,
    LendArgs,
    LendReply,
    LentRobots,
    PeerRef,
    TaskItem,
    loan_reply,
    one_chunk,
    returns_reply,
)

__all__ = ["MIN_LEND", "Lease", "Lender", "LendingCrawl"]

log = logging.getLogger(__name__)

# A host with fewer queued tasks is not worth a lease (and a robots.txt fetch by the
# borrower) to a peer with work of its own: the owner is about to finish it anyway. At 4, a
# busy owner's hosts of two or three queued pages (most of its queue once its long hosts are
# going) stayed until the others idled, and the two peers holding most of them fetched 1-2 s
# after the rest had run dry (cluster benchmark, 8 peers: 24.0 s median over 11 runs,
# against 23.4 s over 8 at 2).
MIN_LEND = 2
# To a borrower whose fetchers idle, smaller hosts are worth it, down to one page: at a
# crawl's end the busiest owners' queues are mostly hosts of one page each, their last
# (cluster benchmark, 8 peers: three peers ran dry 2-3 s before the last while two owners
# fetched a page each of a dozen hosts every half second).
MIN_LEND_IDLE = 1
# How long a LEND may wait for the request under way to the host it lends to end. Well
# inside the borrower's RPC timeout (its resends of the request are not served twice).
LEND_WAIT_S = 0.8
# A loan's pace, one page per this many seconds: the borrower waits for our word every
# ``loanbook.MAX_UNSETTLED`` pages, and our word waits for our lane to the replicas (up to
# ``replication.COPY_SPACING_S``). Measured at full speed, a lent host went at 10-16 pages a
# second. A host that goes faster here (``HostQueue.pace``) is not lent while our fetchers
# have room (``Lender._better_at_home``). Lent, a host fetched here at 400 pages a second went at
# 12 for the rest of the crawl, and one with a 50 ms Crawl-delay (18 a second here) at 6-10
# (steady run of ``benchmarks/cases.py``).
LOAN_PAGE_S = 0.1


def _robots_size(robots: LentRobots | None) -> int:
    return 0 if robots is None or robots.body is None else len(robots.body)


class LendingCrawl(FrontierView, Protocol):
    """What the lender asks of its own crawler (``crawl.Engine``)."""

    def excludes(self, key: bytes) -> bool: ...

    def kept_back(self, hq: HostQueue) -> int: ...

    async def finish(self, tasks: list[Task], *, hurry: bool = False) -> None: ...

    def after_lent(self, key: bytes) -> None: ...


@dataclass(slots=True)
class Lease:
    """What the owner lent: ``tasks`` not yet reported, by fingerprint."""

    lease: int
    borrower: PeerRef
    hq: HostQueue
    key: bytes
    tasks: dict[int, Task]
    deadline: float
    recalled: bool = False  # we are leaving: the borrower is asked to give the rest back


class Lender:
    def __init__(
        self,
        crawl: LendingCrawl,
        book: LoanBook,
        queued: Callable[[], int],
        *,
        is_member: Callable[[bytes], bool],
        active: Callable[[], bool],
        enabled: bool,
    ) -> None:
        """``queued``: tasks in our store (lent and under way included); ``is_member``: only
        members borrow; ``active``: lending only while the peer is; ``enabled``: not
        ``--no-lend``, and not the URL partition (there is nothing to lend with it)."""
        self.crawl = crawl
        self.lent = book.lent
        self._queued = queued
        self._is_member = is_member
        self._active = active
        self.enabled = enabled
        self.leases: dict[int, Lease] = {}
        self._no_leases = asyncio.Event()
        self.lent_total = 0  # tasks lent, ever (status)
        self.robots_lent = 0  # loans that carried our robots.txt policy (status)
        self.lapsed = 0  # leases ended without their borrower (it died or went silent)
        self.outgrown = 0  # leases recalled because more of their host queued here
        self.lends_answered = 0  # LENDs answered with a loan (one or more hosts)
        self.leases_made = 0
        self.reports_served = 0  # GIVE_BACKs served (each reports on one or more leases)

    async def serve_lend(self, sender: PeerRef, args: LendArgs) -> LendReply:
        want, have, hosts = args.want, args.have, args.hosts
        # Our own queue only: borrowed tasks are not ours to lend on.
        backlog = max(0, self._queued() - len(self.lent) - len(self.crawl.in_flight))
        if not self._may_lend_to(sender):
            return loan_reply(0, None, backlog)
        least = MIN_LEND_IDLE if have == 0 else MIN_LEND
        hq = self._host_to_lend(backlog, have, least, busy=False)
        if hq is None:
            busy = self._host_to_lend(backlog, have, least, busy=True)
            if busy is None or not await self._wait_for_request(busy, sender, least):
                return loan_reply(0, None, backlog)
            hq = busy
        self.lends_answered += 1
        # What one answer may move in all: the rule for one host (``_host_to_lend``) for
        # all of them, or the asker would leave with more than we keep.
        room = self._most(backlog, have)
        lease, payload, robots = self._lease(hq, sender, want)
        backlog -= len(lease.tasks)
        want -= len(lease.tasks)
        room -= len(lease.tasks)
        budget = LEND_REPLY_BUDGET - len(payload) - _robots_size(robots)
        more: list[tuple[int, bytes, LentRobots | None]] = []
        # An idle asker takes further hosts that are free now; one behind takes one, since
        # each moves the gap between the two backlogs.
        while (
            have == 0
            and len(more) + 1 < hosts
            and min(want, room) >= least
            and budget >= LOAN_BYTES_MOST
        ):
            hq = self._host_to_lend(backlog, have, least, busy=False, cap=min(want, room))
            if hq is None:
                break
            extra, extra_payload, extra_robots = self._lease(hq, sender, want)
            more.append((extra.lease, extra_payload, extra_robots))
            backlog -= len(extra.tasks)
            want -= len(extra.tasks)
            room -= len(extra.tasks)
            budget -= len(extra_payload) + _robots_size(extra_robots)
        return loan_reply(lease.lease, payload, backlog, robots, more)

    def _lease(
        self, hq: HostQueue, borrower: PeerRef, want: int
    ) -> tuple[Lease, bytes, LentRobots | None]:
        """Lend up to ``want`` of ``hq``'s queued tasks (as many as one reply chunk holds);
        the rest of the host waits here for the lease to end."""
        frontier = self.crawl.frontier
        # A host whose sitemaps we have not read keeps one task here, which reads them.
        first = self.crawl.kept_back(hq)
        tasks = frontier.lend_host(hq)
        key = tasks[0].key
        chunk = tasks[first : first + min(want, MAX_WANT)]
        payload, held = one_chunk(KeyBatch(key, [TaskItem(t.url, t.depth, t.hops) for t in chunk]))
        lent_urls = {item.url for item in held.tasks}
        lease = Lease(
            lease=secrets.randbits(62) + 1,
            borrower=borrower,
            hq=hq,
            key=key,
            tasks={t.fp: t for t in tasks if t.url in lent_urls},
            deadline=time.monotonic() + LEASE_S,
        )
        for t in tasks:
            if t.fp in lease.tasks:
                self.lent[t.fp] = t
            else:
                frontier.push(hq.host, t)  # waits for the lease: the host is busy
        self.leases[lease.lease] = lease
        self.leases_made += 1
        self.lent_total += len(lease.tasks)
        robots = self._robots_for(held.tasks[0].url)
        self.robots_lent += robots is not None
        return lease, payload, robots

    def _robots_for(self, url: str) -> LentRobots | None:
        """Our robots.txt policy for ``url``'s origin, to lend with it; None if we hold none
        worth lending (none yet, an unreachable file's "disallow all", or a long file)."""
        origin = urls.origin_of(url)
        now = time.monotonic()
        policy = self.crawl.robots.get(origin, now)
        if policy is None or policy.kind == "disallow_all":
            return None
        ttl = min(int(policy.expires_at - now), MAX_ROBOTS_TTL)
        if ttl < 1:
            return None
        if policy.kind == "allow_all":
            return LentRobots(origin, None, ttl)
        if policy.body is None or len(policy.body) > MAX_LENT_ROBOTS:
            return None
        return LentRobots(origin, policy.body, ttl)

    def _may_lend_to(self, borrower: PeerRef) -> bool:
        return (
            self.enabled
            and self._active()
            and not self.crawl.paused
            and self._is_member(borrower.id)  # only members borrow
        )

    def _better_at_home(self, hq: HostQueue) -> bool:
        """Whether ``hq`` is better kept here: our fetchers have room (with every one of
        them busy, a host lent frees a share of them for the others), and it goes faster
        here than on a loan (``loanbook.loan_page_s``), as measured (``HostQueue.pace``) or, before
        it is, by its last response time and politeness gap."""
        crawl = self.crawl
        if len(crawl.in_flight) >= crawl.settings.concurrency:
            return False
        pace = hq.pace if hq.pace is not None else hq.polite.cycle(crawl.settings.politeness)
        return pace < loan_page_s(hq.polite.gap(crawl.settings.politeness), LOAN_PAGE_S)

    def _worth_lending(self, hq: HostQueue, least: int = MIN_LEND) -> bool:
        """Enough of ``hq`` queued here, ours, and ours to keep; not our leader: it goes
        first here and has most of our link, while on loan it shares the borrower's and
        waits for our word every ``loanbook.MAX_UNSETTLED`` pages (cluster benchmark, 8
        peers: the 300-page host, lent at 19 s, went at 12 pages a second there against 26
        here, and ended the crawl)."""
        key = hq.key
        return (
            key is not None
            and self.crawl.frontier.lendable(hq, least + self.crawl.kept_back(hq))
            and not self.crawl.excludes(key)
        )

    def _most(self, backlog: int, have: int) -> int:
        """The most tasks a loan may move: keep enough to fill our own fetchers, and at
        least as much as the borrower will then have (moving more than half the gap would
        only turn it round; and the largest host, fetched one request at a time wherever it
        goes, stays put)."""
        return min((backlog - have) // 2, backlog - self.crawl.settings.concurrency)

    def _host_to_lend(
        self, backlog: int, have: int, least: int, *, busy: bool, cap: int | None = None
    ) -> HostQueue | None:
        """The host with most queued tasks (at least ``least``) among those whose move
        narrows the gap between our backlog and the borrower's (``have``; 0 for an idle
        one) and leaves this peer enough of its own to keep its fetchers busy: among the
        hosts with no request under way, or (``busy``) among those with one, which
        :meth:`_wait_for_request` lets end first."""
        most = self._most(backlog, have) if cap is None else min(cap, self._most(backlog, have))
        if most < least:
            return None
        lent = {id(le.hq) for le in self.leases.values()}

        def skip(hq: HostQueue) -> bool:
            key = hq.key
            return (
                key is None
                or self.crawl.excludes(key)
                or id(hq) in lent  # busy because it is lent: its rest waits for that
                or len(hq.tasks) < least + self.crawl.kept_back(hq)
                or self._better_at_home(hq)
            )

        return self.crawl.frontier.largest_lendable(busy=busy, least=least, most=most, skip=skip)

    async def _wait_for_request(self, hq: HostQueue, borrower: PeerRef, least: int) -> bool:
        """Hold ``hq`` back from its next request and wait for the one under way to end.
        True: it ended, and the host is out of the queues, still ours and worth lending.
        A crawl's last minutes are a few long hosts, each with a request always under way:
        without this, the owner with the most left could lend none of them."""
        frontier = self.crawl.frontier
        ready = False
        try:
            async with asyncio.timeout(LEND_WAIT_S):
                await asyncio.shield(frontier.reserve(hq))
            # Anything may have changed while the request ran.
            ready = self._worth_lending(hq, least) and self._may_lend_to(borrower)
        except TimeoutError:
            pass
        finally:
            if not ready:
                frontier.unreserve(hq)
        return ready

    async def serve_return(self, sender: PeerRef, args: GiveBackArgs) -> GiveBackReply:
        reports = args.reports()
        settled: dict[int, tuple[Lease, GiveBack]] = {}  # the leases we know, by lease id
        finished: list[Task] = []
        for report in reports:
            lease = self.leases.get(report.lease)
            if lease is None or lease.borrower.id != sender.id:
                continue
            lease.deadline = time.monotonic() + LEASE_S
            done = [t for fp in report.done if (t := lease.tasks.pop(fp, None)) is not None]
            back = [t for fp in report.back if (t := lease.tasks.pop(fp, None)) is not None]
            for t in done + back:
                self.lent.pop(t.fp, None)
            self._requeue(lease, back)
            finished += done
            settled[report.lease] = (lease, report)
        if finished:
            # Recorded before the lease may end: a leave waiting for its leases then counts
            # its queue with these gone, and hands off exactly the rest. One record for all
            # the leases reported on; hurried: the borrower's next pages wait for our answer.
            await self.crawl.finish(finished, hurry=True)
            for key in {t.key for t in finished}:
                self.crawl.after_lent(key)
        for lease, report in settled.values():
            # (It may have ended meanwhile: revoked by a hand-off, or ended by a leave.)
            if (report.final or not lease.tasks) and lease.lease in self.leases:
                self._end(lease, requeue=True)
        self.reports_served += 1
        return returns_reply(
            [
                (True, settled[r.lease][0].recalled) if r.lease in settled else (False, False)
                for r in reports
            ]
        )

    def _requeue(self, lease: Lease, tasks: list[Task]) -> None:
        if not tasks or lease.hq.removed or self.crawl.excludes(lease.key):
            return  # no longer ours to crawl: the store's rows went (or go) with the key
        for t in tasks:
            self.crawl.frontier.push(lease.hq.host, t)

    def _end(self, lease: Lease, *, requeue: bool) -> None:
        """The lease is over: what was not reported is crawled here again (``requeue``) or
        left to the key's new owner; the host may be fetched again."""
        self.leases.pop(lease.lease, None)
        if not self.leases:
            self._no_leases.set()
        rest = list(lease.tasks.values())
        lease.tasks.clear()
        for t in rest:
            self.lent.pop(t.fp, None)
        if requeue:
            self._requeue(lease, rest)
        self.crawl.frontier.release(lease.hq, response_time=0.0, gap=0.0)
        self.crawl.after_lent(lease.key)

    def recall_outgrown(self) -> None:
        """Recall each lease of a host that goes faster here than on a loan and has more
        tasks waiting here than the borrower still holds: the links to a host arrive at its
        owner while the host is lent, and wait for the whole lease. The crawl's longest
        host, lent in its first second (before its links came in), otherwise stood still
        here for 14 s with 2,900 tasks queued and this peer's fetchers idle (steady run of
        ``benchmarks/cases.py``)."""
        for lease in self.leases.values():
            if (
                not lease.recalled
                and len(lease.hq.tasks) > max(MIN_LEND, len(lease.tasks))
                and self._better_at_home(lease.hq)
            ):
                lease.recalled = True
                self.outgrown += 1

    def recall(self, keys: set[bytes] | None = None) -> None:
        """Leaving (or handing ``keys`` over): each borrower is asked, at its next report,
        to give back what it has not started; what it finishes meanwhile is reported as
        usual, so the hand-off need not wait for whole leases."""
        for lease in self.leases.values():
            if keys is None or lease.key in keys:
                lease.recalled = True

    async def wait_leases(self, timeout: float) -> None:
        """Until every lease has come back, for up to ``timeout`` seconds."""
        if not self.leases:
            return
        self._no_leases.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._no_leases.wait()

    def revoke_keys(self, keys: set[bytes]) -> None:
        """These keys left this peer (a hand-off): their leases end, and the borrower's next
        report hears that it should drop the rest."""
        for lease in [le for le in self.leases.values() if le.key in keys]:
            self._end(lease, requeue=False)

    def _lapse(self, lease: Lease, why: str) -> None:
        self.lapsed += 1
        log.info(
            "took back a lease of %d tasks of %s from %s (%s)",
            len(lease.tasks),
            lease.hq.host,
            lease.borrower,
            why,
        )
        self._end(lease, requeue=True)

    def end_leases(self) -> None:
        """Leaving, after ``wait_leases``: what did not come back is handed off with our
        keys; a borrower that still holds some hears "unknown lease" and drops it."""
        for lease in list(self.leases.values()):
            self._end(lease, requeue=False)

    def lapse_expired(self, now: float) -> None:
        for lease in [le for le in self.leases.values() if le.deadline < now]:
            self._lapse(lease, f"no report for {LEASE_S:g} s")

    def borrower_gone(self, peer_id: bytes, reason: str = "") -> None:
        """A peer left the routing table: its leases lapse."""
        for lease in [le for le in self.leases.values() if le.borrower.id == peer_id]:
            self._lapse(lease, "it left the network")

    def status(self) -> dict[str, int]:
        return {
            "tasks_lent": sum(len(le.tasks) for le in self.leases.values()),
            "leases_out": len(self.leases),
            "lent_total": self.lent_total,
            "robots_lent": self.robots_lent,
            "leases_lapsed": self.lapsed,
            "leases_outgrown": self.outgrown,
            "lends_answered": self.lends_answered,
            "leases_made": self.leases_made,
            "reports_served": self.reports_served,
        }
