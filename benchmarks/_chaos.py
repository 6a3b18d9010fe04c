"""A seeded random schedule of membership events at full speed (``churn.py --chaos``).

Per seed: a steady run (four peers started together, no event) and a chaos run on the same
web (``p2pcrawl.testing.scenarios``: real peer processes, no politeness delay, every timer
and ``--min-peer-age`` at its default). The chaos run starts four peers at once, seeds the
founder once the three joiners are in its routing table and, until 90% of the pages are
fetched, draws events a second or two apart from the seed's generator:

* ``join``: one to three peers at once; half the time the first takes an ID next to the
  busiest peer's (it splits that peer's share of the key space);
* ``leave``: a graceful leave (``p2pcrawl leave``);
* ``kill``: SIGKILL of a random peer or of the busiest, the founder included; odd seeds kill
  the founder within the first 5 s, and joins run in the background so kills land during
  them;
* ``stop``: SIGSTOP for 3-12 s, then SIGCONT;
* ``flood``: 10 s of junk datagrams at a peer's UDP port, ``--flood-rate`` a second (50,000
  by default: 200-byte datagrams, 80 Mbit/s; 0 sends as fast as one process can). An
  attacker sends from a machine of its own; a flooder on this one that sends as fast as it
  can takes one of the two cores the crawl runs on, which is the machine's cost, not the
  peer's. What the flooded peer spends reading and dropping the junk still counts, and
  ``benchmarks/_detection.py`` floods at full rate where false deaths are measured.

At least three peers keep running, and at most two are killed or stopped within any 10 s
(r = 2 replicas: a third loss inside one detection time may lose pages, docs/membership.md).
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _detection import FLOOD_S, spawn_flood

from p2pcrawl.testing import Cluster, PeerProc, TestWeb
from p2pcrawl.testing.cases import CASES, FINISH_S, id_near, preset_id
from p2pcrawl.testing.scenarios import Outcome, Scenario, full_speed_args, full_speed_web

KINDS = {"join": 3, "leave": 1, "kill": 3, "stop": 1, "flood": 1}
FLOOD_RATE = 50_000  # junk datagrams a second
LOSS_WINDOW_S = 10.0


class Chaos:
    def __init__(
        self,
        sc: Scenario,
        rng: random.Random,
        seed: int,
        kinds: dict[str, int] = KINDS,
        flood_rate: float = FLOOD_RATE,
    ) -> None:
        self.sc, self.rng, self.seed, self.kinds = sc, rng, seed, kinds
        self.flood_rate = flood_rate
        self.flood_sent: list[int] = []  # datagrams each flood sent
        self.flood_cpu_s = 0.0  # CPU seconds the flooders took, on this machine
        self.flood_at: list[float] = []  # when each flood began, seconds from the seed
        self.background: list[asyncio.Future[Any]] = []
        self.losses: list[float] = []  # monotonic times of kills and stops
        self.leaving: set[str] = set()
        self.stopped: set[str] = set()
        self.stopped_s = 0.0  # seconds of SIGSTOP drawn, in all
        self.handoffs_s: list[float] = []  # each graceful leave, from its request to its exit
        self.preset: set[str] = set()  # IDs written for joiners next to the busiest peer

    def usable(self) -> list[PeerProc]:
        return [
            p
            for p in self.sc.live()
            if p.name not in self.leaving and p.name not in self.stopped and p.status
        ]

    def may_lose(self) -> bool:
        now = time.monotonic()
        recent = [t for t in self.losses if now - t < LOSS_WINDOW_S]
        return len(self.usable()) > 3 and len(recent) < 2

    async def victim(self) -> PeerProc:
        peers = self.usable()
        if self.rng.random() < 0.5:
            return await self.sc.busiest(peers)
        return self.rng.choice(peers)

    async def run(self, events: int) -> Outcome:
        sc = self.sc
        founder = (await sc.start(1))[0]
        joining = asyncio.ensure_future(sc.join(founder, 3, together=True))
        # Seeded once the joiners are in its table (a joiner whose bootstrap dies before it
        # is admitted rightly gives up, and a network of one can only lose its crawl).
        await sc.admitted(founder, 3, timeout=60.0)
        await sc.seed(founder)
        if self.seed % 2:  # the founder dies in the network's first seconds
            await asyncio.sleep(self.rng.uniform(1.0, 5.0))
            self.losses.append(time.monotonic())
            await sc.kill(founder)
        # The first three joins end before the schedule starts: until then no peer may be
        # lost (at least three must run), and a flood at their bootstrap held them up for
        # 30 s, so the schedule drew only joins and floods.
        await asyncio.gather(joining, return_exceptions=True)
        for _ in range(events):
            await asyncio.sleep(self.rng.uniform(0.5, 2.5))
            if sc.share() >= 0.9:
                break
            await self.event(self.rng.choices(list(self.kinds), list(self.kinds.values()))[0])
        for result in await asyncio.gather(*self.background, return_exceptions=True):
            if isinstance(result, Exception):
                # A joiner whose bootstraps were all killed meanwhile rightly gives up once
                # --join-retry runs out (it exits 1, "no bootstrap peer answered"): noted.
                why = str(result).splitlines()[0] if str(result) else type(result).__name__
                sc.note(f"gave-up:{why[:60].replace(' ', '_')}")
        return await sc.finish(FINISH_S + 60.0)

    async def event(self, kind: str) -> None:
        sc = self.sc
        peers = self.usable()
        if not peers:
            return
        if kind in ("kill", "stop", "leave") and not self.may_lose():
            kind = "join"
        if kind == "join":
            n = self.rng.choice([1, 1, 2, 3])
            if self.rng.random() < 0.5:
                busy = await sc.busiest(peers)
                preset_id(sc, f"p{sc._names}", self.new_id_near(busy, self.rng.randrange(128, 140)))
            boot = self.rng.choice(peers)
            # Two more running peers as bootstraps, as an operator's script lists several
            # (chosen without the generator, so a seed's draws stay as they were): with one,
            # a joiner whose bootstrap was killed as it started knew nobody else, asked it
            # for --join-retry seconds and exited 1 (three joiners at once in a seed 4).
            more = [a for p in peers if p is not boot for a in ("--bootstrap", p.listen)][:4]
            joins = sc.join(boot, n, together=True, extra=more)
            self.background.append(asyncio.ensure_future(joins))
        elif kind == "leave":
            p = await self.victim()
            self.leaving.add(p.name)
            await sc.leave(p)
            self.background.append(asyncio.ensure_future(self._handoff(p, time.monotonic())))
        elif kind == "kill":
            self.losses.append(time.monotonic())
            await sc.kill(await self.victim())
        elif kind == "stop":
            p = await self.victim()
            self.losses.append(time.monotonic())
            self.stopped.add(p.name)
            self.background.append(asyncio.ensure_future(self._stop(p)))
        elif kind == "flood":
            self.background.append(asyncio.ensure_future(self._flood(self.rng.choice(peers))))

    def new_id_near(self, busy: PeerProc, bit: int) -> str:
        """An ID next to ``busy``'s that no peer of the run has had: the first free bit from
        ``bit`` on. Two joins drawn next to the same busiest peer once drew the same bit, and
        two processes ran as one node ID, both owning its hosts (3,968 pages fetched twice
        in one run): an identity copied, not churn."""
        taken = self.preset | {p.node_id for p in self.sc.cluster.peers}
        key = bytes.fromhex(busy.node_id)
        for b in [*range(bit, 140), *range(128, bit)]:
            near = id_near(key, b)
            if near not in taken:
                self.preset.add(near)
                return near
        raise AssertionError(f"no free ID next to {busy.name}")

    async def _stop(self, p: PeerProc) -> None:
        seconds = self.rng.uniform(3.0, 12.0)
        self.stopped_s += seconds
        try:
            await self.sc.stop(p, seconds)
        finally:
            self.stopped.discard(p.name)

    async def _handoff(self, p: PeerProc, asked: float) -> None:
        """How long a leave took: from its request until the leaver exited, its keys handed
        off (docs/membership.md, "Leaving"). One that has not ended within ``FINISH_S`` is
        noted, and counts as far as it got."""
        try:
            async with asyncio.timeout(FINISH_S):
                await p.proc.wait()
        except TimeoutError:
            self.sc.note(f"leave-unended:{p.name}")
        self.handoffs_s.append(time.monotonic() - asked)

    async def _flood(self, p: PeerProc) -> None:
        self.sc.note(f"flood:{p.name}@{self.sc.share():.0%}")
        self.flood_at.append(time.monotonic() - self.sc.started)
        host, port = p.listen.rsplit(":", 1)
        proc = await spawn_flood(host, port, FLOOD_S, self.flood_rate, out=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        sent, cpu = [*out.decode().split(), "0", "0"][:2]
        self.flood_sent.append(int(sent))
        self.flood_cpu_s += float(cpu)


_BURN = """
import sys, time
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
"""


async def _machine_load(
    sc: Scenario, joiners: list[tuple[float, float]], floods: list[float], flood_rate: float
) -> None:
    """What the chaos run's own processes took of this machine, at the same moments from
    the seed: a burner per joiner (its start-up CPU), a flooder per flood."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    port = sink.getsockname()[1]
    load = sorted(
        [(at, "burn", cpu) for at, cpu in joiners] + [(at, "flood", 0.0) for at in floods]
    )
    procs = []
    try:
        for at, kind, cpu in load:
            await asyncio.sleep(max(0.0, sc.started + at - time.monotonic()))
            procs.append(
                await asyncio.create_subprocess_exec(sys.executable, "-c", _BURN, str(cpu))
                if kind == "burn"
                else await spawn_flood("127.0.0.1", port, FLOOD_S, flood_rate)
            )
        for proc in procs:
            await proc.wait()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        sink.close()


