"""Replication follows the replica set: every owned key's replicas kept up to date.

The owner remembers, per key, the replica set it last brought up to date (``ReplicaBook``).
Whenever membership changes, tasks of a key arrive by STORE_TASK, or a replica missed a
copy, the key is *dirty*; the follower (``Follower``) then sends each new replica of a dirty
key its queued tasks and its done fingerprints, off every handler's path. A key's first
copies put it in step at once, so a crawl of many new keys costs no second pass
(docs/membership.md, "Replication follows the replica set").
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from p2pcrawl.crawl import Ledger, Task
from p2pcrawl.network.ports import Ownership
from protocol import PeerRef, PeerTimeout, RemoteError

__all__ = ["KNOWN_MAX", "Follower", "ReplicaBook"]

log = logging.getLogger(__name__)

FOLLOW_PAGE = 2000  # tasks read from the store per round trip when a key is re-replicated
FOLLOW_KEYS = 64  # keys re-replicated at once: their copies share STORE_BACKUPs
MAX_HOLDERS = 8  # peers remembered per key as possibly holding copies
RETRY_S = 1.0  # wait before re-replicating keys a replica missed
# Keys remembered as seen this run (``ReplicaBook.fresh``). Past it, first copies no longer
# put keys in step (the follower sends them, as it did for every key): about 80 bytes each.
KNOWN_MAX = 200_000


class ReplicaBook:
    """Per owned key: the replica set it was last brought up to date with, and every peer
    it was copied to since (they may hold copies until told the work is done)."""

    def __init__(
        self, *, enroll_new: bool, gone: Callable[[bytes], bool] = lambda peer_id: False
    ) -> None:
        """``enroll_new``: this peer held no task and no done page when it started, so a
        key it has seen nothing of this run has nothing anywhere here (``fresh``);
        ``gone``: whether a peer left the table (``Roster.gone``)."""
        self._gone = gone
        self.synced: dict[bytes, frozenset[PeerRef]] = {}
        self.holders: dict[bytes, dict[PeerRef, None]] = defaultdict(dict)
        self.dirty: set[bytes] = set()
        # Bumped by every membership change: a copy that began under an older replica set
        # must not mark its key in step with it.
        self.epoch = 0
        # Keys this peer held no state for before this run (``fresh``) can be counted in
        # step once their first copies are held; with a ledger left from an earlier run, any
        # key may already hold tasks or done pages that only the follower knows to send.
        self._enroll_new = enroll_new
        self._known: set[bytes] = set()  # keys with tasks or done pages here, this run
        # Fresh keys whose first copies are under way: how many intakes wait on them.
        self._arriving: dict[bytes, int] = {}
        self.wake = asyncio.Event()
        self.enrolled_keys = 0  # keys in step from their first copies, no follower pass

    def fresh(self, tasks: Sequence[Task], exclude: Iterable[bytes]) -> set[bytes]:
        """Keys of ``tasks`` this peer holds nothing else of. Every task queued here is
        copied as it is queued (so it passes here first), a page is queued before it is
        done, and done pages of other owners' keys pass ``seen_done``: a key not yet
        known has no other task and no done page here. A key whose first copies are still
        under way (``arrived`` not yet called) is fresh too: its first tasks are not queued
        yet, and more of its tasks must not be queued before the replicas said what they
        know as done (pages finishing together share those first copies)."""
        if not self._enroll_new:
            return set()
        keys = {t.key for t in tasks}
        exclude = set(exclude)
        fresh = (keys - self._known - exclude) | (keys & self._arriving.keys() - exclude)
        self._known |= keys | exclude
        if len(self._known) > KNOWN_MAX:
            self._enroll_new, self._known = False, set()
            return set()
        fresh = {k for k in fresh if k not in self.synced}
        for key in fresh:
            self._arriving[key] = self._arriving.get(key, 0) + 1
        return fresh

    def arrived(self, keys: Iterable[bytes]) -> None:
        """The first copies of these ``fresh`` keys returned (held or not): their tasks
        are queued now, and the next ones are copied as they are queued."""
        for key in keys:
            left = self._arriving.pop(key, 0) - 1
            if left > 0:
                self._arriving[key] = left

    def seen_done(self, keys: Iterable[bytes]) -> None:
        """Done pages of these keys are recorded here (as a replica, or handed over)."""
        if self._enroll_new:
            self._known.update(keys)

    def enroll(self, key: bytes, replicas: frozenset[PeerRef]) -> None:
        """A key's first copies are held by every replica: it is in step with them."""
        if key not in self.synced:
            self.synced[key] = replicas
            self.enrolled_keys += 1

    def holder(self, key: bytes, rep: PeerRef) -> None:
        """``rep`` was sent copies of ``key``: tell it when pages finish. Asked after a copy
        was awaited too, so a peer forgotten meanwhile is not put back."""
        if self._gone(rep.id):
            return
        held = self.holders[key]
        held.pop(rep, None)
        held[rep] = None
        while len(held) > MAX_HOLDERS:
            del held[next(iter(held))]

    def missed(self, rep: PeerRef, keys: set[bytes]) -> None:
        """``rep`` did not take its copies of ``keys``: the follower sends them again."""
        for key in keys:
            synced = self.synced.get(key)
            if synced is not None:
                self.synced[key] = synced - {rep}
        self.mark(keys)

    def mark(self, keys: Iterable[bytes]) -> None:
        self.dirty.update(keys)
        self.wake.set()

    def note_keys(self, keys: Iterable[bytes]) -> None:
        """Keys whose tasks just arrived (routed or handed over): check their replicas soon."""
        new = [k for k in keys if k not in self.synced]
        if new:
            self.mark(new)

    def forget_peer(self, peer_id: bytes, reason: str = "") -> None:
        """A peer left the routing table. It is no longer told of finished pages: each
        DELETE_BACKUP to it would wait out a timeout, and the page's finish with it. If it
        comes back with copies, it re-routes them to their owner, whose done record drops
        them; and it no longer counts as holding any key, so if it comes back as a replica
        it is sent the keys again."""
        for key in list(self.holders):
            held = self.holders[key]
            for rep in [r for r in held if r.id == peer_id]:
                del held[rep]
            if not held:
                del self.holders[key]
        for key, reps in self.synced.items():
            if any(r.id == peer_id for r in reps):
                self.synced[key] = frozenset(r for r in reps if r.id != peer_id)

    def gone(self, peer_id: bytes) -> bool:
        return self._gone(peer_id)

    def membership_changed(self) -> None:
        self.epoch += 1
        self.mark(self.synced)


