"""Site signals with real peer processes: a web with sitemaps, robots headers, canonical
links and page requisites (on its hosts and a CDN outside the scope), crawled at the default
settings but for the delay; and ``--partition domain`` with two subdomains of one site."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from selectolax.lexbor import LexborHTMLParser
from warcio.archiveiterator import ArchiveIterator

from p2pcrawl.crawl import urls
from p2pcrawl.testing import TestWeb, TestWebConfig
from p2pcrawl.testing.signals import CDN_IP
from p2pcrawl.ui.export import run_export
from tests.integration.conftest import crawl_args, leave_all, start_mesh

pytestmark = pytest.mark.slow


@pytest.fixture
async def signals_web() -> AsyncIterator[TestWeb]:
    config = TestWebConfig(
        hosts=3, pages_per_host=20, slow_host_delay=0.02, large_page_bytes=0, signals=True
    )
    async with TestWeb(config) as w:
        yield w


async def test_two_peers_crawl_sitemaps_directives_canonicals_and_requisites(
    signals_web: TestWeb, make_cluster: Any
) -> None:
    web = signals_web
    cluster = await make_cluster(crawl_args(web, "--delay", "0"))
    founder = (await start_mesh(cluster, 2))[0]
    await cluster.api(founder, "/api/seed", "POST", {"urls": [web.hub_url]})
    final = await cluster.wait_finished(timeout=90)
    read = sum(s["signals"]["sitemaps_read"] for s in final)
    fetched_requisites = sum(s["signals"]["requisites_fetched"] for s in final)
    counts = await leave_all(cluster)
    truth = web.ground_truth()
    assert set(counts) == truth and max(counts.values()) == 1
    assert max(web.request_counts.values()) == 1
    f = web.feature_urls
    # Reachable only through a sitemap: plain, in an index, gzip, text, vouched for by
    # robots.txt from another host, guessed at /sitemap.xml. Listed for another host: not.
    for name in ("plain-1", "gz-1", "gz-2", "text-1", "vouched", "guessed"):
        assert f[f"sitemap_{name}"] in counts, name
    assert f["sitemap_cross_host"] not in counts
    # Each sitemap was read once in the whole network; robots.txt named none on host 1 and
    # host 2, so /sitemap.xml was tried there.
    assert set(web.sitemap_counts.values()) == {1}
    assert read == 6  # index, plain, gzip, text, vouched, host 1's /sitemap.xml
    # Robots directives: nofollow from the header and from <meta name="p2pcrawl"> obeyed,
    # the same for another crawler ignored; rel=ugc/sponsored and canonicals followed.
    assert f["header_nofollow_target"] not in counts and f["meta_p2pcrawl_target"] not in counts
    for name in ("header_otherbot_target", "meta_otherbot_target", "ugc_target"):
        assert f[name] in counts, name
    assert f["canonical_by_header"] in counts and f["canonical_target"] in counts
    captures = _jsonl(cluster)
    assert captures[f["noarchive"]]["robots"] == ["noarchive", "noindex"]
    assert captures[f["header_nofollow"]]["robots"] == ["nofollow"]
    assert captures[f["canonical_header"]]["canonical"] == f["canonical_by_header"]
    # Requisites: all of them, the CDN's included, and the ground truth counts them.
    requisites = {u for u in truth if "/static/" in u or CDN_IP in u}
    assert len(requisites) == 3 * 8 + 3 * 2 + 1 and requisites <= set(counts)
    assert fetched_requisites == len(requisites)
    _replay_has_everything(cluster, web.bases[1] + "/s3/p3.html")


def _jsonl(cluster: Any) -> dict[str, dict[str, Any]]:
    out = io.StringIO()
    run_export([p.data for p in cluster.peers], "jsonl", out, lambda _: None)
    return {row["url"]: row for row in map(json.loads, out.getvalue().splitlines())}


def _replay_has_everything(cluster: Any, page: str) -> None:
    """What a replay of ``page`` from the WARCs asks for is in their CDXJ index (what pywb
    replays from): the page's stylesheets, scripts and images, and what its stylesheets
    reference in turn, read back from the archived records, not from the live web."""
    out = io.StringIO()
    run_export([p.data for p in cluster.peers], "cdxj", out, lambda _: None)
    indexed = {json.loads(line.split(" ", 2)[2])["url"] for line in out.getvalue().splitlines()}
    bodies = _bodies([p.data for p in cluster.peers])
    tree = LexborHTMLParser(bodies[page])
    wanted = [n.attributes["href"] for n in tree.css('link[rel="stylesheet"]')]
    wanted += [n.attributes["src"] for n in tree.css("script[src], img[src]")]
    wanted += [str(n.attributes["srcset"]).split()[0] for n in tree.css("img[srcset]")]
    needed = {urls.resolve(page, str(w)) for w in wanted}
    for css in [u for u in needed if u and u.endswith(".css")]:
        for ref in _CSS_REF.findall(_no_comments(bodies[css])):
            needed.add(urls.resolve(css, ref))
    assert None not in needed and len(needed) >= 9
    assert needed <= indexed, sorted(str(u) for u in needed - indexed)


_CSS_REF = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])([^"')\s]+)""")


