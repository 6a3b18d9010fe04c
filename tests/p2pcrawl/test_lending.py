"""Lending: an idle peer crawls a busy owner's hosts on loan, and a dead borrower loses nothing.

Two in-process peers on loopback crawl a real test web. Their IDs are chosen so that one of
them owns every host of the web: without lending the other would sit idle for the whole crawl.
The web's own request counts say what was fetched, and how often.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from p2pcrawl.crawl import HostQueue, Task, urls
from p2pcrawl.crawl.engine import TAILS_PER_FETCH
from p2pcrawl.network import Peer, PeerConfig, save_identity
from p2pcrawl.network.loanbook import unsettled_limit
from p2pcrawl.settings import CrawlSettings, PeerSettings
from p2pcrawl.signalsettings import SignalSettings
from p2pcrawl.testing import TestWeb
from protocol import key_for
from tests.conftest import TEST_MIN_PEER_AGE, TEST_SECRET, WebFactory, crawl_settings_for
from tests.protocol.conftest import eventually

pytestmark = pytest.mark.timeout(90)

# Keyed: lending is off in an open network (docs/security.md), and these IDs are chosen.
DETECT = PeerSettings(
    rpc_timeout=0.3,
    ping_interval=0.3,
    suspicion_timeout=1.0,
    min_peer_age=TEST_MIN_PEER_AGE,
    partition_hold=1.0,  # a killed peer holds the finish back this long, not the merge bound
    secret=TEST_SECRET,
)


# Each peer's --delay here: a loan may run as far ahead of its lender's word as this gap lets
# its host go in ``loanbook.UNSETTLED_S`` (``unsettled_limit``).
DELAY = 0.03


def ids_where_one_owns_all(keys: list[bytes]) -> tuple[bytes, bytes]:
    """(owner, other): two IDs that differ first at a bit where every key agrees with the
    owner's, so the owner is XOR-closer to every one of ``keys``."""
    bits = 8 * len(keys[0])
    ints = [int.from_bytes(k, "big") for k in keys]
    for i in range(bits - 1, -1, -1):
        values = {k >> i & 1 for k in ints}
        if len(values) == 1:
            owner = int.from_bytes(os.urandom(len(keys[0])), "big")
            owner = owner & ~(1 << i) | (values.pop() << i)
            return owner.to_bytes(len(keys[0]), "big"), (owner ^ (1 << i)).to_bytes(
                len(keys[0]), "big"
            )
    raise AssertionError("no bit on which all keys agree: use fewer hosts")


def ids_where_other_owns(keys: list[bytes], n: int) -> tuple[bytes, bytes]:
    """(owner, other): two IDs between which ``other`` owns exactly ``n`` of ``keys``.

    Two IDs that first differ at bit ``i`` split every key by that bit alone (XOR-closer is
    whichever matches it there), so a bit at which exactly ``n`` keys agree is looked for
    over all of them; two random IDs try only the top few bits (failed 1 run in ~25)."""
    size = len(keys[0])
    ints = [int.from_bytes(k, "big") for k in keys]
    for i in range(8 * size - 1, -1, -1):
        ones = sum(k >> i & 1 for k in ints)
        for value, count in ((1, ones), (0, len(keys) - ones)):
            if count == n:
                other = int.from_bytes(os.urandom(size), "big") & ~(1 << i) | (value << i)
                return (other ^ (1 << i)).to_bytes(size, "big"), other.to_bytes(size, "big")
    raise AssertionError(f"no bit splits the keys {len(keys) - n} : {n}")


def three_ranked_ids(keys: list[bytes]) -> tuple[bytes, bytes, bytes]:
    """Three IDs, XOR-closest to every one of ``keys`` in this order: the first two agree
    with every key on a bit where the keys all agree and the third does not; the first also
    on a lower such bit, where the second does not."""
    n = len(keys[0])
    ints = [int.from_bytes(k, "big") for k in keys]
    agree = [i for i in range(8 * n - 1, -1, -1) if len({k >> i & 1 for k in ints}) == 1]
    assert len(agree) >= 2, "fewer than two bits on which all keys agree: use fewer hosts"
    hi, lo = agree[0], agree[1]
    v_hi, v_lo = ints[0] >> hi & 1, ints[0] >> lo & 1
    base = int.from_bytes(os.urandom(n), "big") & ~(1 << hi) & ~(1 << lo)
    first = base | v_hi << hi | v_lo << lo
    second = first ^ (1 << lo)
    third = first ^ (1 << hi)
    return first.to_bytes(n, "big"), second.to_bytes(n, "big"), third.to_bytes(n, "big")


