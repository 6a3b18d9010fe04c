"""Backups on the replicas, kept in step with the replica set; the done range with them.

The Kademlia crawler's improved protocol copies each task to the owner's r nearest
neighbours (STORE_BACKUP) and drops the copies once the page is done (DELETE_BACKUP). Beyond
the paper, this module keeps the invariant of docs/membership.md:

* a queued task is durable on its owner and on the owner's r nearest live peers: the owner
  copies each task new to it (``store_backups``, ``copy_new`` for tasks that came by
  STORE_TASK, whose handler waits for the copies at most ``copy_wait_s``, well inside its
  caller's deadline, so a dead replica cannot make a live owner look dead); it *follows* its
  replica set (``follower``): whenever the r nearest peers of a key change (join, leave,
  crash, takeover, a handoff arriving), or a replica missed a copy, the ones lacking the key
  receive its queued tasks and its done fingerprints;
* a finished task is known as done by every peer that could republish it: the current
  replicas hear it in the same spaced STORE_BACKUP lane as the copies (its done fingerprints),
  every other peer this owner copied the key to since it last changed by DELETE_BACKUP; a
  replica records the fingerprints as done whether or not it held a copy (``handlers``). The
  peer that takes a host over after a crash is one of those replicas, so it dedups every
  republished copy of finished work.

The owner copies, not the discoverer: one lane per replica carries the copies of every
discoverer's tasks and the pages finished, spaced ``COPY_SPACING_S``, and only what is new to
the owner travels (docs/membership.md, "Who writes the replicas").
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p2pcrawl.aio import Coalescer
from p2pcrawl.crawl import PIPELINE_PAGES, Ledger, Task, to_stored
from p2pcrawl.network.answers import past_suspects
from p2pcrawl.network.follower import ReplicaBook
from p2pcrawl.network.ports import Ownership, to_batches
from protocol import Held, KeyBatch, PeerRef, PeerTimeout, RemoteError, TaskSet
from storage import BackupStore

__all__ = ["Replication"]

log = logging.getLogger(__name__)

# Copies of this peer's own keys (and the news of pages finished) go to a replica at most
# this often: a peer finishes a page every 30-60 ms at its cap, and each page's new links
# used to cost one STORE_BACKUP per replica on their own.
COPY_SPACING_S = 0.2
# While this peer has a backlog, its lanes to the replicas flush at most this often: what
# they carry then is mostly the news of pages finished (a page's tail waits for it, well
# inside its share of the fetch slots), and at 0.2 s that news cost 0.35 STORE_BACKUPs per
# page at 8 peers (cluster benchmark). What a remote caller waits for (a STORE_TASK
# handler's copies, the news of pages a borrower reported) still leaves within
# COPY_SPACING_S of the lane's last flush, sharing it as before: sent at once, each cost a
# STORE_BACKUP of its own, and at 4 peers they were 0.49 a page.
PATIENT_COPY_SPACING_S = 0.5
# A lane flushes as soon as this many keys' news waits in it, whatever its spacing. A page
# holds its place in the pipeline (``crawl.Pipeline``, a crash's window) until its news is
# out, so at full speed the spacing would set the pages per second, not the RPCs per page;
# a third of the pipeline leaves the rest of it fetching and parsing meanwhile.
FLUSH_AT_ITEMS = PIPELINE_PAGES // 3
# The same for telling earlier holders (no longer replicas) that pages are finished (a
# page's tail does not wait for them: ``finished``).
DELETE_SPACING_S = 0.2
# A STORE_TASK handler waits at most this share of the RPC timeout for its copies: the
# caller's deadline must measure the owner, not a replica behind it.
COPY_WAIT_SHARE = 0.25

StoreBackup = Callable[[PeerRef, bytes, Sequence[KeyBatch]], Awaitable[Held]]
# Which done fingerprints (by key) said by a peer to take now: ``Claims.taken`` (what it
# holds for a check is recorded as a done range handed over, if it passes).
Believe = Callable[[PeerRef, Mapping[bytes, list[int]]], dict[bytes, list[int]]]
# What a replica did with a copy: ``None`` if it did not take it, else the fingerprints of
# its tasks it knows as done already (a replica records every finished page of the keys
# it replicates, whoever owned them then).
Taken = list[int] | None
Learned = Callable[[list[Task]], Awaitable[None]]
DeleteBackup = Callable[[PeerRef, bytes, Mapping[bytes, Sequence[int]]], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class _KeyCopy:
    """One key's share of a STORE_BACKUP: tasks to hold, fingerprints already done."""

    key: bytes
    tasks: list[Task]
    done: list[int]


