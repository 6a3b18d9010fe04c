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
* it stayed silent for a **suspicion timeout** (time, not a count of failures, so a burst of
  lost datagrams is one event, not three strikes), counted from when the first call it left
  unanswered was sent, and through at least ``min_failed_rounds`` probe rounds. The timeout
  follows memberlist: ``suspicion_timeout`` x max(1, log10 N) for a network of N peers
  (more peers, more chance that one of them is briefly slow), and Lifeguard's *dynamic
  suspicion* (§4.2): while no other peer confirms the silence it starts at
  ``max_timeout_mult`` times that and shrinks, logarithmically, with each helper that
  could not reach the suspect either;
* each of those rounds probed it directly and then **indirectly** through ``k`` other peers
  (SWIM §3.2, PING-REQ): a peer that others can reach is alive, whatever we hear;
* the timeout is multiplied by ``1 + local health score`` (Lifeguard §4): the score rises
  while *this* peer shows signs of overload -- its event loop stalled, its UDP socket dropped
  datagrams (``/proc/net/udp``), it was flooded with junk, or helpers did not even answer its
  indirect probes -- and falls again after clean rounds. A flooded peer thus stops blaming
  others for the replies it could not read. Helpers that have already *declared* the
  suspect dead are not stretched by our health: our doubt is about our own view, and theirs
  was formed under their own health (``_Suspicion.gone``).