def host_keys(web: TestWeb) -> list[bytes]:
    return sorted({key_for(urls.host_of(u)) for u in web.ground_truth()})


def limited(settings: CrawlSettings, max_pages: int) -> CrawlSettings:
    return replace(settings, scope=replace(settings.scope, max_pages=max_pages))


async def start_peer(
    tmp_path: Path,
    name: str,
    node_id: bytes,
    web: TestWeb,
    *,
    concurrency: int,
    settings: PeerSettings = DETECT,
    bootstrap: tuple[tuple[str, int], ...] = (),
    max_pages: int = 0,
    delay: float = DELAY,
    sitemaps: bool = True,
) -> Peer:
    data = tmp_path / name
    if not data.exists():  # else a restart on the same data directory
        data.mkdir()
        save_identity(data, node_id)
    peer = Peer(
        PeerConfig(
            data_dir=data,
            bootstrap=bootstrap,
            crawl=limited(
                crawl_settings_for(
                    web,
                    delay=delay,
                    concurrency=concurrency,
                    signals=SignalSettings(sitemaps=sitemaps),
                ),
                max_pages,
            ),
            peer=settings,
        )
    )
    await peer.start()
    return peer


async def owner_and_other(make_web: WebFactory, tmp_path: Path) -> tuple[TestWeb, Peer, Peer]:
    """A web of four hosts, a peer that owns all of them, and one that owns none."""
    web = await make_web(hosts=4, pages_per_host=60, features=False)
    owner_id, other_id = ids_where_one_owns_all(host_keys(web))
    owner = await start_peer(tmp_path, "owner", owner_id, web, concurrency=2)
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=4, bootstrap=(owner.me.addr,)
    )
    return web, owner, other


async def owner_successor_other(
    make_web: WebFactory, tmp_path: Path, settings: PeerSettings = DETECT
) -> tuple[TestWeb, Peer, Peer, Peer]:
    """Three peers ranked alike for every host of a four-host web: the owner, the one next
    to it (it takes the keys over, and holds the replicas; it does not borrow, so the
    loans go to the third), and one that owns nothing."""
    web = await make_web(hosts=4, pages_per_host=60, features=False)
    owner_id, successor_id, other_id = three_ranked_ids(host_keys(web))
    owner = await start_peer(tmp_path, "owner", owner_id, web, concurrency=2, settings=settings)
    boot = (owner.me.addr,)
    successor = await start_peer(
        tmp_path,
        "successor",
        successor_id,
        web,
        concurrency=2,
        settings=replace(settings, lend=False),
        bootstrap=boot,
    )
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=4, settings=settings, bootstrap=boot
    )
    return web, owner, successor, other


async def all_finished(*peers: Peer) -> None:
    await asyncio.wait_for(asyncio.gather(*(p.parts.quiescence.finished.wait() for p in peers)), 60)


def fetched_once(web: TestWeb) -> tuple[set[str], dict[str, int]]:
    truth = web.ground_truth()
    again = {u: n for u, n in web.request_counts.items() if n > 1}
    return truth - set(web.request_counts), again


async def test_an_idle_peer_crawls_a_busy_owners_hosts_on_loan(
    make_web: WebFactory, tmp_path: Path
) -> None:
    web, owner, other = await owner_and_other(make_web, tmp_path)
    try:
        assert owner.engine is not None and other.engine is not None
        assert owner.ledger is not None and other.ledger is not None
        await owner.seed([web.hub_url])
        await all_finished(owner, other)
        missing, again = fetched_once(web)
        assert not missing and not again
        truth = web.ground_truth()
        # The other peer owns nothing, yet fetched part of the crawl, on loan ...
        assert other.ledger.done_count == 0
        assert other.engine.stats.pages_fetched > 0
        assert other.parts.borrower.borrowed_total > 0 and owner.parts.lender.lent_total > 0
        # Borrowed tasks are never lent on: the owner never got its own hosts back on loan.
        assert other.parts.lender.lent_total == 0 and owner.parts.borrower.borrowed_total == 0
        # Each loan carried the owner's robots.txt policy: every site saw one request for it.
        assert other.parts.borrower.robots_adopted > 0
        assert web.robots_counts and set(web.robots_counts.values()) == {1}
        # ... and the owner recorded every URL done, its own fetches and the borrowed ones.
        assert owner.ledger.done_count == len(truth)
        assert owner.engine.stats.pages_fetched + other.engine.stats.pages_fetched == len(truth)
        assert owner.ledger.queued == 0 and not owner.parts.loans.lent
        assert not owner.parts.lender.leases
        assert not other.parts.loans.loans and other.parts.loans.borrowed == 0
        # The replica copies of the borrowed tasks were dropped too: nothing is left over.
        await other.refresh_counts()
        assert other.status()["backups_held"] == 0
    finally:
        await other.aclose()
        await owner.aclose()


