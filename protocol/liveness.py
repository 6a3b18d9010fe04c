"""Failure detection in the spirit of SWIM, with Lifeguard's local health awareness.

Papers: "SWIM: Scalable Weakly-consistent Infection-style Process Group Membership Protocol"
(Das, Gupta, Motivala, 2002) and "Lifeguard: Local Health Awareness for More Accurate
Failure Detection" (Dadgar, Phillips, Currey, 2018); HashiCorp's memberlist is the reference
implementation of both.

Counting missed replies (three in a row, then evict) confuses three things that look alike
from here: a dead peer, a live peer we cannot hear because *our own* socket or event loop is
overloaded, and a live peer that is briefly slow. Taking over a live peer's hosts is the worst
outcome (its hosts get crawled twice, breaking politeness), so a contact is declared dead only
when all of this holds:

* it is a **suspect**: some call to it failed. Anything heard from it -- a reply, a request,
  an indirect ack -- clears the suspicion at once (SWIM §4.2: suspicion is refuted);
* it stayed silent for ``suspicion_timeout`` seconds since it was first suspected (time, not a
  count of failures, so a burst of lost datagrams is one event, not three strikes), and for at
  least ``min_failed_rounds`` probe rounds;
* each of those rounds probed it directly and then **indirectly** through ``k`` other peers
  (SWIM §3.2, PING-REQ): a peer that others can reach is alive, whatever we hear;
* the timeout is multiplied by ``1 + local health score`` (Lifeguard §4): the score rises
  while *this* peer shows signs of overload -- its event loop stalled, its UDP socket dropped
  datagrams (``/proc/net/udp``), it was flooded with junk, or helpers did not even answer its
  indirect probes -- and falls again after clean rounds. A flooded peer thus stops blaming
  others for the replies it could not read.

``Detector`` and ``LocalHealth`` are pure (a clock is injected); ``looplag.LoopLagMonitor`` and
``socket_drops`` measure this process; the probing itself is ``upkeep.probe_suspects``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "MAX_HEALTH_SCORE",
    "Detector",
    "LivenessConfig",
    "LocalHealth",
    "socket_drops",
]

MAX_HEALTH_SCORE = 8  # Lifeguard's default cap: a timeout stretches to at most 9x
LAG_BAD_S = 0.5  # a loop late by this much could not have read replies in time
JUNK_PER_ROUND = 200  # datagrams dropped as junk in one round that mean "flooded"


@dataclass(frozen=True, slots=True)
class LivenessConfig:
    suspicion_timeout: float = 10.0
    min_failed_rounds: int = 3
    indirect_probes: int = 3


class LocalHealth:
    """Lifeguard's local health multiplier: how much to distrust our own view right now."""

    def __init__(self, cap: int = MAX_HEALTH_SCORE) -> None:
        self.cap = cap
        self.score = 0
        self.signals: dict[str, int] = {}  # why the score went up, for the status page

    def worse(self, reason: str) -> None:
        self.score = min(self.cap, self.score + 1)
        self.signals[reason] = self.signals.get(reason, 0) + 1

    def better(self) -> None:
        self.score = max(0, self.score - 1)

    @property
    def multiplier(self) -> int:
        return 1 + self.score

    def round(
        self,
        *,
        loop_lag: float,
        socket_drops: int,
        junk: int,
        missed_nacks: int,
        probes_ok: int,
        probes_failed: int,
    ) -> None:
        """Fold one probe round's observations in: each bad sign adds one, a clean round
        with at least one answered probe takes one away."""
        bad = False
        if loop_lag >= LAG_BAD_S:
            self.worse("loop_lag")
            bad = True
        if socket_drops > 0:
            self.worse("socket_drops")
            bad = True
        if junk >= JUNK_PER_ROUND:
            self.worse("junk")
            bad = True
        if missed_nacks > 0:
            self.worse("missed_nacks")
            bad = True
        if probes_failed >= 2 and probes_ok == 0:
            # Everyone we asked at once was silent: more likely us than all of them.
            self.worse("all_probes_failed")
            bad = True
        if not bad and probes_ok > 0:
            self.better()


@dataclass(slots=True)
class _Suspicion:
    since: float
    failed_rounds: int = 0
    failed_calls: int = 1


@dataclass(slots=True)
class Detector:
    """Which contacts are suspected, since when, and whether one may now be declared dead."""

    config: LivenessConfig = field(default_factory=LivenessConfig)
    clock: Callable[[], float] = time.monotonic
    health: LocalHealth = field(default_factory=LocalHealth)
    _suspects: dict[bytes, _Suspicion] = field(default_factory=dict)
    refuted: int = 0  # suspicions cleared because the suspect was heard from
    declared: int = 0  # contacts declared dead

    def failed(self, node_id: bytes) -> None:
        """A call to ``node_id`` went unanswered: suspect it (once; later failures only count)."""
        s = self._suspects.get(node_id)
        if s is None:
            self._suspects[node_id] = _Suspicion(self.clock())
        else:
            s.failed_calls += 1

    def heard(self, node_id: bytes) -> None:
        """Anything from ``node_id`` (or an ack relayed for it) refutes the suspicion."""
        if self._suspects.pop(node_id, None) is not None:
            self.refuted += 1

    def forget(self, node_id: bytes) -> None:
        self._suspects.pop(node_id, None)

    def is_suspect(self, node_id: bytes) -> bool:
        return node_id in self._suspects

    def suspects(self) -> list[bytes]:
        return list(self._suspects)

    def probe_failed(self, node_id: bytes) -> None:
        """A whole probe round (direct, then indirect) got no ack."""
        s = self._suspects.get(node_id)
        if s is None:
            s = self._suspects[node_id] = _Suspicion(self.clock(), failed_calls=0)
        s.failed_rounds += 1

    def deadline(self, node_id: bytes) -> float | None:
        """When the suspect may be declared dead, at today's local health."""
        s = self._suspects.get(node_id)
        if s is None:
            return None
        return s.since + self.config.suspicion_timeout * self.health.multiplier

    def dead(self, node_id: bytes) -> bool:
        """True once the suspect has been silent long enough, through enough probe rounds."""
        s = self._suspects.get(node_id)
        if s is None or s.failed_rounds < self.config.min_failed_rounds:
            return False
        deadline = self.deadline(node_id)
        return deadline is not None and self.clock() >= deadline

    def declare(self, node_id: bytes) -> None:
        self._suspects.pop(node_id, None)
        self.declared += 1

    def snapshot(self) -> dict[str, object]:
        now = self.clock()
        return {
            "suspects": {
                k.hex()[:8]: {"for_s": round(now - s.since, 1), "failed_rounds": s.failed_rounds}
                for k, s in self._suspects.items()
            },
            "health_score": self.health.score,
            "health_signals": dict(self.health.signals),
            "refuted": self.refuted,
            "declared_dead": self.declared,
        }


def socket_drops(inode: int) -> int | None:
    """Datagrams the kernel dropped for the UDP socket with this inode (receive buffer full),
    from ``/proc/net/udp`` and ``udp6``; None where that is not available (not Linux).

    Blocking file reads: call it through ``asyncio.to_thread``.
    """
    wanted = str(inode)
    for name in ("/proc/net/udp", "/proc/net/udp6"):
        with contextlib.suppress(OSError), open(name, encoding="ascii") as f:
            next(f, None)  # header
            for line in f:
                cols = line.split()
                # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref ptr drops
                if len(cols) >= 13 and cols[9] == wanted:
                    return int(cols[12])
    return None


def socket_inode(fd: int) -> int:
    return os.fstat(fd).st_ino
