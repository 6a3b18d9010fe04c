"""The task queue: the URLs this peer owns and must crawl (the "task queue" of
"Distributed Crawler Based on the Improved Kademlia Protocol", §2.2.1).

FIFO per insertion, deduplicated by fingerprint, grouped by host key so that a whole host's
queue can move to a new owner on join or leave. ``seq`` is an AUTOINCREMENT rowid on
purpose: a plain INTEGER PRIMARY KEY reuses the highest number after that row is deleted,
and the engine pages with ``seq > cursor``, so a reused number would hide a new task behind
the engine's cursor.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable, Sequence

from storage.db import CountedStore
from storage.records import StoredTask, from_sql_fp, to_sql_fp

__all__ = ["TaskStore"]

APPLICATION_ID = 0x70325431  # "p2T1": marks the file as a task store

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS tasks(
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        fp INTEGER NOT NULL UNIQUE,
        key BLOB NOT NULL,
        url TEXT NOT NULL,
        depth INTEGER NOT NULL,
        hops INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS tasks_by_key ON tasks(key)",
)

_COLUMNS = "seq, url, key, fp, depth, hops"
_Row = tuple[int, str, bytes, int, int, int]


def _task(row: _Row) -> StoredTask:
    _, url, key, fp, depth, hops = row
    return StoredTask(url=url, key=key, fp=from_sql_fp(fp), depth=depth, hops=hops)


class TaskStore(CountedStore):
    """Durable FIFO of :class:`StoredTask`, one SQLite file owned by one worker thread."""

    SCHEMA = _SCHEMA
    APPLICATION_ID = APPLICATION_ID
    TABLE = "tasks"

    async def add(self, tasks: Sequence[StoredTask]) -> list[bool]:
        """Queue the tasks; True for each one newly queued, False for a fingerprint already
        queued (also earlier in the same batch). Durable on return."""
        if not tasks:
            return []
        rows = [(t.url, t.key, to_sql_fp(t.fp), t.depth, t.hops) for t in tasks]

        def job(conn: sqlite3.Connection) -> list[bool]:
            insert = "INSERT OR IGNORE INTO tasks(url, key, fp, depth, hops) VALUES (?,?,?,?,?)"
            return [conn.execute(insert, row).rowcount == 1 for row in rows]

        return await self._worker.run(job, on_commit=self._counted)

    def _counted(self, added: list[bool]) -> None:
        self._count += sum(added)

    async def page(self, after_seq: int, limit: int) -> list[tuple[int, StoredTask]]:
        """Up to ``limit`` (seq, task) pairs with seq > after_seq, in insertion order."""
        if limit <= 0:
            return []

        def job(conn: sqlite3.Connection) -> list[tuple[int, StoredTask]]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM tasks WHERE seq > ? ORDER BY seq LIMIT ?",
                (after_seq, limit),
            ).fetchall()
            return [(row[0], _task(row)) for row in rows]

        return await self._worker.run(job, write=False)

    async def page_key(
        self, key: bytes, after_seq: int, limit: int
    ) -> list[tuple[int, StoredTask]]:
        """Like :meth:`page`, for one host key (by its index, so a long queue of other keys
        costs nothing)."""
        if limit <= 0:
            return []

        def job(conn: sqlite3.Connection) -> list[tuple[int, StoredTask]]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM tasks WHERE key = ? AND seq > ? ORDER BY seq LIMIT ?",
                (key, after_seq, limit),
            ).fetchall()
            return [(row[0], _task(row)) for row in rows]

        return await self._worker.run(job, write=False)

    async def remove(self, fps: Sequence[int]) -> int:
        """Drop tasks that are done or handed off; returns how many rows went."""
        if not fps:
            return 0
        params = [(to_sql_fp(fp),) for fp in fps]

        def job(conn: sqlite3.Connection) -> int:
            return conn.executemany("DELETE FROM tasks WHERE fp = ?", params).rowcount

        return await self._worker.run(job, on_commit=self._removed)

    def _removed(self, n: int) -> None:
        self._count -= n

    async def take_keys(self, keys: Collection[bytes]) -> list[StoredTask]:
        """Remove and return every task of those host keys, in queue order (handoff)."""
        if not keys:
            return []
        wanted = list(dict.fromkeys(keys))

        def job(conn: sqlite3.Connection) -> list[StoredTask]:
            rows: list[_Row] = []
            for key in wanted:
                rows += conn.execute(
                    f"SELECT {_COLUMNS} FROM tasks WHERE key = ?", (key,)
                ).fetchall()
                conn.execute("DELETE FROM tasks WHERE key = ?", (key,))
            rows.sort()
            return [_task(row) for row in rows]

        return await self._worker.run(job, on_commit=self._taken)

    def _taken(self, tasks: list[StoredTask]) -> None:
        self._count -= len(tasks)

    async def key_counts(self) -> dict[bytes, int]:
        """Host key -> number of queued tasks."""

        def job(conn: sqlite3.Connection) -> dict[bytes, int]:
            rows = conn.execute("SELECT key, count(*) FROM tasks GROUP BY key").fetchall()
            return {bytes(key): n for key, n in rows}

        return await self._worker.run(job, write=False)

    async def queued_keys(self, keys: Iterable[bytes]) -> set[bytes]:
        """The host keys among ``keys`` with a task queued: one index probe per key, where
        :meth:`key_counts` reads the whole table."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return set()

        def job(conn: sqlite3.Connection) -> set[bytes]:
            probe = "SELECT 1 FROM tasks WHERE key = ? LIMIT 1"
            return {k for k in wanted if conn.execute(probe, (k,)).fetchone()}

        return await self._worker.run(job, write=False)

    async def count(self) -> int:
        """Queued tasks; answered from a counter kept at commit time, no disk read."""
        return self._count
