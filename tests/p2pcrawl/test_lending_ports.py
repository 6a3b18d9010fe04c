"""Lending through its ports: an owner and a borrower wired to each other without a socket.

Each side is built as the peer builds it (``parts.assemble``), around its own real ledger and
a real, unstarted crawl engine: nothing is fetched, the test settles the borrowed pages
itself. LEND and GIVE_BACK go straight from one side's call to the other side's server, as
typed messages, so what the owner lends is exactly what the borrower takes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from p2pcrawl.crawl import Engine, Ledger, Task, urls
from p2pcrawl.network.borrower import Borrower
from p2pcrawl.network.lender import Lender
from p2pcrawl.network.loanbook import MAX_UNSETTLED, POLITE_UNSETTLED, Borrowed, LoanBook
from p2pcrawl.network.reporting import Reports
from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings
from protocol import GiveBack, GiveBackArgs, KeyBatch, LendArgs, Loan, PeerRef, PeerTimeout, key_for
from protocol.loans import answers_of, loan_of
from tests.p2pcrawl.netfakes import Net, peer, tasks_of
from tests.protocol.conftest import eventually

pytestmark = pytest.mark.timeout(30)

SMALL, BIG = "small.test", "big.test"
OWNER, BORROWER, STRANGER = b"\x10" * 20, b"\x20" * 20, b"\x30" * 20


def decode(batches: list[KeyBatch]) -> dict[bytes, list[Task]]:
    return {
        b.key: [Task(i.url, urls.fingerprint(i.url), b.key, i.depth, i.hops) for i in b.tasks]
        for b in batches
    }


class Side:
    """One peer's lending parts around its own ledger and engine."""

    def __init__(self, ledger: Ledger, me: bytes, other: bytes, delay: float = 1.0) -> None:
        settings = CrawlSettings(
            concurrency=2,
            scope=ScopeSettings(allow_domains=(SMALL, BIG)),
            politeness=PolitenessSettings(delay=delay, politeness_factor=0.0),
        )
        self.ledger = ledger
        self.net = Net(me, [other])
        self.forwarded: list[tuple[bytes, list[int]]] = []
        self.told: list[tuple[bytes, bytes, list[int]]] = []
        self.book = LoanBook(orphaned=lambda key, fps: self.forwarded.append((key, fps)))
        self.engine = Engine(settings, ledger, warc=None, loans=self.book)
        self.lender = Lender(
            self.engine,
            self.book,
            lambda: ledger.queued,
            is_member=self.net.is_member,
            active=lambda: True,
            enabled=True,
        )
        self.give_back_to: Any = None  # the other side's lender
        self.fail_reports = False

        async def forward(key: bytes, fps: list[int]) -> None:
            self.forwarded.append((key, fps))

        async def tell(owner: bytes, key: bytes, fps: list[int]) -> None:
            self.told.append((owner, key, fps))

        self.reports = Reports(
            self.book,
            self.engine.frontier,
            give_back=self._give_back,
            member=self.net.member,
            tell_replicas=tell,
            forward=forward,
        )
        self.borrower = Borrower(
            self.engine,
            self.book,
            self.reports,
            self.net,
            lend=self._lend,
            decode=decode,
            active=lambda: True,
            trusted=True,
            enabled=True,
        )
        self.lend_from: Lender | None = None

    async def _lend(self, to: PeerRef, want: int, have: int | None, hosts: int) -> Loan:
        assert self.lend_from is not None
        reply = await self.lend_from.serve_lend(self.net.me, LendArgs(want, have or 0, hosts))
        return loan_of(reply)

    async def _give_back(self, to: PeerRef, reports: Sequence[GiveBack]) -> list[tuple[bool, bool]]:
        if self.fail_reports:
            raise PeerTimeout(to, to.addr, "give_back")
        assert self.lend_from is not None
        first, *more = reports
        args = GiveBackArgs(first.lease, first.done, first.back, first.final, list(more))
        reply = await self.lend_from.serve_return(self.net.me, args)
        return answers_of(reply, len(reports))

    async def queue(self, host: str, pages: int) -> list[Task]:
        tasks = tasks_of(host, pages)
        await self.ledger.accept(tasks)
        for t in tasks:
            self.engine.frontier.push(urls.host_of(t.url), t)
        return tasks

    async def aclose(self) -> None:
        await self.borrower.aclose()
        await self.reports.aclose()
        await self.engine.aclose()
        await self.ledger.aclose()


