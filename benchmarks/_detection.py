"""Failure detection with the default timers: how soon a dead peer is declared dead, and
whether a live one ever is (``churn.py --detection``).

For each network size and load: N real peers on loopback (a founder, the rest joining at
once), every timer at its default. Loads: ``idle`` (no crawl), ``crawl`` (the founder seeded
with a web that the peers crawl at full speed, no politeness delay) and ``hog`` (the crawl,
with one busy-looping process per core at normal priority beside it, so the peers share a
saturated machine) and ``flood`` (the crawl, and a 10 s flood of junk datagrams at the
founder's UDP port first, as the flood test sends). Then ``kills`` peers are SIGKILLed one
at a time, a few seconds apart, and each survivor's ``peer_lost`` event for each victim
gives one detection time (its wall time minus the kill's). A ``peer_lost`` for a peer that
was still running is a false death.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pcrawl.testing import Cluster, PeerProc, TestWeb, TestWebConfig

LOADS = ("idle", "crawl", "hog", "flood")
FLOOD_S = 10.0
# As tests/integration/test_churn.py's flood: junk datagrams as fast as one process sends,
# or at ``rate`` a second (a fifth argument, ``_chaos``); prints how many it sent and the
# CPU seconds it took (on this machine, the crawl's cores). At a rate, the datagrams go out
# 64 to a ``sendmmsg`` call where libc has it: an attacker floods from a machine of its own,
# and here the sender's CPU is taken from the crawl's two cores (a third less than one
# ``sendto`` a datagram, measured at 50,000 a second).
FLOOD = """
import ctypes, os, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
junk = os.urandom(200)
send_many = None
if rate > 0:
    s.connect((host, port))
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "sendmmsg"):
        class Iov(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        class Hdr(ctypes.Structure):
            _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                        ("iov", ctypes.POINTER(Iov)), ("iovlen", ctypes.c_size_t),
                        ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                        ("flags", ctypes.c_int)]
        class MHdr(ctypes.Structure):
            _fields_ = [("hdr", Hdr), ("len", ctypes.c_uint)]
        buf = ctypes.create_string_buffer(junk, len(junk))
        iov = Iov(ctypes.addressof(buf), len(junk))
        msgs = (MHdr * 64)()
        for m in msgs:
            m.hdr.iov, m.hdr.iovlen = ctypes.pointer(iov), 1
        fd = s.fileno()
        def send_many(n):
            while n > 0:
                done = libc.sendmmsg(fd, msgs, min(n, 64), 0)
                if done <= 0:
                    return
                n -= done
start = time.monotonic()
sent = 0
while (now := time.monotonic()) < start + seconds:
    batch = max(0, int((now - start) * rate) - sent) if rate > 0 else 200
    if send_many is not None:
        send_many(batch)
    else:
        for _ in range(batch):
            try:
                s.sendto(junk, (host, port))
            except OSError:
                pass
    sent += batch
    if rate > 0:
        time.sleep(0.005)
print(sent, time.process_time(), flush=True)
"""


async def spawn_flood(
    host: str, port: str | int, seconds: float, rate: float = 0.0, *, out: int | None = None
) -> asyncio.subprocess.Process:
    """A ``FLOOD`` process: junk datagrams at ``host:port`` for ``seconds``, ``rate`` a
    second (0: as fast as one process sends them). With ``out=asyncio.subprocess.PIPE`` it
    says how many it sent and the CPU seconds it took."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FLOOD,
        host,
        str(port),
        str(seconds),
        str(rate),
        stdout=asyncio.subprocess.DEVNULL if out is None else out,
    )


KILL_GAP_S = 10.0  # between kills: long enough for the slowest detection we accept
_HOG = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@dataclass
class DetectionRun:
    peers: int
    load: str
    detections: list[float] = field(default_factory=list)  # seconds, one per survivor per kill
    missed: int = 0  # survivors that never declared a victim dead
    false_deaths: list[str] = field(default_factory=list)
    stalls: int = 0  # "stalled" events: a peer's loop stood still for half the timeout

    def row(self) -> dict[str, Any]:
        d = sorted(self.detections)
        return {
            "peers": self.peers,
            "load": self.load,
            "detections": len(d),
            "median_s": round(statistics.median(d), 2) if d else None,
            "p90_s": round(d[min(len(d) - 1, int(0.9 * len(d)))], 2) if d else None,
            "max_s": round(d[-1], 2) if d else None,
            "missed": self.missed,
            "false_deaths": len(self.false_deaths),
            "stalls": self.stalls,
        }


