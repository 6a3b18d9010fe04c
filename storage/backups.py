"""The backup queue: copies of tasks held for a nearby owner (STORE_BACKUP).

The "backup queue" of "Distributed Crawler Based on the Improved Kademlia Protocol", §2.2.1.

A peer keeps these so that its neighbour's queue survives the neighbour crashing: it
re-publishes them periodically with STORE_TASK (paced through :meth:`BackupStore.page`),
drops them on DELETE_BACKUP, and hands a departing or replaced owner's share on with
:meth:`BackupStore.take_owner`. ``(owner, fp)`` is unique: a re-sent backup is stored once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence

from storage.db import CountedStore
from storage.records import StoredTask, from_sql_fp, to_sql_fp

__all__ = ["BackupStore"]

APPLICATION_ID = 0x70324231  # "p2B1": marks the file as a backup store

_SCHEMA = (
    # AUTOINCREMENT so a republish cursor never meets a reused rowid behind it.
    """CREATE TABLE IF NOT EXISTS backups(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        owner BLOB NOT NULL,
        fp INTEGER NOT NULL,
        key BLOB NOT NULL,
        url TEXT NOT NULL,
        depth INTEGER NOT NULL,
        hops INTEGER NOT NULL,
        UNIQUE(owner, fp)
    )""",
    "CREATE INDEX IF NOT EXISTS backups_by_owner_key ON backups(owner, key)",
)

_COLUMNS = "id, owner, url, key, fp, depth, hops"
_Row = tuple[int, bytes, str, bytes, int, int, int]


def _task(row: _Row) -> StoredTask:
    _, _, url, key, fp, depth, hops = row
    return StoredTask(url=url, key=key, fp=from_sql_fp(fp), depth=depth, hops=hops)


class BackupStore(CountedStore):
    """Durable backup copies keyed by (owner node ID, fingerprint)."""

    SCHEMA = _SCHEMA
    APPLICATION_ID = APPLICATION_ID
    TABLE = "backups"

    def _changed(self, delta: int) -> None:
        self._count += delta

    async def add(self, owner: bytes, tasks: Sequence[StoredTask]) -> int:
        """Store copies for ``owner``; returns how many were new. Durable on return."""
        if not tasks:
            return 0
        rows = [(owner, t.url, t.key, to_sql_fp(t.fp), t.depth, t.hops) for t in tasks]

        def job(conn: sqlite3.Connection) -> int:
            insert = (
                "INSERT OR IGNORE INTO backups(owner, url, key, fp, depth, hops)"
                " VALUES (?,?,?,?,?,?)"
            )
            return sum(conn.execute(insert, row).rowcount for row in rows)

        return await self._worker.run(job, on_commit=self._changed)

    async def remove(self, owner: bytes, fps: Sequence[int]) -> int:
        """Drop ``owner``'s copies of these fingerprints (DELETE_BACKUP); returns rows gone."""
        if not fps:
            return 0
        params = [(owner, to_sql_fp(fp)) for fp in fps]

        def job(conn: sqlite3.Connection) -> int:
            sql = "DELETE FROM backups WHERE owner = ? AND fp = ?"
            return conn.executemany(sql, params).rowcount

        return await self._worker.run(job, on_commit=self._removed)

    def _removed(self, n: int) -> None:
        self._count -= n

    async def remove_returning(self, owner: bytes, fps: Sequence[int]) -> list[StoredTask]:
        """Like :meth:`remove`, but returns the copies removed (in store order), so that the
        caller can record what the owner finished."""
        if not fps:
            return []
        params = [(owner, to_sql_fp(fp)) for fp in dict.fromkeys(fps)]

        def job(conn: sqlite3.Connection) -> list[StoredTask]:
            rows: list[_Row] = []
            for param in params:
                rows += conn.execute(
                    f"SELECT {_COLUMNS} FROM backups WHERE owner = ? AND fp = ?", param
                ).fetchall()
            conn.executemany("DELETE FROM backups WHERE owner = ? AND fp = ?", params)
            rows.sort()
            return [_task(row) for row in rows]

        return await self._worker.run(job, on_commit=self._taken)

    async def take_owner(
        self, owner: bytes, keys: Collection[bytes] | None = None
    ) -> list[StoredTask]:
        """Remove and return ``owner``'s copies: all of them, or only those host keys."""
        wanted = None if keys is None else list(dict.fromkeys(keys))

        def job(conn: sqlite3.Connection) -> list[StoredTask]:
            rows: list[_Row] = []
            if wanted is None:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM backups WHERE owner = ?", (owner,)
                ).fetchall()
                conn.execute("DELETE FROM backups WHERE owner = ?", (owner,))
            else:
                for key in wanted:
                    rows += conn.execute(
                        f"SELECT {_COLUMNS} FROM backups WHERE owner = ? AND key = ?",
                        (owner, key),
                    ).fetchall()
                    conn.execute("DELETE FROM backups WHERE owner = ? AND key = ?", (owner, key))
            rows.sort()
            return [_task(row) for row in rows]

        return await self._worker.run(job, on_commit=self._taken)

    def _taken(self, tasks: list[StoredTask]) -> None:
        self._count -= len(tasks)

    async def owner_counts(self) -> dict[bytes, int]:
        def job(conn: sqlite3.Connection) -> dict[bytes, int]:
            rows = conn.execute("SELECT owner, count(*) FROM backups GROUP BY owner").fetchall()
            return {bytes(owner): n for owner, n in rows}

        return await self._worker.run(job, write=False)

    async def page(self, after_rowid: int, limit: int) -> list[tuple[int, bytes, StoredTask]]:
        """Up to ``limit`` (rowid, owner, task) with rowid > after_rowid, in rowid order: the
        periodic republish walks the whole store a page at a time."""
        if limit <= 0:
            return []

        def job(conn: sqlite3.Connection) -> list[tuple[int, bytes, StoredTask]]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM backups WHERE id > ? ORDER BY id LIMIT ?",
                (after_rowid, limit),
            ).fetchall()
            return [(row[0], bytes(row[1]), _task(row)) for row in rows]

        return await self._worker.run(job, write=False)

    async def count(self) -> int:
        """Backups held; answered from a counter kept at commit time, no disk read."""
        return self._count
