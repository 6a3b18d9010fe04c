"""Flood benchmark: a keyed 3-peer crawl while one source floods a peer's UDP port.

Two runs on the same test web, in one invocation: a baseline crawl, then the same crawl while
a separate process sends unauthenticated datagrams from 127.0.0.2 to one peer at a fixed
rate (the peer must verify, drop and count each). Prints pages lost (must be 0), duplicate
fetches, time to complete relative to the baseline, and how many flood datagrams the peer saw
and dropped (the rest were lost to the full socket buffer, along with some of the peers' own
datagrams, which are retried).

    python benchmarks/flood.py            # 50,000 datagrams/s for 20 s
    python benchmarks/flood.py --quick    # 10,000 datagrams/s for 5 s, a smaller web
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from p2pcrawl.testing import Cluster, PeerProc, TestWeb, TestWebConfig

FAST = ["--rpc-timeout", "0.5", "--ping-interval", "0.5", "--republish-interval", "2"]

# The flooder: its own process (its own core), paced in 1 ms slices, and it stops itself.
FLOODER = r"""
import os, socket, sys, time
host, port, rate, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.2", 0))
junk = [b"\x00" + os.urandom(20) + os.urandom(180) for _ in range(64)]
sent, start = 0, time.monotonic()
while (now := time.monotonic()) - start < seconds:
    due = int((now - start) * rate)
    while sent < due:
        try:
            s.sendto(junk[sent & 63], (host, port))
        except OSError:
            pass
        sent += 1
    time.sleep(0.001)
print(sent, flush=True)
"""


def crawl_args(web: TestWeb) -> list[str]:
    args = ["--allow-private", "--politeness-factor", "0", "--concurrency", "8", "--delay", "0.1"]
    args += ["--secret", "flood-benchmark-key", *FAST]
    for d in web.allow_domains:
        args += ["--allow-domain", d]
    return args


async def dropped_bad_hmac(peer: PeerProc) -> float:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{peer.status}/metrics") as resp,
    ):
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('p2pcrawl_datagrams_dropped_total{reason="bad_hmac"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def one_run(web: TestWeb, root: Path, *, rate: int, seconds: float) -> dict[str, float]:
    truth = web.ground_truth()
    async with Cluster(root, crawl_args(web)) as cluster:
        founder = await cluster.start_peer("p0")
        for i in (1, 2):
            await cluster.start_peer(f"p{i}", bootstrap=founder)
        await cluster.wait_until(
            lambda ss: len(ss) == 3 and all(s["peers"] == 2 for s in ss), 30, "a full mesh"
        )
        target = cluster.peers[1]
        flooder = None
        if rate:
            host, port = target.listen.rsplit(":", 1)
            flooder = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                FLOODER,
                host,
                port,
                str(rate),
                str(seconds),
                stdout=asyncio.subprocess.PIPE,
            )
        started = time.monotonic()
        await cluster.api(founder, "/api/seed", "POST", {"urls": [web.hub_url]})
        sent = 0
        try:
            await cluster.wait_finished(timeout=600)
            elapsed = time.monotonic() - started
            if flooder is not None:
                async with asyncio.timeout(seconds + 30):
                    out, _ = await flooder.communicate()
                sent = int(out.decode().strip() or 0)
        finally:
            if flooder is not None and flooder.returncode is None:
                flooder.kill()  # by its own PID
                await flooder.wait()
        dropped = await dropped_bad_hmac(target)
        for p in cluster.peers:
            cluster.terminate(p)
        for p in cluster.peers:
            if p.proc.returncode is None:
                await cluster.wait_exit(p, 60)
        counts = cluster.warc_counts()
    return {
        "elapsed": elapsed,
        "lost": len(truth - set(counts)),
        "duplicates": sum(n - 1 for n in counts.values()),
        "sent": sent,
        "dropped": dropped,
    }


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10,000/s for 5 s on a smaller web")
    ap.add_argument("--rate", type=int, help="flood datagrams per second (50,000)")
    ap.add_argument("--seconds", type=float, help="flood duration (20)")
    args = ap.parse_args()
    rate = args.rate or (10_000 if args.quick else 50_000)
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    hosts, pages = (8, 30) if args.quick else (16, 60)
    cfg = TestWebConfig(hosts=hosts, pages_per_host=pages, slow_host_delay=0.02)
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-flood-") as tmp:
        async with TestWeb(cfg) as web:
            n = len(web.ground_truth())
            print(f"test web: {hosts} hosts, {n} URLs; 3 keyed peers; flood {rate}/s x {seconds} s")
            base = await one_run(web, Path(tmp) / "quiet", rate=0, seconds=0)
            web.request_counts.clear()
            flood = await one_run(web, Path(tmp) / "flood", rate=rate, seconds=seconds)
    for name, r in (("quiet", base), ("flood", flood)):
        print(
            f"{name:6s} {r['elapsed']:7.1f} s  lost {r['lost']:.0f}  duplicates "
            f"{r['duplicates']:.0f}  flood sent {r['sent']:.0f}  "
            f"dropped bad_hmac {r['dropped']:.0f}"
        )
    ratio = flood["elapsed"] / base["elapsed"]
    seen = flood["dropped"] / flood["sent"] if flood["sent"] else 0.0
    print(f"time to complete under flood: {ratio:.2f}x the quiet run")
    print(f"flood datagrams read and dropped by the peer: {100 * seen:.1f}% (the rest: kernel)")
    print(
        json.dumps(
            {
                "flood_rate": rate,
                "flood_seconds": seconds,
                "lost": flood["lost"] + base["lost"],
                "slowdown": round(ratio, 3),
                "flood_seen_fraction": round(seen, 3),
                "duplicates": flood["duplicates"],
            }
        )
    )
    return 0 if flood["lost"] == 0 and base["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
