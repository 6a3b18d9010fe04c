"""``--max-rate``: the pacer's bucket, its order, and a real crawl held to the rate."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from aiohttp import web

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import crawl
from p2pcrawl.crawl.fetcher import Fetcher
from p2pcrawl.crawl.frontier import Frontier, HostSlot, Task
from p2pcrawl.crawl.pacing import BURST_S, MIN_BURST, Pacer, on_wire
from p2pcrawl.crawl.robotsgate import RobotsGate
from p2pcrawl.crawl.stats import CrawlStats
from p2pcrawl.testing import TestWeb, TestWebConfig
from tests.p2pcrawl.loopback import fast_settings


async def turns() -> None:
    """Let granted requests run on (a future's callback, then its task)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_no_rate_never_waits() -> None:
    pacer = Pacer(0)
    assert not pacer.enabled
    assert await pacer.start(5.0) == 0.0
    pacer.settle(0.0, 10**9)
    assert pacer.waits == 0


def test_a_negative_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="rate"):
        Pacer(-1)


async def test_waiting_requests_go_smallest_key_first_as_the_bucket_refills() -> None:
    clock = Clock()
    rate = 100_000
    pacer = Pacer(rate, clock=clock)
    pacer.mean = 40_000.0
    assert pacer.burst == max(MIN_BURST, rate * BURST_S)
    # The full bucket lets requests start until it is in debt.
    started = 0
    while True:
        task = asyncio.ensure_future(pacer.start())
        await turns()
        if not task.done():
            task.cancel()
            break
        started += 1
    assert started == 2  # 65,536 -> 25,536 -> -14,464: a third waits
    assert pacer.waits == 1
    order: list[float] = []

    async def request(priority: float) -> None:
        await pacer.start(priority)
        order.append(priority)

    waiting = [asyncio.ensure_future(request(p)) for p in (-3.0, -300.0, -40.0)]
    await turns()
    assert order == []
    clock.now += 14_465 / rate  # out of debt: one request may start
    pacer.settle(0.0, 0)
    await turns()
    assert order == [-300.0]  # the host with the most queued pages first
    clock.now += 40_001 / rate
    pacer.settle(0.0, 0)
    await turns()
    assert order == [-300.0, -40.0]
    clock.now += 40_001 / rate
    pacer.settle(0.0, 0)
    await asyncio.gather(*waiting)
    assert order == [-300.0, -40.0, -3.0]
    pacer.close()


async def test_a_response_larger_than_its_share_is_paid_for_by_the_next() -> None:
    clock = Clock()
    pacer = Pacer(100_000, clock=clock)
    taken = await pacer.start()
    pacer.settle(taken, 1_000_000)  # ten seconds' worth arrived
    assert pacer.mean > taken  # the guess of a page's size moves towards what pages are
    nxt = asyncio.ensure_future(pacer.start())
    clock.now += 5.0
    pacer.settle(0.0, 0)
    await turns()
    assert not nxt.done()  # still in debt after half the time
    clock.now += 5.0
    pacer.settle(0.0, 0)
    await turns()
    assert nxt.done()
    pacer.close()


async def test_a_cancelled_request_takes_nothing_from_the_bucket() -> None:
    clock = Clock()
    pacer = Pacer(100_000, clock=clock)
    pacer.mean = 70_000.0
    await pacer.start()  # in debt now
    gone = asyncio.ensure_future(pacer.start(-1.0))
    kept = asyncio.ensure_future(pacer.start(0.0))
    await turns()
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    clock.now += (70_001 - MIN_BURST) / 100_000
    pacer.settle(0.0, 0)
    await turns()
    assert kept.done()  # the cancelled one, ahead of it, did not take its turn
    pacer.close()


async def test_close_cancels_the_waiting() -> None:
    pacer = Pacer(1_000, clock=Clock())
    pacer.mean = 70_000.0
    await pacer.start()
    waiting = asyncio.ensure_future(pacer.start())
    await turns()
    pacer.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_crawl_moves_no_more_than_its_max_rate(tmp_path: Path) -> None:
    """A real crawl over loopback: every page fetched, and no faster than the rate lets
    (bodies alone, a lower count than the pacer's, which adds the headers)."""
    config = TestWebConfig(hosts=3, pages_per_host=30, large_page_bytes=150_000)
    async with TestWeb(config) as web:
        rate, concurrency = 100_000, 4
        settings = dataclasses.replace(
            fast_settings(web.allow_domains, concurrency=concurrency), max_rate=rate
        )
        t0 = time.monotonic()
        summary = await crawl([web.hub_url], settings, tmp_path)
        elapsed = time.monotonic() - t0
        assert set(read_warc_urls(tmp_path / "warc")) == web.ground_truth()
    moved = summary.stats.bytes_fetched
    # What may pass at once: the full bucket, and the requests under way beyond their
    # share (one large page, the rest well under 20 kB).
    slack = max(MIN_BURST, rate * BURST_S) + config.large_page_bytes + concurrency * 20_000
    assert moved - slack > rate * 0.5  # the bound below means something
    assert elapsed >= (moved - slack) / rate


