"""After membership changes, every key and every backup goes where it belongs now.

"Distributed Crawler Based on the Improved Kademlia Protocol" (§2.4) re-publishes backups
against crashes; here a membership change (a member came or went, this node took ownership,
a handoff gave up) makes a pass due (``due``), which, debounced:

1. *takes over* from owners that are gone: first gives their keys' successors the done
   fingerprints this peer knows (as a replica, or as an earlier owner), then re-routes the
   backups it held for them, minus the ones it knows finished;
2. *rebalances*: hands every key it holds tasks of but no longer owns to its owner
   (``handoff.Handoff``), history included.

Apart from that, a periodic *republish* re-routes every backup whose owner is gone or no
longer closest, or of which this peer is no longer a replica (§2.4.3), and only those:
re-sending backups of healthy owners would flood a healthy network for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

from p2pcrawl.aio import every
from p2pcrawl.crawl import EventLog, Ledger, Task
from p2pcrawl.network.handoff import Handoff, History
from p2pcrawl.network.ports import Ownership
from protocol import MessageError, PeerRef, PeerTimeout, RemoteError, closest
from storage import BackupStore, StoredTask

__all__ = ["Rebalance", "unfinished"]

log = logging.getLogger(__name__)

# A join brings several membership events in a burst: one pass after them. A death does
# not wait for it: the dead owner's hosts stand still until the takeover (0.2 s a kill of
# the Crawl-delay host's owner, whose pace is the crawl's end, in ``benchmarks/churn.py``).
DEBOUNCE_S = 0.2
RETRY_S = 1.0  # a pass that failed is tried again after this


async def unfinished(ledger: Ledger, tasks: list[Task]) -> list[Task]:
    """Drop copies this peer knows to be finished (as a replica it records every done
    fingerprint it is told of; as an old owner it keeps its history): republishing them
    would make a new owner that lacks that history fetch them again."""
    if not tasks:
        return tasks
    done = await ledger.is_done(tasks)
    return [t for t, d in zip(tasks, done, strict=True) if not d]


def _task(s: StoredTask) -> Task:
    return Task(s.url, s.fp, s.key, s.depth, s.hops)


class Rebalance:
    def __init__(
        self,
        ledger: Ledger,
        backups: BackupStore,
        ownership: Ownership,
        handoff: Handoff,
        history: History,
        events: EventLog,
        *,
        peers: Callable[[], list[PeerRef]],
        in_table: Callable[[bytes], bool],
        route: Callable[[list[Task]], Awaitable[None]],
        active: Callable[[], bool],
        due: asyncio.Event,
        replicas: int,
        republish_interval: float,
    ) -> None:
        """``in_table``: whether a peer is in the routing table, young or established
        (``CrawlNode.in_table``); ``route``: tasks to their owners (``Dispatcher.route``);
        ``due``: set when a pass is due (membership changed)."""
        self.ledger = ledger
        self.backups = backups
        self.ownership = ownership
        self.handoff = handoff
        self.history = history
        self.events = events
        self._peers = peers
        self._in_table = in_table
        self._route = route
        self._active = active
        self.due = due
        self.replicas = replicas
        self.republish_interval = republish_interval
        self.gone_owners: set[bytes] = set()  # removed peers whose backups may need taking

    def owner_gone(self, peer_id: bytes, reason: str = "") -> None:
        self.gone_owners.add(peer_id)

    async def run(self) -> None:
        """Owned by the peer: a pass whenever one is due."""
        while True:
            await self.due.wait()
            if not self.gone_owners:
                await asyncio.sleep(DEBOUNCE_S)
            self.due.clear()
            if not self._active():
                continue
            try:
                await self.pass_once()
            except (PeerTimeout, RemoteError, OSError, MessageError) as exc:
                log.warning("rebalance pass failed: %s; retrying", exc)
                await asyncio.sleep(RETRY_S)
                self.due.set()

    async def pass_once(self) -> None:
        """Take over from owners that are gone, then hand on what we no longer own."""
        await self._takeover()
        await self._rebalance()

    async def _takeover(self) -> None:
        """Crash recovery: re-route the backups held for owners that are gone."""
        if not self.gone_owners:
            return
        live = {p.id for p in self._peers()}
        gone = [o for o in self.gone_owners if o not in live]
        self.gone_owners.clear()
        me = self.ownership.me.id
        ours: list[Task] = []
        theirs: list[Task] = []
        mine: dict[bytes, bool] = {}  # key -> whether it is ours now, asked once per key
        for owner in gone:
            taken = await self.backups.take_owner(owner)
            if not taken:
                continue
            tasks = await unfinished(self.ledger, [_task(s) for s in taken])
            self.events.add("takeover", owner=owner.hex()[:8], tasks=len(tasks))
            for t in tasks:
                if t.key not in mine:
                    mine[t.key] = self.ownership.closest_local(t.key, 1)[0].id == me
                (ours if mine[t.key] else theirs).append(t)
        # Keys we now own first: what we know of them is here already. The rest wait for
        # their successors to take the history (a successor that has not declared the death
        # yet refuses it), which held up our own share of the dead owner's hosts until the
        # slowest of them had declared it too.
        if ours:
            await self._route(ours)
        if gone:
            await self._hand_on_history(gone)
        if theirs:
            await self._route(theirs)

    async def _hand_on_history(self, gone: list[bytes]) -> None:
        """Give the successors of vanished owners the done fingerprints this peer knows for
        their keys (as a replica, or as an earlier owner), before a backup is re-routed to them.

        A successor that was not yet a replica when the pages were finished -- it joined
        after them, or the key changed hands since -- has no record of them, and would
        crawl the whole host again.
        """
        me = self.ownership.me.id
        candidates = [*(p.id for p in self._peers()), me, *gone]
        gone_set = set(gone)
        by_owner: dict[PeerRef, list[bytes]] = defaultdict(list)
        for key in await self.ledger.done.keys():
            if closest(key, candidates, 1)[0] not in gone_set:
                continue  # its owner did not change
            successor = self.ownership.closest_local(key, 1)[0]
            if successor.id != me:
                by_owner[successor].append(key)
        await asyncio.gather(*(self.history.hand_on(o, keys) for o, keys in by_owner.items()))

    async def _rebalance(self) -> None:
        """Hand every key this peer no longer owns to its owner, history included."""
        me = self.ownership.me.id
        async with self.handoff.lock:
            counts = await self.ledger.tasks.key_counts()
            moved: dict[PeerRef, list[bytes]] = defaultdict(list)
            for key in counts:
                found = self.ownership.closest_local(key, 1)
                if found and found[0].id != me:
                    moved[found[0]].append(key)
            for owner, keys in moved.items():
                sent = await self.handoff.hand_over(owner, keys)
                self.events.add("handoff", to=owner.id.hex()[:8], keys=len(keys), tasks=sent or 0)

    async def republish_loop(self) -> None:
        """Owned by the peer: the periodic republish of backups that need it."""
        await every(self.republish_interval, self._republish_pass)

    async def _republish_pass(self) -> None:
        if self._active():
            with contextlib.suppress(PeerTimeout, RemoteError, OSError):
                await self.republish()

    async def republish(self) -> int:
        """Re-route every backup whose owner is gone or no longer closest, or of which this
        peer is no longer a replica; returns how many."""
        me = self.ownership.me.id
        live = {p.id for p in self._peers()}
        after = 0
        resent = 0
        while True:
            rows = await self.backups.page(after, 1000)
            if not rows:
                return resent
            after = rows[-1][0]
            stale: dict[bytes, list[Task]] = defaultdict(list)
            for _, owner, s in rows:
                if owner not in live and self._in_table(owner):
                    continue  # too young to count as an owner here yet: alive, wait for it
                found = self.ownership.closest_local(s.key, 1)
                # Copies go to the nearest contacts, young ones included (``replication``).
                near = self.ownership.closest_contacts(s.key, 1 + self.replicas)
                reps = [p.id for p in near if p.id != owner][: self.replicas]
                healthy = owner in live and found and found[0].id == owner and me in reps
                if not healthy:
                    stale[owner].append(_task(s))
            for owner, tasks in stale.items():
                await self._route(await unfinished(self.ledger, tasks))
                await self.backups.remove(owner, [t.fp for t in tasks])
                resent += len(tasks)
