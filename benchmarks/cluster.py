"""A multi-machine cluster on one machine: one network namespace per peer, capped bandwidth.

Topology (created at start, removed on exit and on failure; names start with a per-run prefix):

    web ns   198.18.0.1   the test web (``_clusterweb.py``); ``ip route add local 198.19.0.0/16
                          dev lo`` makes every 198.19.x.y one of its hosts
    ctl ns   198.18.0.2   this script talks to the peers' status servers from here
    peer ns  198.18.0.10+i  one ``p2pcrawl join`` each, with a ``tbf`` cap on the link towards
                          it (its download) of ``--rate-mbit``
    br ns    a bridge joining them (veth pairs); nothing is routed anywhere else

Addresses come only from 198.18.0.0/15 (RFC 2544) and exist only inside these namespaces; the
peers pass ``--allow-private`` because the scope guard refuses non-global addresses (Python's
``ipaddress`` counts 198.18/15 as private). The web has Zipf page counts per host and a latency
per host (10-50 ms), added by the server since ``netem`` is missing here.

For each N in ``--peers`` (interleaved over ``--rounds``), peers start with fresh data, join,
one is seeded with host 0's root (which links to every host) and the run ends when every peer
is idle with nothing in transit; the run lasted from the seed to the latest ``last_task_at``
any peer reports (when a task last left its fetchers), as the peers' clocks saw it, and the
harness's own polled end is reported beside it. Reported, median and range over rounds:
pages/s, speed-up over one peer, CPU seconds per page (all peer processes and their WARC
writers), RPCs and RPC bytes per page, duplicate fetches, and how much of the bandwidth cap
the peers used.

One idle-priority spinner per core runs for the whole benchmark (``--no-hold-clock``: none), so
that every N runs at the same clock: the VM's cores run slower when they idle between bursts,
which a one-peer crawl leaves them doing, and CPU per page across N then compared clocks.

The bottleneck is meant to be the cap (each peer's link), not the machine: the per-peer cap
times N must stay below what the machine's cores can crawl, or the speed-up measures the CPU.

Usage (as root): python benchmarks/cluster.py [--quick] [--peers 1,2,4,8] [--rounds 3]
The last line is one JSON object: {"speedup": {"2": x, ...}, ...}. ``--loop-cpu`` splits the
peers' event-loop CPU by callback (``benchmarks/loopcpu``; it costs about 0.5 ms per page
itself, so quote CPU per page from a run without it).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _netns import WEB_ADDR, Topology, netns_available, peer_addr
from _zipfweb import ZipfWeb

from p2pcrawl.crawl.scheduling import POLICIES
from p2pcrawl.testing.cluster import cpu_seconds
from protocol.balance import key_space_share

BENCH = Path(__file__).resolve().parent


@dataclass
class RunResult:
    peers: int
    pages: int = 0
    # Seed to the last task's end, by the peers' own clocks (``last_task_at``); and seed to
    # the poll that first found them all idle, what the runs measured before: a poll every
    # 0.25 s that must see no new page twice adds up to half a second to every run.
    wall_s: float = 0.0
    wall_s_polled: float = 0.0
    cpu_s: float = 0.0
    rpcs: int = 0
    rpc_bytes: int = 0
    # RPCs sent by name, summed over peers: over the peers' whole life (as ``rpcs``), and the
    # part sent before the seed (joining, surveys), which no page caused.
    rpc_types: Counter[str] = field(default_factory=Counter)
    rpc_types_before: Counter[str] = field(default_factory=Counter)
    # RPCs that got no reply in time (``--rpc-timeout``, then retried or re-routed), and the
    # mean time to a reply by name, over the peers' whole life
    rpc_failed: Counter[str] = field(default_factory=Counter)
    rpc_latency_ms: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0
    web_bytes: int = 0
    per_peer_pages: list[int] = field(default_factory=list)
    lend: bool = True
    open: bool = False  # an open network (no --secret): no lending, signed requests
    lent: int = 0  # tasks the owners lent to idle peers (network/lending.py)
    # Pages fetched again to check a member's done claims (open network: network/vouching.py)
    refetches: int = 0
    # Lending's counters summed over the peers: LENDs answered with a loan, leases made
    # (an answer may hold several), GIVE_BACKs served.
    lending: Counter[str] = field(default_factory=Counter)
    # Links sent to their owners, and not sent because the owner said it holds them.
    dispatch: Counter[str] = field(default_factory=Counter)
    key_space: float = 0.0  # the largest peer's share of the key space, over the mean
    settled: bool = True  # nothing left in transit once the crawl went idle
    # [pages, first request s, last request s] of the web's largest hosts, largest first:
    # each is fetched one request at a time, so the crawl lasts at least its span
    largest: list[list[float]] = field(default_factory=list)
    # Each peer's last page request (s after the seed), earliest first: the crawl's
    # fetching ended at the last; the spread is the time peers sat out of work at the end.
    last_requests: list[float] = field(default_factory=list)
    # --loop-cpu: the peers' event-loop CPU seconds by callback over the run, summed over
    # peers, and their main threads' CPU seconds (the rest is the loop's own select/timers)
    loop_cpu: Counter[str] = field(default_factory=Counter)
    loop_calls: Counter[str] = field(default_factory=Counter)
    main_thread_s: float = 0.0
    # The machine's speed during the run: thread CPU microseconds of one fixed pure-Python
    # job (``_cpuprobe.py``), median over the run; 0 if the probe failed.
    probe_us: float = 0.0

    @property
    def busiest(self) -> float:
        """The busiest peer's pages over the mean: the speed-up is at most N / busiest."""
        pages = self.per_peer_pages
        return max(pages) * len(pages) / sum(pages) if sum(pages) else 0.0

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.wall_s if self.wall_s else 0.0