async def test_bytes_that_arrive_outside_the_fetches_are_paid_for_too() -> None:
    """The peers' RPCs share the link with the pages: what they brought in since the bucket
    was last looked at is taken out of it, so a request waits for them as for a page."""
    clock = Clock()
    rate = 100_000
    pacer = Pacer(rate, clock=clock)
    pacer.mean = 10_000.0
    arrived = 0
    pacer.count_also(lambda: arrived)
    assert await pacer.start() == 10_000.0  # 65,536 -> 55,536
    arrived += 60_000  # a burst of STORE_TASK datagrams
    task = asyncio.ensure_future(pacer.start())
    await turns()
    assert not task.done()  # -4,464: in debt, though no page arrived
    clock.now += 4_465 / rate
    pacer.settle(0.0, 0)
    await turns()
    assert task.done()


def test_the_wire_counts_each_segments_framing() -> None:
    assert on_wire(0) == 0
    assert on_wire(1) == 1 + 66
    assert on_wire(1448) == 1448 + 66
    assert on_wire(16_000) == 16_000 + 12 * 66  # a cluster benchmark page: 12 segments


async def test_robots_txt_does_not_wait_its_turn_but_what_it_carried_is_paid_for() -> None:
    """A host's exploration waits on its robots.txt, so it skips the queue; its bytes still
    come out of the bucket (a robots.txt may be 500 KiB), without moving the page mean."""
    robots = b"# " + b"x" * 70_000 + b"\nUser-agent: *\nDisallow: /private\n"

    async def answer(request: web.BaseRequest) -> web.Response:
        return web.Response(body=robots, content_type="text/plain")

    runner = web.ServerRunner(web.Server(answer, access_log=None))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    clock = Clock()
    pacer = Pacer(100_000, clock=clock)
    assert pacer.burst < on_wire(len(robots))  # one robots.txt puts a full bucket in debt
    mean = pacer.mean
    settings = fast_settings(["127.0.0.1"])
    fetcher = Fetcher(settings)
    await fetcher.start()
    try:
        frontier = Frontier(settings)
        frontier.push("127.0.0.1", Task(f"http://127.0.0.1:{port}/", fp=1, key=b"k" * 20, depth=0))
        hq = frontier.acquire_nowait()
        assert hq is not None
        slot = HostSlot(frontier, hq)
        root = slot.pop()
        assert root is not None
        gate = RobotsGate(settings, fetcher, CrawlStats(), pacer)
        assert await gate.policy_for(slot, root) is None  # fetched: the root waits behind it
        assert pacer.waits == 0  # it did not wait
        assert pacer.mean == mean
        page = asyncio.ensure_future(pacer.start())
        await turns()
        assert not page.done()  # the next page waits for what robots.txt carried
        clock.now += on_wire(len(robots)) / 100_000
        pacer.settle(0.0, 0)
        await turns()
        assert page.done()
        slot.release()
        policy = await gate.policy_for(slot, root)  # cached: no second request
        assert policy is not None and not policy.allowed(f"http://127.0.0.1:{port}/private", "x")
    finally:
        await fetcher.aclose()
        await runner.cleanup()


async def test_a_robots_txt_read_for_a_check_serves_the_hosts_first_page() -> None:
    """``peek`` (a claim's check, ``network.vouching``) reads robots.txt outside any host
    slot; the host's first page then starts from that policy, with no second request."""
    asked: list[str] = []

    async def answer(request: web.BaseRequest) -> web.Response:
        asked.append(request.path)
        return web.Response(body=b"User-agent: *\nDisallow: /private\n", content_type="text/plain")

    runner = web.ServerRunner(web.Server(answer, access_log=None))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    origin = f"http://127.0.0.1:{runner.addresses[0][1]}"
    settings = fast_settings(["127.0.0.1"])
    fetcher = Fetcher(settings)
    await fetcher.start()
    try:
        gate = RobotsGate(settings, fetcher, CrawlStats(), Pacer(0))
        policy = await gate.peek(origin, "x")
        assert policy is not None and not policy.allowed(origin + "/private/1", "x")
        assert await gate.peek(origin, "x") is policy and asked == ["/robots.txt"]
        frontier = Frontier(settings)
        frontier.push("127.0.0.1", Task(origin + "/", fp=1, key=b"k" * 20, depth=0))
        hq = frontier.acquire_nowait()
        assert hq is not None
        slot = HostSlot(frontier, hq)
        root = slot.pop()
        assert root is not None
        assert await gate.policy_for(slot, root) is policy
        assert asked == ["/robots.txt"]
    finally:
        await fetcher.aclose()
        await runner.cleanup()