class Lanes(Protocol):
    """The owner's copies to its replicas (``replication.Replication``)."""

    def replicas_for(self, owner: bytes, key: bytes) -> list[PeerRef]: ...

    def store(
        self, rep: PeerRef, owner: bytes, ts: list[Task], done: dict[bytes, list[int]] | None
    ) -> Awaitable[list[int] | None]: ...


class Follower:
    def __init__(
        self, book: ReplicaBook, ledger: Ledger, ownership: Ownership, lanes: Lanes
    ) -> None:
        self.book = book
        self.ledger = ledger
        self.ownership = ownership
        self.lanes = lanes
        self.resynced_keys = 0

    async def run(self) -> None:
        """Owned by the peer: re-replicate dirty keys, off every RPC handler's path."""
        book = self.book
        while True:
            await book.wake.wait()
            await asyncio.sleep(0.2)  # a join brings several membership events at once
            book.wake.clear()
            try:
                await self.follow()
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.warning("replication pass failed: %s; retrying", exc)
                book.dirty.update(book.synced)
            if book.dirty:
                # A replica missed its copy (a timeout on a saturated link, say): try again
                # soon. Left for the next membership change instead, the key stayed "in
                # transit" for good and the network never counted itself finished.
                await asyncio.sleep(RETRY_S)
                book.wake.set()

    async def follow(self) -> int:
        """Bring the replicas of every dirty owned key up to date; returns keys re-copied."""
        book = self.book
        me = self.ownership.me
        keys, book.dirty = book.dirty, set()
        owned = await self.ledger.tasks.queued_keys(keys)
        todo: list[tuple[bytes, frozenset[PeerRef], frozenset[PeerRef]]] = []
        for key in keys:
            found = self.ownership.closest_local(key, 1)
            if key not in owned or not found or found[0].id != me.id:
                book.synced.pop(key, None)  # not ours (any more): its new owner follows it
                continue
            reps = frozenset(self.lanes.replicas_for(me.id, key))
            fresh = reps - book.synced.get(key, frozenset())
            if fresh:
                todo.append((key, reps, fresh))
            else:
                book.synced[key] = reps
        # Concurrently, so that the keys' copies to one replica share its STORE_BACKUPs.
        limit = asyncio.Semaphore(FOLLOW_KEYS)

        async def one(key: bytes, fresh: frozenset[PeerRef]) -> bool:
            async with limit:
                return await self._resync(key, fresh)

        epoch = book.epoch
        results = await asyncio.gather(*(one(k, f) for k, _, f in todo), return_exceptions=True)
        resynced = 0
        for (key, reps, _), ok in zip(todo, results, strict=True):
            if ok is True:
                book.synced[key] = frozenset(r for r in reps if not book.gone(r.id))
                resynced += 1
            if ok is not True or epoch != book.epoch:
                # A replica missed it, or the replica set changed while it was sent (one of
                # them left, a nearer one came): again on the next pass.
                book.dirty.add(key)
        self.resynced_keys += resynced
        for ok in results:
            if isinstance(ok, BaseException):
                raise ok
        return resynced

    async def _resync(self, key: bytes, reps: frozenset[PeerRef]) -> bool:
        """Send ``key``'s queued tasks and done fingerprints to replicas that lack them."""
        me = self.ownership.me.id
        done = await self.ledger.done.fps_for_keys([key])
        ok = True
        after = 0
        first = True
        while True:
            rows = await self.ledger.load_key(key, after, FOLLOW_PAGE)
            tasks = [t for _, t in rows]
            if not tasks and not first:
                return ok
            results = await asyncio.gather(
                *(self.lanes.store(r, me, tasks, done if first else None) for r in reps)
            )
            for rep in reps:
                self.book.holder(key, rep)
            ok = ok and all(taken is not None for taken in results)
            first = False
            if len(rows) < FOLLOW_PAGE:
                return ok
            after = rows[-1][0]
