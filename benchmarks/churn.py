"""Churn benchmark: 8 peers crawl the test web while peers join, leave and are killed.

Two runs on the same test web, in one invocation: a baseline with 8 steady peers, then the
same crawl under churn (random joins, graceful leaves and SIGKILLs at random moments, at
least 4 peers always alive). Prints pages lost (must be 0), duplicate fetches, and the time
to complete relative to the baseline.

    python benchmarks/churn.py                 # 16 hosts x 40 pages, 8 churn events
    python benchmarks/churn.py --events 12 --seed 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

from p2pcrawl.testing import Cluster, PeerProc, TestWeb, TestWebConfig

FAST = [
    "--rpc-timeout",
    "0.5",
    "--ping-interval",
    "0.5",
    "--suspicion-timeout",
    "2",
    "--republish-interval",
    "2",
]


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


async def one_run(
    web: TestWeb, root: Path, *, peers: int, events: int, rng: random.Random, delay: float
) -> dict[str, object]:
    truth = web.ground_truth()
    async with Cluster(root, crawl_args(web, delay)) as cluster:
        await start_network(cluster, peers)
        started = time.monotonic()
        await cluster.api(cluster.peers[0], "/api/seed", "POST", {"urls": [web.hub_url]})
        log: list[str] = []
        next_name = peers
        for _ in range(events):
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            alive = [p for p in cluster.peers if p.alive]
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
                else:
                    cluster.kill(victim)
                    await victim.proc.wait()
            log.append(f"{kind}@{done}")
        await cluster.wait_finished(timeout=300)
        elapsed = time.monotonic() - started
        for p in cluster.peers:
            cluster.terminate(p)
        for p in cluster.peers:
            if p.proc.returncode is None:
                await cluster.wait_exit(p, 60)
        counts = cluster.warc_counts()
    lost = truth - set(counts)
    return {
        "elapsed": elapsed,
        "lost": len(lost),
        "extra": len(set(counts) - truth),
        "duplicates": sum(n - 1 for n in counts.values()),
        "events": log,
    }


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--events", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.3, help="per-host politeness gap")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cfg = TestWebConfig(
        hosts=args.hosts, pages_per_host=args.pages, slow_host_delay=0.02, large_page_bytes=200_000
    )
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-churn-") as tmp:
        async with TestWeb(cfg) as web:
            n = len(web.ground_truth())
            print(f"test web: {args.hosts} hosts, {n} URLs; {args.peers} peers")
            base = await one_run(
                web, Path(tmp) / "steady", peers=args.peers, events=0, rng=rng, delay=args.delay
            )
            web.request_counts.clear()
            churn = await one_run(
                web,
                Path(tmp) / "churn",
                peers=args.peers,
                events=args.events,
                rng=rng,
                delay=args.delay,
            )
    for name, r in (("steady", base), ("churn", churn)):
        print(
            f"{name:7s} {r['elapsed']:7.1f} s  lost {r['lost']}  duplicates {r['duplicates']}"
            f"  out-of-truth {r['extra']}"
        )
    print(f"churn events: {' '.join(churn['events'])}")  # type: ignore[arg-type]
    ratio = float(churn["elapsed"]) / float(base["elapsed"])  # type: ignore[arg-type]
    print(f"time to complete under churn: {ratio:.2f}x the steady run")
    dup_pct = 100 * int(churn["duplicates"]) / n  # type: ignore[call-overload]
    print(f"pages lost: {churn['lost']} (must be 0); duplicate fetches: {dup_pct:.2f}%")
    return 0 if churn["lost"] == 0 and base["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
