"""Admission to the routing table: no ID is taken on the sender's word.

Stock kademlia adds whoever sends a request, under whatever ID the request names, and a reply
to FIND_NODE lists contacts the replier merely claims. A script that pings with invented IDs
filled a table with 41 contacts that did not exist, and the peer then routed work to them.
Here a contact enters the table only with proof: a reply carrying its ID from its address to a
request of ours. When the proof is not already at hand (a request from a stranger, a contact
learned from a lookup) the node *challenges* the claim: it pings the claimed address, whose
reply must echo a random 20-byte request id (so a spoofed source address cannot answer) and
name the claimed ID. A contact known at one address that shows up at another is moved only if
the old address no longer answers for it and the new one does.

Challenges are work an attacker can cause, so they are bounded: at most ``max_in_flight`` at
once, and a token bucket per claimed IP plus a global one (``ratelimit``). What does not fit
is dropped and counted; a real peer is challenged again the next time it is heard from.

In an open network (no ``--secret``) anyone can still answer for an ID of their choosing at
their own address: admission stops invented and spoofed contacts, not self-chosen IDs
(docs/security.md). The minimum age before a contact takes over keys lives in the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protocol.kbucket import Node
from protocol.ratelimit import Rate, SourceLimits
from protocol.taskset import TaskSet

__all__ = ["Admission", "AdmissionLimits"]

log = logging.getLogger(__name__)

# Pings ``addr`` and returns the ID that answered, or None.
Prober = Callable[[tuple[str, int]], Awaitable[bytes | None]]


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_in_flight: int = 32
    per_ip: Rate = field(default_factory=lambda: Rate(per_s=8.0, burst=32.0))
    overall: Rate = field(default_factory=lambda: Rate(per_s=64.0, burst=128.0))


class Admission:
    def __init__(
        self,
        probe: Prober,
        admit: Callable[[Node], None],
        move: Callable[[Node, Node], None],
        tasks: TaskSet,
        limits: AdmissionLimits | None = None,
    ) -> None:
        self._probe = probe
        self._admit = admit
        self._move = move
        self._tasks = tasks
        self.limits = limits or AdmissionLimits()
        self._per_ip = SourceLimits(self.limits.per_ip, max_sources=4096)
        self._overall = SourceLimits(self.limits.overall, max_sources=1)
        self._in_flight: dict[bytes, Node] = {}  # claimed id -> the claim being checked
        self.counts: Counter[str] = Counter()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until no challenge is in flight."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)

    def challenge(self, claim: Node, known: Node | None = None) -> None:
        """Check that ``claim.id`` answers at ``claim``'s address, then admit it. ``known`` is
        the contact already recorded under that ID elsewhere, if any (a move)."""
        if claim.id in self._in_flight:
            return  # one check per ID at a time; repeats of the claim wait for its outcome
        if len(self._in_flight) >= self.limits.max_in_flight:
            self.counts["limited"] += 1
            return
        if not self._per_ip.allow(claim.ip) or not self._overall.allow(None):
            self.counts["limited"] += 1
            return
        self._in_flight[claim.id] = claim
        self._idle.clear()
        self.counts["challenged"] += 1
        self._tasks.spawn(self._check(claim, known), "admission")

    async def _check(self, claim: Node, known: Node | None) -> None:
        try:
            if known is not None and await self._probe((known.ip, known.port)) == known.id:
                # The ID still answers where we knew it: the new address is an impostor or a
                # second copy of the node; either way the table keeps the proven one.
                self.counts["move_refused"] += 1
                return
            answered = await self._probe((claim.ip, claim.port))
            if answered != claim.id:
                self.counts["failed"] += 1
                return
            if known is not None:
                self.counts["moved"] += 1
                self._move(known, claim)
            else:
                self.counts["admitted"] += 1
                self._admit(claim)
        finally:
            self._in_flight.pop(claim.id, None)
            if not self._in_flight:
                self._idle.set()