@pytest.fixture
async def loan(tmp_path: Path) -> AsyncIterator[tuple[Side, Side, Borrowed]]:
    """An owner with two hosts queued, and a borrower that asked it for a loan."""
    owner = Side(await Ledger.open(tmp_path / "owner"), OWNER, BORROWER)
    other = Side(await Ledger.open(tmp_path / "borrower"), BORROWER, OWNER)
    other.lend_from = owner.lender
    try:
        await owner.queue(SMALL, 10)
        await owner.queue(BIG, 20)
        assert other.borrower.hungry()
        await other.borrower.borrow()
        (held,) = other.book.loans.values()
        yield owner, other, held
    finally:
        await other.aclose()
        await owner.aclose()


def report_now(side: Side) -> None:
    """What the lending loop does when reports fall due."""
    side.reports.report_due(time.monotonic() + 60)


def borrowed_here(side: Side) -> list[Task]:
    hq = side.engine.frontier.hosts.get(urls.host_of(f"http://{SMALL}/"))
    return [t for _, t in hq.tasks] if hq is not None else []


def fetch(side: Side, held: Borrowed, pages: int) -> list[Task]:
    """``pages`` of the loan taken by our fetchers (as ``Frontier.slot`` would)."""
    fetched = borrowed_here(side)[:pages]
    side.engine.frontier.take_tasks(held.host, lambda t: t in fetched)
    return fetched


async def test_a_loan_goes_to_a_member_and_its_pages_are_recorded_done_at_their_owner(
    loan: tuple[Side, Side, Borrowed],
) -> None:
    owner, other, held = loan
    # The host that narrows the gap most without turning it round: the small one, as much
    # of it as the borrower asked for (four fetchers' worth); the rest waits at its owner.
    on_loan = borrowed_here(other)
    assert held.key == key_for(SMALL) and len(on_loan) == 8
    assert all(t.lease == held.lease for t in on_loan) and other.book.borrowed == 8
    assert set(owner.book.lent) == {t.fp for t in on_loan}
    assert owner.ledger.queued == 30  # still queued at its owner until reported
    # A stranger is lent nothing, though the owner has a backlog to lend from.
    refused = await owner.lender.serve_lend(peer(STRANGER), LendArgs(8, 0, 1))
    assert refused.lease == 0 and refused.backlog == 22
    # Four pages fetched here: their tails wait for the owner's word.
    fetched = fetch(other, held, 4)
    word = other.book.settle_now(fetched, finished=True)
    assert word is not None and not word.done()
    report_now(other)
    await asyncio.wait_for(word, 5)
    assert await owner.ledger.is_done(fetched) == [True] * 4
    assert owner.ledger.queued == 26 and len(owner.book.lent) == 4
    # The rest goes back unfetched (the borrower is leaving): the owner crawls it.
    other.reports.give_back_unstarted()
    report_now(other)
    await eventually(lambda: not owner.lender.leases and not other.book.loans)
    assert not owner.book.lent and other.book.borrowed == 0
    back = owner.engine.frontier.hosts[held.host]
    assert len(back) == 6 and not back.polite.busy  # fetched by the owner again