async def test_a_peer_whose_own_health_is_in_doubt_borrows_nothing(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """A flooded peer (its failure detector's local health score raised, as a flood's junk
    raises it each round) asks for no loan while the owner is busy, and borrows again once
    its health has recovered."""
    web, owner, other = await owner_and_other(make_web, tmp_path)
    try:
        assert other.node is not None and owner.engine is not None
        health = other.node.rpc.liveness.health
        for _ in range(health.cap):
            health.worse("junk")
        assert other.node.strained()
        await owner.seed([web.hub_url])
        await eventually(lambda: owner.engine is not None and owner.engine.tasks_queued > 20)
        await asyncio.sleep(0.3)  # a few of the lending loop's turns
        assert other.parts.borrower.borrowed_total == 0
        assert not other.parts.borrower.hungry()
        health.score = 0  # clean rounds take it down one a second
        assert other.parts.borrower.hungry()
        await all_finished(owner, other)
        assert other.parts.borrower.borrowed_total > 0
        missing, again = fetched_once(web)
        assert not missing and not again
    finally:
        await other.aclose()
        await owner.aclose()


async def test_a_borrower_that_does_not_trust_the_network_fetches_robots_itself(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """Outside a keyed (or loopback) network a lender's robots.txt policy is a stranger's
    word, which could lift a site's Disallow rules: the borrower fetches the file itself."""
    web, owner, other = await owner_and_other(make_web, tmp_path)
    try:
        other.parts.borrower.trusted = False
        await owner.seed([web.hub_url])
        await all_finished(owner, other)
        assert not any(fetched_once(web))
        borrower = other.parts.borrower
        assert borrower.borrowed_total > 0 and borrower.robots_adopted == 0
        assert owner.parts.lender.robots_lent > 0  # it was offered, and not taken
        assert max(web.robots_counts.values()) == 2  # the owner's fetch, and the borrower's
    finally:
        await other.aclose()
        await owner.aclose()


async def test_a_peer_far_behind_borrows_before_its_fetchers_idle(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """Both peers own hosts, one three times as many: the other is never idle until its own
    hosts are done, yet it asks for the owner's hosts while the gap is wide (LEND with its
    own backlog), and the owner lends only hosts whose move narrows the gap."""
    web = await make_web(hosts=8, pages_per_host=80, features=False)
    keys = host_keys(web)
    owner_id, other_id = ids_where_other_owns(keys, 2)
    owner = await start_peer(tmp_path, "owner", owner_id, web, concurrency=2)
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=2, bootstrap=(owner.me.addr,)
    )
    borrower = other.parts.borrower
    try:
        assert owner.engine is not None and other.engine is not None
        assert owner.ledger is not None and other.ledger is not None
        # Every host's root at once: the other peer has its own two hosts to crawl from the
        # start, so its fetchers have work (it is not ``hungry``) until they are done.
        roots = sorted({urls.host_of(u) + "/" for u in web.ground_truth()})
        await other.seed([web.hub_url, *roots])
        # Borrowed while its own hosts were still being crawled, not because it ran dry.
        own_done = -1
        async with asyncio.timeout(30):
            while own_done < 0:
                if borrower.borrowed_behind > 0:
                    own_done = other.ledger.done_count
                await asyncio.sleep(0.01)
        assert own_done < 2 * 80
        await all_finished(owner, other)
        missing, again = fetched_once(web)
        assert not missing and not again
        assert owner.ledger.done_count + other.ledger.done_count == len(web.ground_truth())
        assert other.ledger.done_count == 2 * 80  # its own two hosts, all recorded by it
        lending = other.status()["lending"]
        assert isinstance(lending, dict) and lending["borrowed_behind"] == borrower.borrowed_behind
    finally:
        await other.aclose()
        await owner.aclose()


async def test_an_idle_peer_borrows_hosts_of_a_few_pages(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """Hosts of three pages: too small to lend to a peer with work of its own, but the
    end of a crawl is mostly such hosts, and an idle peer takes them, several in one LEND
    answer (one RPC for several loans), and still loses and repeats nothing."""
    web = await make_web(hosts=6, pages_per_host=3, features=False)
    owner_id, other_id = ids_where_one_owns_all(host_keys(web))
    owner = await start_peer(
        tmp_path, "owner", owner_id, web, concurrency=1, delay=1.0, sitemaps=False
    )
    assert owner.ledger is not None
    await owner.seed([web.hub_url])
    # The idle peer arrives once every host has pages queued (the hub and each host's first
    # page fetched): arriving earlier, it may take each host as it appears, one an answer.
    await eventually(lambda: owner.ledger is not None and owner.ledger.done_count >= 7, 30)
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=8, bootstrap=(owner.me.addr,)
    )
    try:
        await all_finished(owner, other)
        missing, again = fetched_once(web)
        assert not missing and not again
        assert owner.ledger.done_count == len(web.ground_truth())
        lender, borrower = owner.parts.lender, other.parts.borrower
        assert 2 <= borrower.borrowed_total < len(web.ground_truth())
        assert lender.lent_total == borrower.borrowed_total
        assert lender.leases_made > lender.lends_answered == borrower.loans_taken
    finally:
        await other.aclose()
        await owner.aclose()


async def test_an_idle_peer_holds_a_loan_for_each_of_its_fetchers(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """A loan is one host, and at a crawl's end a busy owner's queue is mostly hosts of a
    page or two: an idle peer takes as many loans at once as it has fetchers (it was held to
    a quarter of them, two here), and still loses and repeats nothing."""
    web = await make_web(hosts=5, pages_per_host=20, features=False)
    owner_id, other_id = ids_where_one_owns_all(host_keys(web))
    owner = await start_peer(tmp_path, "owner", owner_id, web, concurrency=1, delay=0.5)
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=8, delay=0.5, bootstrap=(owner.me.addr,)
    )
    loans = other.parts.loans.loans
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, len(loans))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        assert owner.ledger is not None
        await owner.seed([web.hub_url])
        await all_finished(owner, other)
        missing, again = fetched_once(web)
        assert not missing and not again
        assert owner.ledger.done_count == len(web.ground_truth())
        assert most >= 3
        assert owner.parts.lender.lent_total == other.parts.borrower.borrowed_total > 0
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await other.aclose()
        await owner.aclose()


async def test_the_leading_host_stays_with_its_owner(make_web: WebFactory, tmp_path: Path) -> None:
    """The leader (the explored host with most found) goes first at its owner, whose link
    it then has nearly to itself; on loan it shares the borrower's and waits on its owner's
    word every few pages, so it is slower there. The owner lends its other hosts instead."""
    web = await make_web(hosts=4, pages_per_host=60, features=False)
    owner_id, other_id = ids_where_one_owns_all(host_keys(web))
    owner = await start_peer(tmp_path, "owner", owner_id, web, concurrency=2)
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=4, bootstrap=(owner.me.addr,)
    )
    assert owner.engine is not None and owner.ledger is not None
    frontier = owner.engine.frontier
    lent: list[tuple[str, bool]] = []  # (host, was it leading) for each host lent
    lend_host = frontier.lend_host

    def spy(hq: HostQueue) -> list[Task]:
        lent.append((hq.host, hq is frontier.leader))
        return lend_host(hq)

    frontier.lend_host = spy  # type: ignore[method-assign]
    try:
        await owner.seed([web.hub_url])
        await all_finished(owner, other)
        missing, again = fetched_once(web)
        assert not missing and not again
        assert owner.ledger.done_count == len(web.ground_truth())
        assert lent and not any(leading for _, leading in lent)
    finally:
        await other.aclose()
        await owner.aclose()