# Keeps one core busy at the lowest priority there is (SCHED_IDLE: it runs only when nothing
# else wants the core). This VM's cores run slower when they idle between bursts: the probe
# job took 1.77 ms on an idle machine and 0.98 ms beside two of these, so a one-peer run (the
# machine mostly idle) paid more CPU per unit of work than an eight-peer run, and CPU-per-page
# ratios across N flattered the larger N.
# It ends by itself when the benchmark does (its parent gone), however the benchmark ended.
_SPIN = """
import os
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


def hold_clock() -> list[subprocess.Popen[bytes]]:
    """One idle-priority spinner per core, for the whole benchmark (``--no-hold-clock``:
    none); stopped by :func:`release_clock`."""
    return [
        subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL)
        for _ in range(os.cpu_count() or 1)
    ]


def release_clock(spinners: list[subprocess.Popen[bytes]]) -> None:
    for proc in spinners:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def start_probe() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(BENCH / "_cpuprobe.py"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def stop_probe(proc: asyncio.subprocess.Process) -> float:
    """The probe's median job time (us); it stops when its stdin closes."""
    try:
        async with asyncio.timeout(10):
            out, _ = await proc.communicate(b"")
        return float(json.loads(out.decode().strip().splitlines()[-1])["probe_us"])
    except (TimeoutError, ValueError, IndexError, KeyError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return 0.0


class Runner:
    def __init__(self, topo: Topology, args: argparse.Namespace, zweb: ZipfWeb) -> None:
        self.topo, self.args, self.web = topo, args, zweb
        self.token = secrets.token_hex(16)
        self.secret = secrets.token_hex(16)
        self.session: aiohttp.ClientSession | None = None

    async def api(self, addr: str, path: str, method: str = "GET", body: Any = None) -> Any:
        assert self.session is not None
        headers = {"Authorization": f"Bearer {self.token}"}
        url = f"http://{addr}:8000{path}"
        async with self.session.request(method, url, json=body, headers=headers) as resp:
            return await resp.json(content_type=None)

    async def web_ctl(self, path: str, method: str = "GET") -> Any:
        assert self.session is not None
        async with self.session.request(method, f"http://{WEB_ADDR}{path}") as resp:
            return await resp.json(content_type=None)

    def peer_cmd(self, i: int, data: Path, lend: bool, open_net: bool = False) -> list[str]:
        a = self.args
        key = ["--open"] if open_net else ["--secret", self.secret]
        cmd = [
            "ip", "netns", "exec", self.topo.ns(f"p{i}"), sys.executable, "-m", "p2pcrawl",
            "--log-level", "warning", "join",
            "--listen", f"{peer_addr(i)}:7000", "--status", f"{peer_addr(i)}:8000",
            "--status-token", self.token, *key, "--data", str(data),
            "--allow-private", "--concurrency", str(a.concurrency), "--delay", "0",
            "--politeness-factor", "0", "--partition", a.partition, "--policy", a.policy,
        ]  # fmt: skip
        for host in self.web.names():
            cmd += ["--allow-domain", host]
        if a.pace:
            cmd += ["--max-rate", str(int(a.pace * a.rate_mbit * 1e6 / 8))]
        if not lend:
            cmd.append("--no-lend")
        if i > 0:
            cmd += ["--bootstrap", f"{peer_addr(0)}:7000"]
        return cmd

    def loop_cpu(self, root: Path, pids: list[int]) -> tuple[Counter[str], Counter[str], float]:
        """The peers' latest ``benchmarks/loopcpu`` totals (at most a quarter second old)."""
        cpu: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        main = 0.0
        for pid in pids:
            try:
                snap = json.loads((root / "loopcpu" / f"{pid}.json").read_text())
            except (OSError, ValueError):
                continue
            cpu.update(snap["cpu"])
            calls.update(snap["calls"])
            main += float(snap.get("main_thread", 0.0))
        return cpu, calls, main

    async def one(
        self, n: int, root: Path, rng: random.Random, lend: bool, open_net: bool = False
    ) -> RunResult:
        procs: list[asyncio.subprocess.Process] = []
        result = RunResult(n, lend=lend and not open_net, open=open_net)
        tag = f"n{n}{'' if lend else 'x'}{'o' if open_net else ''}"
        ids: list[bytes] = []
        env: dict[str, str] | None = None
        if self.args.loop_cpu:
            (root / "loopcpu").mkdir(parents=True, exist_ok=True)
            path = os.pathsep.join(
                filter(None, [str(BENCH / "loopcpu"), os.environ.get("PYTHONPATH")])
            )
            env = dict(os.environ, PYTHONPATH=path, P2PCRAWL_LOOP_CPU=str(root / "loopcpu"))
        try:
            for i in range(n):
                data = root / f"{tag}-p{i}"
                data.mkdir(parents=True)
                if self.args.ids == "random":
                    # The old behaviour, for comparison: a random ID, written where the peer
                    # keeps it. Otherwise each joiner chooses its own (``p2pcrawl join``).
                    doc = {"node_id": rng.randbytes(20).hex(), "version": 1}
                    (data / "node.json").write_text(json.dumps(doc))
                log = (root / f"{tag}-p{i}.log").open("ab")
                proc = await asyncio.create_subprocess_exec(
                    *self.peer_cmd(i, data, lend, open_net),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    stdin=asyncio.subprocess.DEVNULL,
                    env=env,
                )
                log.close()
                procs.append(proc)
                assert proc.stdout is not None
                async with asyncio.timeout(60):
                    while True:
                        line = await proc.stdout.readline()
                        if not line:
                            raise RuntimeError(f"peer {i} exited; see {root}/{tag}-p{i}.log")
                        if line.startswith(b"{") and b'"ready"' in line:
                            ids.append(bytes.fromhex(json.loads(line)["node_id"]))
                            break
            result.key_space = max(key_space_share(i, ids) for i in ids) * n
            addrs = [peer_addr(i) for i in range(n)]
            await self.wait(
                lambda ss: all(s["peers"] == n - 1 for s in ss), addrs, 60, "a full mesh"
            )
            await self.web_ctl("/reset", "POST")
            for a in addrs:
                result.rpc_types_before.update((await self.api(a, "/api/peers"))["rpc"]["rpc_sent"])
            if env is not None:
                await asyncio.sleep(0.5)  # a fresh dump of every peer's totals
                loop0 = self.loop_cpu(root, [p.pid for p in procs])
            probe = await start_probe()
            cpu0 = sum(cpu_seconds(p.pid) for p in procs)
            t0, t0_wall = time.perf_counter(), time.time()
            seed = self.web.url(0, 0)
            await self.api(addrs[0], "/api/seed", "POST", {"urls": [seed]})
            t_end, result.settled = await self.wait_finished(addrs, t0)
            result.wall_s = result.wall_s_polled = t_end - t0
            result.cpu_s = sum(cpu_seconds(p.pid) for p in procs) - cpu0
            result.probe_us = await stop_probe(probe)
            if env is not None:
                await asyncio.sleep(0.5)
                cpu, calls, main = self.loop_cpu(root, [p.pid for p in procs])
                cpu.subtract(loop0[0])
                calls.subtract(loop0[1])
                result.loop_cpu, result.loop_calls = +cpu, +calls
                result.main_thread_s = main - loop0[2]
            stats = await self.web_ctl("/stats")
            result.pages, result.web_bytes = stats["unique"], stats["bytes"]
            result.duplicates = stats["requests"] - stats["unique"]
            result.largest = stats.get("largest", [])
            result.last_requests = stats.get("last_requests", [])
            if self.args.request_log is not None:
                await self.log_requests(n, lend, addrs)
            weights: dict[str, int] = {}
            lat_sum: dict[str, float] = {}
            ends: list[float] = []
            for a in addrs:
                st = await self.api(a, "/api/status")
                result.per_peer_pages.append(int(st["pages_fetched"]))
                ends.append(float(st.get("last_task_at") or 0.0))
                lending = st.get("lending", {})
                result.lent += int(lending.get("lent_total", 0))
                result.refetches += int(st.get("claims", {}).get("refetches", 0))
                for name in ("lends_answered", "leases_made", "reports_served"):
                    result.lending[name] += int(lending.get(name, 0))
                for name, v in st.get("dispatch", {}).items():
                    result.dispatch[name] += int(v)
                rpc = (await self.api(a, "/api/peers"))["rpc"]
                result.rpcs += sum(rpc["rpc_sent"].values())
                result.rpc_types.update(rpc["rpc_sent"])
                result.rpc_failed.update(rpc.get("rpc_failed", {}))
                for name, ms in rpc.get("latency_ms", {}).items():
                    weights[name] = weights.get(name, 0) + rpc["rpc_sent"].get(name, 0)
                    lat_sum[name] = lat_sum.get(name, 0.0) + ms * rpc["rpc_sent"].get(name, 0)
                result.rpc_bytes += int(rpc["bytes_out"])
            result.rpc_latency_ms = {
                k: round(v / weights[k], 1) for k, v in lat_sum.items() if weights.get(k)
            }
            if result.settled and t0_wall < max(ends) <= t0_wall + result.wall_s_polled:
                result.wall_s = max(ends) - t0_wall
        finally:
            for p in procs:
                if p.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGKILL)
            for p in procs:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(10):
                        await p.wait()
        return result

    async def log_requests(self, n: int, lend: bool, addrs: list[str]) -> None:
        """``--request-log``: one JSON line per run, every request the web answered (s after
        the seed, host index, client address, path) and which peer each address is."""
        doc = {
            "peers": n,
            "lend": lend,
            "clients": {a: i for i, a in enumerate(addrs)},
            "requests": await self.web_ctl("/requests"),
        }
        with self.args.request_log.open("a") as fh:
            fh.write(json.dumps(doc) + "\n")

    async def wait(self, pred: Any, addrs: list[str], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                if pred([await self.api(a, "/api/status") for a in addrs]):
                    return
            await asyncio.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}")

    async def wait_finished(self, addrs: list[str], t0: float) -> tuple[float, bool]:
        """When every peer went idle with nothing in transit and stayed so for ``quiet`` s;
        True with it. If the crawl is idle (nothing queued or in flight, no new page) but
        some RPC stays in transit for ``--settle-timeout`` s, the time the crawl went idle and
        False: the pages are all fetched, but the network never became quiescent, which the
        run reports (``unsettled``) rather than waiting out ``--timeout``."""
        quiet, deadline = 2.0, time.monotonic() + self.args.timeout
        since: float | None = None
        idle_since: float | None = None
        last_unique = -1
        ss: list[Any] = []
        while time.monotonic() < deadline:
            ss = [await self.api(a, "/api/status") for a in addrs]
            unique = (await self.web_ctl("/stats"))["unique"]
            idle = (
                unique > 0
                and unique == last_unique
                and all(s["tasks_queued"] == 0 and s["tasks_in_flight"] == 0 for s in ss)
            )
            settled = idle and all(s["rpc_in_transit"] == 0 for s in ss)
            last_unique = unique
            now = time.perf_counter()
            idle_since = (idle_since or now) if idle else None
            if settled:
                since = since or now
                if now - since >= quiet:
                    return since, True
            else:
                since = None
            if idle_since is not None and now - idle_since >= self.args.settle_timeout:
                print(f"  idle but not settled after {self.args.settle_timeout:g} s: "
                      f"{self.describe(ss)}", flush=True)  # fmt: skip
                return idle_since, False
            await asyncio.sleep(0.25)
        raise RuntimeError(f"the crawl did not finish in time; peers {self.describe(ss)}")

    @staticmethod
    def describe(ss: list[Any]) -> list[dict[str, Any]]:
        keys = ("tasks_queued", "tasks_in_flight", "rpc_in_transit", "backups_held", "done")
        return [{k: s.get(k) for k in keys} for s in ss]


