"""The done record: exact fingerprints of finished URLs, behind an in-RAM DSBF.

"Distributed Crawler Based on the Improved Kademlia Protocol" (§2.2.1) keeps a "hash table of
finished URLs" for dedup; "Efficient URL Caching for World Wide Web Crawling" (Mercator)
shows why it belongs on disk with a small fast structure in front (most probes are for URLs
never seen, and those should cost no disk read); "Research on Detecting Duplicated URL in
Dual-Structural Network" (§3) gives that structure: a dynamic splittable Bloom filter.
So the exact set lives in SQLite, grouped by host key (a host's history moves to its new
owner with :meth:`DoneRecord.fps_for_keys`), and the filter answers "certainly not done"
from RAM.

Disk layout: ``done(key_id, fp)`` is a WITHOUT ROWID table whose primary key *is* the row,
so each URL costs one B-tree entry of about 16 bytes (a small host id, an 8-byte fp, record
and cell headers) and no second index; the 20-byte host key is stored once in ``hosts``.

The filter is rebuilt from disk on open (streamed in the worker thread) rather than saved:
a saved filter could disagree with the table after a crash, and a rebuild cannot. When a
DSBF leaf splits, this class finishes the split from the exact fingerprints on disk, in
background steps between client batches (see :mod:`storage.bloom`).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path

from storage.bloom import Rehash, SplittableBloom
from storage.db import BackgroundStep, SqliteWorker, WorkerStore
from storage.hostkeys import HOSTS_TABLE, check_key, host_id
from storage.records import from_sql_fp, to_sql_fp

__all__ = ["PROOF_DIGEST_BYTES", "DoneRecord", "Proof"]

# (host key, fingerprint, URL, digest) of a page fetched here.
Proof = tuple[bytes, int, str, bytes]

APPLICATION_ID = 0x70324431  # "p2D1": marks the file as a done record

_SCHEMA = (
    HOSTS_TABLE,
    """CREATE TABLE IF NOT EXISTS done(
        key_id INTEGER NOT NULL,
        fp INTEGER NOT NULL,
        PRIMARY KEY(key_id, fp)
    ) WITHOUT ROWID""",
    # What a page fetched here was, for a peer that checks this one's word that it is done
    # (docs/security.md, "Forged work claims"): its URL and 8 bytes of its body's digest
    # (empty: finished without a page). Pages recorded done on another peer's word have
    # none. A side table, so the rebuild and rehash scans of ``done`` stay as small as
    # they were, and a data directory from before gains it empty when opened.
    """CREATE TABLE IF NOT EXISTS proofs(
        key_id INTEGER NOT NULL,
        fp INTEGER NOT NULL,
        url TEXT NOT NULL,
        digest BLOB NOT NULL,
        PRIMARY KEY(key_id, fp)
    ) WITHOUT ROWID""",
)

PROOF_DIGEST_BYTES = 8

_SCAN_CHUNK = 20_000  # rows per rehash step: a few tens of ms that writers may wait
_HOST_CACHE = 100_000  # host key -> id entries kept in the worker thread
_MIN_LEAF = 1024
_FANOUT = 3  # the DSBF paper's experiments (§4) use c = 3
_MIN_SQL_FP = -(1 << 63)


def _digest(d: bytes) -> bytes:
    if len(d) not in (0, PROOF_DIGEST_BYTES):
        raise ValueError(f"a page's digest must be {PROOF_DIGEST_BYTES} bytes or none")
    return d


class DoneRecord(WorkerStore):
    """Finished URLs as (host key, fingerprint) pairs. Open with :meth:`open`."""

    def __init__(self, worker: SqliteWorker, bloom: SplittableBloom) -> None:
        super().__init__(worker)
        self._bloom = bloom
        self._count = 0  # rows committed; kept by the worker thread
        self._host_ids: dict[bytes, int] = {}  # committed hosts only; worker thread only
        self._rehashing = False  # written by the worker thread only

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        expected: int = 1_000_000,
        fp_rate: float = 0.001,
        synchronous: str = "NORMAL",
        leaf_capacity: int = 1 << 20,
    ) -> DoneRecord:
        """Open (or create) the record and rebuild its filter from disk.

        The filter is sized for ``max(expected, rows on disk)`` so that it needs no split
        until the record outgrows that: leaves of ``min(leaf_capacity, expected)`` items,
        as many at the root as that takes (the DSBF paper, eq. 5).
        """
        if expected <= 0:
            raise ValueError("expected must be positive")
        path.parent.mkdir(parents=True, exist_ok=True)
        worker = SqliteWorker(
            path, schema=_SCHEMA, application_id=APPLICATION_ID, synchronous=synchronous
        )
        capacity = max(_MIN_LEAF, min(leaf_capacity, expected))
        # A placeholder until setup knows the row count; replaced before open returns.
        record = cls(worker, SplittableBloom(capacity, fp_rate, _FANOUT, root_fanout=1))

        def setup(conn: sqlite3.Connection) -> None:
            n = conn.execute("SELECT count(*) FROM done").fetchone()[0]
            root = max(1, math.ceil(max(expected, n) / capacity))
            bloom = SplittableBloom(capacity, fp_rate, _FANOUT, root_fanout=root)
            cursor = conn.execute("SELECT fp FROM done")
            # from_sql_fp inlined here and in the rehash: a call per row adds seconds at 10M.
            while rows := cursor.fetchmany(_SCAN_CHUNK):
                bloom.add_many([fp + (1 << 64) if fp < 0 else fp for (fp,) in rows])
            record._bloom = bloom
            record._count = n
            # Leaves that overflowed during the rebuild are finished right here.
            step = record._start_rehash()
            while step is not None:
                step = step(conn)

        await worker.start(setup)
        return record

    @property
    def splitting(self) -> bool:
        """True while a DSBF split still waits to be finished from disk (in the background)."""
        return self._rehashing or self._bloom.pending_rehash > 0

    @property
    def bloom(self) -> SplittableBloom:
        """The in-RAM filter, for introspection (height, leaves, nbytes). Do not add to it."""
        return self._bloom

    # -- writes ----------------------------------------------------------------------------

    async def add(self, items: Sequence[tuple[bytes, int]], proofs: Sequence[Proof] = ()) -> int:
        """Record (host key, fp) pairs as done; returns how many were new. Durable on
        return, and :meth:`maybe_contains` already knows them by then. ``proofs``: what
        pages fetched here were (their pairs must be among ``items``)."""
        if not items:
            return 0
        rows = [(check_key(key), to_sql_fp(fp)) for key, fp in items]
        proven = [(key, to_sql_fp(fp), url, _digest(d)) for key, fp, url, d in proofs]
        known = self._host_ids

        def job(conn: sqlite3.Connection) -> tuple[list[int], dict[bytes, int]]:
            new: list[int] = []
            ids: dict[bytes, int] = {}
            for key, fp in rows:
                key_id = ids.get(key) or known.get(key) or host_id(conn, key, create=True)
                ids[key] = key_id
                if conn.execute("INSERT OR IGNORE INTO done VALUES (?, ?)", (key_id, fp)).rowcount:
                    new.append(fp)
            for key, fp, url, d in proven:
                key_id = ids.get(key) or known.get(key) or host_id(conn, key, create=True)
                conn.execute(
                    "INSERT OR IGNORE INTO proofs VALUES (?, ?, ?, ?)", (key_id, fp, url, d)
                )
            return new, ids

        new, _ = await self._worker.run(job, on_commit=self._committed)
        return len(new)

    async def forget(self, items: Sequence[tuple[bytes, int]]) -> int:
        """Drop (host key, fp) pairs from the record, so they may be crawled again (an
        operator's re-crawl); returns how many were there. The filter keeps their bits: it
        may claim too much, never too little, and :meth:`contains` asks the disk."""
        if not items:
            return 0
        rows = [(check_key(key), to_sql_fp(fp)) for key, fp in items]
        known = self._host_ids

        def job(conn: sqlite3.Connection) -> int:
            gone = 0
            for key, fp in rows:
                key_id = known.get(key) or host_id(conn, key, create=False)
                if key_id:
                    sql = "DELETE FROM done WHERE key_id = ? AND fp = ?"
                    gone += conn.execute(sql, (key_id, fp)).rowcount
                    conn.execute("DELETE FROM proofs WHERE key_id = ? AND fp = ?", (key_id, fp))
            return gone

        return await self._worker.run(job, on_commit=self._forgotten)

    def _forgotten(self, gone: int) -> None:
        # Worker thread, after the commit, like every other change of the count.
        self._count -= gone

    def _committed(self, result: tuple[list[int], dict[bytes, int]]) -> None:
        # Worker thread, after the commit: the filter never claims less than the disk holds
        # once add() has returned, and host ids enter the cache only once they exist.
        new, ids = result
        if len(self._host_ids) + len(ids) > _HOST_CACHE:
            self._host_ids.clear()
        self._host_ids.update(ids)
        add = self._bloom.add
        for fp in new:
            add(from_sql_fp(fp))
        self._count += len(new)
        if not self._rehashing:
            step = self._start_rehash()
            if step is not None:
                self._worker.background(step)

    # -- rehash: finishing DSBF splits from the exact fingerprints -------------------------

    def _start_rehash(self) -> BackgroundStep | None:
        rehash = self._bloom.begin_rehash()
        if rehash is None:
            self._rehashing = False
            return None
        self._rehashing = True
        return self._rehash_step(rehash, 0, _MIN_SQL_FP)

    def _rehash_step(self, rehash: Rehash, after_id: int, after_fp: int) -> BackgroundStep:
        def step(conn: sqlite3.Connection) -> BackgroundStep | None:
            # Keyset paging: rows are only ever inserted, so every row that existed when
            # the pass began is met exactly once, however many writes interleave.
            rows = conn.execute(
                "SELECT key_id, fp FROM done WHERE (key_id, fp) > (?, ?)"
                " ORDER BY key_id, fp LIMIT ?",
                (after_id, after_fp, _SCAN_CHUNK),
            ).fetchall()
            rehash.feed([fp + (1 << 64) if fp < 0 else fp for _, fp in rows])
            if len(rows) == _SCAN_CHUNK:
                return self._rehash_step(rehash, rows[-1][0], rows[-1][1])
            rehash.finish()
            # Re-inserting may itself have filled (and split) a child: go again if so.
            return self._start_rehash()

        return step

    # -- reads -----------------------------------------------------------------------------

    def maybe_contains(self, fp: int) -> bool:
        """Filter only, no disk, callable from the event loop: False means certainly not
        done; True means probably done (ask :meth:`contains` to be exact)."""
        return fp in self._bloom

    async def contains(self, items: Sequence[tuple[bytes, int]]) -> list[bool]:
        """Exact membership of (host key, fp) pairs. The filter answers first, so pairs it
        has never seen cost no disk read (and no thread hop if none is left)."""
        flags = [False] * len(items)
        bloom = self._bloom
        probe = [(i, key, to_sql_fp(fp)) for i, (key, fp) in enumerate(items) if fp in bloom]
        if not probe:
            return flags
        known = self._host_ids

        def job(conn: sqlite3.Connection) -> list[int]:
            hits: list[int] = []
            for i, key, fp in probe:
                key_id = known.get(key) or host_id(conn, key, create=False)
                if (
                    key_id
                    and conn.execute(
                        "SELECT 1 FROM done WHERE key_id = ? AND fp = ?", (key_id, fp)
                    ).fetchone()
                ):
                    hits.append(i)
            return hits

        for i in await self._worker.run(job, write=False):
            flags[i] = True
        return flags

    async def proofs(self, items: Sequence[tuple[bytes, int]]) -> list[Proof]:
        """What the pages of those (host key, fp) pairs were, for those fetched here."""
        rows = [(check_key(key), fp, to_sql_fp(fp)) for key, fp in items]
        known = self._host_ids

        def job(conn: sqlite3.Connection) -> list[Proof]:
            out: list[Proof] = []
            for key, fp, sql_fp in rows:
                key_id = known.get(key) or host_id(conn, key, create=False)
                row = conn.execute(
                    "SELECT url, digest FROM proofs WHERE key_id = ? AND fp = ?", (key_id, sql_fp)
                ).fetchone()
                if key_id and row is not None:
                    out.append((key, fp, str(row[0]), bytes(row[1])))
            return out

        return await self._worker.run(job, write=False)

    async def fps_for_keys(
        self, keys: Collection[bytes], *, proven: bool = False
    ) -> dict[bytes, list[int]]:
        """Every done fingerprint of those host keys (moving a host's history to its new
        owner); keys with none map to an empty list. ``proven``: only pages with a proof,
        the ones this peer fetched itself and can answer VOUCH for."""
        wanted = list(dict.fromkeys(keys))
        known = self._host_ids
        query = (
            "SELECT d.fp FROM done d JOIN proofs p ON p.key_id = d.key_id AND p.fp = d.fp"
            " WHERE d.key_id = ?"
            if proven
            else "SELECT fp FROM done WHERE key_id = ?"
        )

        def job(conn: sqlite3.Connection) -> dict[bytes, list[int]]:
            out: dict[bytes, list[int]] = {}
            for key in wanted:
                key_id = known.get(key) or host_id(conn, key, create=False)
                rows = conn.execute(query, (key_id,)).fetchall() if key_id else []
                out[key] = [from_sql_fp(fp) for (fp,) in rows]
            return out

        return await self._worker.run(job, write=False)

    async def keys(self) -> list[bytes]:
        """Every host key with at least one done fingerprint (what REFRESH_TASK may move)."""

        def job(conn: sqlite3.Connection) -> list[bytes]:
            rows = conn.execute(
                "SELECT key FROM hosts WHERE EXISTS (SELECT 1 FROM done WHERE key_id = hosts.id)"
            ).fetchall()
            return [bytes(key) for (key,) in rows]

        return await self._worker.run(job, write=False)

    async def key_counts(self) -> dict[bytes, int]:
        """Host key -> number of done fingerprints (one scan of the record)."""

        def job(conn: sqlite3.Connection) -> dict[bytes, int]:
            rows = conn.execute(
                "SELECT hosts.key, n FROM (SELECT key_id, count(*) AS n FROM done GROUP BY key_id)"
                " JOIN hosts ON hosts.id = key_id"
            ).fetchall()
            return {bytes(key): n for key, n in rows}

        return await self._worker.run(job, write=False)

    async def count(self) -> int:
        """Rows in the record; answered from a counter kept at commit time, no disk read."""
        return self._count

    async def aclose(self) -> None:
        """Drain pending work, close the file. An unfinished rehash is simply dropped: the
        filter is rebuilt from disk on the next open anyway."""
        await super().aclose()
