"""The dispatcher's outboxes: an owner that already has every link we send hears less often."""

from __future__ import annotations

import asyncio

import pytest

from p2pcrawl.crawl import Task, urls
from p2pcrawl.network import Peer
from p2pcrawl.network.dispatch import PATIENT_FLUSH_S, STALE_AFTER, Dispatcher
from p2pcrawl.settings import CrawlSettings, PeerSettings, ScopeSettings
from protocol import key_for
from tests.conftest import PeerFactory

pytestmark = pytest.mark.timeout(60)

CRAWL = CrawlSettings(scope=ScopeSettings(allow_domains=("busy.test",)))


def tasks_for(host: str, pages: range) -> list[Task]:
    out = []
    for i in pages:
        url = f"http://{host}/p{i}"
        out.append(Task(url, urls.fingerprint(url), key_for(host), 1))
    return out


async def queued_urls(peer: Peer) -> set[str]:
    assert peer.ledger is not None
    return {t.url for _, t in await peer.ledger.tasks.page(0, 100_000)}


async def test_an_owner_that_has_every_link_is_sent_to_less_often_while_we_are_busy(
    make_peer: PeerFactory,
) -> None:
    a = await make_peer(crawl=CRAWL, peer=PeerSettings())
    assert a.engine is not None
    a.engine.pause("test")  # every accepted task stays queued
    b = await make_peer(crawl=CRAWL, bootstrap=(a.me.addr,))
    assert b.node is not None and b.engine is not None
    hosts = [f"h{i}.busy.test" for i in range(200)]
    host = next(h for h in hosts if b.node.closest_local(key_for(h), 1)[0].id == a.node_id)
    busy = [True]
    sent: list[int] = []

    async def local(ts: list[Task]) -> None:
        raise AssertionError("every task here has a live owner")

    d = Dispatcher(b.node, b.node.store_task, intake=local, flush_s=0.05, patient=lambda: busy[0])
    try:
        first = tasks_for(host, range(10))
        await d.route(first)
        assert d.spacing(a.me) == d.flush_s  # they were new to the owner
        for n in range(1, STALE_AFTER + 3):
            await d.route(first)  # the owner has all of them already
            sent.append(d.sent_rpcs)
            if n < STALE_AFTER:
                assert d.spacing(a.me) == d.flush_s
        stretched = d.spacing(a.me)
        assert d.flush_s < stretched <= PATIENT_FLUSH_S
        busy[0] = False  # no backlog here: a page's links may decide when the crawl ends
        assert d.spacing(a.me) == d.flush_s
        busy[0] = True
        assert d.spacing(a.me) == stretched
        # One link the owner lacks brings the spacing straight back, and nothing is lost.
        more = tasks_for(host, range(10, 11))
        await d.route(first + more)
        assert d.spacing(a.me) == d.flush_s
        assert await queued_urls(a) == {t.url for t in first + more}
        assert sent == list(range(2, STALE_AFTER + 4))  # one STORE_TASK per route, no resend
    finally:
        await d.aclose()


async def test_a_peer_is_patient_only_with_a_backlog(make_peer: PeerFactory) -> None:
    peer = await make_peer(crawl=CRAWL)
    assert peer.engine is not None
    peer.engine.pause("test")
    assert not peer.parts.patience()
    conc = peer.engine.settings.concurrency
    await peer.intake(tasks_for("busy.test", range(2 * conc + 1)))
    assert peer.parts.patience()
    # A hand-off waits for our pages' tails, and they wait on our lanes: no patience then.
    with peer.parts.patience.waiting():
        assert not peer.parts.patience()
    assert peer.parts.patience()
    # Every pipeline ticket held: the next fetch waits for a tail, and a tail waiting out
    # a stretched spacing is a page not fetched.
    pipeline = peer.engine.pipeline
    assert pipeline.pages is not None
    held = [await pipeline.ticket() for _ in range(pipeline.pages)]
    assert pipeline.gating and not peer.parts.patience()
    # A fetch that waits for one keeps the lanes impatient for a while after it got it.
    waiting = asyncio.ensure_future(pipeline.ticket())
    await asyncio.sleep(0)
    held.pop().release()
    held.append(await waiting)
    held.pop().release()
    assert pipeline.waits == 1 and not peer.parts.patience()
    for ticket in held:
        ticket.release()


async def test_links_leave_without_the_spacing_while_the_page_tails_gate_the_crawl(
    make_peer: PeerFactory,
) -> None:
    """Each page's tail waits for its links' owners; while every pipeline ticket is held, a
    batch waiting out the spacing is pages not fetched (a new owner of a big host crawled
    at a third of its pace for seconds so)."""
    a = await make_peer(crawl=CRAWL, peer=PeerSettings())
    assert a.engine is not None
    a.engine.pause("test")
    b = await make_peer(crawl=CRAWL, bootstrap=(a.me.addr,))
    assert b.node is not None and b.engine is not None
    hosts = [f"h{i}.busy.test" for i in range(200)]
    host = next(h for h in hosts if b.node.closest_local(key_for(h), 1)[0].id == a.node_id)
    rushed = [True]

    async def local(ts: list[Task]) -> None:
        raise AssertionError("every task here has a live owner")

    # A spacing far beyond the test's patience: only a batch that does not wait it out ends.
    d = Dispatcher(b.node, b.node.store_task, intake=local, flush_s=600.0, rushed=lambda: rushed[0])
    try:
        await d.route(tasks_for(host, range(5)))  # a quiet lane sends at once anyway
        await asyncio.wait_for(d.route(tasks_for(host, range(5, 10))), 20)
        assert d.sent_rpcs == 2
        rushed[0] = False  # the tails keep up: links gather for the spacing again
        later = asyncio.ensure_future(d.route(tasks_for(host, range(10, 15))))
        await asyncio.sleep(0.5)
        assert not later.done() and d.sent_rpcs == 2
        rushed[0] = True
        d.hurry()  # what the pipeline does when a fetch starts waiting for a ticket
        await asyncio.wait_for(later, 20)
        assert await queued_urls(a) == {t.url for t in tasks_for(host, range(15))}
    finally:
        await d.aclose()
    # The peer's own dispatcher asks its pipeline.
    dispatcher, pipeline = b.parts.dispatcher, b.engine.pipeline
    assert pipeline.pages is not None and dispatcher.spacing(a.me) == dispatcher.flush_s
    held = [await pipeline.ticket() for _ in range(pipeline.pages)]
    assert pipeline.gating and dispatcher.spacing(a.me) == 0.0
    for ticket in held:
        ticket.release()
    assert dispatcher.spacing(a.me) == dispatcher.flush_s
