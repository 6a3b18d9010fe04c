"""A network that knows it is done: each peer works out ``state: "finished"`` for itself.

Idle queues alone are not "finished": right after a crash every live peer can show an empty
queue while the replicas still hold the dead owner's work. A peer calls itself *quiet* when

* nothing is queued (or it reached a page, disk or network limit and fetches no more), in
  flight or in transit (dispatch, deletes, replica copies),
* it holds no backup of an owner that is not in its routing table (``backups_orphaned``),
* it suspects nobody and is not re-syncing after a stall,
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

QUIET is served through the node's crawl RPC table (``CrawlProtocol.serve``); it carries no
arguments and answers ``{"quiet": bool, "done": int}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from protocol import PeerRef, PeerTimeout, RemoteError

if TYPE_CHECKING:
    from p2pcrawl.network.peer import Peer

__all__ = ["Quiescence"]

log = logging.getLogger(__name__)

TICK_S = 0.5
POLL_MAX_S = 5.0  # the longest wait between two rounds of QUIET while nothing changes


class Quiescence:
    def __init__(self, peer: Peer, settle: float) -> None:
        self.peer = peer
        self.settle = settle
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

    async def serve_quiet(self, sender: PeerRef, args: list[Any]) -> dict[str, Any]:
        if sender.id in self._waiting:
            self._waiting.discard(sender.id)
            if not self._waiting:  # the last one we waited for: everyone may be quiet now
                self._next_poll = 0.0
        led = self.peer.ledger
        return {"quiet": self.quiet(), "done": led.done_count if led else 0}

    def quiet(self) -> bool:
        since = self._quiet_since
        return since is not None and time.monotonic() - since >= self.settle

    def _local_idle(self) -> tuple[bool, tuple[object, ...]]:
        p = self.peer
        eng, node, disp, rep, led = p.engine, p.node, p.dispatcher, p.replication, p.ledger
        if not (eng and node and disp and rep and led and node.protocol) or p.state != "active":
            return False, ()
        suspects = node.protocol.liveness.suspects()
        idle = (
            # A peer at a limit (--max-pages, --max-disk, --max-network-pages) fetches no
            # more: what it has queued waits for a later run, and counts as done here.
            (eng.tasks_queued == 0 or eng.exhausted)
            and not eng.in_flight
            and disp.pending == 0
            and rep.pending == 0
            and self.orphaned == 0
            and not suspects
            and not p.membership.resyncing
        )
        stats = eng.stats
        marks = (
            led.done_count,
            stats.pages_fetched,
            stats.urls_discovered,
            self.held,
            frozenset(x.id for x in node.peers()),
        )
        return idle, marks

    async def _count_orphans(self) -> None:
        p = self.peer
        if p.backups is None or p.node is None:
            return
        live = {x.id for x in p.node.peers()} | {p.node_id}
        owners = await p.backups.owner_counts()
        self.held = sum(owners.values())
        self.orphaned = sum(n for owner, n in owners.items() if owner not in live)

    async def run(self) -> None:
        """Owned by the peer: re-evaluate every ``TICK_S`` seconds."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.tick()
            except Exception:
                log.exception("quiescence check failed")

    async def tick(self) -> None:
        await self._count_orphans()
        idle, marks = self._local_idle()
        now = time.monotonic()
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
                self.peer.events.add("finished")
            self.finished.set()
        else:
            self.finished.clear()

    async def _network_quiet(self) -> bool:
        p = self.peer
        node, led = p.node, p.ledger
        assert node is not None and node.protocol is not None and led is not None
        proto = node.protocol
        others = node.peers()

        async def ask(other: PeerRef) -> dict[str, Any] | None:
            with contextlib.suppress(PeerTimeout, RemoteError, OSError):
                return await proto.request(other, "quiet", [])
            return None

        answers = await asyncio.gather(*(ask(o) for o in others))
        work = led.done_count + sum(int(a.get("done") or 0) for a in answers if a)
        self._work_seen = self._work_seen or work > 0
        self._waiting = {
            o.id
            for o, a in zip(others, answers, strict=True)
            if a is None or a.get("quiet") is not True
        }
        if self._waiting:
            return False
        return self._work_seen