async def test_a_revoked_loan_sends_the_pages_finished_on_it_to_the_keys_new_owner(
    loan: tuple[Side, Side, Borrowed],
) -> None:
    owner, other, held = loan
    fetched = fetch(other, held, 2)
    owner.lender.revoke_keys({held.key})  # the key moved to a joiner
    word = other.book.settle_now(fetched, finished=True)
    report_now(other)
    assert word is not None
    await asyncio.wait_for(word, 5)
    await eventually(lambda: bool(other.forwarded))
    assert other.forwarded == [(held.key, [t.fp for t in fetched])]
    assert not other.book.loans and borrowed_here(other) == []  # the rest is dropped


async def test_a_borrower_whose_lender_is_silent_parks_the_loan_and_tells_its_replicas(
    loan: tuple[Side, Side, Borrowed],
) -> None:
    _, other, held = loan
    fetched = fetch(other, held, 3)
    other.fail_reports = True
    other.book.settle_now(fetched, finished=True)
    report_now(other)
    await eventually(lambda: bool(other.told))
    # Nothing more of it is fetched while the lender may be dead, and its replicas know
    # which pages were finished here before its successor could crawl them again.
    assert borrowed_here(other) == [] and len(held.parked) == 5
    assert other.told == [(OWNER, held.key, [t.fp for t in fetched])]
    # It answers again: the parked pages are fetched after all.
    other.fail_reports = False
    report_now(other)
    await eventually(lambda: len(borrowed_here(other)) == 5)


def test_a_polite_hosts_loan_runs_as_far_ahead_of_its_lenders_word_as_its_gap_allows() -> None:
    """A loan's pages wait for the lender's word every few pages. Four pages a round trip
    of that word held a host with a 50 ms Crawl-delay to 10 pages a second on loan, against
    18 at its owner: such a host may have as many pages waiting as its gap lets it fetch in
    half a second (capped), and a host fetched without a gap keeps MAX_UNSETTLED."""
    book = LoanBook(orphaned=lambda key, fps: None)
    key = key_for(SMALL)

    def under_way(n: int, lease: int = 7) -> dict[int, Task]:
        return {i: Task(f"http://{SMALL}/{i}", i, key, 1, lease=lease) for i in range(n)}

    task = under_way(1)[0]  # the task asking is among those under way
    for gap, limit in ((0.0, MAX_UNSETTLED), (0.05, 10), (0.01, POLITE_UNSETTLED), (1.0, 4)):
        assert book.may_fetch(task, under_way(limit), gap), gap
        assert not book.may_fetch(task, under_way(limit + 1), gap), gap
    # Another loan's pages under way do not count against this one.
    assert book.may_fetch(task, {**under_way(1), **under_way(30, lease=8)}, 0.0)


@pytest.fixture
async def full_speed(tmp_path: Path) -> AsyncIterator[tuple[Side, Side]]:
    """An owner crawling at full speed (no politeness gap, 5 ms answers) with two hosts
    queued, and a peer whose fetchers idle."""
    owner = Side(await Ledger.open(tmp_path / "owner"), OWNER, BORROWER, delay=0.0)
    other = Side(await Ledger.open(tmp_path / "borrower"), BORROWER, OWNER)
    other.lend_from = owner.lender
    try:
        await owner.queue(SMALL, 10)
        await owner.queue(BIG, 20)
        for hq in owner.engine.frontier.hosts.values():
            hq.polite.last_response_time = 0.005  # as after a fetch
        yield owner, other
    finally:
        await other.aclose()
        await owner.aclose()


async def test_a_host_that_goes_faster_at_its_owner_is_lent_only_while_it_would_wait_there(
    full_speed: tuple[Side, Side],
) -> None:
    """A loan goes a few pages per report round trip: lent while its owner's fetchers are
    free, a host fetched at hundreds of pages a second went at a dozen."""
    owner, _ = full_speed
    refused = await owner.lender.serve_lend(peer(BORROWER), LendArgs(8, 0, 1))
    assert refused.lease == 0 and refused.backlog == 30 and not owner.lender.leases
    # Every fetcher of the owner busy: its ready hosts wait, and a loan gains time.
    owner.engine.in_flight.update({t.fp: t for t in tasks_of("busy.test", 2)})
    lent = await owner.lender.serve_lend(peer(BORROWER), LendArgs(8, 0, 1))
    assert lent.lease != 0 and len(owner.lender.leases) == 1


