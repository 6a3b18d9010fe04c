"""Partitions, Jepsen-style: peers in network namespaces, the links between two groups cut
for a while during a crawl at full speed, then healed. Every timer at its default.

Topology: ``_netns.py`` (one namespace per peer on a bridge, the test web in its own; names
start with ``p2pcrawl-part-``, all deleted at the end, on failure too). For each cut
(``--cuts``, seconds) and direction (``--ways``: ``both``, or ``one``: the second group
stops hearing the first), a fresh network of ``--peers`` peers crawls a Zipf web
(``_clusterweb.py``) from host 0's root; at ``--at`` of the pages the cut starts (``tc``
filters at the bridge into a black hole: each group still reaches the web), and it heals
after the given seconds. Checked from the web server's own counts and the peers' status
APIs:

* every URL of the ground truth fetched (``lost`` must be 0), and duplicate fetches;
* ``merge_s``: from the heal until every peer's routing table holds every other peer again
  (docs/membership.md bounds it: heal_interval + heal_max_backoff plus a join, 35 s + 1);
* ``finished_during_cut``: peers that reported ``finished`` while the groups could not
  hear each other (never allowed), and ``finished_early``: ``finished`` while a page of the
  ground truth was still unfetched;
* ``finished``: every peer reported ``finished`` in the end.

Usage (as root): python benchmarks/partition.py [--quick] [--cuts 5,30,120] [--ways both,one]
The last line is one JSON object: {"runs": [...], "lost_max": 0, ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _netns import WEB_ADDR, Topology, netns_available, peer_addr
from _zipfweb import ZipfWeb

BENCH = Path(__file__).resolve().parent
MERGE_BOUND_S = 5.0 + 30.0 + 1.0  # heal_interval + heal_max_backoff + a join (docs)
POLL_S = 0.5


@dataclass
class CutRun:
    cut_s: float
    ways: str
    pages: int = 0
    lost: int = 0
    duplicates: int = 0
    cut_at_share: float = 0.0
    merge_s: float | None = None  # heal -> full tables (None: not within the wait)
    tables_during_cut: list[int] = field(default_factory=list)  # smallest table seen per peer
    finished_during_cut: list[str] = field(default_factory=list)
    finished_early: list[str] = field(default_factory=list)
    finished: bool = False
    crawl_s: float = 0.0
    leaked: int = 0  # packets the cut let through (its black holes are not perfect)

    def problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{self.lost} pages never fetched")
        if self.merge_s is None or self.merge_s > MERGE_BOUND_S:
            out.append(f"halves merged in {self.merge_s} s, bound {MERGE_BOUND_S} s")
        if self.finished_during_cut:
            out.append(f"finished during the cut: {self.finished_during_cut[:3]}")
        if self.finished_early:
            out.append(f"finished with pages unfetched: {self.finished_early[:3]}")
        if not self.finished:
            out.append("not every peer reached finished")
        return out


class Partition:
    def __init__(self, topo: Topology, args: argparse.Namespace, zweb: ZipfWeb) -> None:
        self.topo, self.args, self.web = topo, args, zweb
        self.token = secrets.token_hex(16)
        self.secret = secrets.token_hex(16)
        self.session: aiohttp.ClientSession | None = None

    async def api(self, i: int, path: str, method: str = "GET", body: Any = None) -> Any:
        assert self.session is not None
        headers = {"Authorization": f"Bearer {self.token}"}
        url = f"http://{peer_addr(i)}:8000{path}"
        async with self.session.request(method, url, json=body, headers=headers) as resp:
            return await resp.json(content_type=None)

    async def stats(self) -> dict[str, Any]:
        assert self.session is not None
        async with self.session.get(f"http://{WEB_ADDR}/stats") as resp:
            doc: dict[str, Any] = await resp.json(content_type=None)
            return doc

    async def statuses(self) -> dict[int, dict[str, Any]]:
        out = {}
        for i in range(self.args.peers):
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                out[i] = await self.api(i, "/api/status")
        return out

    def peer_cmd(self, i: int, data: Path) -> list[str]:
        cmd = [
            "ip", "netns", "exec", self.topo.ns(f"p{i}"), sys.executable, "-m", "p2pcrawl",
            "--log-level", "info", "join",
            "--listen", f"{peer_addr(i)}:7000", "--status", f"{peer_addr(i)}:8000",
            "--status-token", self.token, "--secret", self.secret, "--data", str(data),
            "--allow-private", "--delay", "0", "--politeness-factor", "0",
        ]  # fmt: skip
        for host in self.web.names():
            cmd += ["--allow-domain", host]
        if i > 0:
            cmd += ["--bootstrap", f"{peer_addr(0)}:7000"]
        return cmd

    async def start(self, root: Path) -> list[asyncio.subprocess.Process]:
        procs = []
        for i in range(self.args.peers):
            data = root / f"p{i}"
            data.mkdir(parents=True)
            log = (root / f"p{i}.log").open("ab")
            proc = await asyncio.create_subprocess_exec(
                *self.peer_cmd(i, data),
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
            )
            log.close()
            procs.append(proc)
            if i == 0:
                await ready(proc, root / "p0.log")
        await asyncio.gather(*(ready(p, root / f"p{i}.log") for i, p in enumerate(procs) if i))
        return procs

    async def wait(self, pred: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(await self.statuses()):
                return
            await asyncio.sleep(POLL_S)
        raise RuntimeError(f"timed out waiting for {what}")

    async def until_fetched(self, pages: float, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while (await self.stats())["unique"] < pages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {pages:.0f} pages fetched after {timeout} s")
            await asyncio.sleep(0.1)

    async def one(self, root: Path, cut_s: float, ways: str) -> CutRun:
        n = self.args.peers
        run = CutRun(cut_s, ways, pages=self.web.total_pages)
        a, b = list(range(n // 2)), list(range(n // 2, n))
        procs: list[asyncio.subprocess.Process] = []
        try:
            procs = await self.start(root)
            await self.wait(
                lambda ss: len(ss) == n and all(s["peers"] == n - 1 for s in ss.values()),
                120,
                "a full mesh",
            )
            assert self.session is not None
            async with self.session.post(f"http://{WEB_ADDR}/reset"):
                pass
            started = time.monotonic()
            await self.api(0, "/api/seed", "POST", {"urls": [self.web.url(0, 0)]})
            await self.until_fetched(self.args.at * run.pages)
            run.cut_at_share = (await self.stats())["unique"] / run.pages
            leaked_before = self.topo.leaked()  # the black holes' counters outlive a run
            self.topo.cut(a, b, both=ways == "both")
            smallest = {i: n - 1 for i in range(n)}
            end = time.monotonic() + cut_s
            while time.monotonic() < end:
                for i, s in (await self.statuses()).items():
                    smallest[i] = min(smallest[i], int(s["peers"]))
                    if s["state"] == "finished":
                        run.finished_during_cut.append(f"p{i}@{time.monotonic() - started:.0f}s")
                await asyncio.sleep(POLL_S)
            self.topo.heal()
            healed = time.monotonic()
            run.leaked = self.topo.leaked() - leaked_before
            run.tables_during_cut = [smallest[i] for i in range(n)]
            deadline = healed + self.args.timeout
            while time.monotonic() < deadline:
                ss = await self.statuses()
                unique = (await self.stats())["unique"]
                full = len(ss) == n and all(s["peers"] == n - 1 for s in ss.values())
                if full and run.merge_s is None:
                    run.merge_s = round(time.monotonic() - healed, 1)
                done = [i for i, s in ss.items() if s["state"] == "finished"]
                if done and unique < run.pages:
                    run.finished_early.append(f"p{done[0]} with {run.pages - unique} unfetched")
                if full and len(done) == n:
                    run.finished = True
                    break
                await asyncio.sleep(POLL_S)
            run.crawl_s = round(time.monotonic() - started, 1)
            st = await self.stats()
            run.lost = run.pages - int(st["unique"])
            run.duplicates = int(st["requests"]) - int(st["unique"])
        finally:
            self.topo.heal()
            for p in procs:
                if p.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGKILL)
            for p in procs:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(10):
                        await p.wait()
        return run


async def ready(proc: asyncio.subprocess.Process, log: Path) -> None:
    assert proc.stdout is not None
    async with asyncio.timeout(120):
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"a peer exited; see {log}")
            if line.startswith(b"{") and b'"ready"' in line:
                return


async def main_async(args: argparse.Namespace, topo: Topology, zweb: ZipfWeb) -> dict[str, Any]:
    topo.enter("ctl")
    part = Partition(topo, args, zweb)
    runs: list[CutRun] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        part.session = session
        with contextlib.ExitStack() as stack:
            tmp = (
                str(args.keep)
                if args.keep
                else stack.enter_context(tempfile.TemporaryDirectory(prefix="p2pcrawl-part-"))
            )
            for cut_s in args.cuts:
                for ways in args.ways:
                    run = await part.one(Path(tmp) / f"cut{cut_s:g}-{ways}", cut_s, ways)
                    runs.append(run)
                    print(
                        f"cut {cut_s:g} s {ways}: {run.pages} pages, lost {run.lost}, "
                        f"duplicates {run.duplicates} ({100 * run.duplicates / run.pages:.2f}%), "
                        f"cut at {run.cut_at_share:.0%}, smallest tables during the cut "
                        f"{run.tables_during_cut}, merged {run.merge_s} s after the heal, "
                        f"crawl {run.crawl_s} s, finished {run.finished}; problems "
                        f"{run.problems() or 'none'}",
                        flush=True,
                    )
    return {
        "runs": [{**asdict(r), "problems": r.problems()} for r in runs],
        "lost_max": max(r.lost for r in runs),
        "duplicates_max": max(r.duplicates for r in runs),
        "merge_s_max": None
        if any(r.merge_s is None for r in runs)
        else max(r.merge_s or 0.0 for r in runs),
        "finished_during_cut": sum(len(r.finished_during_cut) for r in runs),
        "all_finished": all(r.finished for r in runs),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--cuts", default="5,30,120", help="seconds each cut lasts")
    p.add_argument("--ways", default="both,one", help="both: neither group hears the other")
    p.add_argument("--at", type=float, default=0.3, help="share of pages fetched at the cut")
    p.add_argument("--hosts", type=int, default=60)
    p.add_argument("--max-pages", type=int, default=3000)
    p.add_argument("--exponent", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=180.0, help="after the heal, per run")
    p.add_argument("--keep", type=Path, help="keep the peers' data and logs here")
    p.add_argument("--quick", action="store_true", help="one 5 s cut both ways, a small web")
    a = p.parse_args(argv)
    if a.quick:
        a.cuts, a.ways, a.hosts, a.max_pages, a.timeout = "5", "both", 30, 400, 90.0
    a.cuts = [float(x) for x in a.cuts.split(",")]
    a.ways = a.ways.split(",")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = netns_available()
    if why:
        print(f"partition benchmark unavailable: {why}")
        print(json.dumps({"runs": [], "skipped": why}))
        return 2
    zweb = ZipfWeb(args.hosts, args.max_pages, args.exponent, args.seed)
    print(
        f"web: {args.hosts} hosts, {zweb.total_pages} pages (largest {max(zweb.pages)}); "
        f"{args.peers} peers; cuts {args.cuts} s, {args.ways}",
        flush=True,
    )
    topo = Topology(args.peers, None, name="p2pcrawl-part")
    atexit.register(topo.close)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    web_proc: subprocess.Popen[str] | None = None
    try:
        topo.open()
        web_cmd = [
            "ip", "netns", "exec", topo.ns("web"), sys.executable, str(BENCH / "_clusterweb.py"),
            "--hosts", str(args.hosts), "--max-pages", str(args.max_pages),
            "--exponent", str(args.exponent), "--seed", str(args.seed), "--control", WEB_ADDR,
        ]  # fmt: skip
        web_proc = subprocess.Popen(web_cmd, stdout=subprocess.PIPE, text=True)
        assert web_proc.stdout is not None
        if not web_proc.stdout.readline():
            raise RuntimeError("the test web did not start")
        out = asyncio.run(main_async(args, topo, zweb))
    finally:
        if web_proc is not None and web_proc.poll() is None:
            web_proc.send_signal(signal.SIGTERM)
            try:
                web_proc.wait(10)
            except subprocess.TimeoutExpired:
                web_proc.kill()
                web_proc.wait()
        topo.close()
    print(json.dumps(out))
    bad = out["lost_max"] or out["finished_during_cut"] or not out["all_finished"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
