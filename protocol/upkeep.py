"""The node's two background jobs (``Upkeep``, owned by ``CrawlNode``), in owned loops.

kademlia schedules ``refresh_table`` with ``call_later`` and, after the first run, forgets the
interval it was given (it reschedules itself with the default hour), and it never pings anyone
on its own: a dead neighbour is only noticed when a lookup happens to hit it. Here:

* ``ping_round`` (every ``ping_interval``): ping the closest neighbours -- the likely owners and
  replicas of our keys -- that were silent for a whole interval, plus the contacts silent for
  longest. A failure makes a suspect (``liveness``).
* ``probe_suspects`` (same round): SWIM's probe of each suspect, directly and then through
  ``k`` helpers (PING-REQ); a suspect nobody reaches for the suspicion timeout (stretched by
  our local health score) and enough rounds is declared dead. A crashed owner is noticed
  within about ``max(suspicion_timeout, min_failed_rounds * ping_interval)`` plus a round.
* ``refresh_once`` (every ``refresh_interval``): Kademlia §2.3 bucket refresh -- a lookup of a
  random ID in each bucket idle that long -- plus a lookup of our own ID, which finds new
  close neighbours; then republish stored values older than an hour (§2.5).
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
from protocol.rpc import Rpc
from protocol.sockstats import SocketStats
from protocol.taskset import TaskSet

__all__ = ["ProbeRound", "Upkeep", "ping_round", "probe_suspects", "refresh_once"]

log = logging.getLogger(__name__)

NEIGHBOUR_PINGS = 8  # closest contacts checked each round
STALE_PINGS = 16  # at most this many long-silent contacts checked per round


@dataclass(slots=True)
class ProbeRound:
    """What one round saw: the contacts that answered and that did not (by ID, so pinging
    and then probing one dead peer is one failure, not two), and silent helpers."""

    ok: set[bytes] = field(default_factory=set)
    failed: set[bytes] = field(default_factory=set)
    missed_nacks: int = 0
    declared: int = 0


async def ping_round(
    proto: Rpc, ping_interval: float, stale_after: float, seen: ProbeRound
) -> None:
    router = proto.router
    now = time.monotonic()

    def silent_for(node: Node) -> float:
        return now - (router.last_seen(node.id) or 0.0)

    members = {n.id: n for n in router.members()}
    near = [members[i] for i in closest(proto.my_id, members, NEIGHBOUR_PINGS)]
    targets = [n for n in near if silent_for(n) >= ping_interval]
    stale = sorted((n for n in members.values() if silent_for(n) > stale_after), key=silent_for)
    targets += [n for n in reversed(stale[-STALE_PINGS:]) if n not in targets]
    results = await asyncio.gather(*(proto.call_ping(n) for n in targets))
    for n, (ok, _) in zip(targets, results, strict=True):
        (seen.ok if ok else seen.failed).add(n.id)


async def probe_suspects(proto: Rpc, helpers: int, seen: ProbeRound) -> None:
    """SWIM §3.1-3.2 for every suspect at once: a direct ping, then PING-REQ through up to
    ``helpers`` other contacts; then declare the ones that stayed silent long enough."""
    detector = proto.liveness
    router = proto.router

    async def one(node_id: bytes) -> None:
        node = router.get(node_id)
        if node is None:
            detector.forget(node_id)
            return
        ok, _ = await proto.call_ping(node)
        if ok:
            seen.ok.add(node_id)
            return
        # Helpers: contacts not under suspicion themselves, most recently heard first, with
        # a random pick among equals so repeated rounds do not lean on the same few.
        pool = [n for n in router.members() if n.id != node_id and not detector.is_suspect(n.id)]
        random.shuffle(pool)
        pool.sort(key=lambda n: -(router.last_seen(n.id) or 0.0))
        chosen = pool[:helpers]
        answers = await asyncio.gather(*(proto.ping_req(h, node) for h in chosen))
        if any(a is True for a in answers):
            detector.heard(node_id)  # someone reached it: alive, whatever we could hear
            seen.ok.add(node_id)
            return
        seen.failed.add(node_id)
        seen.missed_nacks += sum(a is None for a in answers)
        if not detector.is_suspect(node_id):
            return  # heard from meanwhile (a request of its own arrived)
        detector.probe_failed(node_id)
        if detector.dead(node_id):
            seen.declared += 1
            proto.contacts.declare_dead(node)

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

    async def start(self, sock: socket.socket, loops: TaskSet) -> None:
        await self.socket.attach(sock)
        loops.spawn(self.lag.run(), "lag")
        loops.spawn(every(self._ping_interval, self.ping_round), "ping")
        loops.spawn(every(self._refresh_interval, self.refresh), "refresh")

    async def ping_round(self) -> None:
        """Ping, probe the suspects, then fold what this round saw into our local health."""
        rpc = self._rpc
        seen = ProbeRound()
        await ping_round(rpc, self._ping_interval, self._refresh_interval, seen)
        await probe_suspects(rpc, self._helpers, seen)
        rpc.liveness.health.round(
            loop_lag=self.lag.take(),
            socket_drops=await self.socket.new_drops(),
            junk=self.socket.new_junk(),
            missed_nacks=seen.missed_nacks,
            probes_ok=len(seen.ok),
            probes_failed=len(seen.failed - seen.ok),
        )
        self.last_round = seen
        self.ping_rounds += 1

    async def refresh(self) -> None:
        await refresh_once(
            self._rpc, self._ksize, self._alpha, self._refresh_interval, self._republish
        )
        self.refresh_runs += 1