def per_page_text(counts: Counter[str], pages: int) -> str:
    """``STORE_TASK 0.90, PING 0.41, ...``: RPCs sent per page by name, most first."""
    return ", ".join(f"{k} {v / max(pages, 1):.2f}" for k, v in counts.most_common()) or "none"


LOOP_CPU_SHOWN = 15  # callbacks printed per run, and kept per N in the JSON line


def med(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


async def main_async(args: argparse.Namespace, topo: Topology, zweb: ZipfWeb) -> dict[str, Any]:
    topo.enter("ctl")
    runner = Runner(topo, args, zweb)
    results: dict[int, list[RunResult]] = {n: [] for n in args.peers}
    unlent: dict[int, list[RunResult]] = {n: [] for n in args.peers if n > 1}
    opened: dict[int, list[RunResult]] = {n: [] for n in args.peers}
    rng = random.Random(args.seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        runner.session = session
        with contextlib.ExitStack() as stack:
            tmp = (
                str(args.keep)
                if args.keep
                else stack.enter_context(tempfile.TemporaryDirectory(prefix="p2pcrawl-cluster-"))
            )
            for r in range(args.rounds):
                # Interleaved: every N once per round, so a busy neighbour hits all N alike.
                for n in args.peers:
                    modes = {"on": [True], "off": [False], "both": [True, False]}[args.lending]
                    for lend in modes if n > 1 else [True]:  # one peer has no one to lend to
                        if args.network != "open":
                            res = await runner.one(n, Path(tmp) / f"r{r}", rng, lend)
                            both = args.lending == "both"
                            (unlent if both and not lend else results)[n].append(res)
                            report_run(r, res)
                    if args.network != "keyed":
                        # An open network lends to nobody (docs/security.md), so one run.
                        res = await runner.one(n, Path(tmp) / f"r{r}", rng, False, True)
                        (opened if args.network == "both" else results)[n].append(res)
                        report_run(r, res)
    out = summarise(args, zweb, results, unlent)
    if args.network == "both":
        out["open"] = open_summary(results, opened)
    return out


def open_summary(
    keyed: dict[int, list[RunResult]], opened: dict[int, list[RunResult]]
) -> dict[str, dict[str, float]]:
    """The open network's runs beside the keyed ones of the same rounds: pages/s and CPU per
    page, each also over the keyed figure at the same N; and the requests to the web its
    checks of done claims cost (``refetches_per_page``: pages fetched again, per page)."""
    out: dict[str, dict[str, float]] = {"pages_per_s": {}, "cpu_ms_per_page": {}}
    out.update(speed_over_keyed={}, cpu_over_keyed={}, refetches_per_page={})

    def cpu_ms(r: RunResult) -> float:
        return 1000 * r.cpu_s / max(r.pages, 1)

    for n, rs in opened.items():
        if not rs or not keyed.get(n):
            continue
        speed = statistics.median(r.pages_per_s for r in rs)
        cpu = statistics.median(map(cpu_ms, rs))
        k_speed = statistics.median(r.pages_per_s for r in keyed[n])
        k_cpu = statistics.median(map(cpu_ms, keyed[n]))
        out["pages_per_s"][str(n)] = round(speed, 2)
        out["cpu_ms_per_page"][str(n)] = round(cpu, 3)
        out["speed_over_keyed"][str(n)] = round(speed / k_speed, 3) if k_speed else 0.0
        out["cpu_over_keyed"][str(n)] = round(cpu / k_cpu, 3) if k_cpu else 0.0
        refetched = statistics.median(r.refetches / max(r.pages, 1) for r in rs)
        out["refetches_per_page"][str(n)] = round(refetched, 4)
    return out


def report_run(r: int, res: RunResult) -> None:
    cpu_ms = 1000 * res.cpu_s / max(res.pages, 1)
    print(
        f"round {r + 1} N={res.peers}{' open' if res.open else ''}"
        f"{'' if res.lend else ' (no lending)'}: "
        f"{res.pages} pages in {res.wall_s:.2f} s (polled {res.wall_s_polled:.2f} s) = "
        f"{res.pages_per_s:.0f} pages/s, "
        f"CPU {cpu_ms:.2f} ms/page ({res.probe_us:.0f} us a probe job), "
        f"{res.rpcs / max(res.pages, 1):.2f} RPCs/page "
        f"({per_page_text(res.rpc_types, res.pages)}; before the seed "
        f"{sum(res.rpc_types_before.values())}), "
        f"{res.duplicates} duplicates ({res.refetches} re-fetches to check claims), "
        f"pages per peer {res.per_peer_pages} "
        f"(busiest/mean {res.busiest:.2f}; key space max/mean {res.key_space:.2f}); "
        f"lent {res.lent} ({res.lending['leases_made']} leases in "
        f"{res.lending['lends_answered']} LEND answers, {res.lending['reports_served']} "
        f"GIVE_BACKs served); links to owners {res.dispatch['urls_sent']} sent, "
        f"{res.dispatch['skipped_known']} not sent (the owner holds them); "
        f"RPCs unanswered {dict(res.rpc_failed) or 0}, mean reply ms "
        f"{res.rpc_latency_ms}; largest hosts [pages, first, last request s] {res.largest}; "
        f"peers' last page requests at {res.last_requests} s"
        f"{'' if res.settled else '; UNSETTLED'}",
        flush=True,
    )
    if res.main_thread_s:
        pages = max(res.pages, 1)
        print(
            f"  event loop CPU (--loop-cpu): main threads {1000 * res.main_thread_s / pages:.3f} "
            f"ms/page, callbacks {1000 * sum(res.loop_cpu.values()) / pages:.3f}; the largest:",
            flush=True,
        )
        for name, s in res.loop_cpu.most_common(LOOP_CPU_SHOWN):
            calls = res.loop_calls[name]
            print(
                f"    {1000 * s / pages:7.3f} ms/page  {calls:8d} calls "
                f"{1e6 * s / max(calls, 1):8.1f} us/call  {name}",
                flush=True,
            )


def summarise(
    args: argparse.Namespace,
    zweb: ZipfWeb,
    results: dict[int, list[RunResult]],
    unlent: dict[int, list[RunResult]],
) -> dict[str, Any]:
    # Speed-up is over one peer; without that run (--no-baseline) there is none.
    base = statistics.median(r.pages_per_s for r in results[1]) if results.get(1) else 0.0
    polled_base = statistics.median(r.pages / r.wall_s_polled for r in results[1]) if base else 0.0
    cap_pages = args.rate_mbit * 1e6 / 8 / args.page_bytes
    out: dict[str, Any] = {"speedup": {}, "pages_per_s": {}, "cpu_ms_per_page": {}}
    out.update(rpcs_per_page={}, rpc_bytes_per_page={}, duplicates={}, cap_used={})
    out.update(pages_fetched={}, busiest_over_mean={}, speedup_bound={}, unsettled={})
    out.update(rpcs_per_page_by_type={}, rpcs_before_seed_by_type={})
    for n, rs in results.items():
        out["pages_per_s"][str(n)] = med([r.pages_per_s for r in rs])
        if n != 1 and base:
            out["speedup"][str(n)] = round(statistics.median(r.pages_per_s for r in rs) / base, 3)
        out["cpu_ms_per_page"][str(n)] = med([1000 * r.cpu_s / max(r.pages, 1) for r in rs])
        out["rpcs_per_page"][str(n)] = med([r.rpcs / max(r.pages, 1) for r in rs])
        out["rpc_bytes_per_page"][str(n)] = med([r.rpc_bytes / max(r.pages, 1) for r in rs])
        names = sorted({k for r in rs for k in r.rpc_types})
        out["rpcs_per_page_by_type"][str(n)] = {
            k: med([r.rpc_types[k] / max(r.pages, 1) for r in rs]) for k in names
        }
        out["rpcs_before_seed_by_type"][str(n)] = {
            k: med([float(r.rpc_types_before[k]) for r in rs])
            for k in sorted({k for r in rs for k in r.rpc_types_before})
        }
        out["duplicates"][str(n)] = med([float(r.duplicates) for r in rs])
        out["pages_fetched"][str(n)] = med([float(r.pages) for r in rs])
        out["cap_used"][str(n)] = med([r.pages_per_s / (n * cap_pages) for r in rs])
        out["busiest_over_mean"][str(n)] = med([r.busiest for r in rs])
        out["unsettled"][str(n)] = sum(not r.settled for r in rs)
        out["speedup_bound"][str(n)] = med([n / r.busiest for r in rs if r.busiest])
        if all(r.largest for r in rs):
            out.setdefault("largest_host_last_s", {})[str(n)] = med([r.largest[0][2] for r in rs])
        if all(r.last_requests for r in rs):
            ends = [r.last_requests for r in rs]
            out.setdefault("last_request_s", {})[str(n)] = med([e[-1] for e in ends])
            out.setdefault("end_spread_s", {})[str(n)] = med([e[-1] - e[0] for e in ends])
        out.setdefault("wall_s", {})[str(n)] = med([r.wall_s for r in rs])
        out.setdefault("wall_s_polled", {})[str(n)] = med([r.wall_s_polled for r in rs])
        if polled_base:
            out.setdefault("speedup_polled", {})[str(n)] = round(
                statistics.median(r.pages / r.wall_s_polled for r in rs) / polled_base, 3
            )
        if all(r.probe_us for r in rs):
            # CPU per page in probe jobs (``_cpuprobe.py``): the machine's speed divided out.
            out.setdefault("probe_us", {})[str(n)] = med([r.probe_us for r in rs])
            out.setdefault("cpu_probe_jobs_per_page", {})[str(n)] = med(
                [1e6 * r.cpu_s / max(r.pages, 1) / r.probe_us for r in rs]
            )
        out.setdefault("rpcs_unanswered_per_page", {})[str(n)] = med(
            [sum(r.rpc_failed.values()) / max(r.pages, 1) for r in rs]
        )
        out.setdefault("lent_per_page", {})[str(n)] = med([r.lent / max(r.pages, 1) for r in rs])
        # Links for other peers' keys per page: sent, and not sent since the owner holds them.
        for name, key in (("links_sent", "urls_sent"), ("links_owner_holds", "skipped_known")):
            out.setdefault(f"{name}_per_page", {})[str(n)] = med(
                [r.dispatch[key] / max(r.pages, 1) for r in rs]
            )
        if all(r.main_thread_s for r in rs):
            top = Counter[str]()
            for r in rs:
                top.update(r.loop_cpu)
            loop = out.setdefault("loop_cpu_ms_per_page", {})[str(n)] = {
                "main_thread": med([1000 * r.main_thread_s / max(r.pages, 1) for r in rs])
            }
            for name, _ in top.most_common(LOOP_CPU_SHOWN):
                loop[name] = med([1000 * r.loop_cpu[name] / max(r.pages, 1) for r in rs])
    for n, rs in unlent.items():
        if not rs or not base:
            continue
        nl = out.setdefault("no_lending", {"speedup": {}, "busiest_over_mean": {}})
        nl["speedup"][str(n)] = round(statistics.median(r.pages_per_s for r in rs) / base, 3)
        nl["busiest_over_mean"][str(n)] = med([r.busiest for r in rs])
        nl.setdefault("cpu_ms_per_page", {})[str(n)] = med(
            [1000 * r.cpu_s / max(r.pages, 1) for r in rs]
        )
    out["cap_pages_per_s_per_peer"] = round(cap_pages, 1)
    out["pages"] = zweb.total_pages
    out.update(cpu_ratios(results))
    return out


def cpu_ratios(results: dict[int, list[RunResult]]) -> dict[str, dict[str, float]]:
    """CPU per page at each N over one peer's (the target: within 1.2x), raw and in probe
    jobs (the machine's speed in each run divided out)."""
    one = results.get(1, [])
    out: dict[str, dict[str, float]] = {"cpu_over_one_peer": {}}
    if not one:
        return out

    def per_page(r: RunResult) -> float:
        return r.cpu_s / max(r.pages, 1)

    def in_jobs(r: RunResult) -> float:
        return per_page(r) / r.probe_us

    for n, rs in results.items():
        if n == 1 or not rs:
            continue
        ratio = statistics.median(map(per_page, rs)) / statistics.median(map(per_page, one))
        out["cpu_over_one_peer"][str(n)] = round(ratio, 3)
        if all(r.probe_us for r in one + rs):
            jobs = statistics.median(map(in_jobs, rs)) / statistics.median(map(in_jobs, one))
            out.setdefault("cpu_over_one_peer_in_probe_jobs", {})[str(n)] = round(jobs, 3)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--peers", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--max-pages", type=int, default=300)
    p.add_argument("--exponent", type=float, default=0.8)
    p.add_argument("--page-bytes", type=int, default=16_000)
    p.add_argument("--rate-mbit", type=float, default=4.0, help="per-peer download cap")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="each peer's --max-rate as a fraction of its cap (0: none)",
    )
    p.add_argument("--partition", choices=["host", "url"], default="host")
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="breadth-first",
        help="each peer's host scheduling policy (p2pcrawl join --policy)",
    )
    p.add_argument(
        "--ids",
        choices=["split", "random"],
        default="split",
        help="split: each joiner chooses its ID (p2pcrawl join's survey); random: written "
        "into the data directories beforehand (the old behaviour)",
    )
    p.add_argument(
        "--lending",
        choices=["on", "off", "both"],
        default="on",
        help="idle peers borrow hosts from busy owners (the default), or --no-lend, or "
        "every N > 1 run both ways in each round (before/after)",
    )
    p.add_argument(
        "--network",
        choices=["keyed", "open", "both"],
        default="keyed",
        help="keyed: the peers share --secret (the default); open: --open, no key (it lends "
        "nothing and signs every crawl RPC); both: each N both ways in each round, the open "
        'runs summarised under "open" against the keyed ones',
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", type=Path, help="keep the peers' data and logs in this directory")
    p.add_argument(
        "--request-log",
        type=Path,
        help="append every run's requests, as the web saw them, to this file (one JSON line "
        "per run; benchmarks/request_log.py reads it)",
    )
    p.add_argument(
        "--loop-cpu",
        action="store_true",
        help="time every event-loop callback of the peers in thread CPU time and print the "
        "largest per run (benchmarks/loopcpu)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="per run")
    p.add_argument(
        "--settle-timeout",
        type=float,
        default=60.0,
        help="seconds an idle crawl may keep RPCs in transit before the run ends unsettled",
    )
    p.add_argument("--quick", action="store_true", help="1, 2 and 4 peers, a small web, 1 round")
    p.add_argument("--smoke", action="store_true", help="1 and 2 peers, a tiny web (tests)")
    p.add_argument(
        "--no-hold-clock",
        dest="hold_clock",
        action="store_false",
        help="do not keep the cores busy with idle-priority spinners (they keep a one-peer run "
        "and an eight-peer run at the same clock, so CPU per page compares across N)",
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="do not add the one-peer run (about 170 s) that speed-up and CPU ratios need; "
        "for comparing builds at one N (run the peers of another checkout with PYTHONPATH)",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.peers, a.rounds, a.hosts, a.max_pages = "1,2,4", 1, 300, 150
    if a.smoke:
        a.peers, a.rounds, a.hosts, a.max_pages, a.rate_mbit = "1,2", 1, 40, 20, 8.0
    if a.ids == "random" and a.network != "keyed":
        # An open network's IDs are made from keys; a written one is refused.
        p.error("--ids random needs --network keyed")
    a.peers = sorted({int(x) for x in a.peers.split(",")})
    if a.peers[0] != 1 and not a.no_baseline:
        a.peers.insert(0, 1)  # speed-up is against one peer
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = netns_available()
    if why:
        print(f"cluster benchmark unavailable: {why}")
        print(json.dumps({"speedup": {}, "skipped": why}))
        return 2
    zweb = ZipfWeb(args.hosts, args.max_pages, args.exponent, args.seed)
    print(
        f"web: {args.hosts} hosts, {zweb.total_pages} pages (Zipf {args.exponent}, largest "
        f"{max(zweb.pages)}), {args.page_bytes} B/page; per-peer cap {args.rate_mbit} Mbit/s "
        f"= {args.rate_mbit * 1e6 / 8 / args.page_bytes:.0f} pages/s; concurrency "
        f"{args.concurrency}; --ids {args.ids}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    topo = Topology(max(args.peers), args.rate_mbit)
    atexit.register(topo.close)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    web_proc: subprocess.Popen[str] | None = None
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        if args.hold_clock:
            spinners = hold_clock()
        topo.open()
        web_cmd = [
            "ip", "netns", "exec", topo.ns("web"), sys.executable, str(BENCH / "_clusterweb.py"),
            "--hosts", str(args.hosts), "--max-pages", str(args.max_pages),
            "--exponent", str(args.exponent), "--seed", str(args.seed),
            "--page-bytes", str(args.page_bytes), "--control", WEB_ADDR,
        ]  # fmt: skip
        web_proc = subprocess.Popen(web_cmd, stdout=subprocess.PIPE, text=True)
        assert web_proc.stdout is not None
        if not web_proc.stdout.readline():
            raise RuntimeError("the test web did not start")
        out = asyncio.run(main_async(args, topo, zweb))
        out["hold_clock"] = bool(spinners)
    finally:
        release_clock(spinners)
        if web_proc is not None and web_proc.poll() is None:
            web_proc.send_signal(signal.SIGTERM)
            try:
                web_proc.wait(10)
            except subprocess.TimeoutExpired:
                web_proc.kill()
                web_proc.wait()
        topo.close()
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
