from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from p2pcrawl.testing import Cluster, PeerProc, TestWeb, TestWebConfig
from tests.conftest import TEST_MIN_PEER_AGE


@pytest.fixture
async def web() -> AsyncIterator[TestWeb]:
    async with TestWeb(
        TestWebConfig(hosts=8, pages_per_host=40, slow_host_delay=0.02, large_page_bytes=300_000)
    ) as w:
        yield w


CONCURRENCY = 8  # every integration peer's --concurrency


def crawl_args(web: TestWeb, *extra: str) -> list[str]:
    args = ["--allow-private", "--politeness-factor", "0", "--concurrency", str(CONCURRENCY)]
    args += ["--min-peer-age", str(TEST_MIN_PEER_AGE)]
    for d in web.allow_domains:
        args += ["--allow-domain", d]
    return [*args, *extra]


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[object]:
    clusters: list[Cluster] = []

    async def factory(common: list[str]) -> Cluster:
        c = Cluster(tmp_path, common)
        await c.__aenter__()
        clusters.append(c)
        return c

    yield factory
    for c in clusters:
        await c.__aexit__(None, None, None)


async def start_mesh(cluster: Cluster, n: int) -> list[PeerProc]:
    """A founder and n-1 joiners, returned once every peer knows every other."""
    founder = await cluster.start_peer("p0")
    peers = [founder]
    for i in range(1, n):
        peers.append(await cluster.start_peer(f"p{i}", bootstrap=founder))
    await cluster.wait_until(
        lambda ss: len(ss) == n and all(s["peers"] == n - 1 for s in ss), 20, "a full mesh"
    )
    return peers


async def leave_all(cluster: Cluster) -> Counter[str]:
    """SIGTERM every peer (a graceful leave), require exit 0, and count the WARC URLs."""
    for p in cluster.peers:
        cluster.terminate(p)
    for p in cluster.peers:
        assert await cluster.wait_exit(p, 30) == 0, cluster.log(p)
    return cluster.warc_counts()


# Junk datagrams at a peer for the given seconds, as fast as one process sends them or at
# about ``rate`` a second; prints how many it sent. Bounded, and it stops by itself.
_FLOOD = """
import os, socket, sys, time
host, port, seconds, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
junk = os.urandom(200)
start = time.monotonic()
n = 0
while (now := time.monotonic()) < start + seconds:
    if rate and n > (now - start) * rate:
        time.sleep(0.005)
        continue
    for _ in range(100):
        try:
            s.sendto(junk, (host, port))
            n += 1
        except OSError:
            pass
print(n)
"""


async def spawn_flood(listen: str, seconds: float, rate: float = 0.0) -> asyncio.subprocess.Process:
    """A flood of the peer listening at ``listen`` (``host:port``); read its stdout for the
    count it sent."""
    host, port = listen.rsplit(":", 1)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _FLOOD,
        host,
        port,
        str(seconds),
        str(rate),
        stdout=asyncio.subprocess.PIPE,
    )