def _no_comments(body: bytes) -> str:
    return re.sub(r"/\*.*?\*/", "", body.decode(), flags=re.S)


def _bodies(dirs: list[Path]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for d in dirs:
        for path in sorted((d / "warc").glob("*.warc.gz")):
            with path.open("rb") as fh:
                for rec in ArchiveIterator(fh):
                    if rec.rec_type == "response":
                        uri = rec.rec_headers.get_header("WARC-Target-URI")
                        out[uri] = rec.content_stream().read()
    return out


# -- --partition domain ---------------------------------------------------------------------

SITE_PAGES = 12


async def test_partition_domain_puts_two_subdomains_on_one_peer_one_request_at_a_time(
    make_cluster: Any,
) -> None:
    """a.site.test and b.site.test (two servers, named with --resolve) link to each other:
    their key is site.test, so one peer owns both, and the site is fetched one request at a
    time with the politeness gap between requests, whichever subdomain they go to."""
    spans: list[tuple[str, float, float]] = []

    async def page(request: web.BaseRequest) -> web.StreamResponse:
        start = time.monotonic()
        await asyncio.sleep(0.01)
        host = (request.host or "").split(":")[0]
        other = "b" if host.startswith("a.") else "a"
        n = int(request.path.strip("/p") or 0) if request.path.startswith("/p") else 0
        links = [f"/p{n + 1}"] if n + 1 < SITE_PAGES else []
        links.append(f"http://{other}.site.test:{request.url.port}/p{n}")
        body = "".join(f'<a href="{h}">x</a>' for h in links)
        spans.append((host, start, time.monotonic()))
        return web.Response(text=body, content_type="text/html")

    runners = []
    port = 0
    for ip in ("127.0.0.61", "127.0.0.62"):
        runner = web.ServerRunner(web.Server(page, access_log=None), shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, ip, port)
        await site.start()
        port = int(runner.addresses[0][1])
        runners.append(runner)
    try:
        cluster = await make_cluster(
            [
                "--allow-private",
                "--allow-domain",
                "site.test",
                "--partition",
                "domain",
                "--resolve",
                "a.site.test:127.0.0.61",
                "--resolve",
                "b.site.test:127.0.0.62",
                "--delay",
                "0.05",
                "--politeness-factor",
                "0",
                "--concurrency",
                "8",
            ]
        )
        founder = (await start_mesh(cluster, 2))[0]
        seed = f"http://a.site.test:{port}/p0"
        await cluster.api(founder, "/api/seed", "POST", {"urls": [seed]})
        final = await cluster.wait_finished(timeout=60)
        counts: Counter[str] = await leave_all(cluster)
    finally:
        for runner in runners:
            await runner.cleanup()
    assert len(counts) == 2 * SITE_PAGES and max(counts.values()) == 1
    # One owner records the whole site (whoever fetched a page on loan).
    assert sorted(s["done"] for s in final) == [0, 2 * SITE_PAGES]
    hosts = {h for h, _, _ in spans}
    assert hosts == {"a.site.test", "b.site.test"}
    ordered = sorted((start, end) for _, start, end in spans)
    for (_, end), (start, _) in itertools.pairwise(ordered):
        assert start >= end, "two requests to the site at once"
        assert start - end >= 0.04, f"a gap of {start - end:.3f} s, --delay is 0.05"