async def one_seed(
    web: TestWeb,
    root: Path,
    seed: int,
    events: int,
    kinds: dict[str, int],
    flood_rate: float,
    control: bool = False,
) -> dict[str, Any]:
    async with Cluster(root / "steady", full_speed_args(web)) as cluster:
        sc = Scenario(cluster, web)
        try:
            steady = await CASES["steady"](sc)
        finally:
            await sc.aclose()
    async with Cluster(root / "chaos", full_speed_args(web)) as cluster:
        sc = Scenario(cluster, web)
        run = Chaos(sc, random.Random(seed), seed, kinds, flood_rate)
        try:
            chaos = await run.run(events)
            # The joiners' start-ups (the first four peers start as in the steady run).
            joiners = [(p.spawned_at - sc.started, p.start_cpu_s) for p in cluster.peers[4:]]
            started_s = sum(cpu for _, cpu in joiners)
        finally:
            await sc.aclose()
    loaded = None
    if control:
        # The control: the steady run again, with the chaos run's machine load and none of its
        # events. At each joiner's spawn a process burns the CPU that joiner took until it was
        # up, and at each flood a flooder sends as many datagrams to a socket nobody reads.
        async with Cluster(root / "control", full_speed_args(web)) as cluster:
            sc = Scenario(cluster, web)
            load = None
            try:
                peers = await sc.start(4)  # as CASES["steady"]
                await sc.wait_mesh()
                await sc.seed(peers[0])
                load = asyncio.ensure_future(_machine_load(sc, joiners, run.flood_at, flood_rate))
                loaded = await sc.finish(FINISH_S)
            finally:
                if load is not None:
                    await asyncio.gather(load, return_exceptions=True)
                await sc.aclose()
    # The budget: the steady crawl plus a detection time per kill, the time a stopped
    # peer's hosts stood still (a stop shorter than detection is waited out), and each
    # graceful leave's hand-off ("a graceful leave costs no more than its handoff").
    det = statistics.median(chaos.detections) if chaos.detections else 0.0
    budget = steady.crawled + chaos.kills * det + run.stopped_s + sum(run.handoffs_s)
    # Not in the budget: the machine's share. A joiner starts on a machine of its own
    # and an attacker floods from one; here both take CPU from the crawl's cores (a joiner,
    # 1.0-1.4 s from spawn to ready). At most this much wall time, the crawl being CPU-bound.
    machine_s = (started_s + run.flood_cpu_s) / (os.cpu_count() or 1)
    return {
        "seed": seed,
        "pages": chaos.pages,
        "lost": chaos.lost,
        "duplicates": chaos.duplicates,
        "in_flight": chaos.in_flight,
        "in_flight_age_s": round(chaos.in_flight_age, 2),
        "in_flight_median_age_s": round(chaos.in_flight_median_age, 2),
        "rates_at_kill": chaos.rates_at_kill,
        "beyond_pairs": chaos.beyond_pairs,
        "beyond": chaos.duplicates - chaos.in_flight,
        "longest_stall_s": round(chaos.longest_stall, 1),
        "dup_bound": round(chaos.dup_bound),
        "kills": chaos.kills,
        "time_ratio": round(chaos.crawled / steady.crawled, 2) if steady.crawled else None,
        "steady_s": round(steady.crawled, 1),
        "chaos_s": round(chaos.crawled, 1),
        "budget_s": round(budget, 1),
        "within_budget": chaos.crawled <= budget,
        "allowance_s": budget - steady.crawled,  # detections, stops, hand-offs on a steady run
        "handoffs_s": [round(h, 1) for h in run.handoffs_s],
        "events_cpu_s": round(started_s + run.flood_cpu_s, 1),
        "joiners_cpu_s": round(started_s, 1),
        "machine_s": round(machine_s, 1),
        "within_budget_and_machine": chaos.crawled <= budget + machine_s,
        "control_s": round(loaded.crawled, 1) if loaded else None,
        "finished_s": round(chaos.elapsed, 1),
        "detections": [round(d, 1) for d in sorted(chaos.detections)],
        "finished": chaos.finished,
        "problems": chaos.problems(),
        "events": chaos.events,
        "flood_rates": [round(n / FLOOD_S) for n in run.flood_sent],
    }