``Detector`` and ``LocalHealth`` are pure (a clock is injected); ``looplag.LoopLagMonitor`` and
``socket_drops`` measure this process; the probing itself is ``upkeep.probe_suspects``.
"""

from __future__ import annotations

import contextlib
import math
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
    """The detector's rules. The defaults follow memberlist's (HashiCorp's implementation of
    SWIM and Lifeguard) scaled to a 1 s probe interval: a suspect that stays silent is
    declared dead after ``suspicion_timeout`` x max(1, log10 N) seconds once independent
    probes confirm it, and up to ``max_timeout_mult`` times that while nobody does."""

    # The shortest suspicion, for a network of up to 10 peers (memberlist: SuspicionMult 4 x
    # a 1 s interval, with a 0.5 s probe timeout; our calls wait 2 s, so 3 s of silence
    # counted from the unanswered call take about as long).
    suspicion_timeout: float = 3.0
    min_failed_rounds: int = 1  # whole probe rounds (direct, then indirect) that failed
    indirect_probes: int = 3
    # How long an unanswered call waited (the RPC timeout): the silence began when it left.
    call_timeout: float = 2.0
    # Lifeguard's dynamic suspicion: with no independent confirmation a suspect waits this
    # many times the shortest suspicion; each confirmation shortens it, logarithmically,
    # down to the shortest at ``confirmations`` (memberlist: SuspicionMaxTimeoutMult 6 and
    # SuspicionMult - 2 confirmations).
    max_timeout_mult: float = 6.0
    confirmations: int = 2


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
        nacks: int = 0,
        heard: int = 0,
    ) -> None:
        """Fold one probe round's observations in: each bad sign adds one, a clean round
        in which some member was heard from takes one away. ``heard``: members heard from
        within the round, so not pinged in it; a busy network's members talk all the time,
        and a score that fell only with answered pings stayed up while only a dead peer was
        quiet enough to ping (a flooded peer next to a killed owner declared it 16 s after
        the kill, 15 s after its flood ended; the others, in 3.4 s)."""
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
        if probes_failed >= 2 and probes_ok == 0 and nacks == 0:
            # Everyone we asked at once was silent, helpers included: more likely us than all
            # of them. A helper's nack is an answer (memberlist raises its awareness only for
            # nacks that do not come): when half a network stops, the live half hears its
            # own helpers say they cannot reach the others either, and must not blame itself
            # for it, or its timeouts stretch ninefold and the dead half is never declared.
            self.worse("all_probes_failed")
            bad = True
        if not bad and (probes_ok > 0 or heard > 0):
            self.better()


@dataclass(slots=True)
class _Suspicion:
    since: float  # when the silence began: the first unanswered call left, or last heard
    failed_rounds: int = 0
    failed_calls: int = 1
    confirmed: int = 0  # most helpers in one round that could not reach it either
    # Most helpers in one round that had declared it dead themselves. Enough of them end
    # the stretch our own poor health puts on the timeout: a flooded successor otherwise
    # left a dead owner's hosts standing 8-15 s after every other peer had declared it.
    gone: int = 0


HEARD_MAX = 4096  # contacts whose last message we remember (a routing table holds fewer)
# How long a verdict is remembered, to tell helpers' PING-REQs that the target was declared
# dead here (not merely unknown): past the slowest detection a flooded peer reaches.
DECLARED_MEMORY_S = 60.0
DECLARED_MAX = 1024


@dataclass(slots=True)
class Detector:
    """Which contacts are suspected, since when, and whether one may now be declared dead.

    A suspect is declared dead once it has been silent, counted from the first call it left
    unanswered, for ``timeout`` seconds (``timeout()``: the shortest suspicion scaled by
    log10 of the network's size, stretched while no other peer confirms the silence and
    while this peer is itself unhealthy), through ``min_failed_rounds`` whole probe rounds.
    """

    config: LivenessConfig = field(default_factory=LivenessConfig)
    clock: Callable[[], float] = time.monotonic
    health: LocalHealth = field(default_factory=LocalHealth)
    # The network's size as the node knows it (None: the contacts heard from, plus us).
    network_size: Callable[[], int] | None = None
    _suspects: dict[bytes, _Suspicion] = field(default_factory=dict)
    _heard: dict[bytes, float] = field(default_factory=dict)  # last message, oldest first
    _declared: dict[bytes, float] = field(default_factory=dict)  # verdicts, oldest first
    refuted: int = 0  # suspicions cleared because the suspect was heard from
    declared: int = 0  # contacts declared dead
    # Of those, declared sooner than our poor health allowed, because helpers had already.
    declared_as_others_did: int = 0

    def failed(self, node_id: bytes, waited: float | None = None) -> None:
        """A call to ``node_id`` went unanswered: suspect it (once; later failures only count).

        The silence is counted from when that call left (``waited`` seconds ago; by default
        ``call_timeout``), or from the last message heard from it if that came later: a
        peer that died while we were waiting on it has been silent since, not since our
        timer ran out."""
        s = self._suspects.get(node_id)
        if s is None:
            now = self.clock()
            last = self._heard.get(node_id, -math.inf)
            wait = self.config.call_timeout if waited is None else waited
            since = min(now, max(last, now - wait))
            self._suspects[node_id] = _Suspicion(since)
        else:
            s.failed_calls += 1

    def heard(self, node_id: bytes) -> None:
        """Anything from ``node_id`` (or an ack relayed for it) refutes the suspicion."""
        heard = self._heard
        heard.pop(node_id, None)
        heard[node_id] = self.clock()
        if len(heard) > HEARD_MAX:
            del heard[next(iter(heard))]
        self._declared.pop(node_id, None)
        if self._suspects.pop(node_id, None) is not None:
            self.refuted += 1

    def forget(self, node_id: bytes) -> None:
        self._suspects.pop(node_id, None)
        self._heard.pop(node_id, None)

    def is_suspect(self, node_id: bytes) -> bool:
        return node_id in self._suspects

    def suspects(self) -> list[bytes]:
        return list(self._suspects)

    def silences(self) -> dict[bytes, float]:
        """Each suspect, and how long it has been silent (seconds)."""
        now = self.clock()
        return {i: now - s.since for i, s in self._suspects.items()}

    def size(self) -> int:
        """The network's size: as the node says, or the contacts heard from plus us."""
        if self.network_size is not None:
            return max(1, self.network_size())
        return len(self._heard) + 1

    def probe_failed(self, node_id: bytes, confirmations: int | None = None, gone: int = 0) -> None:
        """A whole probe round (direct, then indirect) got no ack. ``confirmations``: how
        many helpers answered that they could not reach it either (independent suspicions,
        Lifeguard §4.2); None where the caller does not tell them apart from silent helpers,
        taken as every helper the round could ask (a silent helper also raises our local
        health score, which stretches the timeout by more than it saves). ``gone``: of
        those, how many had declared it dead already."""
        s = self._suspects.get(node_id)
        if s is None:
            s = self._suspects[node_id] = _Suspicion(self.clock(), failed_calls=0)
        s.failed_rounds += 1
        if confirmations is None:
            confirmations = min(self.config.indirect_probes, max(0, self.size() - 2))
        s.confirmed = max(s.confirmed, confirmations)
        s.gone = max(s.gone, gone)

    def timeout(self, node_id: bytes) -> float | None:
        """Seconds of silence after which the suspect may be declared dead, at today's local
        health: memberlist's ``suspicionTimeout`` and Lifeguard's dynamic suspicion."""
        s = self._suspects.get(node_id)
        if s is None:
            return None
        cfg = self.config
        n = self.size()
        shortest = cfg.suspicion_timeout * max(1.0, math.log10(max(1, n)))
        longest = shortest * max(1.0, cfg.max_timeout_mult)
        # Confirmations that could come: none in a network too small to have helpers.
        k = cfg.confirmations if n - 2 >= cfg.confirmations else 0
        if k <= 0 or s.confirmed >= k:
            base = shortest
        else:
            frac = math.log(s.confirmed + 1) / math.log(k + 1)
            base = max(shortest, longest - (longest - shortest) * frac)
        if self._judged(s, n):
            return shortest  # the network has judged it; our health says nothing of that
        return base * self.health.multiplier

    def _judged(self, s: _Suspicion, n: int) -> bool:
        """Enough helpers had declared the suspect dead themselves: 2, or every helper a
        network of ``n`` peers has if fewer."""
        return s.gone >= max(1, min(self.config.confirmations, n - 2))

    def deadline(self, node_id: bytes) -> float | None:
        """When the suspect may be declared dead, at today's local health."""
        s = self._suspects.get(node_id)
        timeout = self.timeout(node_id)
        if s is None or timeout is None:
            return None
        return s.since + timeout

    def dead(self, node_id: bytes) -> bool:
        """True once the suspect has been silent long enough, through enough probe rounds."""
        s = self._suspects.get(node_id)
        if s is None or s.failed_rounds < self.config.min_failed_rounds:
            return False
        deadline = self.deadline(node_id)
        return deadline is not None and self.clock() >= deadline

    def declare(self, node_id: bytes) -> None:
        s = self._suspects.pop(node_id, None)
        self._heard.pop(node_id, None)
        self.declared += 1
        if s is not None and self.health.score and self._judged(s, self.size()):
            self.declared_as_others_did += 1
        declared = self._declared
        declared.pop(node_id, None)
        declared[node_id] = self.clock()
        if len(declared) > DECLARED_MAX:
            del declared[next(iter(declared))]

    def declared_lately(self, node_id: bytes) -> bool:
        """Whether we declared ``node_id`` dead within ``DECLARED_MEMORY_S`` and have not
        heard from it since."""
        at = self._declared.get(node_id)
        return at is not None and self.clock() - at < DECLARED_MEMORY_S

    def snapshot(self) -> dict[str, object]:
        now = self.clock()
        return {
            "suspects": {
                k.hex()[:8]: {
                    "for_s": round(now - s.since, 1),
                    "failed_rounds": s.failed_rounds,
                    "confirmed": s.confirmed,
                    "gone": s.gone,
                    "timeout_s": round(self.timeout(k) or 0.0, 1),
                }
                for k, s in self._suspects.items()
            },
            "network_size": self.size(),
            "health_score": self.health.score,
            "health_signals": dict(self.health.signals),
            "refuted": self.refuted,
            "declared_dead": self.declared,
            "declared_as_others_did": self.declared_as_others_did,
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
