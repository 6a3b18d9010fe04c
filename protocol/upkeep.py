"""The node's two background jobs (``Upkeep``, owned by ``CrawlNode``), in owned loops.

kademlia schedules ``refresh_table`` with ``call_later`` and, after the first run, forgets the
interval it was given (it reschedules itself with the default hour), and it never pings anyone
on its own: a dead neighbour is only noticed when a lookup happens to hit it. Here:

* ``ping_round`` (every ``ping_interval``): ping the members not heard from for half an
  interval, the closest first -- the likely owners and replicas of our keys -- then the most
  silent, up to ``PINGS_PER_ROUND``: in a network of that size every peer checks every
  other each second, and notices a death by itself whether or not it had reason to call the
  dead one. Each ping waits SWIM's probe timeout (``probes.PROBE_TIMEOUT``, 0.5 s), not the
  RPC timeout; a failure makes a suspect (``liveness``), silent since the ping left, and a
  reply that comes later still refutes it.
* ``probe_suspects`` (the same round, beside the pings): SWIM's probe of each suspect,
  directly and then through ``k`` helpers (PING-REQ); one nobody reaches goes to ``judge``,
  which declares it dead once it has been silent for the suspicion timeout (shortened by
  the helpers that could not reach it either, stretched by our local health score), at
  that moment rather than at the next round (Lifeguard's suspicion timer).
* ``refresh_once`` (every ``refresh_interval``): Kademlia §2.3 bucket refresh -- a lookup of a
  random ID in each bucket idle that long -- plus a lookup of our own ID, which finds new
  close neighbours; then republish stored values older than an hour (§2.5).

A crashed member is declared dead about ``suspicion_timeout`` after the first call it left
unanswered; docs/membership.md has the figures.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.kbucket import Node
from protocol.lookup import NodeLookup
from protocol.looplag import LoopLagMonitor
from protocol.ownership import closest
from protocol.periodic import every
from protocol.probes import Answer
from protocol.rpc import Rpc
from protocol.sockstats import SocketStats
from protocol.taskset import TaskSet

__all__ = ["ProbeRound", "Upkeep", "ping_round", "probe_suspects", "refresh_once"]

log = logging.getLogger(__name__)

NEIGHBOUR_PINGS = 8  # closest contacts, checked first each round: our keys' neighbours
# Members checked per round at most: the nearest, then the most silent. In a network this
# size or smaller every member not heard from within half an interval is pinged each round,
# so every peer notices a death by itself, whether or not it had reason to call the dead
# one (SWIM probes every member in turn for the same reason).
PINGS_PER_ROUND = 32


@dataclass(slots=True)
class ProbeRound:
    """What one round saw: the contacts that answered and that did not (by ID, so pinging
    and then probing one dead peer is one failure, not two), and the helpers that answered
    (nacks: they could not reach the suspect either) or stayed silent."""

    ok: set[bytes] = field(default_factory=set)
    failed: set[bytes] = field(default_factory=set)
    nacks: int = 0
    missed_nacks: int = 0
    heard: int = 0  # members heard from within half an interval: not pinged, not suspected


async def ping_round(proto: Rpc, ping_interval: float, seen: ProbeRound) -> None:
    """Ping the members not heard from for half an interval: the nearest first, then the
    most silent, ``PINGS_PER_ROUND`` at most."""
    router = proto.router
    now = time.monotonic()

    def silent_for(node: Node) -> float:
        return now - (router.last_seen(node.id) or 0.0)

    members = {n.id: n for n in router.members()}
    quiet = {i: n for i, n in members.items() if silent_for(n) >= ping_interval / 2}
    seen.heard = sum(1 for i in members if i not in quiet and not proto.liveness.is_suspect(i))
    targets = [quiet[i] for i in closest(proto.my_id, quiet, NEIGHBOUR_PINGS)]
    rest = sorted((n for n in quiet.values() if n not in targets), key=silent_for, reverse=True)
    targets += rest[: max(0, PINGS_PER_ROUND - len(targets))]
    results = await asyncio.gather(*(proto.probe_ping(n) for n in targets))
    for n, ok in zip(targets, results, strict=True):
        (seen.ok if ok else seen.failed).add(n.id)


async def probe_suspects(
    proto: Rpc, helpers: int, seen: ProbeRound, judge: Callable[[Node], None]
) -> None:
    """SWIM §3.1-3.2 for every suspect at once: a direct ping, then PING-REQ through up to
    ``helpers`` other contacts; a suspect nobody reached goes to ``judge``, which declares
    it dead once it has been silent long enough."""
    detector = proto.liveness
    router = proto.router

    async def one(node_id: bytes) -> None:
        node = router.get(node_id)
        if node is None:
            detector.forget(node_id)
            return
        if await proto.probe_ping(node):
            seen.ok.add(node_id)
            return
        # Helpers: contacts not under suspicion themselves, most recently heard first, with
        # a random pick among equals so repeated rounds do not lean on the same few.
        pool = [n for n in router.members() if n.id != node_id and not detector.is_suspect(n.id)]
        random.shuffle(pool)
        pool.sort(key=lambda n: -(router.last_seen(n.id) or 0.0))
        chosen = pool[:helpers]
        answers = await asyncio.gather(*(proto.ping_req(h, node) for h in chosen))
        if Answer.ACK in answers:
            detector.heard(node_id)  # someone reached it: alive, whatever we could hear
            seen.ok.add(node_id)
            return
        seen.failed.add(node_id)
        nacks = answers.count(Answer.NACK) + answers.count(Answer.GONE)
        # A helper's own verdict lifts our health's caution (``liveness``), so it is taken
        # from key holders only: in an open network two members an attacker runs could
        # otherwise have a flooded peer declare the members it cannot hear.
        gone = answers.count(Answer.GONE) if proto.endpoint.keyed else 0
        seen.nacks += nacks
        seen.missed_nacks += answers.count(Answer.SILENT)
        if not detector.is_suspect(node_id):
            return  # heard from meanwhile (a request of its own arrived)
        # Helpers that answered but could not reach it either: independent suspicions.
        detector.probe_failed(node_id, nacks, gone)
        judge(node)

    await asyncio.gather(*(one(i) for i in detector.suspects()))


async def refresh_once(
    proto: Rpc,
    ksize: int,
    alpha: int,
    idle: float,
    republish: Callable[[bytes, Any], Awaitable[bool]],
) -> None:
    targets = [proto.my_id]
    for bucket in proto.router.lonely_buckets(idle):
        low, high = bucket.range
        rid = min(low + secrets.randbelow(high - low + 1), 2**160 - 1)
        targets.append(rid.to_bytes(20, "big"))
    crawls = []
    for target in targets:
        node = Node(target)
        nearest = proto.router.find_neighbors(node, alpha)
        if nearest:
            crawls.append(NodeLookup(proto, node, nearest, ksize, alpha).find())
    await asyncio.gather(*crawls)
    for dkey, value in proto.storage.iter_older_than(3600):
        await republish(dkey, value)


class Upkeep:
    """The liveness round and the table refresh, and what they measure: the event loop's lag
    (one ``LoopLagMonitor`` per process: the status page reads it too) and the socket's
    drops and junk, folded into the failure detector's local health each round."""

    def __init__(
        self,
        rpc: Rpc,
        *,
        ksize: int,
        alpha: int,
        ping_interval: float,
        refresh_interval: float,
        indirect_probes: int,
        stall_after: float,
        on_stall: Callable[[float], None],
        republish: Callable[[bytes, Any], Awaitable[bool]],
    ) -> None:
        self._rpc = rpc
        self._ksize = ksize
        self._alpha = alpha
        self._ping_interval = ping_interval
        self._refresh_interval = refresh_interval
        self._helpers = indirect_probes
        self._republish = republish
        self.lag = LoopLagMonitor(stall_after=stall_after, on_stall=on_stall)
        self.socket = SocketStats(rpc.stats)
        self.last_round = ProbeRound()
        self.ping_rounds = 0
        self.refresh_runs = 0
        self._rounds: list[asyncio.Task[Any]] = []
        # Suspects' verdict timers, with the deadline each was set for.
        self._verdicts: dict[bytes, tuple[float, asyncio.TimerHandle]] = {}

    async def start(self, sock: socket.socket, loops: TaskSet) -> None:
        await self.socket.attach(sock)
        loops.spawn(self.lag.run(), "lag")
        for name, interval, job in (
            ("ping", self._ping_interval, self.ping_round),
            ("refresh", self._refresh_interval, self.refresh),
        ):
            task = loops.spawn(every(interval, job), name)
            if task is not None:
                self._rounds.append(task)

    def stop(self) -> None:
        """No more pings, probes or lookups (this node said GOODBYE): each of them would put
        it back into the tables it just left. The owning TaskSet still awaits them."""
        for task in self._rounds:
            task.cancel()
        self._rounds = []
        self.close()

    def close(self) -> None:
        """Cancel the suspects' verdict timers (the node stops)."""
        for _, timer in self._verdicts.values():
            timer.cancel()
        self._verdicts.clear()

    async def ping_round(self) -> None:
        """Ping, probe the suspects, then fold what this round saw into our local health."""
        rpc = self._rpc
        seen = ProbeRound()
        # Side by side: a round's pings must not hold back the probes of its suspects.
        await asyncio.gather(
            ping_round(rpc, self._ping_interval, seen),
            probe_suspects(rpc, self._helpers, seen, self.judge),
        )
        rpc.liveness.health.round(
            loop_lag=self.lag.take(),
            socket_drops=await self.socket.new_drops(),
            junk=self.socket.new_junk(),
            missed_nacks=seen.missed_nacks,
            nacks=seen.nacks,
            probes_ok=len(seen.ok),
            probes_failed=len(seen.failed - seen.ok),
            heard=seen.heard,
        )
        self.last_round = seen
        self.ping_rounds += 1

    def judge(self, suspect: Node) -> None:
        """A probe round failed to reach ``suspect``: declare it dead if it has been silent
        long enough, else at its deadline (Lifeguard's suspicion timer), unless anything
        is heard from it first. A round waits for nothing: a verdict due in 0.3 s is not
        put off by the sleep before the next round."""
        detector = self._rpc.liveness
        if detector.dead(suspect.id):
            self._declare(suspect)
            return
        deadline = detector.deadline(suspect.id)
        now = detector.clock()
        if deadline is None or deadline <= now:
            return  # not a suspect, or short of failed rounds: the next round judges it
        armed = self._verdicts.get(suspect.id)
        if armed is not None:
            if armed[0] <= deadline:
                return
            # The deadline came nearer (our health recovered, or helpers confirmed): a
            # timer set while a flood stretched it ninefold would keep the verdict 10 s late.
            armed[1].cancel()
        timer = asyncio.get_running_loop().call_later(deadline - now, self._deadline, suspect)
        self._verdicts[suspect.id] = (deadline, timer)

    def _deadline(self, suspect: Node) -> None:
        self._verdicts.pop(suspect.id, None)
        if self._rpc.liveness.is_suspect(suspect.id) and not self._rpc.contacts.departing:
            self.judge(suspect)  # declared now, or later if our health stretched it

    def _declare(self, dead: Node) -> None:
        if self._rpc.router.get(dead.id) is not None:
            self._rpc.contacts.declare_dead(dead)

    async def refresh(self) -> None:
        await refresh_once(
            self._rpc, self._ksize, self._alpha, self._refresh_interval, self._republish
        )
        self.refresh_runs += 1
