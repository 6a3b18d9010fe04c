"""The peer's durable record of work: queued tasks and finished URLs.

The owner of a URL is the only place its duplicates are eliminated exactly: a task is new
when it is neither in the done record nor already queued. The engine's frontier is a
bounded window over the task store, refilled in store order through a cursor, so a huge
queue costs disk, not RAM.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from p2pcrawl.frontier import Task
from storage.done import DoneRecord
from storage.records import StoredTask
from storage.tasks import TaskStore

__all__ = ["Ledger"]


def to_stored(t: Task) -> StoredTask:
    return StoredTask(url=t.url, key=t.key, fp=t.fp, depth=t.depth, hops=t.hops)


def from_stored(s: StoredTask) -> Task:
    return Task(url=s.url, fp=s.fp, key=s.key, depth=s.depth, hops=s.hops)


class Ledger:
    def __init__(self, tasks: TaskStore, done: DoneRecord) -> None:
        self.tasks = tasks
        self.done = done
        self._cursor = 0
        self.queued = 0  # tasks in the store, in-flight ones included
        self.done_count = 0
        self._lock = asyncio.Lock()

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
        self.queued = await tasks.count()
        self.done_count = await done.count()
        return self

    async def aclose(self) -> None:
        try:
            await self.tasks.aclose()
        finally:
            await self.done.aclose()

    async def accept(self, tasks: Sequence[Task]) -> list[Task]:
        """Queue the tasks not seen before and return them. Durable on return."""
        if not tasks:
            return []
        maybe = self.done.maybe_contains
        probe = [t for t in tasks if maybe(t.fp)]
        done_fps: set[int] = set()
        if probe:
            flags = await self.done.contains([(t.key, t.fp) for t in probe])
            done_fps = {t.fp for t, f in zip(probe, flags, strict=True) if f}
        fresh = [t for t in tasks if t.fp not in done_fps]
        if not fresh:
            return []
        async with self._lock:
            added = await self.tasks.add([to_stored(t) for t in fresh])
            new_tasks = [t for t, a in zip(fresh, added, strict=True) if a]
            if new_tasks:
                # A task can finish between the done probe above and the insert: its row
                # was removed, so the insert succeeds. Probe again now that the row exists;
                # the lock keeps load() from handing it to the frontier meanwhile.
                again = await self.done.contains([(t.key, t.fp) for t in new_tasks])
                late = [t.fp for t, d in zip(new_tasks, again, strict=True) if d]
                if late:
                    await self.tasks.remove(late)
                    new_tasks = [t for t, d in zip(new_tasks, again, strict=True) if not d]
        self.queued += len(new_tasks)
        return new_tasks

    async def load(self, limit: int) -> list[Task]:
        """The next tasks in store order not yet handed to the frontier."""
        if limit <= 0:
            return []
        async with self._lock:
            rows = await self.tasks.page(self._cursor, limit)
        if rows:
            self._cursor = rows[-1][0]
        return [from_stored(s) for _, s in rows]

    def rewind(self) -> None:
        """Reload everything on the next load (after tasks were re-queued behind the cursor)."""
        self._cursor = 0

    async def finish(self, tasks: Sequence[Task]) -> None:
        if not tasks:
            return
        added = await self.done.add([(t.key, t.fp) for t in tasks])
        self.done_count += added
        removed = await self.tasks.remove([t.fp for t in tasks])
        self.queued -= removed

    async def drop_done(self, fps: Sequence[int]) -> int:
        """Remove queued tasks that turned out to be finished elsewhere."""
        removed = await self.tasks.remove(fps)
        self.queued -= removed
        return removed

    async def is_done(self, tasks: Sequence[Task]) -> list[bool]:
        return await self.done.contains([(t.key, t.fp) for t in tasks])

    async def take_keys(self, keys: Sequence[bytes]) -> list[Task]:
        taken = await self.tasks.take_keys(keys)
        self.queued -= len(taken)
        return [from_stored(s) for s in taken]
