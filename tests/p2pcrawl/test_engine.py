"""The single-peer crawl engine against the generated test web and small hostile servers.

The main crawl runs once per module (in its own thread and event loop) and several tests
check different properties of it: the fetched set, the WARC files, the statuses, robots.txt
and politeness as the server saw them. Other tests run their own, smaller crawls.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import gzip
import hashlib
import heapq
import itertools
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from warcio.archiveiterator import ArchiveIterator

from p2pcrawl.archive import WarcWriteError, WarcWriter, read_warc_urls
from p2pcrawl.crawl import CrawlSummary, Engine, Ledger, crawl, extract_links, urls
from p2pcrawl.crawl import engine as engine_module
from p2pcrawl.settings import CrawlSettings, FetchLimits, PolitenessSettings, ScopeSettings
from p2pcrawl.testing import TestWeb, TestWebConfig
from tests.p2pcrawl.loopback import Handler, fast_settings, free_port, serve

CONFIG = TestWebConfig(hosts=4, pages_per_host=40, slow_host_delay=0.01, large_page_bytes=300_000)
MAX_BODY = 100_000  # below the large page, far above every other page
CRAWL_DELAY = 0.05  # what the test web's robots.txt asks of its crawl-delay host


class RecordingWeb(TestWeb):
    """The test web, also logging when each request to each host started and ended."""

    __test__ = False

    def __init__(self, config: TestWebConfig) -> None:
        super().__init__(config)
        self.spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.max_in_flight: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()

    async def _handle(self, index: int, request: web.BaseRequest) -> web.StreamResponse:
        host = self.hosts[index]
        self._in_flight[host] += 1
        self.max_in_flight[host] = max(self.max_in_flight[host], self._in_flight[host])
        start = time.monotonic()
        try:
            return await super()._handle(index, request)
        finally:
            self._in_flight[host] -= 1
            self.spans[host].append((start, time.monotonic()))


@dataclass
class Crawled:
    web: RecordingWeb
    summary: CrawlSummary
    warc_dir: Path


@dataclass
class Record:
    uri: str
    status: int
    headers: dict[str, str]  # WARC headers
    http: dict[str, str]  # HTTP headers as stored
    payload: bytes


def read_records(warc_dir: Path) -> tuple[list[Record], list[Record]]:
    """(responses, requests) from every WARC file, read back with warcio."""
    responses: list[Record] = []
    requests: list[Record] = []
    for path in sorted(warc_dir.glob("*.warc.gz")):
        with path.open("rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type not in ("response", "request"):
                    continue
                headers = dict(rec.rec_headers.headers)
                http = dict(rec.http_headers.headers) if rec.http_headers else {}
                status = int(rec.http_headers.get_statuscode()) if rec.rec_type == "response" else 0
                item = Record(
                    headers["WARC-Target-URI"], status, headers, http, rec.raw_stream.read()
                )
                (responses if rec.rec_type == "response" else requests).append(item)
    return responses, requests


def sha1_b32(data: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode()


def settings_for(web: TestWeb, *, max_pages: int = 0, max_depth: int = 50) -> CrawlSettings:
    return fast_settings(web.allow_domains, max_pages=max_pages, max_depth=max_depth)


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Crawled:
    data = tmp_path_factory.mktemp("main-crawl")

    async def run() -> Crawled:
        web = RecordingWeb(CONFIG)
        async with web:
            s = fast_settings(web.allow_domains, fetch=FetchLimits(max_body_bytes=MAX_BODY))
            summary = await crawl([web.hub_url], s, data)
        return Crawled(web, summary, data / "warc")

    # Its own loop in its own thread, so every test of this module can share one crawl.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result(timeout=100)


# --- the main crawl ----------------------------------------------------------------------


def test_fetched_set_is_the_ground_truth(crawled: Crawled) -> None:
    web, summary = crawled.web, crawled.summary
    truth = web.ground_truth()
    warc_urls = Counter(read_warc_urls(crawled.warc_dir))
    assert set(warc_urls) == truth
    assert max(warc_urls.values()) == 1
    # The server agrees: every ground-truth URL requested once, nothing else.
    assert set(web.request_counts) == truth
    assert max(web.request_counts.values()) == 1
    assert summary.pages_fetched == len(truth)
    assert summary.queued == 0
    assert summary.errors == {}
    assert "internal" not in summary.stats.errors


def test_every_redirect_and_error_recorded(crawled: Crawled) -> None:
    responses, _ = read_records(crawled.warc_dir)
    expected = crawled.web.expected_status()
    assert {r.uri: r.status for r in responses} == expected
    statuses = Counter(expected.values())
    assert {301, 302, 404, 500} <= set(statuses)
    assert crawled.summary.stats.status == statuses
    assert crawled.summary.stats.redirects == statuses[301] + statuses[302]
    # A 3xx record keeps its Location, so the redirect can be replayed from the archive.
    loop = crawled.web.feature_urls["redirect_loop"]
    assert next(r for r in responses if r.uri == loop).http["Location"] == "loop-b"


def test_robots_fetched_once_per_host(crawled: Crawled) -> None:
    web = crawled.web
    assert web.robots_counts == {host: 1 for host in web.hosts}
    assert crawled.summary.stats.robots_fetched == len(web.hosts)
    assert crawled.summary.stats.robots_disallowed > 0


def test_private_only_fetched_where_robots_allows(crawled: Crawled) -> None:
    web = crawled.web
    private = {url.split("/")[2] for url in web.request_counts if "/private/" in url}
    assert private == {web.no_robots_host}


def test_warc_round_trip(crawled: Crawled) -> None:
    web = crawled.web
    responses, requests = read_records(crawled.warc_dir)
    assert len(responses) == len(requests) == len(web.ground_truth())
    by_id = {r.headers["WARC-Record-ID"]: r for r in responses}
    for req in requests:
        resp = by_id[req.headers["WARC-Concurrent-To"]]
        assert req.uri == resp.uri
        assert req.payload == b""
    assert {r.headers["WARC-Concurrent-To"] for r in requests} == set(by_id)
    large = web.feature_urls["large"]
    for r in responses:
        assert r.headers["WARC-Payload-Digest"] == sha1_b32(r.payload), r.uri
        status, headers, body = web.render(r.uri)
        assert r.status == status
        if headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)  # stored decoded, and the header says so
            assert r.http["X-Crawler-Original-Content-Encoding"] == "gzip"
            assert "Content-Encoding" not in r.http
        if r.uri == large:
            assert r.payload == body[:MAX_BODY]
        else:
            assert r.payload == body, r.uri
            assert "WARC-Truncated" not in r.headers
        assert int(r.http["Content-Length"]) == len(r.payload)


def test_truncated_page_recorded_and_its_links_followed(crawled: Crawled) -> None:
    web = crawled.web
    responses, _ = read_records(crawled.warc_dir)
    large = next(r for r in responses if r.uri == web.feature_urls["large"])
    assert large.headers["WARC-Truncated"] == "length"
    assert len(large.payload) == MAX_BODY < CONFIG.large_page_bytes
    assert web.feature_urls["large_child"] in {r.uri for r in responses}
    assert crawled.summary.stats.truncated == 1


def test_crawl_delay_gaps_between_requests(crawled: Crawled) -> None:
    """Server-side timestamps: each request to the Crawl-delay host starts at least the
    delay after the previous one started, and after it ended (the politeness rule, not a
    speed measurement)."""
    web = crawled.web
    assert web.crawl_delay_host is not None
    robots = web.robots_txt(web.hosts.index(web.crawl_delay_host))
    assert robots is not None and f"Crawl-delay: {CRAWL_DELAY}" in robots
    spans = sorted(web.spans[web.crawl_delay_host])
    assert len(spans) > 10
    assert min(b[0] - a[1] for a, b in itertools.pairwise(spans)) >= 0
    # The server stamps a request when it reads it, which this process's loop may delay
    # by a few milliseconds more for one request than for the next; over the whole run
    # those delays cancel out but for the first and the last.
    intervals = [b[0] - a[0] for a, b in itertools.pairwise(spans)]
    assert min(intervals) >= CRAWL_DELAY - 0.01
    assert (spans[-1][0] - spans[0][0]) / len(intervals) >= CRAWL_DELAY - 0.001
    # The other hosts ask for no delay and we set none: no gap is imposed there, which is what
    # makes the check above about Crawl-delay rather than about a slow crawl.
    assert robots.count("Crawl-delay") == 1


def test_never_two_requests_to_one_host_at_once(crawled: Crawled) -> None:
    web = crawled.web
    assert set(web.max_in_flight) == set(web.hosts)
    assert max(web.max_in_flight.values()) == 1
    spans = {h: sorted(s) for h, s in web.spans.items()}
    for host, s in spans.items():
        for a, b in itertools.pairwise(s):
            assert b[0] >= a[1], host


# --- crawls of their own ----------------------------------------------------------------


@pytest.fixture
async def small_web() -> AsyncIterator[TestWeb]:
    async with TestWeb(CONFIG) as web:
        yield web


@pytest.mark.parametrize("max_pages", [1, 7, 20])
async def test_max_pages_stops_at_exactly_n(
    small_web: TestWeb, tmp_path: Path, max_pages: int
) -> None:
    summary = await crawl(
        [small_web.hub_url], settings_for(small_web, max_pages=max_pages), tmp_path
    )
    assert summary.pages_fetched == max_pages
    assert len(read_warc_urls(tmp_path / "warc")) == max_pages
    assert sum(small_web.request_counts.values()) == max_pages
    assert summary.queued > 0  # the rest waits in the task store for the next run


def expected_within_depth(web: TestWeb, max_depth: int) -> set[str]:
    """Ground-truth URLs within ``max_depth`` links of the hub; a redirect and a canonical
    URL keep their page's depth."""
    truth = web.ground_truth()
    best: dict[str, int] = {}
    heap = [(0, web.hub_url)]
    while heap:
        depth, url = heapq.heappop(heap)
        if url in best:
            continue
        best[url] = depth
        status, headers, body = web.render(url)
        found: list[tuple[int, str]] = []
        if 300 <= status < 400:
            target = urls.resolve(url, headers["Location"])
            if target is not None:
                found.append((depth, target))
        elif status == 200 and headers["Content-Type"].startswith("text/html"):
            if headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            page = extract_links(body, url)
            found.extend((depth + 1, u) for u in page.links)
            if page.canonical is not None:
                found.append((depth, page.canonical))  # the same document: its depth
        for d, u in found:
            if d <= max_depth and u in truth and u not in best:
                heapq.heappush(heap, (d, u))
    return set(best)