async def test_a_lease_whose_host_outgrew_it_at_its_owner_is_recalled(
    full_speed: tuple[Side, Side],
) -> None:
    owner, other = full_speed
    owner.engine.in_flight.update({t.fp: t for t in tasks_of("busy.test", 2)})
    await other.borrower.borrow()
    (held,) = other.book.loans.values()
    (lease,) = owner.lender.leases.values()
    lent = len(lease.tasks)
    owner.engine.in_flight.clear()
    # Links to the lent host arrive at its owner: while fewer wait there than the loan
    # holds, the lease runs on.
    host = held.host
    waiting = len(owner.engine.frontier.hosts[host])
    more = tasks_of(host, range(100, 100 + lent - waiting))
    await owner.ledger.accept(more)
    for t in more:
        owner.engine.frontier.push(host, t)
    owner.lender.recall_outgrown()
    assert not lease.recalled
    # One more, and the owner would fetch more of the host than the borrower still has:
    # the borrower hears it at its next report, gives back what it has not started, and
    # the host is the owner's to fetch again.
    fetched = fetch(other, held, 2)
    late = tasks_of(host, [999])
    await owner.ledger.accept(late)
    owner.engine.frontier.push(host, late[0])
    owner.lender.recall_outgrown()
    assert lease.recalled and owner.lender.outgrown == 1
    word = other.book.settle_now(fetched, finished=True)
    report_now(other)
    assert word is not None
    await asyncio.wait_for(word, 5)
    assert held.back  # what it had not started, to go back with its next report
    report_now(other)
    await eventually(lambda: not owner.lender.leases and not other.book.loans)
    assert await owner.ledger.is_done(fetched) == [True, True]
    back = owner.engine.frontier.hosts[host]
    assert not back.polite.busy and len(back) == 2 * lent - 2 + 1


async def test_a_hosts_measured_pace_at_its_owner_decides_whether_it_is_lent(
    full_speed: tuple[Side, Side],
) -> None:
    """Measured, a host's pace at home includes its waits for a fetcher: one that goes
    slower than a loan would is lent though a fetcher is free at this moment, and one that
    goes faster is kept."""
    owner, _ = full_speed
    for hq in owner.engine.frontier.hosts.values():
        hq.pace = 0.02  # 50 pages a second here
    refused = await owner.lender.serve_lend(peer(BORROWER), LendArgs(8, 0, 1))
    assert refused.lease == 0 and not owner.lender.leases
    for hq in owner.engine.frontier.hosts.values():
        hq.pace = 0.5  # two pages a second here: each waited for a fetcher
    lent = await owner.lender.serve_lend(peer(BORROWER), LendArgs(8, 0, 1))
    assert lent.lease != 0 and len(owner.lender.leases) == 1


async def test_a_polite_host_slowed_at_its_owner_is_lent_to_go_at_its_gap(
    full_speed: tuple[Side, Side],
) -> None:
    """A host with a 50 ms Crawl-delay goes at about its gap on loan too (its loan may run
    further ahead of the owner's word): kept while it goes near that gap at its owner, lent
    once it goes at 11 pages a second there (an owner busy with its big host), though that
    is faster than a loan of a host fetched without a gap."""
    owner, _ = full_speed
    for hq in owner.engine.frontier.hosts.values():
        hq.polite.robots_delay = 0.05
        hq.pace = 0.055  # 18 pages a second here
    refused = await owner.lender.serve_lend(peer(BORROWER), LendArgs(8, 0, 1))
    assert refused.lease == 0 and not owner.lender.leases
    for hq in owner.engine.frontier.hosts.values():
        hq.pace = 0.09
    lent = await owner.lender.serve_lend(peer(BORROWER), LendArgs(8, 0, 1))
    assert lent.lease != 0 and len(owner.lender.leases) == 1
