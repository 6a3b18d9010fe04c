"""Freshness: the adaptive revisit policy against a uniform interval at the same request budget.

    python benchmarks/revisit.py            # 240 pages, 90 s per run, 3 seeds (about 6 min)
    python benchmarks/revisit.py --quick    # 120 pages, 40 s per run (about 3 min)

One peer (the in-process engine, WARC output on) crawls the changing test web
(``p2pcrawl.testing.changing``) in continuous mode. Each page changes as a Poisson process;
the rates are lognormal (heavy-tailed), a median page changing every ``100 x --revisit``
with a log-spread of 2, so most pages change rarely and a few very often. The web keeps
the change log and every answer as ground truth, from which the run's freshness (the
time-averaged share of pages whose archived copy is current, Cho and Garcia-Molina) and
age are computed, between the moment every page was first fetched and the end.

Per seed, first the adaptive policy (``--revisit 1s --revisit-max 32s``; the interval law
of p2pcrawl/crawl/refresh.py) runs; then the uniform policy runs with the one interval that
makes the same number of requests over the same span (``--revisit-min = --revisit-max``),
on the same web (same seed, same change times), once more with the interval corrected if its
requests missed the adaptive run's by over 2%. Seeds run side by side.

Printed: freshness and age of both, their requests, the share of revisits answered 304,
the body bytes the adaptive run downloaded against re-downloading every page on every
revisit, and the visit history's bytes per URL (disk, RAM, wire) next to the done record's
(benchmarks/done_record.py). Targets: adaptive freshness above uniform at equal requests,
and at least 80% fewer body bytes than full re-downloads. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from p2pcrawl.crawl import crawl
from p2pcrawl.network import history_chunks
from p2pcrawl.settings import CrawlSettings, PolitenessSettings, RevisitSettings, ScopeSettings
from p2pcrawl.testing import ChangingConfig, ChangingWeb, Freshness
from storage import Visit, VisitStore

EVERY_S = 1.0
MAX_S = 32.0
CALIBRATE = 0.02  # the share by which the uniform run's requests may miss the adaptive run's
MEDIAN_GAP = 100.0  # x --revisit: the median page's change interval
SIGMA = 2.0
# What the done record measured at 10 M URLs (benchmarks/done_record.py, docs/benchmarks.md).
DONE_RAM, DONE_DISK = 1.88, 18.3


def settings(web: ChangingWeb, every: float, low: float, high: float) -> CrawlSettings:
    return CrawlSettings(
        politeness=PolitenessSettings(delay=0.0, politeness_factor=0.0),
        scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        revisit=RevisitSettings(every=every, min_interval=low, max_interval=high),
    )


def warm_time(web: ChangingWeb) -> float:
    """When every page had been fetched once (seconds after the web's start)."""
    return max(page.log[0][0] for page in web.pages.values() if page.log)


async def run_policy(
    cfg: ChangingConfig, every: float, low: float, high: float, duration: float, work: Path
) -> tuple[Freshness, float]:
    """One continuous crawl of a fresh web; (its report, the measured span in seconds)."""
    async with ChangingWeb(cfg) as web:
        # The span ends when the crawl stops fetching, not once its files are closed.
        end = web.now() + duration
        await crawl([web.hub_url], settings(web, every, low, high), work, run_for=duration)
        start = warm_time(web)
        if any(not page.log for page in web.pages.values()):
            raise RuntimeError("the crawl did not reach every page")
        return web.report(start, end), end - start


async def run_seed(seed: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    cfg = ChangingConfig(
        hosts=args.hosts,
        pages_per_host=args.pages // args.hosts,
        seed=seed,
        median_gap_s=MEDIAN_GAP * EVERY_S,
        sigma=SIGMA,
        horizon_s=args.duration * 2 + 60,
        new_links=False,
        first_ip=100 + 20 * (seed % 7),
    )
    adaptive, span = await run_policy(cfg, EVERY_S, 1.0, MAX_S, args.duration, work / "a")
    pages = cfg.hosts * cfg.pages_per_host
    interval = max(1.0, pages * span / max(1, adaptive.requests))
    uniform, _ = await run_policy(cfg, interval, interval, interval, args.duration, work / "u")
    # Politeness and the first pass make the requests of an interval only roughly
    # pages x span / interval: once more with the interval scaled by the miss, and the run
    # nearer the adaptive one's requests is the comparison ("at equal requests").
    if abs(uniform.requests - adaptive.requests) > CALIBRATE * adaptive.requests:
        again = max(1.0, interval * uniform.requests / max(1, adaptive.requests))
        second, _ = await run_policy(cfg, again, again, again, args.duration, work / "u2")
        if abs(second.requests - adaptive.requests) < abs(uniform.requests - adaptive.requests):
            uniform, interval = second, again
    return {"seed": seed, "adaptive": adaptive, "uniform": uniform, "interval": interval}


async def fill_history(n: int, path: Path) -> float:
    """Write ``n`` histories like a real crawl's (URLs of 40-90 characters, half with an
    ETag, all with a digest and Last-Modified) to a store at ``path``; returns the wire
    form's bytes per URL."""
    rng = random.Random(7)
    hosts = n // 200 + 1
    now = int(time.time() * 1000)
    store = await VisitStore.open(path)
    try:
        rows = [
            Visit(
                url=f"https://host{i % hosts}.example.org/articles/{i}/"
                + "x" * rng.randrange(10, 60),
                key=(i % hosts).to_bytes(20, "big"),
                fp=rng.getrandbits(64),
                depth=rng.randrange(8),
                due=now + rng.randrange(1, 86_400_000),
                fetched=now - rng.randrange(1, 86_400_000),
                status=200,
                interval=rng.randrange(3_600_000, 16 * 86_400_000),
                captured=now - rng.randrange(1, 30 * 86_400_000),
                digest=rng.randbytes(20),
                etag=f'"{rng.getrandbits(64):x}"' if i % 2 else "",
                lastmod=now // 1000 - rng.randrange(1, 10**8),
                visits=rng.randrange(32),
                changes=rng.randrange(8),
                changed_ms=rng.randrange(10**9),
                unchanged_ms=rng.randrange(10**10),
                changes_seen=rng.randrange(20),
            )
            for i in range(n)
        ]
        for i in range(0, n, 2000):
            await store.record(rows[i : i + 2000])
        # As STORE_HISTORY carries them to a key's new owner and its replicas.
        return sum(map(len, history_chunks(rows[:10_000]))) / min(n, 10_000)
    finally:
        await store.aclose()


def history_bytes(n: int, work: Path) -> tuple[float, float, float]:
    """(disk, RAM, wire) bytes per URL of the visit history. RAM is the marginal figure:
    the RSS growth of a fresh process that opens the history and reads a due window, at
    ``n`` URLs against ``n / 2``; both outgrow SQLite's page cache (8 MiB, about 35,000
    histories), which is the history's RAM besides the window of due pages."""
    big, small = work / "big" / "visits.sqlite3", work / "small" / "visits.sqlite3"
    wire = asyncio.run(fill_history(n, big))
    asyncio.run(fill_history(n // 2, small))
    disk = sum(p.stat().st_size for p in big.parent.iterdir()) / n
    grown = []
    for path, rows in ((big, n), (small, n // 2)):
        child = subprocess.run(
            [sys.executable, __file__, "--ram-child", str(path), "--history-rows", str(rows)],
            check=True,
            capture_output=True,
            text=True,
        )
        grown.append(json.loads(child.stdout.strip().splitlines()[-1])["grown"])
    ram = (grown[0] - grown[1]) / (n - n // 2)
    return disk, ram, wire


def ram_child(path: Path, n: int) -> None:
    """In a fresh process: the RSS growth of opening the history and reading a window of due
    rows, as the scheduler does."""

    async def run() -> int:
        gc.collect()
        before = rss()
        store = await VisitStore.open(path)
        try:
            due = await store.due(2**62, 2000)
            assert len(due) == min(n, 2000)
            await store.schedule(2**62, 10, 100_000)
            gc.collect()
            return rss() - before
        finally:
            await store.aclose()

    print(json.dumps({"grown": asyncio.run(run())}))


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def med(values: list[float]) -> float:
    return statistics.median(values)


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    runs = await asyncio.gather(
        *(run_seed(seed, args, work / f"seed{seed}") for seed in range(1, args.seeds + 1))
    )
    print(
        f"{'seed':>4} {'policy':>9} {'requests':>9} {'fresh':>7} {'age s':>7} {'304':>6}"
        f" {'body kB':>9} {'full kB':>9}   uniform interval"
    )
    for r in runs:
        for name in ("adaptive", "uniform"):
            f: Freshness = r[name]
            print(
                f"{r['seed']:>4} {name:>9} {f.requests:>9,} {f.freshness:>7.4f} {f.age_s:>7.3f}"
                f" {f.not_modified / max(1, f.requests):>6.1%} {f.body_bytes / 1e3:>9,.0f}"
                f" {f.full_bytes / 1e3:>9,.0f}"
                + (f"   {r['interval']:.2f} s" if name == "uniform" else "")
            )
    ad = [r["adaptive"] for r in runs]
    un = [r["uniform"] for r in runs]
    result = {
        "freshness": {"adaptive": med([f.freshness for f in ad]),
                      "uniform": med([f.freshness for f in un])},
        "age_s": {"adaptive": med([f.age_s for f in ad]), "uniform": med([f.age_s for f in un])},
        "requests": {"adaptive": med([f.requests for f in ad]),
                     "uniform": med([f.requests for f in un])},
        "adaptive_wins": sum(a.freshness > u.freshness for a, u in zip(ad, un, strict=True)),
        "seeds": len(runs),
        "not_modified_share": med([f.not_modified / max(1, f.requests) for f in ad]),
        "body_bytes": med([f.body_bytes for f in ad]),
        "full_bytes": med([f.full_bytes for f in ad]),
        "body_bytes_saved": med([1 - f.body_bytes / max(1, f.full_bytes) for f in ad]),
    }  # fmt: skip
    fa, fu = result["freshness"]["adaptive"], result["freshness"]["uniform"]
    print(
        f"\nfreshness (median of {len(runs)} seeds): adaptive {fa:.4f}, uniform {fu:.4f} at "
        f"{result['requests']['adaptive']:,.0f} / {result['requests']['uniform']:,.0f} requests"
        f" (adaptive higher in {result['adaptive_wins']} of {len(runs)}; target: higher)"
    )
    print(
        f"age: adaptive {result['age_s']['adaptive']:.3f} s, uniform "
        f"{result['age_s']['uniform']:.3f} s"
    )
    print(
        f"revisits answered 304: {result['not_modified_share']:.1%}; body bytes "
        f"{result['body_bytes'] / 1e6:.2f} MB against {result['full_bytes'] / 1e6:.2f} MB "
        f"re-downloading every page: {result['body_bytes_saved']:.1%} fewer (target >= 80%)"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="120 pages, 40 s per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--pages", type=int, help="changing pages (240; quick: 120)")
    parser.add_argument("--hosts", type=int, default=6)
    parser.add_argument("--duration", type=float, help="seconds per run (90; quick: 40)")
    parser.add_argument("--history-rows", type=int, help="histories measured (200k; quick 100k)")
    parser.add_argument("--ram-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.pages = args.pages or (120 if args.quick else 240)
    args.duration = args.duration or (40.0 if args.quick else 90.0)
    args.history_rows = args.history_rows or (100_000 if args.quick else 200_000)
    if args.ram_child is not None:
        ram_child(args.ram_child, args.history_rows)
        return
    work = Path(tempfile.mkdtemp(prefix="revisit-bench-"))
    try:
        print(
            f"revisit benchmark: {args.pages} pages on {args.hosts} hosts, {args.duration:g} s "
            f"per run, {args.seeds} seeds; --revisit {EVERY_S:g}s --revisit-max {MAX_S:g}s; "
            f"change rates lognormal, median every {MEDIAN_GAP * EVERY_S:g} s, sigma {SIGMA}"
        )
        result = asyncio.run(main_async(args, work))
        n = args.history_rows
        disk, ram, wire = history_bytes(n, work / "history")
        print(
            f"visit history at {n:,} URLs: disk {disk:.1f} B/URL, RAM {ram:.2f} B/URL "
            f"(marginal RSS growth, {n // 2:,} against {n:,} URLs), wire {wire:.1f} B/URL; "
            f"the done record: RAM {DONE_RAM} B/URL, disk {DONE_DISK} B/URL"
        )
        result["history_bytes_per_url"] = {
            "disk": round(disk, 1),
            "ram": round(ram, 2),
            "wire": round(wire, 1),
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