def web_args(web: TestWeb) -> list[str]:
    args = ["--allow-private", "--politeness-factor", "0", "--delay", "0"]
    for d in web.allow_domains:
        args += ["--allow-domain", d]
    return args


def hog() -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL)
        for _ in range(os.cpu_count() or 1)
    ]


async def lost_events(
    cluster: Cluster, peer: PeerProc, stalls: dict[str, int] | None = None
) -> list[tuple[str, float]]:
    with contextlib.suppress(Exception):
        doc = await cluster.api(peer, "/api/events")
        if stalls is not None:
            stalls[peer.name] = sum(1 for e in doc["events"] if e.get("kind") == "stalled")
        return [
            (str(e["peer"]), float(e["t"])) for e in doc["events"] if e.get("kind") == "peer_lost"
        ]
    return []


async def one(root: Path, web: TestWeb, peers: int, load: str, kills: int) -> DetectionRun:
    run = DetectionRun(peers, load)
    hogs: list[subprocess.Popen[bytes]] = []
    async with Cluster(root, web_args(web), startup_timeout=120) as cluster:
        try:
            founder = await cluster.start_peer("p0")
            await asyncio.gather(
                *(cluster.start_peer(f"p{i}", bootstrap=founder) for i in range(1, peers))
            )
            await cluster.wait_until(
                lambda ss: len(ss) == peers and all(s["peers"] == peers - 1 for s in ss),
                120,
                "a full mesh",
            )
            if load != "idle":
                web.request_counts.clear()
                await cluster.api(founder, "/api/seed", "POST", {"urls": [web.hub_url]})
            if load == "hog":
                hogs = hog()
            await asyncio.sleep(2.0)
            if load == "flood":
                host, port = founder.listen.rsplit(":", 1)
                flood = await spawn_flood(host, port, FLOOD_S)
                await flood.wait()
                await asyncio.sleep(3.0)
            killed: dict[str, float] = {}
            ids = {p.node_id[:8] for p in cluster.peers}
            seen: dict[tuple[str, str], float] = {}  # (survivor, victim) -> declared at
            stalls: dict[str, int] = {}
            for i in range(kills):
                victim = cluster.peers[1 + i * (peers - 1) // max(1, kills)]
                killed[victim.node_id[:8]] = time.time()
                cluster.kill(victim)
                await victim.proc.wait()
                await asyncio.sleep(KILL_GAP_S)
                # Read now: a survivor may be the next victim.
                for p in cluster.peers:
                    if p.alive:
                        for who, t in await lost_events(cluster, p, stalls):
                            seen.setdefault((p.name, who), t)
            run.stalls = sum(stalls.values())
            for (name, who), t in seen.items():
                if who in killed and t >= killed[who]:
                    run.detections.append(t - killed[who])
                elif who in ids:
                    run.false_deaths.append(f"{name} lost {who}")
            # Survivors of each kill that never declared the victim dead.
            run.missed = max(0, survivors(peers, kills) - len(run.detections))
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    return run


def survivors(peers: int, kills: int) -> int:
    """Survivor-victim pairs: each kill is watched by every peer still running."""
    return sum(peers - 1 - i for i in range(kills))


async def detection(tmp: Path, sizes: list[int], loads: list[str], kills: int) -> dict[str, Any]:
    cfg = TestWebConfig(hosts=8, pages_per_host=400, slow_host_delay=0.0, large_page_bytes=50_000)
    rows: list[dict[str, Any]] = []
    all_times: list[float] = []
    false = 0
    async with TestWeb(cfg) as web:
        for n in sizes:
            for load in loads:
                run = await one(tmp / f"det-{n}-{load}", web, n, load, kills)
                row = run.row()
                rows.append(row)
                all_times += run.detections
                false += len(run.false_deaths)
                print(
                    f"detection N={n} {load}: median {row['median_s']} s, p90 {row['p90_s']} s, "
                    f"max {row['max_s']} s over {row['detections']} ({row['missed']} missed); "
                    f"false deaths {row['false_deaths']} {run.false_deaths[:3]}; "
                    f"stalls {row['stalls']}",
                    flush=True,
                )
    return {
        "detection_median_s": round(statistics.median(all_times), 2) if all_times else None,
        "false_deaths": false,
        "detection": rows,
    }
