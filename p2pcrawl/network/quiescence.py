"""A network that knows it is done: each peer works out ``state: "finished"`` for itself.

Idle queues alone are not "finished": right after a crash every live peer can show an empty
queue while the replicas still hold the dead owner's work. A peer calls itself *quiet* when

* nothing is queued (or it reached a page, disk or network limit and fetches no more), in
  flight or in transit (dispatch, deletes, replica copies),
* it holds no backup of an owner that is not in its routing table (``backups_orphaned``),
* it suspects nobody and is not re-syncing after a stall,
* it declared no peer dead in the last ``hold`` seconds (``--partition-hold``, the merge
  bound): a half cut off by a partition looks dead, and a half must not be reported
  finished while the other may still come back with work of its own; a peer that says
  GOODBYE holds nothing back, and one that comes back frees the hold at once,
* and none of that, nor its progress counters or its membership, changed for ``settle``
  seconds;

and *finished* when it is quiet and every peer it knows answered QUIET ("are you quiet?") with
yes, at least one of them (or itself) having finished some work. A peer that cannot be asked
is a suspect, so it blocks the state until the failure detector has decided about it.

A quiet peer asks again at growing intervals (up to ``POLL_MAX_S``) while nothing changes:
asking every peer every tick cost N(N-1) QUIETs per tick, an idle 8-peer network's main
traffic. It asks at once when its own state changes, and when the last of the peers that
answered "not quiet" asks *it*: only a quiet peer asks, so that peer just became quiet, and the
last one to do so makes everyone ask again within a tick. Asking again after each of them (as
it once did) cost a round from every quiet peer each time one more went quiet.

QUIET is served through the node's crawl RPC table (``CrawlNode.serve``); it carries no
arguments and answers whether this peer is quiet and how many pages it has done
(``answer``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from p2pcrawl.aio import every
from p2pcrawl.crawl import CrawlStats, EventLog, Task
from protocol import NoArgs, PeerRef, PeerTimeout, QuietReply, RemoteError

__all__ = ["Quiescence", "Work"]

log = logging.getLogger(__name__)

TICK_S = 0.5
POLL_MAX_S = 5.0  # the longest wait between two rounds of QUIET while nothing changes
MAX_LOST = 1024  # peers declared dead remembered for the hold (the oldest go first)

# A peer's answer to QUIET: whether it is quiet, and how many pages it has done.
QuietAnswer = tuple[bool, int]


class Work(Protocol):
    """What our crawler has to do and has done (``crawl.Engine``)."""

    @property
    def tasks_queued(self) -> int: ...

    @property
    def in_flight(self) -> Mapping[int, Task]: ...

    @property
    def stats(self) -> CrawlStats: ...

    @property
    def exhausted(self) -> bool:
        """A limit (--max-pages, --max-disk, --max-network-pages) stopped its fetching."""
        ...


class Members(Protocol):
    def peers(self) -> list[PeerRef]: ...

    def suspects(self) -> list[bytes]: ...


class Quiescence:
    def __init__(
        self,
        work: Work,
        members: Members,
        events: EventLog,
        *,
        me: bytes,
        done_count: Callable[[], int],
        in_transit: Callable[[], int],
        backup_owners: Callable[[], Awaitable[dict[bytes, int]]],
        steady: Callable[[], bool],
        ask: Callable[[PeerRef], Awaitable[QuietAnswer]],
        settle: float,
        hold: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``done_count``: pages done here; ``in_transit``: URLs and news waiting in our RPC
        lanes; ``backup_owners``: backups held here by owner; ``steady``: the peer is active
        and not re-syncing after a stall; ``ask``: QUIET to a peer; ``settle``: how long
        nothing may change before this peer calls itself quiet; ``hold``: how long a
        peer declared dead keeps this one from being quiet (``lost``)."""
        self.work = work
        self.members = members
        self.events = events
        self.me = me
        self._done_count = done_count
        self._in_transit = in_transit
        self._backup_owners = backup_owners
        self._steady = steady
        self._ask = ask
        self.settle = settle
        self.hold = hold
        self._clock = clock
        self._lost: dict[bytes, float] = {}  # peers declared dead: when, newest last
        self.finished = asyncio.Event()
        self.orphaned = 0  # backups held for owners not in the routing table
        self.held = 0
        self._quiet_since: float | None = None
        self._last: tuple[object, ...] | None = None
        # Some peer had finished work when we last heard: a peer that did none itself and
        # finds itself alone (the others left once they saw the network finished) may
        # still call the network finished.
        self._work_seen = False
        self._next_poll = 0.0
        self._poll_gap = TICK_S
        self._waiting: set[bytes] = set()  # peers whose last answer was not "quiet"

    def answer(self, sender: bytes) -> QuietAnswer:
        """QUIET from ``sender``: whether we are quiet, and how many pages we have done."""
        if sender in self._waiting:
            self._waiting.discard(sender)
            if not self._waiting:  # the last one we waited for: everyone may be quiet now
                self._next_poll = 0.0
        return self.quiet(), self._done_count()

    async def serve(self, sender: PeerRef, args: NoArgs) -> QuietReply:
        """QUIET as this peer serves it (``answer``)."""
        return QuietReply(*self.answer(sender.id))

    def lost(self, peer_id: bytes, reason: str) -> None:
        """``Roster.on_departure``: a peer declared dead (not one that said GOODBYE, nor
        one replaced in its bucket) holds the finish back for ``hold`` seconds."""
        if reason != "unresponsive" or self.hold <= 0:
            return
        self._lost.pop(peer_id, None)
        self._lost[peer_id] = self._clock()
        while len(self._lost) > MAX_LOST:
            del self._lost[next(iter(self._lost))]

    def holding(self) -> float:
        """Seconds the finish is still held back by a peer declared dead (0: none)."""
        if not self._lost:
            return 0.0
        now, members = self._clock(), {x.id for x in self.members.peers()}
        for peer_id, at in list(self._lost.items()):
            if now - at >= self.hold or peer_id in members:  # taken for a crash, or back
                del self._lost[peer_id]
        return max((self.hold - (now - at) for at in self._lost.values()), default=0.0)

    def quiet(self) -> bool:
        since = self._quiet_since
        return since is not None and self._clock() - since >= self.settle

    def _local_idle(self) -> tuple[bool, tuple[object, ...]]:
        if not self._steady():
            return False, ()
        work, members = self.work, self.members
        idle = (
            # A peer at a limit (--max-pages, --max-disk, --max-network-pages) fetches no
            # more: what it has queued waits for a later run, and counts as done here.
            (work.tasks_queued == 0 or work.exhausted)
            and not work.in_flight
            and self._in_transit() == 0
            and self.orphaned == 0
            and not members.suspects()
            and not self.holding()
        )
        stats = work.stats
        marks = (
            self._done_count(),
            stats.pages_fetched,
            stats.urls_discovered,
            self.held,
            frozenset(x.id for x in members.peers()),
        )
        return idle, marks

    async def _count_orphans(self) -> None:
        live = {x.id for x in self.members.peers()} | {self.me}
        owners = await self._backup_owners()
        self.held = sum(owners.values())
        self.orphaned = sum(n for owner, n in owners.items() if owner not in live)

    async def run(self) -> None:
        """Owned by the peer: re-evaluate every ``TICK_S`` seconds."""
        await every(TICK_S, self.tick)

    async def tick(self) -> None:
        await self._count_orphans()
        idle, marks = self._local_idle()
        now = self._clock()
        if not idle or marks != self._last:
            self._quiet_since = now if idle else None
            self._last = marks
            self.finished.clear()
            self._next_poll, self._poll_gap = 0.0, TICK_S
            return
        if self._quiet_since is None:
            self._quiet_since = now
        if not self.quiet() or now < self._next_poll:
            return
        self._next_poll = now + self._poll_gap
        self._poll_gap = min(2 * self._poll_gap, POLL_MAX_S)
        if await self._network_quiet():
            if not self.finished.is_set():
                log.info("the network is finished: every peer is quiet")
                self.events.add("finished")
            self.finished.set()
        else:
            self.finished.clear()

    async def _network_quiet(self) -> bool:
        others = self.members.peers()

        async def ask(other: PeerRef) -> QuietAnswer | None:
            try:
                return await self._ask(other)
            except (PeerTimeout, RemoteError, OSError):
                return None

        answers = await asyncio.gather(*(ask(o) for o in others))
        work = self._done_count() + sum(a[1] for a in answers if a)
        self._work_seen = self._work_seen or work > 0
        self._waiting = {
            o.id for o, a in zip(others, answers, strict=True) if a is None or a[0] is not True
        }
        if self._waiting:
            return False
        return self._work_seen
