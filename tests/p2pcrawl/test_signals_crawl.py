"""Site signals in real crawls by one peer: the flags that turn them off or around, and
politeness by server address, checked from the servers' side of the wire."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import crawl
from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings, SignalSettings
from p2pcrawl.testing import TestWeb, TestWebConfig
from p2pcrawl.testing.signals import CDN_IP
from p2pcrawl.ui.export import run_export
from tests.p2pcrawl.loopback import Served, serve


def _settings(web: TestWeb, signals: SignalSettings, by: str = "host") -> CrawlSettings:
    return CrawlSettings(
        concurrency=8,
        politeness=PolitenessSettings(delay=0, politeness_factor=0, politeness_by=by),  # type: ignore[arg-type]
        scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        signals=signals,
    )


async def test_signal_flags_turn_each_signal_off_or_around(tmp_path: Path) -> None:
    """--drop-rel-nofollow, --ignore-robots-meta, --obey-noarchive, --requisites scope and
    --no-sitemaps together, against the ground truth of the default crawl."""
    config = TestWebConfig(
        hosts=2, pages_per_host=12, slow_host_delay=0.0, large_page_bytes=0, signals=True
    )
    async with TestWeb(config) as web:
        flags = SignalSettings(
            follow_rel_nofollow=False,
            robots_meta=False,
            obey_noarchive=True,
            requisites="scope",
            sitemaps=False,
        )
        summary = await crawl([web.hub_url], _settings(web, flags), tmp_path)
        fetched = set(read_warc_urls(tmp_path / "warc"))
        assert web.sitemap_counts == {}  # --no-sitemaps: not even /sitemap.xml
    f = web.feature_urls
    expected = {u for u in web.ground_truth(rel_nofollow=False) if CDN_IP not in u}
    expected -= set(web.sitemap_pages[0]) | set(web.sitemap_pages[1])
    expected |= {web.hub_url}
    nofollow_targets = {
        f["header_nofollow_target"],
        f["meta_p2pcrawl_target"],
        web.bases[0] + "/meta/nofollow-target-0.html",
        web.bases[0] + "/meta/nofollow-target-1.html",
    }
    assert fetched == expected | nofollow_targets
    assert not {f["ugc_target"], f["sponsored_target"]} & fetched  # --drop-rel-nofollow
    assert web.bases[0] + "/static/site.css" in fetched  # requisites in scope are fetched
    assert summary.stats.headers_only == 1
    captures = _export(tmp_path)
    noarchive = captures[f["noarchive"]]
    assert noarchive["robots"] == ["noarchive", "noindex"] and noarchive["length"] == 0
    assert captures[f["header_nofollow"]]["robots"] == ["nofollow"]
    assert captures[f["canonical_header"]]["canonical"] == f["canonical_by_header"]
    assert captures[web.hub_url]["robots"] == [] and captures[web.hub_url]["canonical"] is None


def _export(data: Path) -> dict[str, dict[str, object]]:
    out: list[str] = []

    class Sink:
        def write(self, s: str) -> None:
            out.append(s)

    run_export([data], "jsonl", Sink(), lambda _: None)  # type: ignore[arg-type]
    rows = [json.loads(line) for line in "".join(out).splitlines()]
    return {str(r["url"]): r for r in rows}


def _overlaps(spans: list[tuple[float, float]]) -> int:
    """Requests that began before an earlier one had been answered."""
    n, end = 0, float("-inf")
    for start, stop in sorted(spans):
        n += start < end
        end = max(end, stop)
    return n


async def _crawl_two_ports(tmp_path: Path, by: str) -> tuple[Served, Served, int]:
    """Two servers on one address (two ports: two hosts to the crawl, one machine), each a
    chain of pages answering in 10 ms; returns them and the pages fetched."""

    async def page(request: web.BaseRequest) -> web.StreamResponse:
        await asyncio.sleep(0.01)
        n = int(request.path.strip("/p") or 0) if request.path.startswith("/p") else 0
        links = "".join(f'<a href="/p{n * 3 + k}">x</a>' for k in (1, 2, 3) if n * 3 + k < 20)
        return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")

    async with serve(page, "127.0.0.63") as a, serve(page, "127.0.0.63") as b:
        settings = replace(
            CrawlSettings(),
            concurrency=8,
            politeness=PolitenessSettings(delay=0, politeness_factor=0, politeness_by=by),  # type: ignore[arg-type]
            scope=ScopeSettings(allow_domains=("127.0.0.63",), allow_private=True),
        )
        summary = await crawl([a.base + "/", b.base + "/"], settings, tmp_path / by)
    return a, b, summary.pages_fetched


async def test_two_hosts_on_one_address_never_overlap_by_ip(tmp_path: Path) -> None:
    a, b, pages = await _crawl_two_ports(tmp_path, "ip")
    assert pages == 40
    assert _overlaps(a.spans + b.spans) == 0
    # The same crawl by host: the two hosts are fetched side by side, so the check above
    # is one that fails when politeness is per host.
    a, b, pages = await _crawl_two_ports(tmp_path, "host")
    assert pages == 40 and _overlaps(a.spans) == 0 and _overlaps(b.spans) == 0
    assert _overlaps(a.spans + b.spans) > 0
