"""A crash's window: the pages a peer requested whose done record had not left it yet.

A killed peer's successor fetches those again (docs/membership.md, "What a crash costs"). On a
web that answers faster than page tails finish, the fetch and tail slots used to fill, up to
(1 + TAILS_PER_FETCH) x concurrency pages whatever the replicas' lane did; a page now holds a
``Pipeline`` ticket from its request until its done record is out.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from aiohttp import web

from p2pcrawl.crawl import Engine, Ledger, Task
from p2pcrawl.crawl.pipeline import PIPELINE_PAGES, Pipeline
from tests.p2pcrawl.loopback import fast_settings, serve

LANE_S = 0.1  # how long the news of a finished page takes to reach the replicas


async def _page(request: web.BaseRequest) -> web.StreamResponse:
    if request.path == "/robots.txt":
        return web.Response(status=404)
    return web.Response(text="<p>no links</p>", content_type="text/html")


async def test_a_full_speed_crawl_has_at_most_the_pipeline_between_request_and_done(
    tmp_path: Path,
) -> None:
    """Four hosts answering at once, the default concurrency, and every page's done record
    taking 0.1 s to reach the replicas (their lane): at no moment are more than
    ``PIPELINE_PAGES`` pages requested and not yet done. Without the tickets it was 96."""
    requested = done = widest = 0

    async def counted(request: web.BaseRequest) -> web.StreamResponse:
        nonlocal requested, widest
        if request.path.startswith("/p"):
            requested += 1
            widest = max(widest, requested - done)
        return await _page(request)

    async def lane(tasks: list[Task], *, hurry: bool = False) -> None:
        nonlocal done
        await asyncio.sleep(LANE_S)
        done += sum("/p" in t.url for t in tasks)  # not robots.txt

    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(serve(counted, f"127.0.0.{30 + i}")) for i in range(4)
        ]
        settings = fast_settings([s.host for s in servers], concurrency=32)
        ledger = await Ledger.open(tmp_path / "stores")
        stack.push_async_callback(ledger.aclose)
        engine = Engine(settings, ledger, warc=None, on_finished=lane, pipeline=Pipeline())
        stack.push_async_callback(engine.aclose)
        tasks = [engine.seed_tasks([f"{s.base}/p{i}"])[0] for s in servers for i in range(60)]
        assert len(await ledger.accept(tasks)) == 240
        await engine.start()
        async with asyncio.timeout(30):
            while not engine.idle:
                await engine.wait_progress(0.1)
    assert requested == done == 240
    assert PIPELINE_PAGES // 2 < widest <= PIPELINE_PAGES


async def test_a_slow_fetch_gives_its_ticket_back() -> None:
    """A fetch still under way after ``quick_s`` (a remote web) holds no ticket: the fetches
    a slow web needs in parallel are not cut to the tickets."""
    pipeline = Pipeline(pages=2, quick_s=0.05)
    slow = await pipeline.ticket()
    slow.started()
    quick = await pipeline.ticket()
    quick.started()
    quick.fetched()  # its page is in its tail: the ticket stays until it is done
    async with asyncio.timeout(1):
        third = await pipeline.ticket()  # the slow fetch's, once it turned out slow
    assert pipeline.slow_fetches == 1
    slow.release()  # its page done at last: nothing more to give back
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.2):
            await pipeline.ticket()
            raise AssertionError("a ticket was given back twice")
    quick.release()
    third.release()
