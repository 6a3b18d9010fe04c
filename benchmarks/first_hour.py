"""A new user's first hour, measured: the figures of the README's first sections.

Each scenario against a baseline measured in the same run:

* ``dead_hosts``: ``join --exit-when-finished`` (default settings, ``--allow-loopback``) on a
  small local site, alone and then with a closed port and a ``.invalid`` host among its
  seeds: the seconds from the last real page to the exit, both times. Before hosts that do
  not answer were given up, the second run did not end for ten minutes.
* ``max_disk``: one peer crawls a fast test web (100 KB pages, 32 fetches at once) under
  ``--max-disk 3M``; the largest size of its data directory, sampled every 20 ms, over the
  bound (was 2.1x-2.9x).
* ``big_config``: seconds to the ready line of ``join --config`` with 300,000
  ``allow-domain`` entries, and without (was: no ready line after a minute).
* ``founder_view``: a joiner whose status server starts before it joins, as ``join`` does:
  seconds from its start to its row in the founder's network view, and to its own (was
  about 60 s for the founder).
* ``upgrade``: three peers crawl a test web; mid-crawl one is stopped with SIGTERM, as
  ``systemctl stop`` does, and started again on the same data directory. Pages lost
  (must be 0), fetched twice, and the time against a steady run of the same web.

    python benchmarks/first_hour.py            # all, the upgrade on 8 hosts x 60 pages
    python benchmarks/first_hour.py --quick    # smaller
    python benchmarks/first_hour.py --only upgrade,max_disk

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.testing import FAST_DETECTION, Cluster, PeerProc, TestWeb, TestWebConfig

CLI = [sys.executable, "-m", "p2pcrawl"]
SCENARIOS = ("dead_hosts", "max_disk", "big_config", "founder_view", "upgrade")


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _join(root: Path, name: str, *args: str) -> asyncio.subprocess.Process:
    log = (root / f"{name}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *CLI, "join", "--listen", "127.0.0.1:0", "--status", "127.0.0.1:0",
        "--data", str(root / name), *args,
        stdout=asyncio.subprocess.PIPE, stderr=log,
    )  # fmt: skip
    log.close()
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()


# -- dead hosts -------------------------------------------------------------------------------


async def _batch(root: Path, name: str, seeds: list[str]) -> tuple[float, dict[str, Any]]:
    """Seconds from the last real page to the exit, and the final JSON line."""
    args = ["--allow-loopback", "--exit-when-finished"]
    for s in seeds:
        args += ["--seed", s]
    proc = await _join(root, name, *args)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 900)
    finally:
        await _stop(proc)
    ended = time.time()
    final = json.loads(out.decode().splitlines()[-1])
    last_page = max(
        (p.stat().st_mtime for p in (root / name / "warc").glob("*.warc.gz")), default=ended
    )
    return ended - last_page, final


async def dead_hosts(root: Path, quick: bool) -> dict[str, Any]:
    # A small site, so the dead hosts are what the crawl waits for at its end.
    config = TestWebConfig(hosts=1, pages_per_host=3 if quick else 6, features=False)
    async with TestWeb(config) as web:
        alone, base = await _batch(root, "alone", [web.hub_url])
        dead = [f"http://127.0.0.1:{free_port()}/", "http://no-such-host.invalid/"]
        with_dead, final = await _batch(root, "dead", [web.hub_url, *dead])
    return {
        "exit_after_last_page_s": round(with_dead, 1),
        "baseline_s": round(alone, 1),
        "pages": final["pages_fetched"],
        "baseline_pages": base["pages_fetched"],
        "hosts_given_up": sorted(g["origin"] for g in final["unreachable"]),
    }


# -- max disk ---------------------------------------------------------------------------------


async def max_disk(root: Path, quick: bool) -> dict[str, Any]:
    from p2pcrawl.crawl.disk import directory_bytes
    from p2pcrawl.network import Peer, PeerConfig
    from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings

    out: dict[str, Any] = {}
    for label, limit, page in (("3M_100KB", 3 << 20, 100_000), ("20M_30KB", 20 << 20, 30_000)):
        if quick and label != "3M_100KB":
            continue
        config = TestWebConfig(hosts=8, pages_per_host=400, features=False, page_bytes=page)
        async with TestWeb(config) as web:
            settings = CrawlSettings(
                politeness=PolitenessSettings(delay=0.0, politeness_factor=0.0),
                scope=ScopeSettings(
                    allow_domains=tuple(web.allow_domains),
                    allow_loopback=True,
                    max_disk_bytes=limit,
                ),
            )
            data = root / f"disk-{label}"
            peer = Peer(PeerConfig(data_dir=data, crawl=settings))
            await peer.start()
            most = 0
            try:
                await peer.seed([web.hub_url])
                while True:
                    most = max(most, await asyncio.to_thread(directory_bytes, data))
                    eng = peer.engine
                    assert eng is not None
                    if eng.disk.full and not eng.in_flight and not eng.tails:
                        break
                    await asyncio.sleep(0.02)
                most = max(most, await asyncio.to_thread(directory_bytes, data))
                pages = eng.stats.pages_fetched
            finally:
                await peer.aclose()
        out[label] = {"max_bytes": most, "ratio": round(most / limit, 3), "pages": pages}
    return out


# -- a big config -----------------------------------------------------------------------------


async def _ready_s(root: Path, name: str, *args: str) -> float:
    started = time.monotonic()
    proc = await _join(root, name, *args)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 600)
        assert json.loads(line)["ready"]
        return time.monotonic() - started
    finally:
        await _stop(proc)


async def big_config(root: Path, quick: bool) -> dict[str, Any]:
    n = 30_000 if quick else 300_000
    path = root / "big.toml"
    names = "\n".join(f'  "site-{i}.example.com",' for i in range(n))
    path.write_text(f"allow-domain = [\n{names}\n]\n", encoding="utf-8")
    plain = await _ready_s(root, "plain")
    big = await _ready_s(root, "big", "--config", str(path))
    return {
        "domains": n,
        "config_mb": round(path.stat().st_size / 1e6, 1),
        "ready_s": round(big, 2),
        "baseline_ready_s": round(plain, 2),
    }


# -- the founder's view -----------------------------------------------------------------------


async def founder_view(root: Path, quick: bool) -> dict[str, Any]:
    status = free_port()
    founder = await _join(root, "f0", "--status", f"127.0.0.1:{status}")
    joiner: asyncio.subprocess.Process | None = None
    try:
        assert founder.stdout is not None
        ready = json.loads(await founder.stdout.readline())
        started = time.monotonic()
        joiner = await _join(root, "f1", "--bootstrap", ready["listen"])
        assert joiner.stdout is not None
        mine = json.loads(await asyncio.wait_for(joiner.stdout.readline(), 60))
        seen: dict[str, float] = {}
        async with aiohttp.ClientSession() as s:
            for who, addr in (("founder", f"127.0.0.1:{status}"), ("joiner", mine["status"])):
                while time.monotonic() - started < 180:
                    async with s.get(f"http://{addr}/api/network") as r:
                        doc = await r.json()
                    if doc["peers_reachable"] == 2 == doc["peers_known"]:
                        seen[who] = round(time.monotonic() - started, 1)
                        break
                    await asyncio.sleep(0.25)
        return {
            "founder_sees_joiner_s": seen.get("founder"),
            "joiner_sees_all_s": seen.get("joiner"),
        }
    finally:
        for p in (joiner, founder):
            if p is not None:
                await _stop(p)


# -- a rolling upgrade ------------------------------------------------------------------------


async def _crawl(web: TestWeb, root: Path, upgrade: bool) -> dict[str, Any]:
    args = ["--allow-private", "--delay", "0.05", "--politeness-factor", "0", *FAST_DETECTION]
    for d in web.allow_domains:
        args += ["--allow-domain", d]
    web.request_counts.clear()
    async with Cluster(root, args) as cluster:
        founder = await cluster.start_peer("p0")
        peers = [founder] + [await cluster.start_peer(f"p{i}", bootstrap=founder) for i in (1, 2)]
        await cluster.wait_until(
            lambda ss: len(ss) == 3 and all(s["peers"] == 2 for s in ss), 30, "a full mesh"
        )
        started = time.monotonic()
        await cluster.api(founder, "/api/seed", "POST", {"urls": [web.hub_url]})
        truth = len(web.ground_truth())
        stopped_s = 0.0
        if upgrade:
            victim: PeerProc = peers[2]

            async def fetched() -> int:
                return sum(int(s["pages_fetched"]) for s in await cluster.statuses())

            while await fetched() < truth // 3:  # noqa: ASYNC110 (polled over HTTP)
                await asyncio.sleep(0.2)
            old_id = victim.node_id
            down = time.monotonic()
            cluster.terminate(victim)  # SIGTERM: the graceful leave systemctl stop sends
            code = await cluster.wait_exit(victim, 120)
            assert code == 0, cluster.log(victim)
            # "upgrade" here; then the same command on the same data directory
            again = await cluster.start_peer("p2-again", bootstrap=founder, data=victim.data)
            stopped_s = time.monotonic() - down
            assert again.node_id == old_id, "a restart keeps its node ID"
        await cluster.wait_finished(timeout=600)
        elapsed = time.monotonic() - started
        for p in cluster.peers:
            cluster.terminate(p)  # graceful: every WARC record written and closed
        for p in cluster.peers:
            if p.proc.returncode is None:
                await cluster.wait_exit(p, 60)
        archived = await asyncio.to_thread(_archived, root)
    got = set(archived)
    served = Counter({u: n for u, n in web.request_counts.items() if not u.endswith("/robots.txt")})
    return {
        "lost": len(web.ground_truth() - got),
        "duplicates": sum(n - 1 for n in served.values() if n > 1),
        "seconds": round(elapsed, 1),
        "stopped_for_s": round(stopped_s, 1),
    }


def _archived(root: Path) -> Counter[str]:
    """The URLs in the WARC files of every data directory under ``root`` (blocking)."""
    archived: Counter[str] = Counter()
    for data in sorted(root.iterdir()):
        if (data / "warc").is_dir():
            archived.update(read_warc_urls(data / "warc"))
    return archived


async def upgrade(root: Path, quick: bool) -> dict[str, Any]:
    hosts, pages = (4, 40) if quick else (8, 60)
    async with TestWeb(TestWebConfig(hosts=hosts, pages_per_host=pages, features=False)) as web:
        (root / "steady").mkdir()
        (root / "rolling").mkdir()
        steady = await _crawl(web, root / "steady", upgrade=False)
        rolling = await _crawl(web, root / "rolling", upgrade=True)
    return {
        "pages": len(web.ground_truth()),
        "lost": rolling["lost"],
        "duplicates": rolling["duplicates"],
        "time_ratio": round(rolling["seconds"] / steady["seconds"], 2),
        "steady": steady,
        "rolling": rolling,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    runs = {
        "dead_hosts": dead_hosts,
        "max_disk": max_disk,
        "big_config": big_config,
        "founder_view": founder_view,
        "upgrade": upgrade,
    }
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-first-hour-") as tmp:
        for name in chosen:
            where = Path(tmp) / name
            where.mkdir()
            started = time.monotonic()
            result[name] = await runs[name](where, args.quick)
            print(f"{name} ({time.monotonic() - started:.0f} s): {json.dumps(result[name])}")
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
