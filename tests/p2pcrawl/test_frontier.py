"""The two-level frontier without sockets or sleeping: a fake clock drives every gap."""

from __future__ import annotations

import asyncio

import pytest

from p2pcrawl.crawl import DomainTable, Frontier, HostQueue, Task, parse_domain_tables
from p2pcrawl.crawl.domains import DomainGate
from p2pcrawl.crawl.frontier import HostSlot
from p2pcrawl.crawl.scheduling import ServerEstimate
from p2pcrawl.settings import CrawlSettings, Policy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def task(url: str, depth: int = 0) -> Task:
    return Task(url=url, fp=hash(url) & (2**64 - 1), key=b"k" * 20, depth=depth)


def make(policy: Policy = "breadth-first") -> tuple[Frontier, Clock]:
    clock = Clock()
    return Frontier(CrawlSettings(policy=policy), clock=clock), clock


def take(f: Frontier) -> tuple[HostQueue, Task]:
    hq = f.acquire_nowait()
    assert hq is not None
    t = f.pop_task(hq)
    assert t is not None
    return hq, t


def test_one_host_is_never_handed_out_twice_at_once() -> None:
    f, _ = make()
    for i in range(3):
        f.push("a", task(f"http://a/{i}"))
    hq, _ = take(f)
    assert hq.host == "a" and hq.polite.busy
    assert f.acquire_nowait() is None  # "a" still has two URLs, but one request is out
    f.push("a", task("http://a/late"))  # more work for a busy host does not free it
    assert f.acquire_nowait() is None
    f.release(hq, response_time=0.01, gap=0.0)
    again = f.acquire_nowait()
    assert again is hq
    assert f.acquire_nowait() is None
    with pytest.raises(RuntimeError):
        hq.polite.start(0.0)  # the politeness state itself refuses a second request


def test_politeness_gap_is_honoured() -> None:
    f, clock = make()
    f.push("a", task("http://a/1"))
    f.push("a", task("http://a/2"))
    hq, _ = take(f)
    f.release(hq, response_time=0.2, gap=2.0)
    assert hq.polite.next_allowed == clock.now + 2.0
    assert f.next_delay() == pytest.approx(2.0)
    assert f.acquire_nowait() is None
    clock.now += 1.999
    assert f.acquire_nowait() is None
    assert f.next_delay() == pytest.approx(0.001)
    clock.now += 0.001
    assert f.acquire_nowait() is hq
    assert f.next_delay() is None


def test_a_waiting_host_does_not_block_others() -> None:
    f, clock = make()
    f.push("slow", task("http://slow/1"))
    f.push("slow", task("http://slow/2"))
    hq, _ = take(f)
    f.release(hq, response_time=0.0, gap=10.0)
    f.push("b", task("http://b/1"))
    other, _ = take(f)
    assert other.host == "b"
    clock.now += 10
    assert take(f)[0].host == "slow"


def test_breadth_first_round_robin_over_hosts() -> None:
    f, _ = make("breadth-first")
    for host in ("a", "b", "c"):
        for i in range(3):
            f.push(host, task(f"http://{host}/{i}"))
    order = []
    for _ in range(9):
        hq, t = take(f)
        order.append(t.url)
        f.release(hq, response_time=0.0, gap=0.0)
    assert order == [f"http://{h}/{i}" for i in range(3) for h in ("a", "b", "c")]
    assert f.acquire_nowait() is None
    assert len(f) == 0


def test_urls_of_a_host_come_out_fifo_breadth_first() -> None:
    f, _ = make("breadth-first")
    for i, depth in enumerate([3, 1, 2]):
        f.push("a", task(f"http://a/{i}", depth))
    got = []
    for _ in range(3):
        hq, t = take(f)
        got.append(t.url)
        f.release(hq, response_time=0.0, gap=0.0)
    assert got == ["http://a/0", "http://a/1", "http://a/2"]


def test_crawl_capability_takes_shallow_urls_first() -> None:
    f, _ = make("crawl-capability")
    for i, depth in enumerate([3, 1, 2]):
        f.push("a", task(f"http://a/{i}", depth))
    got = []
    for _ in range(3):
        hq, t = take(f)
        got.append(t.depth)
        f.release(hq, response_time=0.0, gap=0.0)
    assert got == [1, 2, 3]


