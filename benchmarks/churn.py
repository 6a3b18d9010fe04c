"""Churn benchmark: 8 peers crawl the test web while peers join, leave and are killed.

For each of several seeds, two runs on one test web: a baseline with 8 steady peers, then
the same crawl under churn (random joins, graceful leaves and SIGKILLs at random moments,
at least 4 peers always alive). Per run: pages lost (must be 0), duplicate fetches counted
by the test web's server (not from WARC files), and the time to complete against the steady
run of the same seed, with the fixed quiet window of the finish check subtracted from both.
Prints the median and range over the seeds; the last line is one JSON object.

    python benchmarks/churn.py                 # 5 seeds, 16 hosts x 40 pages, 8 events
    python benchmarks/churn.py --quick         # 2 seeds, 4 events
    python benchmarks/churn.py --runs 3 --seed 7
    python benchmarks/churn.py --detection     # detection time and false deaths, defaults
    python benchmarks/churn.py --chaos --seeds 10   # a random schedule at full speed (_chaos.py)
    python benchmarks/churn.py --chaos --kinds join,leave,kill,stop   # the same, no floods
    python benchmarks/churn.py --chaos --flood-rate 0   # floods as fast as one process sends
    python benchmarks/churn.py --chaos --control   # + the steady run under the events' load
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _chaos import FLOOD_RATE, chaos
from _detection import LOADS, detection

from p2pcrawl.testing import FAST_DETECTION, Cluster, PeerProc, TestWeb, TestWebConfig

FAST = list(FAST_DETECTION)


def crawl_args(web: TestWeb, delay: float) -> list[str]:
    args = ["--allow-private", "--politeness-factor", "0", "--concurrency", "8"]
    args += ["--delay", str(delay), *FAST]
    for d in web.allow_domains:
        args += ["--allow-domain", d]
    return args


async def start_network(cluster: Cluster, n: int) -> list[PeerProc]:
    founder = await cluster.start_peer("p0")
    for i in range(1, n):
        await cluster.start_peer(f"p{i}", bootstrap=founder)
    await cluster.wait_until(
        lambda ss: len(ss) == n and all(s["peers"] == n - 1 for s in ss), 30, "a full mesh"
    )
    return list(cluster.peers)


QUIET_S = 3.0  # Cluster.wait_finished's settle window, the same in every run


def _seconds(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)


async def one_run(
    web: TestWeb, root: Path, *, peers: int, events: int, rng: random.Random, delay: float
) -> dict[str, object]:
    truth = web.ground_truth()
    web.request_counts.clear()
    async with Cluster(root, crawl_args(web, delay)) as cluster:
        await start_network(cluster, peers)
        started = time.monotonic()
        await cluster.api(cluster.peers[0], "/api/seed", "POST", {"urls": [web.hub_url]})
        log: list[str] = []
        next_name = peers
        # A peer asked to leave runs on while it hands off, and exits soon after: not a
        # bootstrap for a joiner, nor a victim again.
        leaving: set[str] = set()
        for _ in range(events):
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            alive = [p for p in cluster.peers if p.alive and p.name not in leaving]
            done = sum(s["pages_fetched"] for s in await cluster.statuses())
            if done >= len(truth) * 0.9:
                break
            kind = rng.choice(["join", "leave", "kill"]) if len(alive) > 4 else "join"
            if kind == "join":
                boot = rng.choice(alive)
                await cluster.start_peer(f"p{next_name}", bootstrap=boot)
                next_name += 1
            else:
                victim = rng.choice(alive[1:])  # the seeded founder stays: any other may go
                if kind == "leave":
                    await cluster.api(victim, "/api/leave", "POST")
                    leaving.add(victim.name)
                else:
                    cluster.kill(victim)
                    await victim.proc.wait()
            log.append(f"{kind}@{done}")
        await cluster.wait_finished(timeout=300, quiet=QUIET_S)
        elapsed = time.monotonic() - started - QUIET_S
        for p in cluster.peers:
            cluster.terminate(p)
        for p in cluster.peers:
            if p.proc.returncode is None:
                await cluster.wait_exit(p, 60)
    counts = web.request_counts
    return {
        "elapsed": elapsed,
        "lost": len(truth - set(counts)),
        "duplicates": sum(n - 1 for u, n in counts.items() if u in truth),
        "events": log,
    }


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (range {min(values):.2f}-{max(values):.2f})"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--events", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5, help="seeds: --seed, --seed+1, ...")
    ap.add_argument("--delay", type=float, default=0.3, help="per-host politeness gap")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 seeds, 4 churn events")
    ap.add_argument(
        "--detection",
        action="store_true",
        help="measure failure detection at the default timers instead (_detection.py)",
    )
    ap.add_argument("--sizes", default="4,8,16", help="--detection: network sizes")
    ap.add_argument("--loads", default=",".join(LOADS), help="--detection: idle,crawl,hog")
    ap.add_argument("--kills", type=int, default=3, help="--detection: victims per network")
    ap.add_argument(
        "--chaos",
        action="store_true",
        help="a seeded random schedule at full speed, every timer at its default (_chaos.py)",
    )
    ap.add_argument("--seeds", type=int, default=10, help="--chaos: seeds --seed, --seed+1, ...")
    ap.add_argument("--web-pages", type=int, default=5000, help="--chaos: pages of the web")
    ap.add_argument(
        "--kinds",
        default="join,leave,kill,stop,flood",
        help="--chaos: the events drawn (without flood: a flood's junk costs a 2-core machine "
        "its crawl time, not the protocol)",
    )
    ap.add_argument(
        "--flood-rate",
        type=float,
        default=FLOOD_RATE,
        help="--chaos: junk datagrams a second per flood (0: as fast as one process sends, "
        "which takes a core of this machine from the crawl)",
    )
    ap.add_argument(
        "--control",
        action="store_true",
        help="--chaos: also the steady run under each chaos run's machine load (a burner per "
        "joiner, as much CPU as its start-up took, and its floods, at the same moments) and "
        "no event: what the events cost this machine, apart from what they cost the crawl",
    )
    args = ap.parse_args()
    if args.flood_rate < 0:
        ap.error("--flood-rate: 0 or more")
    if args.chaos:
        seeds = list(range(args.seed, args.seed + (2 if args.quick else args.seeds)))
        out = await chaos(
            seeds,
            args.events,
            args.web_pages,
            args.kinds.split(","),
            args.flood_rate,
            args.control,
        )
        print(json.dumps(out))
        return 0 if out["lost_max"] == 0 else 1
    if args.detection:
        with tempfile.TemporaryDirectory(prefix="p2pcrawl-detect-") as tmp:
            sizes = [int(x) for x in args.sizes.split(",")]
            out = await detection(Path(tmp), sizes, args.loads.split(","), args.kills)
        print(json.dumps(out))
        return 0 if out["false_deaths"] == 0 else 1
    if args.quick:
        args.runs, args.events = 2, 4
    cfg = TestWebConfig(
        hosts=args.hosts, pages_per_host=args.pages, slow_host_delay=0.02, large_page_bytes=200_000
    )
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-churn-") as tmp:
        async with TestWeb(cfg) as web:
            n = len(web.ground_truth())
            print(f"test web: {args.hosts} hosts, {n} URLs; {args.peers} peers; {args.runs} seeds")
            for i in range(args.runs):
                seed = args.seed + i
                rng = random.Random(seed)
                root = Path(tmp) / f"seed{seed}"
                base = await one_run(
                    web, root / "steady", peers=args.peers, events=0, rng=rng, delay=args.delay
                )
                churn = await one_run(
                    web,
                    root / "churn",
                    peers=args.peers,
                    events=args.events,
                    rng=rng,
                    delay=args.delay,
                )
                ratio = _seconds(churn["elapsed"]) / _seconds(base["elapsed"])
                row = {
                    "seed": seed,
                    "lost": churn["lost"],
                    "steady_lost": base["lost"],
                    "duplicates": churn["duplicates"],
                    "steady_duplicates": base["duplicates"],
                    "time_ratio": round(ratio, 3),
                    "events": churn["events"],
                }
                rows.append(row)
                print(
                    f"seed {seed}: lost {row['lost']}  duplicates {row['duplicates']}"
                    f" ({100 * int(row['duplicates']) / n:.2f}%)  time {ratio:.2f}x steady"
                    f"  [{' '.join(churn['events'])}]"  # type: ignore[arg-type]
                )
    lost = [float(r["lost"]) for r in rows]  # type: ignore[arg-type]
    dups = [100 * float(r["duplicates"]) / n for r in rows]  # type: ignore[arg-type]
    ratios = [float(r["time_ratio"]) for r in rows]  # type: ignore[arg-type]
    print(f"pages lost: {spread(lost)} (must be 0)")
    print(f"duplicate fetches, % of pages: {spread(dups)}")
    print(f"time to complete under churn, x steady: {spread(ratios)}")
    summary = {
        "runs": len(rows),
        "pages": n,
        "lost_max": max(lost),
        "duplicates_pct_median": round(statistics.median(dups), 3),
        "duplicates_pct_range": [round(min(dups), 3), round(max(dups), 3)],
        "time_ratio_median": round(statistics.median(ratios), 3),
        "time_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }
    print(json.dumps(summary))
    return 0 if all(r["lost"] == 0 and r["steady_lost"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
