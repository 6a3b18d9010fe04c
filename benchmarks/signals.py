"""Site signals (issue 37): what reading them costs a peer, and what complete pages bring.

(a) HTML pages/s of one peer on the single-peer benchmark's plain web (no requisites, no
    sitemaps to find, robots.txt naming none), its default settings (sitemaps, robots meta
    tags and headers, requisite extraction on) against the same engine with them turned off
    (``--no-sitemaps --requisites off``), rounds interleaved: the ratio is what the signals
    cost on pages that carry none.
(b) The signals web (``TestWebConfig(signals=True)``: every page with a stylesheet that
    imports another and names a font and images, a script, images, some on a CDN host):
    HTML pages/s, requisites fetched per HTML page, and whether the WARC holds exactly the
    ground truth.
(c) The sitemap parser alone: a 50,000-URL sitemap plain and gzip-compressed, fed in 64 KiB
    chunks (URLs/s), and a gzip bomb inflating past 50 MB: how long until it is cut, and the
    longest the event loop waits for one step.

Usage: python benchmarks/signals.py [--quick] [--rounds R] [--hosts N] [--pages N]
The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import TestWebParams, children_cpu_s, serve_test_web, stop_process

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import crawl
from p2pcrawl.crawl.sitemaps import SitemapParser
from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings, SignalSettings
from p2pcrawl.testing import TestWeb, TestWebConfig
from p2pcrawl.testing.hostilesignals import _huge_gzip
from p2pcrawl.testing.signals import urlset

OFF = SignalSettings(sitemaps=False, requisites="off")


def settings(domains: list[str], signals: SignalSettings, concurrency: int) -> CrawlSettings:
    return CrawlSettings(
        concurrency=concurrency,
        politeness=PolitenessSettings(delay=0, politeness_factor=0),
        scope=ScopeSettings(allow_domains=tuple(domains), allow_private=True),
        signals=signals,
    )


def run(
    hub: str, domains: list[str], signals: SignalSettings, concurrency: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-signals-") as tmp:
        gc.collect()
        cpu0, t0, child0 = time.process_time(), time.perf_counter(), children_cpu_s()
        summary = asyncio.run(crawl([hub], settings(domains, signals, concurrency), Path(tmp)))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0 + children_cpu_s() - child0
        archived = read_warc_urls(Path(tmp) / "warc")
    stats = summary.stats
    html = stats.pages_fetched - stats.requisites_fetched
    return {
        "html_pages": html,
        "requisites": stats.requisites_fetched,
        "wall_s": wall,
        "html_pages_per_s": html / wall,
        "cpu_ms_per_html_page": 1000 * cpu / max(html, 1),
        "sitemaps_read": stats.sitemaps_read,
        "archived": len(archived),
        "urls": set(archived),  # type: ignore[dict-item]
    }


def plain_web(args: argparse.Namespace) -> dict[str, float]:
    params = TestWebParams(args.hosts, args.pages, 30_000, 50, 1)
    on: list[dict[str, float]] = []
    off: list[dict[str, float]] = []
    with serve_test_web(params) as web:
        for r in range(args.rounds):
            for name, sig, out in (("on", SignalSettings(), on), ("off", OFF, off)):
                res = run(web.hub, web.allow_domains, sig, args.concurrency)
                out.append(res)
                print(
                    f"  (a) round {r + 1} signals {name}: {res['html_pages']:.0f} HTML pages, "
                    f"{res['html_pages_per_s']:.0f}/s, "
                    f"{res['cpu_ms_per_html_page']:.2f} ms CPU each",
                    flush=True,
                )
    ratios = [a["html_pages_per_s"] / b["html_pages_per_s"] for a, b in zip(on, off, strict=True)]
    cpu = [
        a["cpu_ms_per_html_page"] / b["cpu_ms_per_html_page"] for a, b in zip(on, off, strict=True)
    ]
    print(
        f"(a) plain web, signals on / off: {statistics.median(ratios):.3f}x HTML pages/s "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f}), CPU per page {statistics.median(cpu):.3f}x"
    )
    return {
        "pages_per_s_on": statistics.median(r["html_pages_per_s"] for r in on),
        "pages_per_s_off": statistics.median(r["html_pages_per_s"] for r in off),
        "ratio": statistics.median(ratios),
        "cpu_ratio": statistics.median(cpu),
    }


def signals_web(args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, "-m", "p2pcrawl.testing.serve", "--signals", "--no-features"]
    cmd += ["--hosts", str(args.hosts), "--pages", str(args.pages // 4), "--page-bytes", "30000"]
    cmd += ["--mean-links", "50", "--large-page-bytes", "0", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        res = run(info["hub"], info["allow_domains"], SignalSettings(), args.concurrency)
    finally:
        stop_process(proc)
    config = TestWebConfig(
        hosts=args.hosts,
        pages_per_host=args.pages // 4,
        page_bytes=30_000,
        mean_links=50,
        features=False,
        large_page_bytes=0,
        signals=True,
        port=int(info["port"]),
    )
    truth = TestWeb(config).ground_truth()
    exact = res["urls"] == truth  # type: ignore[comparison-overlap]
    per_page = res["requisites"] / max(res["html_pages"], 1)
    print(
        f"(b) signals web: {res['html_pages']:.0f} HTML pages at {res['html_pages_per_s']:.0f}/s, "
        f"{res['requisites']:.0f} requisites ({per_page:.3f} per HTML page), "
        f"{res['sitemaps_read']:.0f} sitemaps read; WARC == ground truth: {exact}"
    )
    return {
        "html_pages_per_s": res["html_pages_per_s"],
        "requisites_per_html_page": per_page,
        "exact": float(exact),
    }


def parser_speed() -> dict[str, float]:
    body = urlset([f"https://example.com/section/{i}/page.html" for i in range(50_000)])
    out: dict[str, float] = {}
    for name, data in (("plain", body), ("gzip", gzip.compress(body))):
        best = float("inf")
        for _ in range(3):
            parser = SitemapParser()
            t0 = time.perf_counter()
            for i in range(0, len(data), 1 << 16):
                parser.feed(data[i : i + (1 << 16)])
                while parser.pending:
                    parser.feed(b"")
            doc = parser.close()
            best = min(best, time.perf_counter() - t0)
        assert len(doc.urls) == 50_000
        out[f"{name}_urls_per_s"] = 50_000 / best
    bomb = _huge_gzip()
    parser = SitemapParser()
    t0 = time.perf_counter()
    longest = 0.0
    for i in range(0, len(bomb), 1 << 16):
        s = time.perf_counter()
        parser.feed(bomb[i : i + (1 << 16)])
        longest = max(longest, time.perf_counter() - s)
        while parser.pending:
            s = time.perf_counter()
            parser.feed(b"")
            longest = max(longest, time.perf_counter() - s)
        if parser.done:
            break
    out["bomb_cut_s"] = time.perf_counter() - t0
    out["bomb_longest_step_ms"] = 1000 * longest
    print(
        f"(c) sitemap parser: {out['plain_urls_per_s']:.0f} URLs/s plain, "
        f"{out['gzip_urls_per_s']:.0f} gzip; a {len(bomb) // 1000} kB gzip bomb cut "
        f"({parser.doc.bound}) after {out['bomb_cut_s']:.2f} s, longest step "
        f"{out['bomb_longest_step_ms']:.1f} ms"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--pages", type=int, default=500, help="pages per host of the plain web")
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="5 hosts x 200 pages, 1 round")
    args = p.parse_args(argv)
    if args.quick:
        args.hosts, args.pages, args.rounds = 5, 200, 1
    a = plain_web(args)
    b = signals_web(args)
    c = parser_speed()
    headline = {
        "html_pages_per_s_signals_on_over_off": round(a["ratio"], 3),
        "cpu_per_html_page_on_over_off": round(a["cpu_ratio"], 3),
        "requisites_per_html_page": round(b["requisites_per_html_page"], 3),
        "signals_web_html_pages_per_s": round(b["html_pages_per_s"], 1),
        "signals_web_exact": bool(b["exact"]),
        "sitemap_urls_per_s": round(c["plain_urls_per_s"]),
        "sitemap_gzip_urls_per_s": round(c["gzip_urls_per_s"]),
        "gzip_bomb_longest_step_ms": round(c["bomb_longest_step_ms"], 1),
    }
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
