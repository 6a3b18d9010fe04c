"""Continuous mode with a real peer and the changing test web (docs/freshness.md).

An unchanged page is answered 304 and archived as a revisit record; a changed page is
archived in full and the page new with its change is crawled; a removed page is retired;
politeness and robots.txt's expiry hold for revisits; the status API says ``waiting``.
Intervals of 1 s keep this quick.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from warcio.archiveiterator import ArchiveIterator

from p2pcrawl.archive import PROFILE_IDENTICAL, PROFILE_NOT_MODIFIED
from p2pcrawl.crawl import Engine, crawl
from p2pcrawl.network import Peer, save_identity
from p2pcrawl.settings import (
    CrawlSettings,
    PeerSettings,
    PolitenessSettings,
    RevisitSettings,
    ScopeSettings,
)
from p2pcrawl.testing import ChangingConfig, ChangingWeb
from storage import Visit
from tests.conftest import TEST_MIN_PEER_AGE, TEST_SECRET, PeerFactory, StatusFactory, id_next_to

pytestmark = pytest.mark.timeout(60)

WebMaker = Callable[..., Any]


@pytest.fixture
async def changing_web() -> AsyncIterator[WebMaker]:
    webs: list[ChangingWeb] = []

    async def factory(**config: Any) -> ChangingWeb:
        web = ChangingWeb(ChangingConfig(**config))
        await web.start()
        webs.append(web)
        return web

    yield factory
    for web in reversed(webs):
        await web.aclose()


def settings_for(web: ChangingWeb, revisit: RevisitSettings, **politeness: Any) -> CrawlSettings:
    return CrawlSettings(
        politeness=PolitenessSettings(**{"delay": 0.0, "politeness_factor": 0.0, **politeness}),
        scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        revisit=revisit,
    )


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await _true(check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)


async def _true(result: bool | Awaitable[bool]) -> bool:
    return await result if inspect.isawaitable(result) else result


def records(data_dir: Path) -> list[tuple[str, Any]]:
    """(type, WARC headers) of every response and revisit record, in file order."""
    out = []
    for path in sorted((data_dir / "warc").glob("*.warc.gz")):
        with path.open("rb") as f:
            for rec in ArchiveIterator(f, check_digests="raise"):
                if rec.rec_type in ("response", "revisit"):
                    out.append((rec.rec_type, rec.rec_headers))
    return out


def statuses(web: ChangingWeb, url: str) -> list[int]:
    return [status for _, status, _ in web.requests(url)]


async def test_revisits_304_change_new_links_and_retire(
    changing_web: WebMaker, make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    web: ChangingWeb = await changing_web(hosts=2, pages_per_host=3)
    delay = 0.15
    settings = settings_for(
        web, RevisitSettings(every=1, max_interval=2), delay=delay, robots_ttl=2.0
    )
    peer = await make_peer(crawl=settings)
    server = await make_status(peer)
    await peer.add_seeds([web.hub_url])
    pages = web.page_urls()
    same, changed, removed = pages[0], pages[1], pages[4]
    await until(lambda: all(statuses(web, u) for u in pages), 20, "every page fetched")
    web.change(changed)
    web.remove(removed, 410)
    new_page = f"{web.bases[0]}/new/1-1.html"
    assert peer.engine is not None and peer.engine.revisits is not None
    revisits = peer.engine.revisits
    await until(
        lambda: web.new_requests[new_page] > 0 and revisits.stats.retired >= 1, 20,
        "the changed page's new link crawled and the removed page retired",
    )  # fmt: skip
    await until(lambda: statuses(web, same).count(304) >= 2, 10, "two 304s")
    async with aiohttp.ClientSession() as s, s.get(server.url + "api/status") as resp:
        st = await resp.json()
    rv = st["revisit"]
    assert rv["not_modified"] >= 2 and rv["changes_detected"] >= 1 and rv["retired"] >= 1
    assert rv["revisits_per_hour"] == rv["revisits"] > 0
    assert 0 < rv["not_modified_share"] <= 1
    assert st["next_due_at"] is not None and rv["upcoming"]
    async with aiohttp.ClientSession() as s, s.get(server.url + "metrics") as resp:
        metrics = await resp.text()
    assert 'p2pcrawl_revisits_total{outcome="not_modified"}' in metrics

    # The ground truth, from the server's side.
    assert statuses(web, same)[0] == 200 and set(statuses(web, same)[1:]) == {304}
    assert statuses(web, changed).count(200) == 2  # the first fetch and the changed page
    assert statuses(web, removed).count(410) == settings.revisit.retire_after
    await asyncio.sleep(2.5)  # a retired page is not asked for again
    assert statuses(web, removed).count(410) == settings.revisit.retire_after
    # Revisits wait their turn like first fetches: the per-host gap, and robots.txt again
    # once its cache expired (RFC 9309 §2.4).
    for times in web.host_times:
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= delay * 0.9
    assert min(web.robots_counts) >= 2

    data_dir = peer.config.data_dir
    await peer.aclose()  # the WARC files are complete once the writer is closed
    recs = records(data_dir)
    by_url: dict[str, list[tuple[str, Any]]] = {}
    for kind, head in recs:
        by_url.setdefault(head.get_header("WARC-Target-URI"), []).append((kind, head))
    first_kind, first = by_url[same][0]
    assert first_kind == "response"
    # Named after its URL and time (capture_record_id), so revisits can refer to it.
    assert uuid.UUID(first.get_header("WARC-Record-ID")[10:-1]).version == 5
    later = by_url[same][1:]
    assert later and all(k == "revisit" for k, _ in later)
    for _, head in later:
        assert head.get_header("WARC-Profile") == PROFILE_NOT_MODIFIED
        assert head.get_header("WARC-Refers-To") == first.get_header("WARC-Record-ID")
        assert head.get_header("WARC-Refers-To-Date") == first.get_header("WARC-Date")
        assert head.get_header("WARC-Payload-Digest") == first.get_header("WARC-Payload-Digest")
    responses = [h for k, h in by_url[changed] if k == "response"]
    assert len(responses) == 2
    assert len({h.get_header("WARC-Payload-Digest") for h in responses}) == 2
    # Revisits after the change refer to the new capture.
    after = [h for k, h in by_url[changed] if k == "revisit"]
    assert all(h.get_header("WARC-Refers-To") == responses[1].get_header("WARC-Record-ID")
               for h in after[-1:])  # fmt: skip
    assert by_url[new_page][0][0] == "response"
    # The hub sends no validators: it is fetched whole and found identical.
    hub = [h for k, h in by_url[web.hub_url] if k == "revisit"]
    assert hub and all(h.get_header("WARC-Profile") == PROFILE_IDENTICAL for h in hub)


async def test_a_peer_with_nothing_due_reports_waiting_and_never_finished(
    changing_web: WebMaker, make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    web: ChangingWeb = await changing_web(hosts=1, pages_per_host=2)
    peer = await make_peer(crawl=settings_for(web, RevisitSettings(every=30, min_interval=30)))
    server = await make_status(peer)
    await peer.add_seeds([web.hub_url])
    states: set[str] = set()
    async with aiohttp.ClientSession() as s:
        deadline = time.monotonic() + 15
        while True:
            async with s.get(server.url + "api/status") as resp:
                st = await resp.json()
            states.add(st["state"])
            if st["state"] == "waiting" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        # The network view and the progress line (Peer.status) say the same.
        async with s.get(server.url + "api/network") as resp:
            net = await resp.json()
    assert net["state"] == "waiting" and net["revisit"]["tracked"] == 3, net
    assert peer.status()["state"] == "waiting"
    assert st["state"] == "waiting", st
    assert "finished" not in states
    assert st["next_due_at"] > time.time() + 20
    assert st["tasks_queued"] == 0 and st["revisit"]["tracked"] == 3  # hub and two pages
    assert peer.engine is not None and peer.engine.revisits is not None
    assert peer.engine.revisits.nothing_due_until() == pytest.approx(st["next_due_at"])


async def test_the_history_survives_a_restart(
    changing_web: WebMaker, make_peer: PeerFactory, tmp_path: Path
) -> None:
    web: ChangingWeb = await changing_web(hosts=1, pages_per_host=2)
    settings = settings_for(web, RevisitSettings(every=2, min_interval=2))
    data = tmp_path / "peer"
    first = await crawl([web.hub_url], settings, data, run_for=1.5)
    assert first.pages_fetched == 3
    page = web.page_urls()[0]
    # A new run finds the history: the page is revisited conditionally, not fetched whole.
    again = await crawl([web.hub_url], settings, data, run_for=2.5)
    assert again.pages_fetched >= 3
    assert statuses(web, page)[0] == 200 and 304 in statuses(web, page)[1:]
    assert statuses(web, page).count(200) == 1


async def test_budgets_and_sitemap_hints_apply_to_revisits(
    changing_web: WebMaker, tmp_path: Path
) -> None:
    web: ChangingWeb = await changing_web(hosts=1, pages_per_host=3)
    # A host's page budget counts revisits as it counts first fetches.
    budget = settings_for(web, RevisitSettings(every=1, max_interval=1))
    budget = CrawlSettings(
        politeness=budget.politeness,
        scope=ScopeSettings(
            allow_domains=budget.scope.allow_domains, allow_private=True, max_pages_per_host=6
        ),
        revisit=budget.revisit,
    )
    engines: list[Engine] = []
    summary = await crawl([web.hub_url], budget, tmp_path / "a", run_for=3.5,
                          on_engine=engines.append)  # fmt: skip
    assert summary.pages_fetched == 6
    assert engines[0].revisits is not None and engines[0].revisits.stats.postponed > 0

    # A sitemap's <lastmod> newer than a page's last visit makes it due now: the sitemap is
    # read again with robots.txt, once its cache expired (here after 1 s), when the host's
    # other pages come up for their revisits.
    other: ChangingWeb = await changing_web(hosts=1, pages_per_host=2, first_ip=210, sitemap=True)
    slow = settings_for(other, RevisitSettings(every=2, min_interval=2), robots_ttl=1.0)
    target, still = other.page_urls()
    hinted: list[int] = []

    async def hint(engine: Engine) -> None:
        await until(lambda: bool(statuses(other, target)), 10, "first fetch")
        rev = engine.revisits
        assert rev is not None and rev.store is not None
        await asyncio.sleep(0.3)  # its visit is recorded once its record is written
        # Not due within this run: only the sitemap can bring it back.
        (row,) = [v for v in await rev.store.due(1 << 62, 10) if v.url == target]
        await rev.store.record([dataclasses.replace(row, due=row.due + 3_600_000)])
        await asyncio.sleep(1.0)  # <lastmod> is later than the visit, to the millisecond
        other.change(target)
        hinted.append(rev.stats.hinted)

    tasks: list[asyncio.Task[None]] = []
    watched: list[Engine] = []

    def watch(engine: Engine) -> None:
        watched.append(engine)
        tasks.append(asyncio.create_task(hint(engine)))

    await crawl([other.hub_url], slow, tmp_path / "b", run_for=6.0, on_engine=watch)
    await asyncio.gather(*tasks)
    assert other.sitemap_counts[0] >= 2  # read again after robots.txt expired
    assert hinted == [0] and watched[0].revisits is not None
    assert watched[0].revisits.stats.hinted >= 1, watched[0].revisits.stats
    # The hub, two pages and the page new with the change: a sitemap read leaves no history
    # row of its own.
    assert watched[0].revisits.tracked == 4
    assert set(other.new_requests) == {other.bases[0] + "/new/0-1.html"}
    assert statuses(other, target)[:2] == [200, 200]  # the change, fetched in full
    assert [v for _, _, v in other.requests(target)][:2] == [0, 1]
    assert 304 in statuses(other, still)  # revisited on its own schedule


@pytest.mark.timeout(120)  # five steps of at most 20 s each, on a loaded machine
async def test_the_history_moves_with_its_key_on_join_crash_and_leave(
    changing_web: WebMaker, make_peer: PeerFactory, tmp_path: Path
) -> None:
    """A host's pages are revisited with the validators of their last visit (answered 304)
    by whichever peer owns the host: B, which took it from A by a join; A, after B crashed
    (a key handed away and back by a crash); C, which took it by a join; A, after C left
    gracefully. A peer that got the done range without the visit history would never
    revisit them at all.

    Each step waits on the owner's own rows, not on the web's log: until a handoff is
    through the old owner revisits too, and its 304s prove nothing of the new one."""
    web: ChangingWeb = await changing_web(hosts=2, pages_per_host=2)
    # Every page every second: each step waits for one round of revisits at most.
    settings = settings_for(web, RevisitSettings(every=1, max_interval=1))
    fast = PeerSettings(  # keyed: the joiners' IDs are chosen next to the host's key
        rpc_timeout=0.3,
        ping_interval=0.3,
        suspicion_timeout=1.0,
        min_peer_age=TEST_MIN_PEER_AGE,
        secret=TEST_SECRET,
    )
    a = await make_peer(crawl=settings, peer=fast)
    assert a.engine is not None and a.engine.revisits is not None
    host = [u for u in web.page_urls() if u.startswith(web.bases[0] + "/")]  # and its hub
    key = a.engine.key_of(host[0])

    async def joiner(name: str) -> Peer:
        (tmp_path / name).mkdir()
        save_identity(tmp_path / name, id_next_to(key))  # the host's owner once it joins
        return await make_peer(crawl=settings, peer=fast, bootstrap=(a.me.addr,))

    async def rows_of(peer: Peer) -> dict[str, Visit]:
        assert peer.engine is not None and peer.engine.revisits is not None
        assert peer.engine.revisits.store is not None
        return {v.url: v for v in await peer.engine.revisits.store.visits_for_keys([key])}

    async def revisited_by(peer: Peer, since: float) -> bool:
        """``peer`` itself was answered 304 for every page of the host since ``since``: a
        row handed to it or copied carries the time of another peer's visit, before it."""
        rows = await rows_of(peer)
        return all(
            u in rows and rows[u].status == 304 and rows[u].fetched >= since * 1000 for u in host
        )

    def through_with_it(peer: Peer) -> bool:
        """``peer`` stopped crawling the host for its new owner, its last fetch ended."""
        assert peer.engine is not None
        flying = peer.engine.in_flight.values()
        return peer.engine.excludes(key) and not any(t.key == key for t in flying)

    await a.add_seeds([web.hub_url])
    await until(lambda: all(statuses(web, u) for u in host), 20, "A fetches the host")
    b = await joiner("peer1")
    await until(lambda: through_with_it(a), 20, "A hands the host to B")

    async def b_has_them() -> bool:
        return set(host) <= set(await rows_of(b))

    await until(b_has_them, 20, "B has the host's visit history")
    # A stays one of the key's replicas and keeps its rows as copies: had B crashed before
    # its first round to its replicas, the host would have had no history anywhere.
    assert set(host) <= set(await rows_of(a))
    since = time.time()
    await until(lambda: revisited_by(b, since), 20, "B revisits the host it joined for")
    # A is one of B's replicas: B's rows reach it within a round.
    for _ in range(40):
        copies = await rows_of(a)
        if all(u in copies and copies[u].etag for u in host):
            break
        await asyncio.sleep(0.1)
    assert all(u in copies and copies[u].etag for u in host), copies
    await b.aclose()  # a crash: no goodbye, nothing handed over
    since = time.time()
    await until(lambda: revisited_by(a, since), 20, "A revisits the host after B's crash")

    c = await joiner("peer2")
    assert c.engine is not None and c.engine.revisits is not None
    await until(lambda: through_with_it(a), 20, "A hands the host to C")
    since = time.time()
    await until(lambda: revisited_by(c, since), 20, "C revisits the host it joined for")
    assert c.engine.revisits.stats.not_modified >= len(host)
    assert c.engine.revisits.stats.first_visits == 0  # nothing fetched in full: it knew them
    await c.leave()
    await c.aclose()  # as `p2pcrawl leave` does: the process exits
    since = time.time()
    await until(lambda: revisited_by(a, since), 20, "A revisits the host after C's leave")
    assert all(s in (200, 304) for u in host for s in statuses(web, u))
    assert all(statuses(web, u).count(200) == 1 for u in host)  # never fetched in full again
