"""Membership under churn and load, end to end: real peer processes on loopback.

Duplicates are counted from the test web's own request counts (server side), not from the
WARC files, and every test ends with every peer reporting ``state: "finished"`` -- never
while a backup of a dead owner is still unclaimed (``Cluster.wait_network_finished``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import TAILS_PER_FETCH
from p2pcrawl.network import read_contacts
from p2pcrawl.settings import PeerSettings
from p2pcrawl.testing import FAST_DETECTION, Cluster, PeerProc, TestWeb, TestWebConfig
from tests.conftest import TEST_SECRET
from tests.integration.conftest import CONCURRENCY, crawl_args, spawn_flood, start_mesh

pytestmark = pytest.mark.slow

FAST = list(FAST_DETECTION)
MAX_DUP_SHARE = 0.005  # the bound: duplicate fetches at most 0.5% of pages
# docs/membership.md, "Healing": two halves merge within heal_interval + heal_max_backoff
# (the defaults: neither is a flag) plus one join round trip -- a lookup of a few RPCs.
_HEAL = PeerSettings()
MERGE_BOUND_S = _HEAL.heal_interval + _HEAL.heal_max_backoff + 3 * 0.5 + 1.0


@pytest.fixture
async def churn_web() -> AsyncIterator[TestWeb]:
    async with TestWeb(
        TestWebConfig(hosts=12, pages_per_host=50, slow_host_delay=0.02, large_page_bytes=100_000)
    ) as w:
        yield w


def args(web: TestWeb, *extra: str) -> list[str]:
    return crawl_args(web, "--delay", "0.1", *FAST, *extra)


def server_duplicates(web: TestWeb) -> tuple[int, int]:
    """(duplicate fetches, pages): every ground-truth URL requested, counted by the server."""
    truth = web.ground_truth()
    counts = web.request_counts
    missing = truth - set(counts)
    assert not missing, f"never fetched: {sorted(missing)[:5]}"
    return sum(n - 1 for u, n in counts.items() if u in truth), len(truth)


async def fetched(cluster: Cluster) -> int:
    return sum(s["pages_fetched"] for s in await cluster.statuses())


async def wait_fetched(cluster: Cluster, n: int) -> None:
    await cluster.wait_until(lambda ss: sum(s["pages_fetched"] for s in ss) >= n, 90, f"{n} pages")


async def busiest(cluster: Cluster, peers: list[PeerProc]) -> PeerProc:
    st = {p.name: await cluster.api(p, "/api/status") for p in peers}
    return max(peers, key=lambda p: st[p.name]["tasks_queued"] + st[p.name]["tasks_in_flight"])


async def finish_and_count(cluster: Cluster, web: TestWeb, what: str) -> tuple[int, int]:
    final = await cluster.wait_network_finished(timeout=180)
    assert all(s["backups_orphaned"] == 0 for s in final)
    dups, pages = server_duplicates(web)
    # An open network (loopback, no key) fetches a few pages again to check its members'
    # claims that pages are done (docs/security.md): those are no duplicate of the crawl.
    # A peer killed on the way took its count with it; its few are left in ``dups``.
    refetched = sum(s["claims"]["refetches"] for s in final)
    print(f"{what}: {dups} second requests, {refetched} of them to check claims")
    dups = max(0, dups - refetched)
    print(f"{what}: {dups} duplicate fetches of {pages} pages ({100 * dups / pages:.2f}%)")
    if dups:  # who fetched what twice, for whoever reads a failure
        by_peer = {p.name: set(read_warc_urls(p.data / "warc")) for p in cluster.peers}
        twice = sorted(u for u, n in web.request_counts.items() if n > 1)
        for u in twice[:10]:
            print(" ", u, [name for name, got in by_peer.items() if u in got])
    return dups, pages


async def test_joins_then_the_busiest_peer_crashes(churn_web: TestWeb, make_cluster: Any) -> None:
    # Keyed, as the frozen-peer test below: in an open network a takeover's history names
    # only the pages its sender fetched itself (docs/security.md, "What a handoff names"),
    # so a joiner next to the victim that joined too late to be brought up to date as its
    # replica fetches the victim's finished pages again when their links come back (in CI,
    # 61 pages, first fetched by the victim and again by the joiner whose ID halved its
    # part of the key space, which had joined about when it was killed).
    cluster = await make_cluster(args(churn_web, "--secret", TEST_SECRET))
    peers = await start_mesh(cluster, 3)
    await cluster.api(peers[0], "/api/seed", "POST", {"urls": [churn_web.hub_url]})
    truth = len(churn_web.ground_truth())
    await wait_fetched(cluster, truth // 10)
    for i in range(3):
        peers.append(await cluster.start_peer(f"j{i}", bootstrap=peers[i]))
    await wait_fetched(cluster, truth // 3)
    victim = await busiest(cluster, peers[1:])
    cluster.kill(victim)
    await victim.proc.wait()
    dups, pages = await finish_and_count(cluster, churn_web, "joins then a crash")
    duplicates_within(dups, dup_bound(pages, 1), "joins then a crash")


async def test_a_frozen_peer_is_not_crawled_twice(churn_web: TestWeb, make_cluster: Any) -> None:
    # Keyed: in an open network the peers that took the frozen peer's hosts over hand it back
    # done ranges they were handed, which nobody can vouch for, and it fetches their pages
    # again when their links come back (docs/security.md, "still does not guarantee").
    cluster = await make_cluster(args(churn_web, "--secret", TEST_SECRET))
    peers = await start_mesh(cluster, 3)
    await cluster.api(peers[0], "/api/seed", "POST", {"urls": [churn_web.hub_url]})
    truth = len(churn_web.ground_truth())
    await wait_fetched(cluster, truth // 4)
    frozen = await busiest(cluster, peers[1:])
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(15)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    dups, pages = await finish_and_count(cluster, churn_web, "SIGSTOP 15 s")
    status = await cluster.api(frozen, "/api/status")
    events = await cluster.api(frozen, "/api/events")
    assert any(e.get("kind") == "stalled" for e in events["events"]), events
    assert status["state"] == "finished"
    duplicates_within(dups, dup_bound(pages, 1), "a frozen peer")


async def test_a_flood_at_one_peer_evicts_nobody(churn_web: TestWeb, make_cluster: Any) -> None:
    cluster = await make_cluster(args(churn_web))
    peers = await start_mesh(cluster, 3)
    await cluster.api(peers[0], "/api/seed", "POST", {"urls": [churn_web.hub_url]})
    truth = len(churn_web.ground_truth())
    await wait_fetched(cluster, truth // 4)
    target = peers[1]
    flood = await spawn_flood(target.listen, 10)
    try:
        out, _ = await asyncio.wait_for(flood.communicate(), 60)
    finally:
        if flood.returncode is None:
            flood.kill()
            await flood.wait()
    sent = int(out.decode().strip() or 0)
    dups, pages = await finish_and_count(cluster, churn_web, f"flood of {sent} datagrams")
    lost = []
    for p in peers:
        events = await cluster.api(p, "/api/events")
        lost += [e for e in events["events"] if e.get("kind") == "peer_lost"]
    rpc = (await cluster.api(target, "/api/peers")).get("rpc", {})
    print(f"flood: {sent} datagrams; target liveness {json.dumps(rpc.get('liveness'))}")
    assert lost == [], f"a live peer was declared dead: {lost}"
    assert dups <= max(1, MAX_DUP_SHARE * pages)


async def test_exit_when_finished_ends_a_batch_crawl(web: TestWeb, make_cluster: Any) -> None:
    cluster = await make_cluster(crawl_args(web, "--delay", "0", *FAST, "--exit-when-finished"))
    peers = await start_mesh(cluster, 3)
    await cluster.api(peers[0], "/api/seed", "POST", {"urls": [web.hub_url]})
    for p in peers:
        assert await cluster.wait_exit(p, 120) == 0, cluster.log(p)
    summaries = [json.loads(x) for p in peers for x in p.stdout_lines if '"finished"' in x]
    assert len(summaries) == 3 and all(s["finished"] is True for s in summaries)
    assert sum(s["pages_fetched"] for s in summaries) == len(web.ground_truth())
    dups, _ = server_duplicates(web)
    assert dups <= sum(s["claims_refetched"] for s in summaries)  # none but the checks


def duplicates_within(dups: int, bound: float, what: str) -> None:
    assert dups <= bound, f"{what}: {dups} duplicate fetches, over the bound of {bound:.1f}"


def dup_bound(pages: int, in_flight_peers: int) -> float:
    """The issue's 0.5% plus what each crashed or frozen peer had under way: up to
    ``--concurrency`` fetches (8 here) and, behind them, up to ``TAILS_PER_FETCH`` pages per
    fetch slot fetched and waiting for their links to be durable and their finish to reach
    the replicas (a page is done only then). None of those is recorded where the peer's
    successor looks, so it fetches them again (``test_lifecycle`` bounds its second SIGKILL
    the same way). Measured: 3-14 for one peer, 3-26 for two."""
    return max(1, MAX_DUP_SHARE * pages) + CONCURRENCY * (1 + TAILS_PER_FETCH) * in_flight_peers


@pytest.mark.timeout(300)
async def test_two_simultaneous_crashes_with_two_replicas_lose_nothing(
    churn_web: TestWeb, make_cluster: Any
) -> None:
    # r = 2: every queued task is on its owner and two replicas, so any two peers may die at
    # once and a third copy is left to republish (docs/membership.md, the invariant).
    cluster = await make_cluster(args(churn_web, "--replicas", "2"))
    peers = await start_mesh(cluster, 5)
    await cluster.api(peers[0], "/api/seed", "POST", {"urls": [churn_web.hub_url]})
    truth = len(churn_web.ground_truth())
    await wait_fetched(cluster, truth // 4)
    st = {p.name: await cluster.api(p, "/api/status") for p in peers[1:]}
    load = {n: s["tasks_queued"] + s["tasks_in_flight"] for n, s in st.items()}
    victims = sorted(peers[1:], key=lambda p: load[p.name], reverse=True)[:2]
    assert sum(load[v.name] for v in victims) > 0, "the victims held no work: nothing tested"
    for v in victims:  # back to back: neither is declared dead before the other dies
        cluster.kill(v)
    for v in victims:
        await v.proc.wait()
    print("killed", [v.name for v in victims], "of", load)
    dups, pages = await finish_and_count(cluster, churn_web, "two simultaneous crashes, r=2")
    duplicates_within(dups, dup_bound(pages, 2), "two crashes")


@pytest.mark.timeout(300)
async def test_a_crash_during_a_graceful_leave_loses_nothing(
    churn_web: TestWeb, make_cluster: Any
) -> None:
    cluster = await make_cluster(args(churn_web))
    peers = await start_mesh(cluster, 4)
    await cluster.api(peers[0], "/api/seed", "POST", {"urls": [churn_web.hub_url]})
    truth = len(churn_web.ground_truth())
    await wait_fetched(cluster, truth // 4)
    leaver = await busiest(cluster, peers[1:])
    rest = [p for p in peers[1:] if p is not leaver]
    victim = await busiest(cluster, rest)
    cluster.terminate(leaver)
    # Kill the victim once the leave is under way: the leaver first lets its fetches end,
    # then says goodbye and hands its keys to their new owners -- the victim among them.
    await cluster.wait_until(
        lambda ss: any(s["state"] == "leaving" for s in ss) or not leaver.alive, 10, "leaving"
    )
    leaving_at_crash = leaver.alive
    cluster.kill(victim)
    await victim.proc.wait()
    print(f"{leaver.name} leaving, {victim.name} killed")
    assert await cluster.wait_exit(leaver, 60) == 0, cluster.log(leaver)
    assert leaving_at_crash, "the leave ended before the crash: nothing tested"
    dups, pages = await finish_and_count(cluster, churn_web, "a crash during a graceful leave")
    duplicates_within(dups, dup_bound(pages, 1), "a crash during a leave")


async def table_sizes(cluster: Cluster, peers: list[PeerProc]) -> dict[str, int]:
    """Routing-table sizes of running peers (a stopped peer's status API would not answer)."""
    return {p.name: (await cluster.api(p, "/api/status"))["peers"] for p in peers}


async def wait_tables(cluster: Cluster, peers: list[PeerProc], size: int, timeout: float) -> float:
    started = time.monotonic()
    while (sizes := await table_sizes(cluster, peers)) and any(n != size for n in sizes.values()):
        assert time.monotonic() - started < timeout, f"tables {sizes}, wanted {size} each"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.timeout(300)
async def test_a_split_merges_within_the_documented_bound(
    churn_web: TestWeb, make_cluster: Any
) -> None:
    """Both halves declare each other dead, then find each other again through healing.

    Freezing one half gets it declared dead by the other; thawing it while freezing the other
    gets the other declared dead in turn. Once both run again, neither half has the other in
    its routing table: only the contacts saved in the data directory (healing) can join them,
    within ``heal_interval + heal_max_backoff`` plus a join round trip (docs/membership.md).
    """
    cluster = await make_cluster(args(churn_web))
    peers = await start_mesh(cluster, 4)
    a, b = peers[:2], peers[2:]
    await cluster.api(peers[0], "/api/seed", "POST", {"urls": [churn_web.hub_url]})
    truth = len(churn_web.ground_truth())
    await wait_fetched(cluster, truth // 4)
    await cluster.wait_until(  # healing needs the contacts saved in each data directory
        lambda _: all(len(read_contacts(p.data)) == 3 for p in peers), 30, "saved contacts"
    )
    try:
        for p in b:
            os.kill(p.pid, signal.SIGSTOP)
        await wait_tables(cluster, a, 1, 30)  # a declared b dead
        for p in a:
            os.kill(p.pid, signal.SIGSTOP)
        for p in b:
            os.kill(p.pid, signal.SIGCONT)
        await wait_tables(cluster, b, 1, 30)  # b, thawed, declared a dead
    finally:
        for p in peers:
            os.kill(p.pid, signal.SIGCONT)
    split = await table_sizes(cluster, peers)
    took = await wait_tables(cluster, peers, 3, MERGE_BOUND_S + 30)
    rejoins = []
    for p in peers:
        rejoins += [
            e
            for e in (await cluster.api(p, "/api/events"))["events"]
            if e.get("kind") == "rejoined"
        ]
    print(f"split {split} merged in {took:.1f} s (bound {MERGE_BOUND_S:.1f} s); rejoins {rejoins}")
    assert took <= MERGE_BOUND_S
    # No duplicate bound here: each half crawled the other's hosts while it believed it dead,
    # which a split cannot avoid. What must hold is the ground truth and the finished state.
    await finish_and_count(cluster, churn_web, "a split that merged")