class Replication:
    def __init__(
        self,
        ownership: Ownership,
        book: ReplicaBook,
        ledger: Ledger,
        backups: BackupStore,
        *,
        store_backup: StoreBackup,
        delete_backup: DeleteBackup,
        replicas: int,
        rpc_timeout: float,
        patient: Callable[[], bool] = lambda: False,
        believe: Believe = lambda sender, done: dict(done),
        suspect: Callable[[bytes], bool] = lambda peer_id: False,
    ) -> None:
        """``store_backup``, ``delete_backup``: the RPCs (``CrawlNode``); ``replicas``: r;
        ``patient``: whether the news of finished pages may wait longer now; ``believe``:
        which of a replica's "known as done" to take (``Claims.taken``: in an open network a
        replica's answer is a claim like any other); ``suspect``: whether the failure
        detector suspects a peer now (``_answers``). A peer the book counts as gone
        (``ReplicaBook.gone``) is sent nothing more."""
        self.ownership = ownership
        self.book = book
        self.ledger = ledger
        self.backups = backups
        self._suspect = suspect
        self._store_backup = store_backup
        self._believe = believe
        self._delete_backup = delete_backup
        self.replicas = replicas
        self._deletes: Coalescer[PeerRef, tuple[bytes, int], None] = Coalescer(
            self._send_deletes, spacing=DELETE_SPACING_S, max_items=2000, name="delete-backup"
        )
        # Copies of our own keys, one lane per replica: (key, tasks, done fingerprints) each.
        self._patient = patient
        self._copies: Coalescer[PeerRef, _KeyCopy, Taken] = Coalescer(
            self._send_copies,
            spacing=COPY_SPACING_S,
            spacing_of=self._copy_spacing,
            max_items=FLUSH_AT_ITEMS,
            name="store-backup",
        )
        self.copy_wait_s = COPY_WAIT_SHARE * rpc_timeout
        # A STORE_TASK handler's copies go on after it stopped waiting, as does what waits
        # for their answers (``copy_new``).
        self._late = TaskSet("late-copies")
        self.late_copies = 0  # STORE_TASK handlers that answered before their copies were held
        self.suspects_passed = 0  # waits that went on without a suspected replica's answer
        self.missed_copies = 0  # STORE_BACKUPs a replica did not take: its keys are re-sent

    @property
    def pending(self) -> int:
        return self._deletes.pending + self._copies.pending + len(self.book.dirty)

    async def aclose(self) -> None:
        # Shutting down: what was not sent stays on the replicas until a takeover dedups it,
        # and what was not copied is still queued here (its intake never returned).
        await self._late.aclose()
        await self._deletes.aclose(timeout=0.0)
        await self._copies.aclose(timeout=0.0)

    def hurry(self) -> None:
        """Every lane to a replica waiting out its spacing sends now."""
        self._copies.kick()

    def _copy_spacing(self, rep: PeerRef) -> float:
        return PATIENT_COPY_SPACING_S if self._patient() else COPY_SPACING_S

    @staticmethod
    def _within(hurry: bool) -> float | None:
        return COPY_SPACING_S if hurry else None

    # -- copies ------------------------------------------------------------------------------

    def replicas_for(self, owner: bytes, key: bytes) -> list[PeerRef]:
        """The r contacts nearest ``key`` after ``owner``, young ones included, as this peer
        sees the network: a young ID may not own keys yet, but it holds copies from the
        moment it is in the table (docs/membership.md, "No window without redundancy")."""
        found = self.ownership.closest_contacts(key, self.replicas + 1)
        return [p for p in found if p.id != owner][: self.replicas]

    async def copy_for(
        self,
        owner: PeerRef,
        tasks: Sequence[Task],
        done: dict[bytes, list[int]] | None = None,
        *,
        enroll: Iterable[bytes] = (),
        hurry: bool = False,
    ) -> list[Task]:
        """Copy ``tasks`` (and the ``done`` range of their keys) to ``owner``'s replicas,
        this peer included if it is one. Best effort: a replica that misses its copy is
        filled by the owner's ``follow``. Keys in ``enroll`` (our own, with nothing of theirs
        held before these tasks) count as in step with their replicas once all copies are
        held. Returns the tasks some replica knows as done already."""
        book, me = self.book, self.ownership.me.id
        by_rep: dict[PeerRef, list[Task]] = defaultdict(list)
        keys = {t.key for t in tasks} | set(done or {})
        dones: dict[PeerRef, dict[bytes, list[int]]] = defaultdict(dict)
        reps_of: dict[bytes, frozenset[PeerRef]] = {}
        for key in keys:
            reps = self.replicas_for(owner.id, key)
            reps_of[key] = frozenset(reps)
            for rep in reps:
                by_rep[rep].extend(t for t in tasks if t.key == key)
                if done and done.get(key):
                    dones[rep][key] = done[key]
                if owner.id == me:
                    book.holder(key, rep)
        epoch = book.epoch
        sent = list(by_rep)
        results = await self._answers(
            {r: self.store(r, owner.id, ts, dones.get(r), hurry) for r, ts in by_rep.items()},
            lambda taken: taken is not None,
        )
        known = {fp for taken in results if taken for fp in taken}
        finished = [t for t in tasks if t.fp in known]
        if epoch != book.epoch:
            # The replica sets changed meanwhile: these went to the old ones.
            book.mark(enroll)
            return finished
        failed = {r for r, taken in zip(sent, results, strict=True) if taken is None}
        for key in enroll:
            held = reps_of.get(key)
            if held is not None and not held & failed:
                book.enroll(key, held)
        return finished

    def fresh(self, tasks: Sequence[Task], exclude: Iterable[bytes] = ()) -> set[bytes]:
        """Keys of ``tasks`` this peer holds nothing of (no task, no done page), those in
        ``exclude`` (a done range comes with them) apart: ``ReplicaBook.fresh``."""
        return self.book.fresh(tasks, exclude)

    def arrived(self, keys: Iterable[bytes]) -> None:
        """``ReplicaBook.arrived``."""
        self.book.arrived(keys)

    async def store_backups(
        self, tasks: Sequence[Task], *, fresh: Iterable[bytes] = (), hurry: bool = False
    ) -> list[Task]:
        """Copies of tasks this peer owns and just queued; returns those a replica knows as
        done already. Keys in ``fresh`` (``fresh``) are in step once every copy is held.
        ``hurry``: someone waits for them, and a patient lane's spacing does not hold
        them."""
        return await self.copy_for(self.ownership.me, tasks, enroll=fresh, hurry=hurry)

    async def copy_new(
        self, tasks: Sequence[Task], *, fresh: Iterable[bytes] = (), late: Learned | None = None
    ) -> list[Task] | None:
        """Copies of tasks that came by STORE_TASK, inside its handler: waited for at most
        ``copy_wait_s``; returns those a replica knows as done, or None if the wait ran
        out. A later copy still goes (the lane's flush is not the handler's), and ``late``
        hears what the replicas knew then (nothing, if it failed: the follower gets its
        keys)."""
        task = self._late.spawn(self.store_backups(tasks, fresh=fresh, hurry=True), "copy-new")
        if task is None:
            return None
        try:
            async with asyncio.timeout(self.copy_wait_s):
                known: list[Task] = await asyncio.shield(task)
                return known
        except TimeoutError:
            self.late_copies += 1
            if late is not None:
                self._late.spawn(self._answered_late(task, late), "copy-late")
            return None

    @staticmethod
    async def _answered_late(copy: asyncio.Task[list[Task]], late: Learned) -> None:
        try:
            known = await copy
        except Exception:  # its replica missed it: the follower's
            known = []
        await late(known)

    async def store(
        self,
        rep: PeerRef,
        owner: bytes,
        ts: list[Task],
        done: dict[bytes, list[int]] | None,
        hurry: bool = False,
    ) -> Taken:
        """Copies of ``owner``'s tasks (and done range) to ``rep``: None if it did not take
        them, else the fingerprints of those it knows as done. Our own go in ``rep``'s
        spaced lane, a handoff's for another owner at once."""
        me = self.ownership.me.id
        if rep.id == me:
            if done:
                await self.record_done(owner, done)
            return (await self.hold(owner, ts)).done
        if owner == me:
            by_key: dict[bytes, list[Task]] = {k: [] for k in done or {}}
            for t in ts:
                by_key.setdefault(t.key, []).append(t)
            items = [_KeyCopy(k, kts, (done or {}).get(k, [])) for k, kts in by_key.items()]
            taken = await self._copies.submit(rep, items, within=self._within(hurry))
            if any(t is None for t in taken):
                return None
            return [fp for t in taken if t for fp in t]
        if self.book.gone(rep.id):
            return None
        try:
            return (await self._store_backup(rep, owner, to_batches(ts, done))).done
        except (PeerTimeout, RemoteError, OSError) as exc:
            log.info("STORE_BACKUP to %s failed: %s", rep, exc)
            return None

    async def _send_copies(self, rep: PeerRef, items: list[_KeyCopy]) -> list[Taken]:
        if self.book.gone(rep.id):
            # Left the table (dead, gone) since these were queued: not waited on; the
            # follower gives its keys to the replicas there are now.
            self.missed_copies += 1
            self.book.missed(rep, {it.key for it in items})
            return [None] * len(items)
        tasks = [t for it in items for t in it.tasks]
        done: dict[bytes, list[int]] = defaultdict(list)
        for it in items:
            done[it.key].extend(it.done)
        try:
            held = await self._store_backup(rep, self.ownership.me.id, to_batches(tasks, done))
        except (PeerTimeout, RemoteError, OSError) as exc:
            log.info("STORE_BACKUP to %s failed: %s", rep, exc)
            # Its submitters may have stopped waiting (``copy_new``): the follower makes
            # good what this replica lacks, tasks and done fingerprints alike.
            self.missed_copies += 1
            self.book.missed(rep, {it.key for it in items})
            return [None] * len(items)
        known = set(held.done)
        if not known:
            return [[] for _ in items]
        claimed: dict[bytes, list[int]] = defaultdict(list)
        for it in items:
            claimed[it.key].extend(t.fp for t in it.tasks if t.fp in known)
        believed = self._believe(rep, claimed)
        return [
            [t.fp for t in it.tasks if t.fp in known] if it.key in believed else [] for it in items
        ]

    def note_keys(self, keys: Iterable[bytes]) -> None:
        """Keys whose tasks just arrived (routed or handed over): check their replicas soon."""
        self.book.note_keys(keys)

    async def hold(self, owner: bytes, tasks: Sequence[Task]) -> Held:
        """Keep copies of ``owner``'s tasks here, except finished ones; returns how many,
        and the fingerprints of the finished ones (an owner new to the key learns them).

        A copy can arrive after the news that its page is done (a handoff's sender writes
        the new owner's replicas in parallel with the new owner). Done fingerprints are
        recorded *before* copies are dropped, so probing again after the insert closes the
        race: either the drop comes after our insert, or our second probe sees the
        fingerprint.
        """
        if not tasks:
            return Held(0)
        finished = await self.ledger.is_done(tasks)
        keep = [t for t, d in zip(tasks, finished, strict=True) if not d]
        done = [t.fp for t, d in zip(tasks, finished, strict=True) if d]
        if not keep:
            return Held(0, done)
        added = await self.backups.add(owner, [to_stored(t) for t in keep])
        late = [t.fp for t, d in zip(keep, await self.ledger.is_done(keep), strict=True) if d]
        if late:
            added -= await self.backups.remove(owner, late)
        return Held(max(0, added), done + late)

    # -- finished work ----------------------------------------------------------------------

    async def finished(self, tasks: list[Task], *, hurry: bool = False) -> None:
        """Tell every peer that may hold a copy that ``tasks`` are finished; wait for the
        current replicas (earlier holders are told without waiting, below).

        Waiting keeps a crash from leaving a replica with a copy of a finished page and no
        record that it is finished: it would fetch it again. ``hurry``: a remote caller waits
        for it (a borrower, for our answer to its report), and a patient lane's spacing does
        not hold it.
        """
        me = self.ownership.me.id
        holders = self.book.holders
        # The current replicas hear it in their copy lane (done fingerprints of a
        # STORE_BACKUP): that lane flushes to them anyway, and one RPC carries both.
        to_reps: dict[PeerRef, dict[bytes, list[int]]] = defaultdict(lambda: defaultdict(list))
        by_rep: dict[PeerRef, list[tuple[bytes, int]]] = defaultdict(list)
        for t in tasks:
            reps = self.replicas_for(me, t.key)
            for rep in reps:
                if rep.id != me:
                    to_reps[rep][t.key].append(t.fp)
            for rep in holders.get(t.key, {}):
                if rep.id != me and rep not in reps:
                    by_rep[rep].append((t.key, t.fp))
        waits = {
            r: self._copies.submit(
                r, [_KeyCopy(k, [], fps) for k, fps in done.items()], within=self._within(hurry)
            )
            for r, done in to_reps.items()
        }
        # Earlier holders are told, not waited for: a page's tail held its ticket until the
        # slowest of them answered, and a holder displaced by a young joiner set the owner's
        # pace at one lane spacing per pipeline (24 pages in 0.2 s: 120 a second where it
        # crawled 320). Their copies cost no duplicate: republished, they reach the key's
        # owner or its successor, a current replica, which heard of the page in the awaited
        # lane above; one that becomes a replica again is sent the done range by the
        # follower, since it is not in step with the key.
        for r, f in by_rep.items():
            self._deletes.post(r, f)
        if waits:
            await self._answers(waits, lambda taken: taken is not None and None not in taken)

    async def _answers(
        self, calls: dict[PeerRef, Coroutine[Any, Any, Any]], held: Callable[[Any], bool]
    ) -> list[Any]:
        """``answers.past_suspects``; the calls not waited for go on, owned by ``_late``."""
        results, passed = await past_suspects(
            calls, held, lambda rep: self._suspect(rep.id), self._late
        )
        self.suspects_passed += passed
        return results

    async def record_done(self, owner: bytes, done: dict[bytes, list[int]]) -> int:
        """``owner`` finished these (DELETE_BACKUP): drop our copies and remember every
        fingerprint under its key, copy or not, so whoever takes the host over does not
        fetch it again. Returns how many copies went."""
        pairs = [(k, fp) for k, fps in done.items() for fp in fps]
        self.book.seen_done(done)
        await self.ledger.done.add(pairs)
        return await self.backups.remove(owner, [fp for _, fp in pairs])

    async def finished_for(self, owner: bytes, key: bytes, fps: list[int]) -> None:
        """Pages of ``owner``'s that this peer crawled on loan and ``owner`` does not answer
        for: its replicas record them as done now, so that if it is dead, its successor (one
        of them) does not crawl them again from its copies (docs/membership.md, "Lending")."""
        me = self.ownership.me.id

        async def one(rep: PeerRef) -> None:
            if rep.id == me:
                await self.record_done(owner, {key: fps})
                return
            try:
                await self._delete_backup(rep, owner, {key: fps})
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.info("DELETE_BACKUP for %s to %s failed: %s", owner.hex()[:8], rep, exc)

        await asyncio.gather(*(one(r) for r in self.replicas_for(owner, key)))

    async def _send_deletes(self, rep: PeerRef, pairs: list[tuple[bytes, int]]) -> list[None]:
        if self.book.gone(rep.id):
            return [None] * len(pairs)  # left the table: a copy it kept is re-routed, deduped
        done: dict[bytes, list[int]] = defaultdict(list)
        for key, fp in pairs:
            done[key].append(fp)
        try:
            await self._delete_backup(rep, self.ownership.me.id, done)
        except (PeerTimeout, RemoteError, OSError) as exc:
            # The copies stay; the replica's republish pass re-routes them to the owner,
            # which dedups them against its done record.
            log.info("DELETE_BACKUP to %s failed: %s", rep, exc)
        return [None] * len(pairs)