async def test_a_borrower_that_dies_loses_no_task(make_web: WebFactory, tmp_path: Path) -> None:
    web, owner, other = await owner_and_other(make_web, tmp_path)
    closed = False
    try:
        assert owner.engine is not None and owner.ledger is not None
        await owner.seed([web.hub_url])
        await eventually(lambda: bool(other.parts.loans.loans), timeout=30)
        # Dies with a loan in hand: no goodbye, no report.
        await other.aclose()
        closed = True
        await eventually(lambda: not owner.parts.lender.leases, timeout=20)
        assert owner.parts.lender.lapsed >= 1
        await asyncio.wait_for(owner.parts.quiescence.finished.wait(), 60)
        missing, again = fetched_once(web)
        assert not missing
        truth = web.ground_truth()
        assert owner.ledger.done_count == len(truth) and owner.ledger.queued == 0
        # What the borrower fetched after its last report, and its fetches under way, may be
        # fetched again: a few pages, never a whole lease.
        assert sum(n - 1 for n in again.values()) <= 4 + 4
    finally:
        if not closed:
            await other.aclose()
        await owner.aclose()


async def test_pages_finished_on_a_lapsed_lease_count_as_done_at_their_owner(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """A lease can lapse while its borrower lives (a report late under load). The borrower's
    next report hears "unknown lease" and sends what it finished to the owner as done
    history: those pages are done at the owner, and its status counts them, as it counts the
    pages a borrower reports in time (the network view sums every peer's "done")."""
    web, owner, other = await owner_and_other(make_web, tmp_path)
    loans = other.parts.loans.loans
    try:
        assert owner.ledger is not None
        await owner.seed([web.hub_url])
        # Finished on loan, not yet reported: then the owner gives up on the lease.
        await eventually(lambda: any(b.done for b in loans.values()), timeout=30)
        owner.parts.lender.lapse_expired(float("inf"))
        assert owner.parts.lender.lapsed >= 1
        await all_finished(owner, other)
        missing, _ = fetched_once(web)
        assert not missing
        assert owner.ledger.queued == 0
        assert owner.ledger.done_count == len(web.ground_truth())
        assert owner.status()["done"] == len(web.ground_truth())
    finally:
        await other.aclose()
        await owner.aclose()


async def test_pages_finished_on_a_loan_that_ended_unreported_are_done_at_the_borrower(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """A loan can end before its borrower reports what it finished: the key handed on, or
    the lease lapsed. The borrower sends those pages to the key's owner as done history and
    keeps them in its own done record too: the key's new owner got them queued with the key
    and may lend them straight back before that history reaches it, and the borrower then
    reports them done instead of fetching them a second time (a join test once saw four
    pages fetched twice by one borrower, a second apart)."""
    # 120 pages a host: at 60 the owner crawled the web alone in about 2 s in 1 run of 6,
    # its borrower's LENDs (at 0, 1 and 1.5 s, the first before the seed) finding no host
    # to lend, and the test timed out waiting for a loan. At 120 it timed out once more, in
    # a CI run (2 cores shared with the other tests; 14 runs alone and beside two busy loops
    # passed): the slow host's 30 ms a page keeps the owner busy at least 3.6 s, so a LEND
    # finds a host to lend whatever the machine's load.
    web = await make_web(hosts=4, pages_per_host=120, features=False, slow_host_delay=0.03)
    owner_id, other_id = ids_where_one_owns_all(host_keys(web))
    alone = replace(DETECT, replicas=0)  # the borrower hears of no page as a replica
    owner = await start_peer(tmp_path, "owner", owner_id, web, concurrency=2, settings=alone)
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=4, settings=alone, bootstrap=(owner.me.addr,)
    )
    loans = other.parts.loans.loans
    try:
        assert other.ledger is not None and owner.ledger is not None
        await owner.seed([web.hub_url])
        finished: list[tuple[bytes, int]] = []
        async with asyncio.timeout(30):
            while not finished:
                await asyncio.sleep(0.001)
                for b in loans.values():
                    if b.done and (b.report_task is None or b.report_task.done()):
                        finished = [(b.key, fp) for fp in b.done]  # not reported yet
                        break
        # The owner gives up on every lease at once, with nothing awaited in between: the
        # borrower's next report hears "unknown lease".
        owner.parts.lender.lapse_expired(float("inf"))
        done = other.ledger.done
        await eventually(lambda: all(done.maybe_contains(fp) for _, fp in finished), timeout=10)
        assert all(await done.contains(finished))
        await all_finished(owner, other)
        missing, _ = fetched_once(web)
        assert not missing
        assert owner.ledger.done_count == len(web.ground_truth())
    finally:
        await other.aclose()
        await owner.aclose()


async def test_a_lender_restarted_on_a_new_port_ends_the_loan(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """The lender dies and comes back at once with its data directory: same ID, a new port,
    so nobody declares it dead. The borrower's next report reaches it there (not the old
    port, where nothing answers), hears "unknown lease" and drops the loan, and the crawl
    finishes: the restarted owner crawls what its store still holds."""
    web, owner, other = await owner_and_other(make_web, tmp_path)
    restarted: Peer | None = None
    loans = other.parts.loans.loans
    loans_at_crash = 0
    try:
        try:
            await owner.seed([web.hub_url])
            await eventually(lambda: any(len(b.held) >= 4 for b in loans.values()), timeout=30)
        finally:
            exposed = set(loans)
            await owner.aclose()  # no goodbye: a crash, and a restart right after
            # The owner answers LEND until its socket closes: a loan taken while it shut
            # down is exposed to the crash as much as one held before.
            exposed |= set(loans)
            loans_at_crash = len(exposed)
        restarted = await start_peer(
            tmp_path, "owner", owner.node_id, web, concurrency=2, bootstrap=(other.me.addr,)
        )
        assert restarted.me.addr != owner.me.addr
        await all_finished(restarted, other)
        missing, again = fetched_once(web)
        assert not missing
        assert not loans and other.engine is not None and other.parts.loans.borrowed == 0
        # What was under way when the owner died, and each loan's pages not yet recorded,
        # may be fetched twice; no more. Under way at the owner (concurrency 2): its
        # fetches, and its pages in their tails, whose finish waits for their links and
        # their replicas (up to TAILS_PER_FETCH per fetch slot). Counting the fetches
        # alone, the bound failed about 1 run in 7 to 10 (7 duplicates against 6). Not yet
        # recorded: up to ``unsettled_limit`` pages a loan.
        under_way = (1 + TAILS_PER_FETCH) * 2
        unsettled = unsettled_limit(DELAY) * loans_at_crash
        assert loans_at_crash >= 1
        assert sum(n - 1 for n in again.values()) <= under_way + unsettled
    finally:
        await other.aclose()
        if restarted is not None:
            await restarted.aclose()


async def test_a_lender_that_leaves_gracefully_costs_no_duplicate(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """The owner of every host leaves while its pages are out on loan; a third peer takes its
    keys over. The borrower's pages under way route their links to the leaving owner, which
    stores them until its leases are settled (a refusal would hold those pages until its
    goodbye, its wait for the lease would time out, and the new owner would fetch them
    again); then it hands everything off."""
    web, owner, successor, other = await owner_successor_other(make_web, tmp_path)
    try:
        try:
            await owner.seed([web.hub_url])
            loans = other.parts.loans.loans
            await eventually(lambda: any(len(b.held) >= 4 for b in loans.values()), timeout=30)
            report = await owner.leave()
            assert report.failed == 0 and not owner.parts.lender.leases
        finally:
            await owner.aclose()
        await all_finished(successor, other)
        missing, again = fetched_once(web)
        assert not missing and not again
    finally:
        await other.aclose()
        await successor.aclose()


async def test_handing_on_a_lent_keys_history_keeps_the_loan(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """A replica records its neighbours' finished pages under their keys, and a REFRESH_TASK
    answer hands such a done-only key on like an owned one (``Engine.exclude_keys``). The
    tasks it holds on loan for that key are its lender's: they stay queued and are fetched."""
    web, owner, other = await owner_and_other(make_web, tmp_path)
    try:
        engine = other.engine
        assert engine is not None and owner.ledger is not None
        await owner.seed([web.hub_url])

        def queued_on_loan() -> int:
            return sum(
                1
                for b in other.parts.loans.loans.values()
                for _, t in getattr(engine.frontier.hosts.get(b.host), "tasks", [])
                if t.lease == b.lease
            )

        await eventually(lambda: queued_on_loan() >= 2, timeout=30)
        keys = {b.key for b in other.parts.loans.loans.values()}
        assert engine.exclude_keys(keys) == []  # nothing of its own to hand over
        assert queued_on_loan() >= 2
        await all_finished(owner, other)
        missing, again = fetched_once(web)
        assert not missing and not again
        assert owner.ledger.done_count == len(web.ground_truth())
    finally:
        await other.aclose()
        await owner.aclose()


async def test_a_silent_lenders_replicas_learn_what_its_borrower_finished(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """The lender stops answering with a borrowed page finished and not yet recorded: the
    borrower's unanswered report tells the lender's replicas, so that if it is dead, its
    successor (one of them) does not fetch the page again from its copies."""
    # Reports time out fast, but nobody declares the silent lender dead during the test:
    # what its replicas learn, they learn from the borrower's unanswered report alone.
    patient = replace(DETECT, suspicion_timeout=60.0)
    web, owner, successor, other = await owner_successor_other(make_web, tmp_path, patient)
    # The selector loop's UDP transport is a ReadTransport too: it can stop reading.
    transport = owner.node.rpc.endpoint.transport if owner.node is not None else None
    assert isinstance(transport, asyncio.ReadTransport)
    try:
        assert other.engine is not None
        assert successor.ledger is not None and owner.ledger is not None
        await owner.seed([web.hub_url])
        frontier = other.engine.frontier

        def on_loan() -> list[Task]:
            return [
                t
                for b in other.parts.loans.loans.values()
                for _, t in getattr(frontier.hosts.get(b.host), "tasks", [])
                if t.lease == b.lease
            ]

        # Pages left to park: after the lender falls silent the loan may fetch up to
        # ``limit`` more (the borrower's --delay spaces its requests, so a loan may run
        # further ahead than MAX_UNSETTLED), one is settled by hand below, and some must
        # still be queued. A loan made while its host had two pages queued is fetched whole
        # before any report times out, and then nothing is left to see parked.
        limit = unsettled_limit(DELAY)
        await eventually(lambda: len(on_loan()) >= limit + 2, timeout=30)
        transport.pause_reading()  # the lender falls silent
        requested = Counter(web.request_counts)
        lent_hosts = {b.host for b in other.parts.loans.loans.values()}
        page = on_loan()[0]
        # Fetched and archived here, as far as the loan is concerned; its tail now waits
        # for the lender's word.
        assert frontier.take_tasks(urls.host_of(page.url), lambda t: t is page) == [page]
        waiting = other.parts.loans.settle_now([page], finished=True)
        assert waiting is not None and not waiting.done()
        loans = other.parts.loans.loans
        await eventually(lambda: any(b.parked for b in loans.values()), timeout=10)
        # Unanswered, each loan fetched at most ``limit`` pages more: what the lender's
        # successor would fetch again had it died (their tails wait on links to the lender).
        # Per loan, that is per lent host (the borrower may hold several loans at once).
        await asyncio.sleep(0.5)
        since = Counter(web.request_counts)
        since.subtract(requested)
        for host in lent_hosts:
            more = sum(n for url, n in since.items() if urls.host_of(url) == host)
            assert more <= limit, (host, more)
        for replica in (successor, other):
            assert replica.ledger is not None
            deadline = asyncio.get_running_loop().time() + 10
            while not (await replica.ledger.is_done([page]))[0]:
                assert asyncio.get_running_loop().time() < deadline, f"{replica} never heard"
                await asyncio.sleep(0.05)
        assert not (await owner.ledger.is_done([page]))[0]  # the lender never heard of it
        assert other.node is not None and owner.me in other.node.peers()  # nor was it dropped
    finally:
        transport.resume_reading()
        await other.aclose()
        await successor.aclose()
        await owner.aclose()


async def test_a_borrower_at_its_page_limit_gives_its_loan_back(
    make_web: WebFactory, tmp_path: Path
) -> None:
    """A borrower that may fetch no more (``--max-pages`` here; a full disk or a dead WARC
    writer alike) returns what it holds on loan and has not started: its owner crawls it."""
    web = await make_web(hosts=4, pages_per_host=60, features=False)
    owner_id, other_id = ids_where_one_owns_all(host_keys(web))
    owner = await start_peer(tmp_path, "owner", owner_id, web, concurrency=2)
    other = await start_peer(
        tmp_path, "other", other_id, web, concurrency=4, bootstrap=(owner.me.addr,), max_pages=6
    )
    try:
        assert owner.ledger is not None and other.engine is not None
        await owner.seed([web.hub_url])
        await asyncio.wait_for(owner.parts.quiescence.finished.wait(), 60)
        missing, again = fetched_once(web)
        assert not missing and not again
        assert owner.ledger.done_count == len(web.ground_truth())
        assert other.parts.borrower.borrowed_total > other.engine.stats.pages_fetched == 6
        assert not other.parts.loans.loans and not owner.parts.lender.leases
    finally:
        await other.aclose()
        await owner.aclose()
