"""A peer crawls the test web with its hostile hosts mixed in (``TestWebConfig.hostile``).

One crawl per module; each test checks what one hostile case left behind: what is recorded
in the WARC, what was retried, what was skipped, and that the regular web still reached its
ground truth while the status page kept answering.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from warcio.archiveiterator import ArchiveIterator

from p2pcrawl.crawl import CrawlStats
from p2pcrawl.network import Peer, PeerConfig
from p2pcrawl.settings import (
    CrawlSettings,
    FetchLimits,
    PeerSettings,
    PolitenessSettings,
    ScopeSettings,
)
from p2pcrawl.testing import HostileConfig, HostileWeb, TestWeb, TestWebConfig
from p2pcrawl.testing.hostile import GUARD_TARGETS, RESET_LINKS
from p2pcrawl.ui import StatusServer

MAX_RETRIES = 2
PAGES_PER_HOST = 150  # the trap host's page budget (the regular hosts have fewer pages)
URLS_PER_HOST = 200  # and its URL budget (the regular hosts have fewer URLs than this)
TOTAL_TIMEOUT = 2.0  # the tarpit is cut here; the slow robots.txt never answers within it


@dataclass
class Crawled:
    web: TestWeb
    hostile: HostileWeb
    stats: CrawlStats
    status: dict[str, Any]
    records: dict[str, list[dict[str, Any]]]  # URL -> its response records
    status_answers: int = 0
    status_failures: list[str] = field(default_factory=list)
    metrics: str = ""


def _read_records(directory: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.warc.gz")):
        with path.open("rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type != "response":
                    continue
                url = rec.rec_headers.get_header("WARC-Target-URI")
                out.setdefault(url, []).append(
                    {
                        "truncated": rec.rec_headers.get_header("WARC-Truncated"),
                        "status": rec.http_headers.get_statuscode(),
                        "body": rec.content_stream().read(),
                    }
                )
    return out


async def _crawl(tmp: Path) -> Crawled:
    hostile_config = HostileConfig(
        drip_interval=0.2, slow_robots_delay=3 * TOTAL_TIMEOUT, trap_fanout=1
    )
    config = TestWebConfig(
        hosts=3,
        pages_per_host=30,
        slow_host_delay=0.01,
        large_page_bytes=0,
        hostile=True,
        hostile_config=hostile_config,
    )
    async with TestWeb(config) as web:
        assert web.hostile is not None
        settings = CrawlSettings(
            concurrency=8,
            fetch=FetchLimits(total_timeout=TOTAL_TIMEOUT, read_timeout=TOTAL_TIMEOUT),
            politeness=PolitenessSettings(
                delay=0.0, politeness_factor=0.0, max_retries=MAX_RETRIES, robots_error_ttl=0.2
            ),
            # Loopback only: the guard host's redirects point at addresses that must stay
            # refused, and nothing may ever be sent there.
            scope=ScopeSettings(
                allow_domains=tuple(web.crawl_domains),
                allow_loopback=True,
                max_pages_per_host=PAGES_PER_HOST,
                max_urls_per_host=URLS_PER_HOST,
            ),
        )
        peer = Peer(
            PeerConfig(data_dir=tmp / "peer", crawl=settings, peer=PeerSettings(replicas=0))
        )
        await peer.start()
        server = StatusServer(peer, "127.0.0.1", 0)
        await server.start()
        try:
            crawled = await _run(peer, server, web)
        finally:
            await server.aclose()
            await peer.aclose()
        crawled.records = _read_records(tmp / "peer" / "warc")
        return crawled


async def _run(peer: Peer, server: StatusServer, web: TestWeb) -> Crawled:
    assert web.hostile is not None and peer.engine is not None
    await peer.add_seeds([web.hub_url])
    answers = 0
    failures: list[str] = []
    metrics = ""
    # Every status request is bounded by 1 s: the page must answer within that while the
    # peer fetches the tarpit, parses the bomb and walks the trap.
    timeout = aiohttp.ClientTimeout(total=1.0)
    quiet = 0
    status: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(1200):  # at most ~2 minutes
            for path in ("", "api/status", "metrics"):
                try:
                    async with session.get(server.url + path) as resp:
                        assert resp.status == 200
                        if path == "api/status":
                            status = await resp.json()
                        elif path == "metrics":
                            metrics = await resp.text()
                        else:
                            await resp.read()
                    answers += 1
                except (TimeoutError, aiohttp.ClientError) as exc:
                    failures.append(f"{path or '/'}: {exc!r}")
            idle = status.get("pages_fetched", 0) > 0 and peer.engine.idle
            quiet = quiet + 1 if idle else 0
            if quiet >= 5:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the crawl did not finish: {status}")
    return Crawled(
        web=web,
        hostile=web.hostile,
        stats=peer.engine.stats,
        status=status,
        records={},
        status_answers=answers,
        status_failures=failures,
        metrics=metrics,
    )


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crawled]:
    tmp = tmp_path_factory.mktemp("hostile")
    result: list[Crawled] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(asyncio.run(_crawl(tmp)))
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    # Its own thread and loop, so the module-scoped crawl does not hold pytest-asyncio's.
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    yield result[0]


def test_the_regular_web_reaches_its_ground_truth(crawled: Crawled) -> None:
    fetched = set(crawled.web.request_counts)
    assert fetched == crawled.web.ground_truth()
    assert all(n == 1 for n in crawled.web.request_counts.values())


def test_the_status_page_answered_throughout(crawled: Crawled) -> None:
    assert crawled.status_failures == []
    assert crawled.status_answers >= 30
    assert "p2pcrawl_loop_lag_p99_seconds" in crawled.metrics
    assert crawled.status["loop_lag_max_ms"] >= 0


def test_tarpit_is_archived_cut_by_time_and_its_link_followed(crawled: Crawled) -> None:
    h = crawled.hostile
    (record,) = crawled.records[h.url("tarpit", "/tarpit.html")]
    assert record["truncated"] == "time"
    assert record["status"] == "200"
    assert b'href="/tarpit/child.html"' in record["body"]
    assert h.requests["tarpit"]["/tarpit.html"] == 1  # a timeout mid-body is not retried
    assert h.requests["tarpit"]["/tarpit/child.html"] == 1
    assert crawled.stats.truncated_by["time"] == 1


def test_reset_mid_body_is_retried_then_archived_as_a_disconnect(crawled: Crawled) -> None:
    h = crawled.hostile
    assert h.requests["reset"]["/reset.html"] == 1 + MAX_RETRIES
    (record,) = crawled.records[h.url("reset", "/reset.html")]
    assert record["truncated"] == "disconnect"
    assert len(record["body"]) == h.config.reset_after
    for i in range(RESET_LINKS):
        assert h.requests["reset"][f"/reset/child-{i}.html"] == 1
    assert crawled.stats.truncated_by["disconnect"] == 1
    assert crawled.stats.errors["disconnect"] == MAX_RETRIES + 2  # reset.html, reset-once


def test_a_reset_that_heals_is_archived_whole(crawled: Crawled) -> None:
    h = crawled.hostile
    assert h.requests["reset"]["/reset-once.html"] == 2
    (record,) = crawled.records[h.url("reset", "/reset-once.html")]
    assert record["truncated"] is None
    assert record["body"].endswith(b"</html>\n")


def test_nested_tag_bomb_is_parsed_within_a_bound_and_every_link_followed(
    crawled: Crawled,
) -> None:
    h = crawled.hostile
    (record,) = crawled.records[h.url("bomb", "/bomb.html")]
    assert record["truncated"] is None
    assert record["body"].count(b"<div>") == h.config.bomb_depth
    for where in ("before", "inside", "after"):
        assert h.requests["bomb"][f"/bomb/{where}.html"] == 1
    assert crawled.stats.parse_bounded["depth"] == 1
    assert crawled.stats.parsed_in_worker >= 1


def test_link_trap_is_bounded_by_the_host_budgets(crawled: Crawled) -> None:
    h = crawled.hostile
    trap_pages = [u for u in crawled.records if u.startswith(h.base("trap"))]
    assert 0 < len(trap_pages) <= PAGES_PER_HOST
    budget = crawled.stats.budget
    assert budget["host_urls"] > 0 and budget["host_pages"] > 0
    assert budget["repeating_path"] > 0
    assert budget["session_id"] > 0
    assert not any("sid=" in u or "jsessionid" in u for u in crawled.records)
    control = h.requests["trap"]["/robots.txt"] + h.requests["trap"]["/sitemap.xml"]
    assert sum(h.requests["trap"].values()) - control <= PAGES_PER_HOST


def test_guard_redirects_never_reach_a_refused_address(crawled: Crawled) -> None:
    h = crawled.hostile
    stats = crawled.stats
    # robots.txt redirected to the metadata address: refused, and treated as unavailable.
    assert stats.errors["robots_redirect_refused"] == 1
    assert stats.errors["forbidden"] >= 1
    assert h.requests["guard"]["/robots.txt"] == 1
    # So the host's own pages are crawled; the redirects into refused space are fetched as
    # redirects, and their targets never are.
    assert h.requests["guard"]["/guard/ok.html"] == 1
    for name in GUARD_TARGETS:
        if name != "robots":
            assert h.requests["guard"][f"/guard/{name}"] == 1
    targets = {t.rstrip("/") for t in GUARD_TARGETS.values()}
    assert not any(u.rstrip("/") in targets for u in crawled.records)


def test_slow_robots_holds_its_host_and_nothing_else(crawled: Crawled) -> None:
    h = crawled.hostile
    # Each try timed out: an origin that does not answer. After the retries it is given up,
    # and its URL ends as an error, never fetched.
    assert h.requests["slowrobots"]["/robots.txt"] == MAX_RETRIES + 1
    assert h.requests["slowrobots"]["/index.html"] == 0
    assert crawled.stats.errors["host_unreachable"] == 1


async def test_the_fetcher_refuses_shared_and_embedded_addresses_without_connecting() -> None:
    from p2pcrawl.crawl import Fetcher

    settings = CrawlSettings(scope=ScopeSettings(allow_loopback=True))
    fetcher = Fetcher(settings)
    await fetcher.start()
    try:
        for url in GUARD_TARGETS.values():
            res = await fetcher.fetch(url)
            assert res.error == "forbidden", url
            assert res.elapsed == 0.0  # refused before any connection was tried
    finally:
        await fetcher.aclose()


def test_sitemap_bombs_are_cut_counted_and_never_fatal(crawled: Crawled) -> None:
    """Entity bombs and XXE refused, a gzip bomb cut at 50 MB inflated, a file of 60,000
    URLs cut at 50,000, malformed XML cut where it breaks, an index chain cut at two levels:
    each counted, the peer kept answering (test above), the good URLs crawled."""
    bounded = crawled.stats.sitemap_bounded
    assert bounded["entities"] >= 2, dict(bounded)  # laughs.xml and xxe.xml
    for why in ("too_large", "too_many_urls", "malformed", "depth"):
        assert bounded[why] >= 1, (why, dict(bounded))
    req = crawled.hostile.requests["sitemapbomb"]
    for name in ("laughs.xml", "xxe.xml", "huge.xml.gz", "many.xml", "broken.xml", "deep-0.xml"):
        assert req[f"/sitemaps/{name}"] == 1, name
    assert req["/from-broken/1.html"] == req["/from-broken/2.html"] == 1
    assert req["/from-deep/0.html"] == req["/from-deep/1.html"] == 1
    assert req["/from-deep/2.html"] == 0 and req["/sitemaps/deep-3.xml"] == 0
    assert not any(p.startswith("/many/") for p in crawled.hostile.requests["otherbot"])


def test_a_sitemap_lists_only_its_own_host(crawled: Crawled) -> None:
    h = crawled.hostile
    assert h.requests["sitemapcross"]["/listed.html"] == 1
    assert h.requests["otherbot"]["/listed-by-another.html"] == 0
    assert crawled.stats.sitemap_bounded["cross_host"] >= 1


def test_a_nofollow_header_for_another_crawler_does_not_apply(crawled: Crawled) -> None:
    req = crawled.hostile.requests["otherbot"]
    assert req["/child.html"] == 1  # X-Robots-Tag: otherbot: nofollow
    assert req["/ours.html"] == 1
    assert req["/never.html"] == 0  # X-Robots-Tag: p2pcrawl: nofollow