def test_longest_first_reranks_a_host_whose_queue_grows_while_it_waits() -> None:
    """Found one link at a time, the long host was scheduled with one queued URL, ranked
    with the short ones; by its turn it has the longest queue, and goes first."""
    f, clock = make("longest-first")
    # An explored host with more found than any here leads (it goes before the roots);
    # kept out of the way by a request under way to it.
    for i in range(100):
        f.push("lead", task(f"http://lead/{i}"))
    first, _ = take(f)
    f.release(first, response_time=0.0, gap=0.0)
    lead, _ = take(f)
    assert lead is first and f.leader is first
    for host in ("long", "a", "b", "c"):
        for i in range(2 if host == "long" else 4):
            f.push(host, task(f"http://{host}/{i}"))
    # Never fetched from: each explored once, in the order they came.
    explored = []
    while (hq := f.acquire_nowait()) is not None:
        explored.append(hq.host)
        assert f.pop_task(hq) is not None
        f.release(hq, response_time=0.0, gap=0.0)
        if len(explored) == 4:
            break
    assert explored == ["long", "a", "b", "c"]
    # Ranked with 1 queued + 1 taken, behind 3 + 1 each; then its links arrive.
    for i in range(2, 12):
        f.push("long", task(f"http://long/{i}"))
    order = []
    while (hq := f.acquire_nowait()) is not None:
        order.append(hq.host)
        assert f.pop_task(hq) is not None
    # Each host once (its stale entries skipped): "long" first, the rest as they came.
    assert order == ["long", "a", "b", "c"]
    for host in order:
        f.release(f.host(host), response_time=0.0, gap=1.0)
    clock.now += 1.0  # out of the waiting heap, ranked afresh: 10 queued + 2 taken
    assert f.acquire_nowait() is f.host("long")
    assert len(f) == 10 + 3 * 2 + 98


def test_a_root_put_back_behind_robots_txt_keeps_its_host_unexplored() -> None:
    """The first request to a host is its robots.txt; its root goes back on the queue, and
    the host, still never fetched from, keeps its place before the hosts already explored
    under longest-first (ranked as one URL found, it waited behind all of them)."""
    f, _ = make("longest-first")
    for i in range(6):
        f.push("long", task(f"http://long/{i}"))
    hq, _ = take(f)
    f.release(hq, response_time=0.0, gap=0.0)
    take(f)  # the leader, a request under way to it
    for i in range(3):
        f.push("short", task(f"http://short/{i}"))
    hq, _ = take(f)
    f.release(hq, response_time=0.0, gap=0.0)  # fetched: 2 queued + 1 taken
    assert f.leader is f.host("long")
    f.push("new", task("http://new/"))
    slot = HostSlot(f, f.acquire_nowait() or pytest.fail("no host ready"))
    assert slot.host == "new"
    root = slot.pop()
    assert root is not None
    slot.requeue(root)  # robots.txt first
    slot.release()
    assert f.host("new").taken == 0
    assert f.acquire_nowait() is f.host("new")


def test_performance_first_serves_the_faster_host_first() -> None:
    f, _ = make("performance-first")
    f.host("slow").est = ServerEstimate(connect_time=0.5, response_time=1.0)
    f.host("fast").est = ServerEstimate(connect_time=0.01, response_time=0.01)
    # The slow host arrives first: breadth-first would serve it first, this policy must not.
    for i in range(5):
        f.push("slow", task(f"http://slow/{i}"))
        f.push("fast", task(f"http://fast/{i}"))
    hq, _ = take(f)
    assert hq.host == "fast"
    assert take(f)[0].host == "slow"  # the only other ready host

    bf, _ = make("breadth-first")
    for host in ("slow", "fast"):
        bf.push(host, task(f"http://{host}/0"))
    assert take(bf)[0].host == "slow"


def test_remove_hosts_returns_tasks_and_busy_host_is_not_rescheduled() -> None:
    f, _ = make()
    for i in range(3):
        f.push("a", task(f"http://a/{i}"))
        f.push("b", task(f"http://b/{i}"))
    busy, inflight = take(f)
    assert busy.host == "a"
    removed = f.remove_hosts(["a", "nonexistent"])
    assert sorted(t.url for t in removed) == ["http://a/1", "http://a/2"]
    assert inflight.url == "http://a/0"  # the in-flight task is the caller's, not returned
    assert "a" not in f.hosts
    assert len(f) == 3
    f.release(busy, response_time=0.0, gap=0.0)  # the fetch in flight ends after the move
    served = []
    while (hq := f.acquire_nowait()) is not None:
        t = f.pop_task(hq)
        assert t is not None
        served.append(t.url)
        f.release(hq, response_time=0.0, gap=0.0)
    assert served == ["http://b/0", "http://b/1", "http://b/2"]
    assert len(f) == 0


def test_prune_keeps_hosts_whose_gap_still_runs() -> None:
    f, clock = make()
    f.push("a", task("http://a/1"))
    f.push("b", task("http://b/1"))
    f.push("c", task("http://c/1"))
    a, _ = take(f)
    f.release(a, response_time=0.0, gap=5.0)  # idle, gap running
    b, _ = take(f)  # busy
    c, _ = take(f)
    f.release(c, response_time=0.0, gap=0.0)  # idle, gap over
    f.push("d", task("http://d/1"))  # has work
    assert f.prune() == 1
    assert set(f.hosts) == {"a", "b", "d"}
    clock.now += 5.0
    assert f.prune() == 1
    assert set(f.hosts) == {"b", "d"}
    f.release(b, response_time=0.0, gap=0.0)
    assert f.prune() == 1
    assert set(f.hosts) == {"d"}
    # A pruned host comes back with fresh state when new work arrives.
    f.push("a", task("http://a/2"))
    assert f.host("a") is not a
    assert f.acquire_nowait() is not None


