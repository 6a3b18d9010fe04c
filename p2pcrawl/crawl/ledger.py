"""The peer's durable record of work: queued tasks and finished URLs.

The owner of a URL is the only place its duplicates are eliminated exactly: a task is new
when it is neither in the done record nor already queued. The engine's frontier is a
bounded window over the task store, refilled in store order through a cursor, so a huge
queue costs disk, not RAM.

Concurrent ``accept`` and ``finish`` calls are group-committed (:class:`p2pcrawl.aio.Coalescer`):
twenty workers finishing pages at once cost one done-record job and one task-store job, not
forty, and each caller still returns only once its own rows are committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from p2pcrawl.aio import Coalescer
from p2pcrawl.crawl.frontier import Task
from storage import DoneRecord, StoredTask, TaskStore, VisitStore

__all__ = ["Ledger"]

# How long the first of a group of callers waits for others to join its store round trip.
# A page takes tens of milliseconds end to end, so 2 ms is small next to it, and at a few
# hundred pages a second it gathers most concurrent finishes into one flush.
GROUP_WINDOW_S = 0.002
_NONE: Mapping[int, bytes] = {}


def to_stored(t: Task) -> StoredTask:
    return StoredTask(url=t.url, key=t.key, fp=t.fp, depth=t.depth, hops=t.hops)


def from_stored(s: StoredTask) -> Task:
    return Task(url=s.url, fp=s.fp, key=s.key, depth=s.depth, hops=s.hops)


class Ledger:
    def __init__(
        self, tasks: TaskStore, done: DoneRecord, *, group_window: float = GROUP_WINDOW_S
    ) -> None:
        self.tasks = tasks
        self.done = done
        # Continuous mode's visit history (storage/visits.py), once ``open_visits`` made it.
        self.visits: VisitStore | None = None
        self.directory: Path | None = None  # where ``open`` found the stores
        self._cursor = 0
        # Rows may exist past the cursor. The engine asks for more after every page; when
        # nothing was queued since the last load reached the end, there is nothing to read
        # and the answer costs no trip to the store's thread.
        self._behind = True
        self.queued = 0  # tasks in the store, in-flight ones included
        # Tasks that left the queue finished: fetched here, reported by a borrower, or found
        # done when done history arrived (a borrower's pages on a lapsed lease). Counted as
        # their rows go, so a page counts once whichever path records it first; the network
        # view sums it over peers. (At start: the done record's size, replicas' news included.)
        self.done_count = 0
        self._lock = asyncio.Lock()
        # One lane each (key None); flushes of a lane never overlap, which _accept's two
        # halves around the lock rely on.
        self._accepts: Coalescer[None, Task, bool] = Coalescer(
            self._accept, window=group_window, name="ledger-accept"
        )
        self._finishes: Coalescer[None, tuple[Task, bytes | None], None] = Coalescer(
            self._finish, window=group_window, name="ledger-finish"
        )

    @classmethod
    async def open(cls, directory: Path, *, expected_done: int = 1_000_000) -> Ledger:
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        tasks = await TaskStore.open(directory / "tasks.sqlite3")
        try:
            done = await DoneRecord.open(directory / "done.sqlite3", expected=expected_done)
        except BaseException:
            await tasks.aclose()
            raise
        self = cls(tasks, done)
        self.directory = directory
        self.queued = await tasks.count()
        self.done_count = await done.count()
        return self

    async def open_visits(self) -> VisitStore:
        """The visit history next to the other stores (continuous mode), opened once."""
        if self.visits is None:
            if self.directory is None:
                raise RuntimeError("continuous mode needs a ledger opened from a directory")
            self.visits = await VisitStore.open(self.directory / "visits.sqlite3")
        return self.visits

    async def aclose(self) -> None:
        try:
            # Callers already waiting get their flush; only then do the stores close.
            await self._accepts.aclose()
            await self._finishes.aclose()
        finally:
            try:
                await self.tasks.aclose()
            finally:
                try:
                    await self.done.aclose()
                finally:
                    if self.visits is not None:
                        await self.visits.aclose()

    async def accept(self, tasks: Sequence[Task]) -> list[Task]:
        """Queue the tasks not seen before and return them. Durable on return."""
        if not tasks:
            return []
        for t in tasks:
            # Validate here so a bad task fails its own caller, not a whole group's flush.
            to_stored(t)
        flags = await self._accepts.submit(None, tasks)
        return [t for t, new in zip(tasks, flags, strict=True) if new]

    async def _accept(self, _: None, tasks: list[Task]) -> list[bool]:
        """One flush of ``accept``: a flag per task, True if it was newly queued. A task
        also earlier in the same flush counts once (the store ignores the repeat)."""
        maybe = self.done.maybe_contains
        probe = [t for t in tasks if maybe(t.fp)]
        done_fps: set[int] = set()
        if probe:
            flags = await self.done.contains([(t.key, t.fp) for t in probe])
            done_fps = {t.fp for t, f in zip(probe, flags, strict=True) if f}
        fresh = [i for i, t in enumerate(tasks) if t.fp not in done_fps]
        flags = [False] * len(tasks)
        if not fresh:
            return flags
        async with self._lock:
            added = await self.tasks.add([to_stored(tasks[i]) for i in fresh])
            new = [i for i, a in zip(fresh, added, strict=True) if a]
            if new:
                # A task can finish between the done probe above and the insert: its row
                # was removed, so the insert succeeds. Probe again now that the row exists;
                # the lock keeps load() from handing it to the frontier meanwhile.
                again = await self.done.contains([(tasks[i].key, tasks[i].fp) for i in new])
                late = [tasks[i].fp for i, d in zip(new, again, strict=True) if d]
                if late:
                    await self.tasks.remove(late)
                    new = [i for i, d in zip(new, again, strict=True) if not d]
                if new:
                    self._behind = True  # under the lock, so load() cannot miss them
        self.queued += len(new)
        for i in new:
            flags[i] = True
        return flags

    async def load(self, limit: int) -> list[tuple[int, Task]]:
        """The next (seq, task) pairs in store order not yet handed to the frontier."""
        if limit <= 0:
            return []
        async with self._lock:
            if not self._behind:
                return []
            rows = await self.tasks.page(self._cursor, limit)
            if len(rows) < limit:
                self._behind = False
        if rows:
            self._cursor = rows[-1][0]
        return [(seq, from_stored(s)) for seq, s in rows]

    @property
    def cursor(self) -> int:
        """The store order ``load`` has reached: every task up to this seq was handed out."""
        return self._cursor

    async def load_key(self, key: bytes, after_seq: int, limit: int) -> list[tuple[int, Task]]:
        """Up to ``limit`` (seq, task) pairs of one host key after ``after_seq``, in order."""
        if limit <= 0:
            return []
        async with self._lock:  # as in load(): never a task whose late done probe is pending
            rows = await self.tasks.page_key(key, after_seq, limit)
        return [(seq, from_stored(s)) for seq, s in rows]

    async def finish(self, tasks: Sequence[Task], digests: Mapping[int, bytes] = _NONE) -> None:
        """Record the tasks as done, then drop them from the queue. Durable on return.
        ``digests``: of the pages fetched here, by fingerprint (``storage.DoneRecord``'s
        proofs; ``b""``: finished here without a page)."""
        if not tasks:
            return
        await self._finishes.submit(None, [(t, digests.get(t.fp)) for t in tasks])

    async def _finish(self, _: None, items: list[tuple[Task, bytes | None]]) -> list[None]:
        tasks = [t for t, _ in items]
        proofs = [(t.key, t.fp, t.url, d) for t, d in items if d is not None]
        # Done first: a task is never in neither store, so accept() cannot take it as new.
        await self.done.add([(t.key, t.fp) for t in tasks], proofs)
        removed = await self.tasks.remove([t.fp for t in tasks])
        self.queued -= removed
        self.done_count += removed
        return [None] * len(tasks)

    async def drop_done(self, fps: Sequence[int]) -> int:
        """Remove queued tasks that turned out to be finished elsewhere (their fingerprints
        are in the done record already); they count as done here."""
        removed = await self.drop(fps)
        self.done_count += removed
        return removed

    async def drop(self, fps: Sequence[int]) -> int:
        """Remove queued tasks that will not be fetched, without counting them as done."""
        removed = await self.tasks.remove(fps)
        self.queued -= removed
        return removed

    async def forget_done(self, tasks: Sequence[Task]) -> int:
        """Let done tasks be crawled again (``--recrawl``); returns how many were done."""
        gone = await self.done.forget([(t.key, t.fp) for t in tasks])
        self.done_count -= gone
        if self.visits is not None:
            # Fetched again in full, as asked; its history starts over.
            await self.visits.remove([(t.key, t.fp) for t in tasks])
        return gone

    async def is_done(self, tasks: Sequence[Task]) -> list[bool]:
        return await self.done.contains([(t.key, t.fp) for t in tasks])

    async def take_keys(self, keys: Sequence[bytes]) -> list[Task]:
        taken = await self.tasks.take_keys(keys)
        self.queued -= len(taken)
        return [from_stored(s) for s in taken]