async def chaos(
    seeds: list[int],
    events: int,
    pages: int,
    kinds: list[str] | None = None,
    flood_rate: float = FLOOD_RATE,
    control: bool = False,
) -> dict[str, Any]:
    drawn = {k: w for k, w in KINDS.items() if kinds is None or k in kinds}
    if not drawn or set(kinds or ()) - set(KINDS):
        raise SystemExit(f"--kinds: choose among {','.join(KINDS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-chaos-") as tmp:
        async with TestWeb(full_speed_web(pages)) as web:
            for seed in seeds:
                row = await one_seed(
                    web, Path(tmp) / f"seed{seed}", seed, events, drawn, flood_rate, control
                )
                rows.append(row)
                det = row["detections"]
                print(
                    f"seed {seed}: lost {row['lost']}, duplicates {row['duplicates']} "
                    f"({100 * row['duplicates'] / row['pages']:.2f}%; bound {row['dup_bound']} "
                    f"for {row['kills']} kills; {row['in_flight']} in the killed peers' in-flight "
                    f"windows, fetched up to {row['in_flight_age_s']} s before the kill, "
                    f"median {row['in_flight_median_age_s']} s, the killed peers' requests in "
                    f"the second before it {row['rates_at_kill']}; "
                    f"{row['beyond']} beyond them), crawl {row['chaos_s']} s = "
                    f"{row['time_ratio']}x the steady {row['steady_s']} s (budget "
                    f"{row['budget_s']} s, {row['budget_s'] + row['machine_s']:.1f} s with the "
                    f"{row['events_cpu_s']} CPU s the joiners' start-ups "
                    f"({row['joiners_cpu_s']}) and the flooders took on this machine; longest "
                    f"wait for a new page "
                    f"{row['longest_stall_s']} s), finished at {row['finished_s']} s, detection s "
                    f"{det or '-'}, leaves' hand-offs s {row['handoffs_s'] or '-'}, every peer "
                    f"finished: {row['finished']}; problems "
                    f"{row['problems'] or 'none'}\n  events {' '.join(row['events'])}"
                    f"\n  floods, datagrams a second: {row['flood_rates'] or '-'}"
                    f"\n  beyond the windows, by first -> second fetcher: "
                    f"{'; '.join(row['beyond_pairs']) or '-'}"
                    + (
                        f"\n  control: the steady run with this run's machine load and no "
                        f"event, {row['control_s']} s"
                        if control
                        else ""
                    ),
                    flush=True,
                )
    dets = [d for r in rows for d in r["detections"]]
    ratios = [r["time_ratio"] for r in rows if r["time_ratio"]]
    # The steady run is the same crawl in every seed (no event, IDs the survey's), so its
    # median over the seeds is the baseline each chaos run is held to: one steady run read
    # 21-36 s on this machine, more than a whole seed's events could explain.
    steady = statistics.median(r["steady_s"] for r in rows) if rows else 0.0
    for r in rows:
        r["budget_median_s"] = round(steady + r["allowance_s"], 1)
        r["within_median_budget"] = r["chaos_s"] <= steady + r["allowance_s"]
    if rows:
        print(
            f"against the median steady run, {steady:.1f} s: "
            + "; ".join(
                f"seed {r['seed']} {r['chaos_s']} s ({r['chaos_s'] / steady:.2f}x; budget "
                f"{r['budget_median_s']} s)"
                for r in rows
            )
        )
    return {
        "seeds": len(rows),
        "pages": rows[0]["pages"] if rows else 0,
        "lost_max": max((r["lost"] for r in rows), default=0),
        "seeds_with_loss": sum(1 for r in rows if r["lost"]),
        "duplicates_pct_median": round(
            statistics.median(100 * r["duplicates"] / r["pages"] for r in rows), 3
        )
        if rows
        else None,
        "beyond_in_flight_pct_median": round(
            statistics.median(100 * r["beyond"] / r["pages"] for r in rows), 3
        )
        if rows
        else None,
        "detection_median_s": round(statistics.median(dets), 2) if dets else None,
        "time_ratio_median": round(statistics.median(ratios), 2) if ratios else None,
        "seeds_within_budget": sum(1 for r in rows if r["within_budget"]),
        "seeds_within_budget_and_machine": sum(1 for r in rows if r["within_budget_and_machine"]),
        "steady_median_s": round(steady, 1),
        "time_vs_median_steady_median": round(
            statistics.median(r["chaos_s"] for r in rows) / steady, 2
        )
        if rows and steady
        else None,
        "seeds_within_median_budget": sum(1 for r in rows if r["within_median_budget"]),
        "all_finished": all(r["finished"] for r in rows),
        "seeds_with_problems": sum(1 for r in rows if r["problems"]),
        "flood_rate": flood_rate,
        **(
            {
                "control_median_s": statistics.median(r["control_s"] for r in rows),
                "seeds_within_budget_on_control": sum(
                    1 for r in rows if r["chaos_s"] <= r["control_s"] + r["allowance_s"]
                ),
            }
            if control and rows
            else {}
        ),
    }