async def test_acquire_waits_for_push_and_for_the_gap() -> None:
    f, clock = make()
    waiter = asyncio.ensure_future(f.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    f.push("a", task("http://a/1"))
    hq = await asyncio.wait_for(waiter, 5)
    assert hq.host == "a"
    t = f.pop_task(hq)
    assert t is not None
    # With a gap pending, acquire() sleeps on the real loop until next_delay(); a release
    # after the fake clock moved past the gap wakes it at once.
    f.push("a", task("http://a/2"))
    f.release(hq, response_time=0.0, gap=3600.0)
    waiter = asyncio.ensure_future(f.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.now += 3600.0
    f.push("b", task("http://b/1"))  # any push wakes a waiter, which re-checks the heaps
    got = await asyncio.wait_for(waiter, 5)
    assert got.host in ("a", "b")
    assert f.acquire_nowait() is not None  # and the other one is ready too


async def test_wake_all_releases_waiters() -> None:
    f, _ = make()
    waiters = [asyncio.ensure_future(f.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    f.wake_all()
    f.push("a", task("http://a/1"))
    done, pending = await asyncio.wait(waiters, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    for w in pending:
        w.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def test_take_tasks_leaves_the_rest_in_place_and_the_host_busy() -> None:
    f, _ = make()
    for i in range(4):
        f.push("a", task(f"http://a/{i}"))
    busy, inflight = take(f)
    assert busy.host == "a" and inflight.url == "http://a/0"
    taken = f.take_tasks("a", lambda t: t.url.endswith(("/1", "/3")))
    assert sorted(t.url for t in taken) == ["http://a/1", "http://a/3"]
    assert len(f) == 1 and f.hosts["a"] is busy and busy.polite.busy
    assert f.acquire_nowait() is None  # the request under way still holds the host
    assert f.take_tasks("a", lambda t: False) == [] and f.take_tasks("zz", lambda t: True) == []
    assert [t.url for t in f.take_tasks("a", lambda t: True)] == ["http://a/2"]
    assert "a" not in f.hosts and len(f) == 0


async def test_a_reserved_host_goes_to_the_lender_when_its_request_ends() -> None:
    """Lending a host with a request under way: the request ends, and the host's next one
    is the borrower's, never a worker's here as well."""
    f, _ = make()
    for i in range(4):
        f.push("a", task(f"http://a/{i}"))
    hq, _ = take(f)
    ended = f.reserve(hq)
    assert not ended.done()
    f.push("a", task("http://a/late"))  # new work for a reserved host does not free it
    f.release(hq, response_time=0.01, gap=0.0)
    assert ended.done()
    assert f.acquire_nowait() is None  # out of the queues: the lender takes it now
    lent = f.lend_host(hq)
    assert len(lent) == 4 and hq.polite.busy and hq.reserved is None
    f.release(hq, response_time=0.0, gap=0.0)  # the lease ended
    assert f.acquire_nowait() is None  # nothing was left here


async def test_an_unreserved_host_is_crawled_again() -> None:
    f, _ = make()
    for i in range(3):
        f.push("a", task(f"http://a/{i}"))
    hq, _ = take(f)
    f.reserve(hq)
    f.release(hq, response_time=0.01, gap=0.0)
    f.unreserve(hq)  # not lent after all (the borrower went, or the wait ran out)
    assert f.acquire_nowait() is hq
    # Given up while the request is still under way: it comes back at the release.
    f.reserve(hq)
    f.unreserve(hq)
    f.release(hq, response_time=0.01, gap=0.0)
    assert f.acquire_nowait() is hq


def test_the_explored_host_with_most_found_leads_ahead_of_the_roots() -> None:
    """While a peer explores the roots it was sent, one long host's chain keeps going: the
    explored host with most found goes before the hosts never fetched from, until another
    explored host has found more or it has nothing left."""
    f, _ = make("longest-first")
    for i in range(6):
        f.push("long", task(f"http://long/{i}"))
    hq, _ = take(f)
    f.release(hq, response_time=0.0, gap=0.0)
    for root in ("r1", "r2"):
        f.push(root, task(f"http://{root}/"))
    hq, _ = take(f)
    assert hq.host == "long" and f.leader is hq
    hq, _ = take(f)
    assert hq.host == "r1"  # while a request to the leader is under way, the roots go
    for i in range(1, 30):
        f.push("r1", task(f"http://r1/{i}"))
    f.release(hq, response_time=0.0, gap=0.0)  # 29 queued + 1 taken: more than "long"
    assert f.leader is f.host("r1")
    hq, _ = take(f)
    assert hq.host == "r1"
    f.release(hq, response_time=0.0, gap=0.0)
    # A leader that is lent out leads no more: busy while lent, it fetches nothing here.
    f.lend_host(f.host("r1"))
    assert f.leader is None


def test_a_borrowed_hosts_queue_goes_before_the_borrowers_own_roots() -> None:
    f, _ = make("longest-first")
    for root in ("r1", "r2", "r3"):
        f.push(root, task(f"http://{root}/"))
    lent = task("http://lent/p1")
    lent.lease = 7
    f.push("lent", lent)
    hq, t = take(f)
    assert hq.host == "lent" and t is lent


async def test_a_domains_concurrency_parks_its_hosts_until_one_of_its_requests_ends() -> None:
    table = DomainTable(parse_domain_tables({"example.org": {"concurrency": 2}}))
    f, _ = make()
    f.gate = DomainGate(table.limit_at)
    for host in ("a.example.org", "b.example.org:8080", "c.example.org", "d.example.org"):
        f.push(host, task(f"http://{host}/"))
    f.push("other.net", task("http://other.net/"))
    got = [take(f)[0] for _ in range(3)]
    # Two of the domain's hosts at once; the others are parked, and no other domain waits.
    assert {hq.host for hq in got} == {"a.example.org", "b.example.org:8080", "other.net"}
    assert f.acquire_nowait() is None and f.next_delay() is None  # parked, not on a timer
    waiter = asyncio.ensure_future(f.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    # A parked host handed to another peer meanwhile is passed over for the next one.
    assert f.remove_hosts(["c.example.org"])
    f.release(got[0], response_time=0.1, gap=0.0)
    async with asyncio.timeout(1):
        woken = await waiter  # woken by the release, not by polling
    assert woken.host == "d.example.org"
    assert f.acquire_nowait() is None  # two under way again (b and d)
    f.push("e.example.org", task("http://e.example.org/"))
    f.release(got[2], response_time=0.1, gap=0.0)  # another domain's end frees nothing here
    assert f.acquire_nowait() is None
    f.release(woken, response_time=0.1, gap=0.0)
    assert take(f)[0].host == "e.example.org"


def test_a_hosts_pace_is_the_time_between_its_requests_while_more_of_it_waits() -> None:
    """Lending compares it with a loan's pace (``network.lender.LOAN_PAGE_S``): the time a
    request takes, its gap, and the wait for a fetcher all count; a host that waited for
    links, or was lent, does not count that wait."""
    f, clock = make()
    for i in range(3):
        f.push("a", task(f"http://a/{i}"))
    hq, _ = take(f)
    assert hq.pace is None
    clock.now += 0.01
    f.release(hq, response_time=0.01, gap=0.04)
    clock.now += 0.1  # no fetcher free until now: 0.06 s past the gap
    take(f)
    assert hq.pace == pytest.approx(0.11)
    clock.now += 0.01
    f.release(hq, response_time=0.01, gap=0.0)
    take(f)  # the last one: nothing more of it waits
    assert hq.pace == pytest.approx(0.01)  # the lower median of 0.11 and 0.01
    f.release(hq, response_time=0.01, gap=0.0)
    clock.now += 60.0  # its links came in a minute later: not its pace here
    f.push("a", task("http://a/late"))
    f.push("a", task("http://a/later"))
    take(f)
    assert hq.pace == pytest.approx(0.01)
    f.release(hq, response_time=0.01, gap=0.0)
    f.lend_host(hq)
    clock.now += 30.0  # on loan for half a minute
    f.push("a", task("http://a/back"))
    f.push("a", task("http://a/back2"))
    f.release(hq, response_time=0.0, gap=0.0)
    take(f)
    assert hq.pace == pytest.approx(0.01)


def test_one_stall_does_not_make_a_host_slow() -> None:
    """A 50 ms Crawl-delay host fetched at its gap, then one request held up half a second
    (this peer's loop stalled): still 50 ms a page, so its owner does not lend it away for
    that; slow for most of its last few requests, it is slow."""
    f, clock = make()
    for i in range(12):
        f.push("a", task(f"http://a/{i}"))
    hq, _ = take(f)
    for wait in (0.05, 0.05, 0.05, 0.5, 0.05):
        f.release(hq, response_time=0.005, gap=0.045)
        clock.now += wait
        take(f)
    assert hq.pace == pytest.approx(0.05)
    for wait in (0.3, 0.3, 0.3):
        f.release(hq, response_time=0.005, gap=0.045)
        clock.now += wait
        take(f)
    assert hq.pace == pytest.approx(0.3)