@pytest.mark.parametrize("max_depth", [0, 1])
async def test_max_depth(small_web: TestWeb, tmp_path: Path, max_depth: int) -> None:
    expected = expected_within_depth(small_web, max_depth)
    if max_depth == 1:
        assert set(small_web.hosts) == {u.split("/")[2] for u in expected}
        assert small_web.feature_urls["redirect_chain_end"] in expected  # via 301 + 302
    summary = await crawl(
        [small_web.hub_url], settings_for(small_web, max_depth=max_depth), tmp_path
    )
    assert Counter(read_warc_urls(tmp_path / "warc")) == Counter(expected)
    assert summary.stats.too_deep > 0
    assert summary.queued == 0


async def test_partition_by_url_gives_the_ground_truth(small_web: TestWeb, tmp_path: Path) -> None:
    summary = await crawl([small_web.hub_url], settings_for(small_web), tmp_path, partition="url")
    warc_urls = Counter(read_warc_urls(tmp_path / "warc"))
    assert set(warc_urls) == small_web.ground_truth()
    assert max(warc_urls.values()) == 1
    assert summary.queued == 0


async def test_restart_resumes_without_refetching(small_web: TestWeb, tmp_path: Path) -> None:
    first = await crawl([small_web.hub_url], settings_for(small_web, max_pages=20), tmp_path)
    assert first.pages_fetched == 20 and first.queued > 0
    first_urls = set(read_warc_urls(tmp_path / "warc"))
    assert len(first_urls) == 20
    second = await crawl([small_web.hub_url], settings_for(small_web), tmp_path)
    all_urls = Counter(read_warc_urls(tmp_path / "warc"))
    truth = small_web.ground_truth()
    assert set(all_urls) == truth
    assert max(all_urls.values()) == 1  # no URL archived by both runs
    assert second.pages_fetched == len(truth) - 20
    assert set(small_web.request_counts) == truth
    assert max(small_web.request_counts.values()) == 1  # and the server saw none twice
    assert second.queued == 0


