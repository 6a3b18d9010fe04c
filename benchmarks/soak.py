"""Soak: one peer crawls a large test web with the hostile hosts mixed in, for a bounded time.

Every second it samples the peer process's resident memory, its open descriptors, its queue
sizes (tasks queued, in flight, in the frontier window) and the event loop's lag, then plots
them (``docs/soak.png`` by default). The checks, from what a peer must survive unattended:

- RSS after the warm-up (the first minute; a fifth of a short run) grows at most 10%;
- no descriptor leak: open descriptors at the end are within a few of the warm-up level;
- event-loop lag p99 (over the whole run) under 100 ms.

The baseline for the ratios is the same run's own warm-up sample. The test web runs in its
own process (benchmarks/_common.py), so its memory and CPU are not the peer's.

    python benchmarks/soak.py                 # 10 minutes, 20 hosts x 20,000 pages
    python benchmarks/soak.py --quick         # 60 s, a smaller web
    python benchmarks/soak.py --duration 10 --no-plot   # what the tests run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import stop_process

from p2pcrawl.aio import LoopLagMonitor
from p2pcrawl.network import Peer, PeerConfig
from p2pcrawl.settings import (
    CrawlSettings,
    FetchLimits,
    PeerSettings,
    PolitenessSettings,
    ScopeSettings,
)

DOCS = Path(__file__).resolve().parents[1] / "docs"
RSS_GROWTH_MAX = 0.10
FD_SLACK = 16  # connections and files open at any instant vary by this much
LAG_P99_MAX_S = 0.100


@dataclass(slots=True)
class Sample:
    t: float
    rss_mb: float
    fds: int
    queued: int
    in_flight: int
    frontier: int
    lag_p99_ms: float
    lag_max_ms: float
    pages: int


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def serve_web(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "p2pcrawl.testing.serve",
        "--hosts",
        str(args.hosts),
        "--pages",
        str(args.pages),
        "--page-bytes",
        str(args.page_bytes),
        "--large-page-bytes",
        "0",
        "--slow-host-delay",
        "0.05",
        "--hostile",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        stop_process(proc)
        raise RuntimeError("the test web did not start")
    return proc, json.loads(line)


async def soak(args: argparse.Namespace, web: dict[str, Any], data: Path) -> list[Sample]:
    settings = CrawlSettings(
        concurrency=args.concurrency,
        fetch=FetchLimits(total_timeout=5.0, read_timeout=5.0),
        politeness=PolitenessSettings(
            delay=args.delay, politeness_factor=0.0, max_retries=2, robots_error_ttl=5.0
        ),
        scope=ScopeSettings(
            allow_domains=tuple(web["crawl_domains"]),
            allow_loopback=True,
            max_pages_per_host=args.max_pages_per_host,
        ),
    )
    peer = Peer(PeerConfig(data_dir=data, crawl=settings, peer=PeerSettings(replicas=0)))
    # The whole run's lag, not the peer's sliding window: the p99 check is over all of it.
    lag = LoopLagMonitor(interval=0.05, window=int(args.duration / 0.05) + 100)
    await peer.start()
    lag.start()
    samples: list[Sample] = []
    try:
        await peer.add_seeds([web["hub"]])
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < args.duration:
            eng = peer.engine
            assert eng is not None
            window = peer.parts.node.lag.snapshot()
            samples.append(
                Sample(
                    t=round(elapsed, 2),
                    rss_mb=round(rss_mb(), 1),
                    fds=open_fds(),
                    queued=eng.tasks_queued,
                    in_flight=len(eng.in_flight),
                    frontier=len(eng.frontier),
                    lag_p99_ms=round(window.p99 * 1000, 2),
                    lag_max_ms=round(window.max * 1000, 2),
                    pages=eng.stats.pages_fetched,
                )
            )
            await asyncio.sleep(max(0.0, len(samples) - (time.monotonic() - started)))
        whole = lag.snapshot()
        samples.append(samples[-1])  # placeholder replaced below
        samples[-1] = Sample(
            **{
                **asdict(samples[-2]),
                "lag_p99_ms": round(whole.p99 * 1000, 2),
                "lag_max_ms": round(whole.max * 1000, 2),
            }
        )
    finally:
        await lag.aclose()
        await peer.aclose()
    return samples


def plot(samples: list[Sample], warm: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    axes[0].plot(t, [s.rss_mb for s in samples])
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].plot(t, [s.fds for s in samples])
    axes[1].set_ylabel("open descriptors")
    axes[2].plot(t, [s.queued for s in samples], label="queued")
    axes[2].plot(t, [s.frontier for s in samples], label="frontier window")
    axes[2].plot(t, [s.in_flight for s in samples], label="in flight")
    axes[2].set_ylabel("URLs")
    axes[2].legend(loc="upper left")
    axes[3].plot(t, [s.lag_p99_ms for s in samples], label="p99 (last 60 s)")
    axes[3].plot(t, [s.lag_max_ms for s in samples], label="max (last 60 s)")
    axes[3].axhline(LAG_P99_MAX_S * 1000, color="grey", linestyle=":", label="100 ms")
    axes[3].set_ylabel("event-loop lag (ms)")
    axes[3].set_xlabel("seconds")
    axes[3].legend(loc="upper left")
    for ax in axes:
        ax.axvline(warm, color="grey", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"p2pcrawl soak: one peer, test web with hostile hosts, {t[-1]:.0f} s")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def summarise(samples: list[Sample], warm_s: float) -> dict[str, Any]:
    body = samples[:-1]
    warm = next((s for s in body if s.t >= warm_s), body[0])
    end = body[-1]
    rss_growth = (end.rss_mb - warm.rss_mb) / warm.rss_mb if warm.rss_mb else 0.0
    whole = samples[-1]
    return {
        "duration_s": end.t,
        "samples": len(body),
        "pages": end.pages,
        "pages_per_s": round(end.pages / end.t, 1) if end.t else 0.0,
        "rss_mb": {"warm": warm.rss_mb, "end": end.rss_mb, "max": max(s.rss_mb for s in body)},
        "rss_end_over_warm": round(end.rss_mb / warm.rss_mb, 3) if warm.rss_mb else 0.0,
        "fds": {"warm": warm.fds, "end": end.fds, "max": max(s.fds for s in body)},
        "loop_lag_ms": {"p99": whole.lag_p99_ms, "max": whole.lag_max_ms},
        "checks": {
            "rss_growth_le_10pct": rss_growth <= RSS_GROWTH_MAX,
            "no_fd_leak": end.fds <= warm.fds + FD_SLACK,
            "lag_p99_lt_100ms": whole.lag_p99_ms < LAG_P99_MAX_S * 1000,
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds (600)")
    p.add_argument("--warmup", type=float, default=None, help="seconds (60, or a fifth)")
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--pages", type=int, default=20_000, help="pages per host")
    p.add_argument("--page-bytes", type=int, default=5_000)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--delay", type=float, default=0.02, help="per-host gap (s)")
    p.add_argument("--max-pages-per-host", type=int, default=5_000)
    p.add_argument("--quick", action="store_true", help="60 s, 10 hosts x 2,000 pages")
    p.add_argument("--out", type=Path, default=DOCS / "soak.png", help="the plot")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--json", type=Path, help="also write the samples and summary here")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.hosts, args.pages = min(args.duration, 60.0), 10, 2_000
    if args.warmup is None:
        args.warmup = min(60.0, args.duration / 5)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    proc, web = serve_web(args)
    try:
        with tempfile.TemporaryDirectory(prefix="p2pcrawl-soak-") as tmp:
            samples = asyncio.run(soak(args, web, Path(tmp)))
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()
    summary = summarise(samples, args.warmup)
    if not args.no_plot:
        plot(samples[:-1], args.warmup, args.out)
        summary["plot"] = str(args.out)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"summary": summary, "samples": [asdict(s) for s in samples[:-1]]})
        )
    print(
        f"{summary['samples']} samples over {summary['duration_s']:.0f} s, "
        f"{summary['pages']} pages ({summary['pages_per_s']}/s); "
        f"RSS end/warm {summary['rss_end_over_warm']}x, "
        f"fds {summary['fds']['warm']} -> {summary['fds']['end']}, "
        f"loop lag p99 {summary['loop_lag_ms']['p99']} ms, max {summary['loop_lag_ms']['max']} ms"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
