"""Membership scenarios at full speed with every timer at its default: tests and benchmarks.

A scenario is a :class:`~p2pcrawl.testing.Cluster` of real peer processes crawling a
:class:`~p2pcrawl.testing.TestWeb` with no politeness delay, so one peer fetches hundreds of
pages a second, and events (joins, crashes, leaves, stops) land while the network is young
and busy. Nothing is shortened: ``--min-peer-age``, the ping interval, the suspicion timeout
and every other timer keep their defaults, as a new user's network has them.

What a scenario checks comes from the web server's own request counts (the ground truth
fetched, duplicates) and from each peer's status API (``finished``, never reported while a
page of the ground truth is still unfetched). :class:`Outcome` keeps the figures; the tests
assert on them and the benchmarks print them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from p2pcrawl.aio import TaskSet
from p2pcrawl.testing.cluster import Cluster, PeerProc
from p2pcrawl.testing.web import TestWeb, TestWebConfig

__all__ = ["DUP_SHARE", "Outcome", "Scenario", "full_speed_args", "full_speed_web"]

DUP_SHARE = 0.005  # duplicates allowed beyond what each killed peer had under way
# What a killed peer may have had between fetch and done: ``--concurrency`` fetches (32 by
# default) and up to ``TAILS_PER_FETCH`` (2) page tails per fetch slot (docs/membership.md).
IN_FLIGHT_PER_KILL = 32 * 3
POLL_S = 0.25
# A joiner whose neighbour died mid-join waits for it (today up to the handoff timeout, 30 s)
# before its ready line: the cluster's usual 20 s would end the case instead of measuring it.
STARTUP_S = 60.0
# No page of the ground truth fetched for this long while some are missing: the crawl has
# stalled (with the defaults a crash costs its detection time, a few seconds; the failures
# this catches stood still for 30 s to minutes), and the run ends there.
STALL_S = 30.0
# A call sent just before its target was declared dead or said goodbye may still fail after
# it (the RPC timeout, 2 s), and log lines carry whole seconds.
FORGET_GRACE_S = 3.0
_CALL_FAILED = re.compile(
    r"^(\d\d):(\d\d):(\d\d) .*\b(STORE_TASK|REFRESH_TASK|STORE_BACKUP|DELETE_BACKUP|handoff|"
    r"history|report)\b.* to ([0-9a-f]{8}@[0-9.]+:\d+)\b.*(failed|unanswered)"
)
_GAVE_UP = "never handed over all"


def full_speed_web(pages: int = 2_500, hosts: int = 4, big_share: float = 0.8) -> TestWebConfig:
    """A web of ``hosts`` hosts, host 0 (the hub's) holding ``big_share`` of ``pages``: the
    big site's owner does most of the work, as on a real crawl."""
    big = round(pages * big_share)
    return TestWebConfig(
        hosts=hosts,
        pages_per_host=max(1, (pages - big) // max(1, hosts - 1)),
        big_host_pages=big,
        slow_host_delay=0.0,
        large_page_bytes=50_000,
    )


SCENARIO_SECRET = "scenario-network-key"


def full_speed_args(web: TestWeb, *extra: str) -> list[str]:
    """Crawl ``web`` as fast as it answers; every timer and ``--min-peer-age`` at default.

    The network is keyed, as one across machines is by default: the cases place some IDs
    next to the busiest host, which an open network's IDs (made from a key with a puzzle)
    do not allow (docs/security.md)."""
    args = ["--allow-private", "--politeness-factor", "0", "--delay", "0"]
    args += ["--secret", SCENARIO_SECRET]
    for d in web.allow_domains:
        args += ["--allow-domain", d]
    return [*args, *extra]


@dataclass
class Outcome:
    """What one scenario run saw."""

    pages: int = 0  # the ground truth
    lost: int = 0  # ground-truth URLs never requested
    duplicates: int = 0  # requests beyond the first, for ground-truth URLs
    refetched: int = 0  # of those, the live peers' checks of done claims (docs/security.md)
    # Of those, the killed peers' in-flight windows: a URL first requested by a peer that was
    # killed afterwards (its done news died with it), and how long before its kill at most.
    in_flight: int = 0
    in_flight_age: float = 0.0
    in_flight_median_age: float = 0.0
    # Per kill: the killed peer's requests in the second before it (its window in seconds
    # is its share of ``in_flight`` over this).
    rates_at_kill: list[int] = field(default_factory=list)
    beyond_pairs: list[str] = field(default_factory=list)  # ``Scenario._beyond_pairs``
    kills: int = 0
    elapsed: float = 0.0  # seed to every peer finished (or to the give-up)
    # Seed to the last ground-truth page's first fetch: the crawl itself. ``finished`` may
    # come up to --partition-hold later after a crash (a dead peer may be a cut-off half).
    crawled: float = 0.0
    finished: bool = False  # every live peer reported ``finished``
    premature: list[str] = field(default_factory=list)  # "finished" while pages were unfetched
    stalled: bool = False  # ended early: nothing new fetched for STALL_S with pages missing
    longest_stall: float = 0.0  # the longest wait between new pages before the last one
    detections: list[float] = field(default_factory=list)  # kill -> peer_lost, per survivor
    # Calls that still waited on a peer after it was declared dead or said goodbye, and
    # joins that gave up on a neighbour instead of taking its keys from the replicas.
    lingering: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    @property
    def dup_bound(self) -> float:
        return max(1.0, DUP_SHARE * self.pages) + IN_FLIGHT_PER_KILL * self.kills + self.refetched

    def problems(self) -> list[str]:
        """Every guarantee the run broke, in words (empty: none)."""
        out = []
        if self.lost:
            out.append(f"{self.lost} of {self.pages} pages never fetched")
        if self.duplicates > self.dup_bound:
            out.append(f"{self.duplicates} duplicate fetches, over {self.dup_bound:.0f}")
        if self.stalled:
            out.append(f"stalled: no new page for {STALL_S:.0f} s with pages unfetched")
        elif not self.finished:
            out.append("not every live peer reached finished")
        out += [f"finished too early: {p}" for p in self.premature]
        return out

    def line(self, what: str, steady: float | None = None) -> str:
        ratio = f" ({self.crawled / steady:.2f}x the steady {steady:.1f} s)" if steady else ""
        det = ", ".join(f"{d:.1f}" for d in sorted(self.detections)) or "-"
        return (
            f"{what}: {self.pages} pages, lost {self.lost}, duplicates {self.duplicates} "
            f"(bound {self.dup_bound:.0f}; {self.in_flight} in killed peers' in-flight windows, "
            f"fetched at most {self.in_flight_age:.2f} s before the kill), "
            f"crawl {self.crawled:.1f} s{ratio}, finished at "
            f"{self.elapsed:.1f} s, longest stall {self.longest_stall:.1f} s, detection s "
            f"[{det}], finished {self.finished}, calls to forgotten peers {len(self.lingering)}; "
            f"events {' '.join(self.events)}"
        )


class Scenario:
    """One run: a cluster, the web it crawls, and the events applied to it."""

    def __init__(self, cluster: Cluster, web: TestWeb) -> None:
        self.cluster = cluster
        cluster.startup_timeout = max(cluster.startup_timeout, STARTUP_S)
        self.web = web
        self.truth = web.ground_truth()
        self.started = 0.0
        self.outcome = Outcome(pages=len(self.truth))
        # (name, "prefix@address", wall time): two joiners next to one busy peer can share the
        # 8 hex digits of an ID prefix (a leave was once counted as the other's detection).
        self._kills: list[tuple[str, str, float]] = []
        self._killed_at: dict[str, float] = {}  # name -> monotonic time of its SIGKILL
        # Duplicates outside the kills' windows, by (first fetcher, second fetcher): the
        # monotonic times of both requests.
        self._beyond: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        self._names = 0
        self._progress = (0, 0.0)  # (ground-truth pages fetched, when that count was reached)
        self._watch = TaskSet("scenario")
        web.request_counts.clear()
        web.request_log.clear()

    async def aclose(self) -> None:
        await self._watch.aclose()

    # -- the network -------------------------------------------------------------------------

    def _name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names - 1}"

    async def start(
        self, n: int, *, together: bool = True, founder_args: Sequence[str] = ()
    ) -> list[PeerProc]:
        """A founder (with ``founder_args`` besides the cluster's), then ``n - 1`` joiners
        through it: all at once (``together``), or each once the one before is up."""
        name = self._name("p")
        founder = await self.cluster.start_peer(name, extra=[*agent(name), *founder_args])
        if n == 1:
            return [founder]
        return [founder, *await self.join(founder, n - 1, together=together)]

    async def join(
        self, boot: PeerProc, n: int, *, together: bool = True, extra: list[str] | None = None
    ) -> list[PeerProc]:
        names = [self._name("p") for _ in range(n)]
        if together:
            started = await asyncio.gather(
                *(
                    self.cluster.start_peer(m, bootstrap=boot, extra=[*agent(m), *(extra or [])])
                    for m in names
                )
            )
            joined = list(started)
        else:
            joined = [
                await self.cluster.start_peer(m, bootstrap=boot, extra=[*agent(m), *(extra or [])])
                for m in names
            ]
        self.note(f"join{n}@{self.share():.0%}")
        return joined

    async def wait_mesh(self, timeout: float = 30.0) -> None:
        n = len(self.live())
        await self.cluster.wait_until(
            lambda ss: len(ss) == n and all(s["peers"] == n - 1 for s in ss), timeout, "a mesh"
        )

    async def admitted(self, peer: PeerProc, n: int, timeout: float) -> None:
        """Until ``peer`` has ``n`` contacts in its routing table (``/api/peers``), young
        ones included (``peer_added`` waits for ``--min-peer-age``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                doc: Any = await self.cluster.api(peer, "/api/peers")
                if sum(len(b["peers"]) for b in doc["buckets"]) >= n:
                    self.note(f"table{n}")
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{peer.name} did not admit {n} peers in {timeout} s")

    def live(self) -> list[PeerProc]:
        return [p for p in self.cluster.peers if p.alive]

    async def seed(self, peer: PeerProc) -> None:
        self.started = time.monotonic()
        self._progress = (self.fetched(), self.started)
        self._watch.spawn(self._watch_progress(), "progress")
        await self.cluster.api(peer, "/api/seed", "POST", {"urls": [self.web.hub_url]})

    async def _watch_progress(self) -> None:
        """Sample the server's count of pages fetched: the longest wait for a new one (while
        some were missing) shows a stall however the crawl ended."""
        while True:
            await asyncio.sleep(0.1)
            now, n = time.monotonic(), self.fetched()
            count, since = self._progress
            if n != count:
                self.outcome.longest_stall = max(self.outcome.longest_stall, now - since)
                self._progress = (n, now)

    def idle_for(self) -> float:
        """Seconds since a page of the ground truth was last fetched for the first time."""
        return time.monotonic() - self._progress[1]

    # -- progress, from the server's side ------------------------------------------------------

    def fetched(self) -> int:
        counts = self.web.request_counts
        return sum(1 for u in counts if u in self.truth)

    def share(self) -> float:
        return self.fetched() / max(1, len(self.truth))

    def note(self, what: str) -> None:
        at = time.monotonic() - self.started if self.started else 0.0
        self.outcome.events.append(f"{what}@{at:.1f}s")

    async def until_share(self, share: float, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.share() < share:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.share():.0%} fetched after {timeout} s")
            await asyncio.sleep(0.05)

    async def busiest(self, among: list[PeerProc] | None = None) -> PeerProc:
        """The peer with most work queued and in flight."""
        peers = [p for p in (among or self.live()) if p.alive]
        load: dict[str, int] = {}
        for p in peers:
            with contextlib.suppress(Exception):
                st = await self.cluster.api(p, "/api/status")
                load[p.name] = int(st["tasks_queued"]) + int(st["tasks_in_flight"])
        return max(peers, key=lambda p: load.get(p.name, -1))

    # -- events ----------------------------------------------------------------------------

    async def kill(self, peer: PeerProc) -> None:
        self._kills.append((peer.name, f"{peer.node_id[:8]}@{peer.listen}", time.time()))
        self._killed_at[peer.name] = time.monotonic()
        self.cluster.kill(peer)
        await peer.proc.wait()
        self.outcome.kills += 1
        self.note(f"kill:{peer.name}@{self.share():.0%}")

    async def leave(self, peer: PeerProc) -> None:
        self.note(f"leave:{peer.name}@{self.share():.0%}")
        await self.cluster.api(peer, "/api/leave", "POST")

    async def stop(self, peer: PeerProc, seconds: float) -> None:
        """SIGSTOP for ``seconds``, then SIGCONT: a peer that looks dead and is not."""
        self.note(f"stop{seconds:.0f}s:{peer.name}@{self.share():.0%}")
        os.kill(peer.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(peer.pid, signal.SIGCONT)

    # -- the end ---------------------------------------------------------------------------

    async def finish(self, timeout: float) -> Outcome:
        """Wait until every live peer reports ``finished`` (at most ``timeout`` seconds from
        the seed; less if the crawl stalls for ``STALL_S``), watching that none does while a
        page of the ground truth is unfetched or a backup is orphaned; then count."""
        out = self.outcome
        deadline = self.started + timeout
        missing, statuses = len(self.truth) - self.fetched(), []
        while time.monotonic() < deadline:
            statuses = await self.cluster.statuses()
            missing = len(self.truth) - self.fetched()
            done = [s for s in statuses if s.get("state") == "finished"]
            orphans = sum(int(s.get("backups_orphaned", 0)) for s in statuses)
            if done and (missing or orphans):
                who = ",".join(str(s.get("node_id", "?"))[:8] for s in done)
                out.premature.append(f"{who}, {missing} pages unfetched, {orphans} orphans")
                break
            if statuses and len(statuses) == len(self.live()) and len(done) == len(statuses):
                out.finished = True
                break
            if missing and self.idle_for() > STALL_S:
                out.stalled = True
                break
            await asyncio.sleep(POLL_S)
        out.elapsed = time.monotonic() - self.started
        out.crawled = self._progress[1] - self.started
        await self._watch.aclose()
        if missing:  # the wait that never ended counts too
            out.longest_stall = max(out.longest_stall, self.idle_for())
        counts = self.web.request_counts
        out.lost = len(self.truth - set(counts))
        out.duplicates = sum(n - 1 for u, n in counts.items() if u in self.truth)
        out.refetched = sum(int((s.get("claims") or {}).get("refetches", 0)) for s in statuses)
        ages = self._in_flight()
        out.in_flight, out.in_flight_age = len(ages), max(ages, default=0.0)
        out.in_flight_median_age = statistics.median(ages) if ages else 0.0
        out.rates_at_kill = self._rates_at_kill()
        out.beyond_pairs = self._beyond_pairs()
        gone = await self._gone()
        out.detections = [
            gone[p.name][who] - at
            for _name, who, at in self._kills
            for p in self.live()
            if who in gone.get(p.name, {})
        ]
        out.lingering = self._lingering(gone)
        return out

    def _in_flight(self) -> list[float]:
        """Per duplicate of a URL first requested by a peer before it was killed, the time
        from that request to the kill: what a crash costs by design (docs/membership.md,
        "What a crash costs"); any other duplicate has another cause."""
        first: dict[str, tuple[float, str]] = {}
        ages: list[float] = []
        for t, url, ua in self.web.request_log:
            if url not in self.truth:
                continue
            if url not in first:
                first[url] = (t, ua.removeprefix(AGENT))
                continue
            at, who = first[url]
            killed = self._killed_at.get(who)
            if killed is not None and at <= killed:
                ages.append(killed - at)
            else:
                self._beyond[(who, ua.removeprefix(AGENT))].append((at, t))
        return ages

    def _beyond_pairs(self, top: int = 3) -> list[str]:
        """The duplicates beyond the kills' windows by (first fetcher, second fetcher): how
        many, and when (s after the start) the first and the second fetches fell."""
        out = []
        pairs = sorted(self._beyond.items(), key=lambda kv: -len(kv[1]))[:top]
        for (first, again), times in pairs:
            t0 = [a - self.started for a, _ in times]
            t1 = [b - self.started for _, b in times]
            out.append(
                f"{len(times)} {first}->{again} (first {min(t0):.1f}-{max(t0):.1f} s, again "
                f"{min(t1):.1f}-{max(t1):.1f} s)"
            )
        return out

    def _rates_at_kill(self) -> list[int]:
        return [
            sum(
                1
                for t, _, ua in self.web.request_log
                if ua.removeprefix(AGENT) == who and killed - 1.0 < t <= killed
            )
            for who, killed in self._killed_at.items()
        ]

    async def _gone(self) -> dict[str, dict[str, float]]:
        """Per live peer: when it forgot each peer it lost or that left (wall time)."""
        out: dict[str, dict[str, float]] = {}
        for p in self.live():
            with contextlib.suppress(Exception):
                doc: Any = await self.cluster.api(p, "/api/events")
                seen = out.setdefault(p.name, {})
                for e in doc["events"]:
                    if e.get("kind") in ("peer_lost", "peer_left"):
                        seen.setdefault(f"{e['peer']}@{e.get('addr')}", float(e["t"]))
        return out

    def _lingering(self, gone: dict[str, dict[str, float]]) -> list[str]:
        """From the live peers' logs: failed calls to a peer more than ``FORGET_GRACE_S``
        after this peer had forgotten it, and joins that gave up on a neighbour."""
        out = []
        for p in self.live():
            forgot = {k: _clock_s(t) for k, t in gone.get(p.name, {}).items()}
            assert p.log_path is not None
            for line in p.log_path.read_text(errors="replace").splitlines():
                if _GAVE_UP in line:
                    out.append(f"{p.name}: {line[:120]}")
                m = _CALL_FAILED.match(line)
                if m is None or m.group(5) not in forgot:
                    continue
                at = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
                if at > forgot[m.group(5)] + FORGET_GRACE_S:
                    out.append(f"{p.name}: {line[:120]}")
        return out

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{self.cluster.log(p)}" for p in self.cluster.peers)


# Each peer's requests name it (its User-Agent), so the server's log tells who fetched what.
AGENT = "p2pcrawl-scenario/"


def agent(name: str) -> list[str]:
    return ["--user-agent", f"{AGENT}{name}"]


def _clock_s(t: float) -> float:
    """Seconds since local midnight, as the peers' log lines print their time."""
    lt = time.localtime(t)
    return lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + (t % 1)