# --- Retry-After ---------------------------------------------------------------------------


def _overloaded_once(status: int) -> Handler:
    seen: Counter[str] = Counter()

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/robots.txt":
            return web.Response(status=404)
        seen[request.path] += 1
        if seen[request.path] == 1:
            return web.Response(status=status, headers={"Retry-After": "1"})
        return web.Response(text="<p>fine now</p>", content_type="text/html")

    return handle


async def _always_503(request: web.BaseRequest) -> web.StreamResponse:
    if request.path == "/robots.txt":
        return web.Response(status=404)
    return web.Response(status=503, headers={"Retry-After": "0"})


async def test_retry_after_backs_off_then_records_the_answer(tmp_path: Path) -> None:
    """429 and 503 with Retry-After: the page is asked again after the wait and archived once,
    with the answer that finally came; the overload answers are counted, not archived. A
    server that never recovers is archived with its last 503 after max_retries."""
    async with (
        serve(_overloaded_once(503), "127.0.0.8") as s503,
        serve(_overloaded_once(429), "127.0.0.9") as s429,
        serve(_always_503, "127.0.0.10") as down,
    ):
        servers = (s503, s429, down)
        seeds = [s.base + "/" for s in servers]
        settings = fast_settings([s.host for s in servers], max_retries=2)
        summary = await crawl(seeds, settings, tmp_path)
        for s in (s503, s429):
            assert s.paths["/"] == 2
            spans = s.spans[-2:]
            assert spans[1][0] - spans[0][1] >= 1.0 - 1e-3  # Retry-After honoured
        assert down.paths["/"] == 3  # the first try and max_retries=2 more
    responses, _ = read_records(tmp_path / "warc")
    assert {r.uri: r.status for r in responses} == {
        s503.base + "/": 200,
        s429.base + "/": 200,
        down.base + "/": 503,
    }
    assert summary.pages_fetched == 3
    assert summary.stats.retries == 4
    assert summary.stats.status == {200: 2, 503: 1 + 3, 429: 1}
    assert summary.queued == 0


