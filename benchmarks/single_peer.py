"""Single-peer throughput: p2pcrawl's engine against a bare asyncio loop, Scrapy and wget.

All four crawl the same generated test web (``p2pcrawl.testing.web``, served from a subprocess so
it has its own core) with the same concurrency and no politeness delay:

(a) bare   aiohttp GET + selectolax links + urljoin/urldefrag + a set: the ceiling for a
           Python crawler on this machine; no robots.txt, no WARC, no persistence.
(b) engine p2pcrawl.crawl.engine.crawl with WARC output on, robots.txt obeyed; its CPU includes
           the WARC writer process.
(c) scrapy Scrapy (its own virtualenv, benchmarks/.venv-scrapy), CrawlSpider + LinkExtractor,
           ROBOTSTXT_OBEY, one connection per host.
(d) wget   GNU wget -r, one connection: the C reference.

Every crawler runs once per round, rounds interleaved (--rounds, default 3), so a busy
neighbour slows all of them alike; the table shows each crawler's median round and the ratios
are medians (with range) of the per-round ratios.

Usage: python benchmarks/single_peer.py [--quick] [--hosts N] [--pages N] [--concurrency N]
       [--rounds R] [--skip scrapy,wget] [--json results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit

import aiohttp
from _common import (
    BENCH_DIR,
    Result,
    TestWebInfo,
    TestWebParams,
    children_cpu_s,
    compare,
    format_table,
    ground_truth,
    is_site_file,
    measure_children,
    process_cpu_s,
    serve_test_web,
)
from selectolax.lexbor import LexborHTMLParser

SCRAPY_VERSION = "2.19.0"
SCRAPY_VENV = BENCH_DIR / ".venv-scrapy"
CRAWLERS = ("bare", "engine", "scrapy", "wget")
TARGETS = {"bare": 0.7, "scrapy": 5.0}


# --- (a) the bare loop -----------------------------------------------------------------------


def in_scope(url: str, domains: tuple[str, ...]) -> bool:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return False
    host = parts.hostname or ""
    return any(host == d or host.endswith("." + d) for d in domains)


async def bare_crawl(hub: str, domains: tuple[str, ...], concurrency: int) -> set[str]:
    """The least a Python crawler must do per page; returns the URLs that got a response."""
    seen = {hub}
    fetched: set[str] = set()
    queue: asyncio.Queue[str] = asyncio.Queue()
    queue.put_nowait(hub)

    def enqueue(base: str, href: str) -> None:
        link = urldefrag(urljoin(base, href))[0]
        if link not in seen and in_scope(link, domains):
            seen.add(link)
            queue.put_nowait(link)

    # One connection per host, as the engine's fetcher has (politeness): without it the bare
    # loop would open many connections to a host and win by breaking the rule.
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=1)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while True:
                url = await queue.get()
                try:
                    async with session.get(url, allow_redirects=False) as resp:
                        body = await resp.read()
                        ctype = resp.headers.get("Content-Type", "")
                        location = resp.headers.get("Location")
                    fetched.add(url)
                    if location:
                        enqueue(url, location)
                    if "html" in ctype:
                        for node in LexborHTMLParser(body).css("a[href]"):
                            href = node.attributes.get("href")
                            if href:
                                enqueue(url, href)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    print(f"  bare: {url}: {exc!r}", file=sys.stderr)
                finally:
                    queue.task_done()

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            await queue.join()
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    return fetched


def run_bare(web: TestWebInfo, concurrency: int) -> Result:
    result = Result("bare aiohttp+selectolax")
    gc.collect()
    cpu0, t0 = time.process_time(), time.perf_counter()
    urls = asyncio.run(bare_crawl(web.hub, tuple(web.allow_domains), concurrency))
    result.wall_s = time.perf_counter() - t0
    result.cpu_s = time.process_time() - cpu0
    result.urls = urls
    result.pages = len(urls)
    return result


# --- (b) the engine --------------------------------------------------------------------------


def run_engine(web: TestWebInfo, concurrency: int) -> Result:
    result = Result("p2pcrawl engine (WARC on)")
    try:
        from p2pcrawl.archive import read_warc_urls
        from p2pcrawl.crawl import crawl
        from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings
    except ImportError as exc:
        result.available = False
        result.note = f"engine: not available ({exc})"
        return result
    settings = CrawlSettings(
        concurrency=concurrency,
        politeness=PolitenessSettings(delay=0, politeness_factor=0),
        scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
    )
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-bench-") as tmp:
        data_dir = Path(tmp)
        gc.collect()
        cpu0, t0 = time.process_time(), time.perf_counter()
        writer0 = children_cpu_s()
        summary = asyncio.run(crawl([web.hub], settings, data_dir))
        result.wall_s = time.perf_counter() - t0
        # The WARC writer is a child process, reaped before crawl() returns.
        writer_cpu_s = children_cpu_s() - writer0
        result.cpu_s = time.process_time() - cpu0 + writer_cpu_s
        warc_urls = read_warc_urls(data_dir / "warc")
        warc_bytes = sum(p.stat().st_size for p in summary.warc_files)
    pages = [u for u in warc_urls if not is_site_file(u)]
    result.urls = set(pages)
    result.pages = len(pages)
    result.note = (
        f"engine counted {summary.pages_fetched}; CPU includes the WARC writer process's "
        f"{writer_cpu_s / max(result.pages, 1) * 1000:.2f} s/1k; WARC: "
        f"{len(warc_urls) - len(pages)} robots.txt, {len(pages) - len(result.urls)} duplicate, "
        f"{warc_bytes / 1e6:.0f} MB in {len(summary.warc_files)} file(s)"
    )
    return result


# --- (c) Scrapy --------------------------------------------------------------------------------

SCRAPY_SCRIPT = textwrap.dedent(
    '''
    """Generated by benchmarks/single_peer.py: crawl the test web with Scrapy."""
    import json
    import sys
    import time

    from scrapy import signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.linkextractors import LinkExtractor
    from scrapy.spiders import CrawlSpider, Rule

    cfg = json.load(open(sys.argv[1]))
    fetched = []
    clock = {}


    class TestWebSpider(CrawlSpider):
        name = "testweb"
        allowed_domains = cfg["allow_domains"]
        start_urls = [cfg["hub"]]
        # LinkExtractor compares domains with the URL's netloc, port included, so it gets
        # host:port; the OffsiteMiddleware (allowed_domains) compares bare hostnames.
        rules = (Rule(LinkExtractor(allow_domains=cfg["hosts"]), follow=True),)

        @classmethod
        def from_crawler(cls, crawler, *args, **kwargs):
            spider = super().from_crawler(crawler, *args, **kwargs)
            # Every HTTP response the downloader got, before any middleware can drop it.
            crawler.signals.connect(spider.on_response, signal=signals.response_downloaded)
            crawler.signals.connect(spider.on_open, signal=signals.spider_opened)
            crawler.signals.connect(spider.on_close, signal=signals.spider_closed)
            return spider

        def on_response(self, response, request, spider):
            fetched.append(response.url)

        def on_open(self, spider):
            clock["opened"] = (time.perf_counter(), time.process_time())

        def on_close(self, spider):
            clock["closed"] = (time.perf_counter(), time.process_time())


    process = CrawlerProcess(
        settings={
            "ROBOTSTXT_OBEY": True,
            "CONCURRENT_REQUESTS": cfg["concurrency"],
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "DOWNLOAD_DELAY": 0,
            "AUTOTHROTTLE_ENABLED": False,
            "LOG_LEVEL": "WARNING",
            "TELNETCONSOLE_ENABLED": False,
            "REMOTE_CONTROL_ENABLED": False,
        }
    )
    crawler = process.create_crawler(TestWebSpider)
    process.crawl(crawler)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, float))}
    crawl_wall = clock["closed"][0] - clock["opened"][0]
    crawl_cpu = clock["closed"][1] - clock["opened"][1]
    out = {"urls": fetched, "stats": stats, "crawl_wall_s": crawl_wall, "crawl_cpu_s": crawl_cpu}
    json.dump(out, open(cfg["out"], "w"))
    '''
)


def scrapy_python() -> Path:
    """The Scrapy virtualenv's interpreter, creating the venv on first use."""
    python = SCRAPY_VENV / "bin" / "python"
    if python.exists():
        probe = subprocess.run(
            [str(python), "-c", "import scrapy"], capture_output=True, check=False
        )
        if probe.returncode == 0:
            return python
    print(f"  creating {SCRAPY_VENV} with scrapy=={SCRAPY_VERSION} (first run only)")
    subprocess.run([sys.executable, "-m", "venv", str(SCRAPY_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"scrapy=={SCRAPY_VERSION}"],
        check=True,
    )
    return python


def run_scrapy(web: TestWebInfo, concurrency: int) -> Result:
    result = Result(f"scrapy {SCRAPY_VERSION}")
    try:
        python = scrapy_python()
    except (subprocess.CalledProcessError, OSError) as exc:
        result.available = False
        result.note = f"scrapy: could not install ({exc})"
        return result
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-scrapy-") as tmp:
        script, cfg, out = Path(tmp, "spider.py"), Path(tmp, "cfg.json"), Path(tmp, "out.json")
        script.write_text(SCRAPY_SCRIPT)
        cfg.write_text(
            json.dumps(
                {
                    "hub": web.hub,
                    "allow_domains": web.allow_domains,
                    "hosts": web.hosts,
                    "concurrency": concurrency,
                    "out": str(out),
                }
            )
        )
        with measure_children(result):
            proc = subprocess.run([str(python), str(script), str(cfg)], check=False)
        if proc.returncode != 0 or not out.exists():
            result.available = False
            result.note = f"scrapy exited {proc.returncode}"
            return result
        data = json.loads(out.read_text())
    urls = [u for u in data["urls"] if not is_site_file(u)]
    result.urls = set(urls)
    result.pages = len(urls)
    stats = data["stats"]
    crawl_wall = data["crawl_wall_s"]
    result.note = (
        f"{len(data['urls']) - len(urls)} robots.txt, {len(urls) - len(result.urls)} duplicate, "
        f"{stats.get('log_count/ERROR', 0)} errors; spider open->close alone: "
        f"{crawl_wall:.2f} s, {len(urls) / crawl_wall:.0f} pages/s, "
        f"{1000 * data['crawl_cpu_s'] / max(1, len(urls)):.2f} CPU s/1k"
    )
    return result


# --- (d) wget ----------------------------------------------------------------------------------

WGET_URL = re.compile(r" URL:\s*(\S+) ")
WGET_HTTP_ERROR = re.compile(r"^(\S+):\s*\S+ \S+ ERROR (\d{3})")


def run_wget(web: TestWebInfo) -> Result:
    result = Result("wget -r (C, 1 connection)")
    wget = shutil.which("wget")
    if wget is None:
        result.available = False
        result.note = "wget: not installed"
        return result
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-wget-") as tmp:
        cmd = [
            wget,
            "--recursive",
            "--level=inf",
            "--span-hosts",
            f"--domains={','.join(web.allow_domains)}",
            "--no-verbose",
            "--delete-after",
            "--directory-prefix",
            tmp,
            "--output-file",
            str(Path(tmp, "wget.log")),
            web.hub,
        ]
        with measure_children(result):
            proc = subprocess.run(cmd, check=False)
        log = Path(tmp, "wget.log").read_text(errors="replace").splitlines()
    fetched = [m.group(1) for line in log if (m := WGET_URL.search(line))]
    errors = [m.group(1) for line in log if (m := WGET_HTTP_ERROR.match(line))]
    urls = [u for u in fetched + errors if not is_site_file(u)]
    result.urls = set(urls)
    result.pages = len(urls)
    result.note = (
        f"exit {proc.returncode}, {len(fetched) + len(errors) - len(urls)} robots.txt, "
        f"{len(urls) - len(result.urls)} duplicate, {len(errors)} HTTP errors"
    )
    return result


# --- driver ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--pages", type=int, default=1000, help="pages per host")
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--page-bytes", type=int, default=30_000)
    p.add_argument("--mean-links", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip", default="", help=f"comma list of {','.join(CRAWLERS)}")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median, range)")
    p.add_argument("--quick", action="store_true", help="5 hosts x 200 pages, 1 round: a smoke run")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.hosts, args.pages, args.rounds = 5, 200, 1
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - set(CRAWLERS)
    if unknown:
        p.error(f"--skip: unknown crawler(s) {sorted(unknown)}; choose from {CRAWLERS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = TestWebParams(args.hosts, args.pages, args.page_bytes, args.mean_links, args.seed)
    print(
        f"test web: {params.hosts} hosts x {params.pages} pages, {params.page_bytes} B/page, "
        f"{params.mean_links} links/page, features off; concurrency {args.concurrency}"
    )
    # Other processes on a small machine move every number here; say how busy it was.
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    # Install Scrapy before anything is timed.
    if "scrapy" not in args.skip:
        scrapy_python()
    rounds: dict[str, list[Result]] = {}
    with serve_test_web(params) as web:
        try:
            truth: set[str] | None = ground_truth(params, web.port)
        except Exception as exc:  # the test web is another module; say so rather than crash
            print(f"ground truth unavailable: {exc!r}")
            truth = None
        print(f"hub {web.hub}; {len(truth) if truth else '?'} pages expected\n")
        runners = {
            "bare": lambda: run_bare(web, args.concurrency),
            "engine": lambda: run_engine(web, args.concurrency),
            "scrapy": lambda: run_scrapy(web, args.concurrency),
            "wget": lambda: run_wget(web),
        }
        for round_no in range(args.rounds):
            for name in CRAWLERS:
                if name in args.skip:
                    continue
                print(f"round {round_no + 1}: running {name} ...", flush=True)
                server0 = process_cpu_s(web.pid)
                r = runners[name]()
                r.server_cpu_s = process_cpu_s(web.pid) - server0
                rounds.setdefault(name, []).append(r)
                if r.available:
                    print(f"  {r.pages} pages in {r.wall_s:.2f} s; {compare(r, truth)}")
                else:
                    print(f"  {r.note}")

    # Each crawler's median round (by pages/s) stands for it in the table.
    results = {
        name: sorted(rs, key=lambda r: r.pages_per_s)[len(rs) // 2] for name, rs in rounds.items()
    }
    print()
    print(format_table(results.values()))
    for name, rs in rounds.items():
        speeds = [r.pages_per_s for r in rs if r.available]
        if len(speeds) > 1:
            print(f"{name}: pages/s over {len(speeds)} rounds {min(speeds):.0f}-{max(speeds):.0f}")
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    ratios: dict[str, float] = {}
    engine_rounds = rounds.get("engine", [])
    if engine_rounds and all(r.available for r in engine_rounds):
        print()
        for name in ("bare", "scrapy", "wget"):
            others = rounds.get(name)
            if not others or not all(o.available and o.pages_per_s for o in others):
                continue
            per_round = [
                e.pages_per_s / o.pages_per_s for e, o in zip(engine_rounds, others, strict=True)
            ]
            ratio = statistics.median(per_round)
            ratios[name] = round(ratio, 3)
            target = TARGETS.get(name)
            verdict = ""
            if target is not None:
                verdict = f"  (target >= {target}x: {'met' if ratio >= target else 'NOT met'})"
            spread = f" [{min(per_round):.3f}-{max(per_round):.3f}]" if len(per_round) > 1 else ""
            print(f"engine/{name}: {ratio:.3f}x pages/s (median of rounds){spread}{verdict}")
    else:
        print("\nengine: not available; targets: engine >= 0.7x bare, >= 5x scrapy")

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "params": params_dict(params),
                    "concurrency": args.concurrency,
                    "rounds": args.rounds,
                    "results": [r.as_json() for r in results.values()],
                },
                indent=2,
            )
        )
    print(json.dumps({"engine_over": ratios, "rounds": args.rounds}))
    return 0


def params_dict(params: TestWebParams) -> dict[str, int]:
    return {
        "hosts": params.hosts,
        "pages_per_host": params.pages,
        "page_bytes": params.page_bytes,
        "mean_links": params.mean_links,
        "seed": params.seed,
    }


if __name__ == "__main__":
    sys.exit(main())