REFILL_DELAY = 0.4  # Crawl-delay of the host that drains and comes back
SLOW_PAGE_S = 2.5  # beyond the housekeeping's second, so the drained host is forgotten


async def test_crawl_delay_holds_for_a_host_that_drained_and_came_back(tmp_path: Path) -> None:
    """Host A's queue empties after its first page and the engine forgets the idle host; its
    next links arrive seconds later, from a slow page of host B. Its robots.txt is cached (a
    day) and not fetched again, and its Crawl-delay must still space the new requests."""

    async def host_a(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/robots.txt":
            return web.Response(text=f"User-agent: *\nCrawl-delay: {REFILL_DELAY}\n")
        return web.Response(text="<p>leaf</p>", content_type="text/html")

    async with serve(host_a, "127.0.0.12") as a:

        async def host_b(request: web.BaseRequest) -> web.StreamResponse:
            if request.path == "/robots.txt":
                return web.Response(status=404)
            if request.path == "/":
                return web.Response(text='<a href="/slow">s</a>', content_type="text/html")
            await asyncio.sleep(SLOW_PAGE_S)
            links = "".join(f'<a href="{a.base}/p{i}">p</a>' for i in range(4))
            return web.Response(text=links, content_type="text/html")

        async with serve(host_b, "127.0.0.13") as b:
            settings = fast_settings([a.host, b.host])
            summary = await crawl([a.base + "/", b.base + "/"], settings, tmp_path)
    assert summary.pages_fetched == 2 + 5
    assert a.paths["/robots.txt"] == 1
    spans = sorted(a.spans)  # robots.txt and / at the start, then the four links
    later = [sp for sp in spans if sp[0] >= spans[0][0] + SLOW_PAGE_S]
    assert len(later) == 4, spans
    gaps = [y[0] - x[1] for x, y in itertools.pairwise(later)]
    assert min(gaps) >= REFILL_DELAY - 1e-3, gaps


# --- hostile pages --------------------------------------------------------------------------

BOMB_LINKS = 20_000
IN_SCOPE_BOMB_TARGETS = 50


async def _hostile(request: web.BaseRequest) -> web.StreamResponse:
    path = request.path
    if path == "/robots.txt":
        return web.Response(status=404)
    if path == "/":
        links = ["/garbage", "/bomb", "/longhref", "/js-redirect", "/long-location", "/nul"]
        body = "".join(f'<a href="{u}">{u}</a>' for u in links)
        return web.Response(text=body, content_type="text/html")
    if path == "/garbage":
        noise = random.Random(7).randbytes(200_000)
        return web.Response(body=noise, content_type="text/html")
    if path == "/bomb":
        parts = []
        for i in range(BOMB_LINKS):
            if i % 2:
                parts.append(f'<a href="http://h{i}.example.invalid/">x</a>')
            else:
                parts.append(f'<a href="/b/{i // 2 % IN_SCOPE_BOMB_TARGETS}.html">x</a>')
        return web.Response(text="".join(parts), content_type="text/html")
    if path == "/longhref":
        body = f'<a href="/x?{"a" * 100_000}">long</a><a href="/ok.html">ok</a>'
        return web.Response(text=body, content_type="text/html")
    if path == "/js-redirect":
        return web.Response(status=302, headers={"Location": "javascript:alert(1)"})
    if path == "/long-location":
        return web.Response(status=302, headers={"Location": "/y?" + "b" * 70_000})
    if path == "/nul":
        raw = b'<a href="/nul\x00t.html">nul</a><base href="javascript:void(0)"><a href="ok2">'
        return web.Response(body=raw, content_type="text/html")
    return web.Response(text="<p>leaf</p>", content_type="text/html")


async def test_hostile_pages_do_not_break_the_crawl(tmp_path: Path) -> None:
    async with serve(_hostile, "127.0.0.11") as server:
        settings = fast_settings([server.host], max_retries=1)
        summary = await crawl([server.base + "/"], settings, tmp_path)
        paths = dict(server.paths)
    stats = summary.stats
    assert "internal" not in summary.errors  # no exception escaped a worker
    assert summary.queued == 0
    assert stats.errors["bad_redirect"] == 1  # javascript: Location
    # The link bomb: at most max_links_per_page links kept, in-scope duplicates fetched once.
    for i in range(IN_SCOPE_BOMB_TARGETS):
        assert paths[f"/b/{i}.html"] == 1
    assert stats.out_of_scope > 0
    assert stats.links_extracted <= FetchLimits().max_links_per_page + 100
    # The 100 KB href is refused, the link after it followed; nothing too long was requested.
    assert paths["/ok.html"] == 1
    assert max(len(p) for p in paths) <= FetchLimits().max_url_length
    # A 70 KB Location header is more than the client parses: a protocol error, retried
    # max_retries times like any protocol error, then counted and given up.
    assert paths["/long-location"] == 2
    assert stats.errors["protocol"] == 2
    # Every other page answered once and was archived, garbage included.
    assert max(n for p, n in paths.items() if p != "/long-location") == 1
    archived = Counter(read_warc_urls(tmp_path / "warc"))
    assert max(archived.values()) == 1
    assert server.base + "/garbage" in archived
    assert summary.pages_fetched == len(archived)


# --- a host that never answers --------------------------------------------------------------


async def test_dead_host_does_not_stall_the_crawl(tmp_path: Path) -> None:
    settings = CrawlSettings(
        concurrency=2,
        politeness=PolitenessSettings(
            delay=0, politeness_factor=0, robots_error_ttl=0.05, max_retries=2
        ),
        scope=ScopeSettings(allow_domains=("127.0.0.1",), allow_private=True),
    )
    async with asyncio.timeout(5):
        summary = await crawl([f"http://127.0.0.1:{free_port()}/"], settings, tmp_path)
    assert summary.queued == 0
    assert summary.errors.get("connect", 0) >= 1


# --- the WARC writer dies mid-crawl -------------------------------------------------------


async def test_a_dead_warc_writer_stops_fetching_and_loses_no_url(
    small_web: TestWeb, tmp_path: Path
) -> None:
    """Pages count as done only once archived: when the writer process dies, the engine stops
    fetching, and a later run on the same data directory archives exactly what is missing."""
    settings = settings_for(small_web)
    ledger = await Ledger.open(tmp_path / "stores")
    warc = WarcWriter(tmp_path / "warc", prefix="first")
    await warc.start()
    engine = Engine(settings, ledger, warc=warc)
    try:
        await engine.start()
        await engine.add_seeds([small_web.hub_url])
        async with asyncio.timeout(20):
            while warc.records_written < 10:
                await engine.wait_progress(0.01)
            assert warc.pid is not None
            os.kill(warc.pid, signal.SIGKILL)
            while engine.failure is None or engine.in_flight:
                await engine.wait_progress(0.1)
        assert isinstance(engine.failure, WarcWriteError)
        stopped_at = engine.stats.pages_fetched
        await asyncio.sleep(0.3)
        assert engine.stats.pages_fetched == stopped_at  # no fetching after the failure
        assert ledger.queued > 0
    finally:
        await engine.aclose()
        with contextlib.suppress(WarcWriteError):
            await warc.aclose()
        await ledger.aclose()
    first = Counter(read_warc_urls(tmp_path / "warc"))
    assert 0 < len(first) < len(small_web.ground_truth())

    small_web.request_counts.clear()
    await crawl([small_web.hub_url], settings, tmp_path)
    archived = Counter(read_warc_urls(tmp_path / "warc"))
    assert set(archived) == small_web.ground_truth()
    # Fetched again only if its record reached the file but its answer never left the writer.
    assert sum(archived.values()) - len(archived) <= 20


# --- one long host does not fill the frontier window ----------------------------------------


async def _plain_page(request: web.BaseRequest) -> web.StreamResponse:
    if request.path == "/robots.txt":
        return web.Response(status=404)
    return web.Response(text="<p>no links</p>", content_type="text/html")


async def test_a_paused_engine_fetches_the_moment_its_last_pause_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A joiner's engine is paused until its join is through, and the hosts handed to it
    stand still until it fetches: its workers wake when the last pause is released, not at
    their next look (here an hour away). One pause of two released starts nothing."""
    monkeypatch.setattr(engine_module, "NEAR_EVERY_S", 3600.0)
    async with serve(_plain_page, "127.0.0.30") as server:
        settings = fast_settings([server.host], concurrency=2)
        ledger = await Ledger.open(tmp_path / "stores")
        engine = Engine(settings, ledger, warc=None)
        assert len(await ledger.accept(engine.seed_tasks([f"{server.base}/p1"]))) == 1
        try:
            engine.pause("joining")
            engine.pause("stall")
            await engine.start()
            await asyncio.sleep(0.3)  # the workers are in their paused wait
            engine.resume("stall")
            await asyncio.sleep(0.3)
            assert not server.paths
            engine.resume("joining")
            async with asyncio.timeout(20):
                while ledger.done_count < 1:
                    await engine.wait_progress(0.1)
        finally:
            await engine.aclose()
            await ledger.aclose()
    assert server.paths["/p1"] == 1


async def test_a_long_host_queue_does_not_fill_the_window(tmp_path: Path) -> None:
    """The two levels of High-performance crawl scheduling: the store holds 300 URLs of one host
    before 10 of each of four others. With a window of 60 URLs and 20 per host, every host has
    work in the window at once, and the long host's queue is read again by key as it drains."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(serve(_plain_page, f"127.0.0.{20 + i}"))
            for i in range(5)
        ]
        base = fast_settings([s.host for s in servers], concurrency=4)
        settings = dataclasses.replace(base, frontier_window=60, host_queue_window=20)
        ledger = await Ledger.open(tmp_path / "stores")
        engine = Engine(settings, ledger, warc=None)
        long_host, *short_hosts = servers
        tasks = [engine.seed_tasks([f"{long_host.base}/p{i}"])[0] for i in range(300)]
        for s in short_hosts:
            tasks += [engine.seed_tasks([f"{s.base}/p{i}"])[0] for i in range(10)]
        assert len(await ledger.accept(tasks)) == 340
        try:
            engine.pause("test")  # fill the window, fetch nothing yet
            await engine.start()
            async with asyncio.timeout(10):
                while len(engine.frontier) < 60:
                    await engine.wait_progress(0.01)
            queued = {h: len(hq.tasks) for h, hq in engine.frontier.hosts.items()}
            assert queued == {
                f"{long_host.host}:{long_host.port}": 20,
                **{f"{s.host}:{s.port}": 10 for s in short_hosts},
            }
            engine.resume("test")
            async with asyncio.timeout(30):
                while not engine.idle:
                    await engine.wait_progress(0.1)
        finally:
            await engine.aclose()
            await ledger.aclose()
    control = {"/robots.txt": 1, "/sitemap.xml": 1}  # each host's robots.txt names no sitemap
    assert long_host.paths == Counter({**control, **{f"/p{i}": 1 for i in range(300)}})
    for s in short_hosts:
        assert s.paths == Counter({**control, **{f"/p{i}": 1 for i in range(10)}})
    assert ledger.queued == 0 and ledger.done_count == 340
