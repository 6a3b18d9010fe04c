"""The visit history: what the owner knows of each URL it crawled, for revisiting it.

In continuous mode (docs/freshness.md) a finished URL stays in the done record (links to it
are still duplicates) and also gets a row here: when it was last fetched, what the server
said, the validators of its archived copy (ETag, Last-Modified, payload digest) for a
conditional GET, the change estimate behind its interval, and when it is due again. The
table is also the durable queue of revisits: the scheduler reads due rows by the ``due``
index, and a row leaves that range only when its revisit is recorded, so a crash in between
revisits the page again after the restart.

Grouped by host key like the done record (:meth:`VisitStore.take_keys`,
:meth:`VisitStore.merge` and :func:`pack_visits` are what moves a key's history to its new
owner). Times are integer milliseconds of Unix time: SQLite stores them in 6 bytes, and a
zero, an empty string or an empty blob costs no payload byte at all, so fields a visit does
not have take no room.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields
from typing import Any

import msgspec

from storage.db import CountedStore
from storage.hostkeys import HOSTS_TABLE, check_key, host_id
from storage.records import from_sql_fp, to_sql_fp

__all__ = [
    "MAX_VALIDATOR",
    "Visit",
    "VisitStore",
    "pack_visits",
    "unpack_visits",
]

APPLICATION_ID = 0x70325631  # "p2V1": marks the file as a visit history

# The longest ETag kept (characters). Real ones are 10-60; a longer one is not stored and
# the next revisit asks with If-Modified-Since alone (or unconditionally).
MAX_VALIDATOR = 128
_DIGEST_BYTES = 20  # SHA-1, the digest WARC-Payload-Digest carries
_MAX_URL = 64 * 1024  # a sanity bound here; the crawler's own limit is far lower

_SCHEMA = (
    HOSTS_TABLE,
    """CREATE TABLE IF NOT EXISTS visits(
        key_id INTEGER NOT NULL,
        fp INTEGER NOT NULL,
        url TEXT NOT NULL,
        depth INTEGER NOT NULL,
        due INTEGER NOT NULL,
        fetched INTEGER NOT NULL,
        status INTEGER NOT NULL,
        interval INTEGER NOT NULL,
        captured INTEGER NOT NULL,
        digest BLOB NOT NULL,
        etag TEXT NOT NULL,
        lastmod INTEGER NOT NULL,
        visits INTEGER NOT NULL,
        changes INTEGER NOT NULL,
        changed_ms INTEGER NOT NULL,
        unchanged_ms INTEGER NOT NULL,
        changes_seen INTEGER NOT NULL,
        misses INTEGER NOT NULL,
        PRIMARY KEY(key_id, fp)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS visits_due ON visits(due)",
)
_COLUMNS = (
    "url, depth, due, fetched, status, interval, captured, digest, etag, lastmod, "
    "visits, changes, changed_ms, unchanged_ms, changes_seen, misses"
)
_INSERT = f"INTO visits(key_id, fp, {_COLUMNS}) VALUES ({', '.join(['?'] * 18)})"
_SELECT = f"SELECT hosts.key, visits.fp, {_COLUMNS} FROM visits JOIN hosts ON hosts.id = key_id"


@dataclass(frozen=True, slots=True)
class Visit:
    """One URL's history. Times are Unix milliseconds; 0 means "none"."""

    url: str
    key: bytes  # 20-byte DHT key of the URL's partition unit
    fp: int  # unsigned 64-bit fingerprint of the canonical URL
    depth: int
    due: int  # when it is to be visited again
    fetched: int  # the last visit (0: finished elsewhere, never visited here)
    status: int  # the last visit's HTTP status (0: no response)
    interval: int  # the current revisit interval, ms
    captured: int = 0  # the archived full capture revisits refer to (WARC-Refers-To-Date)
    digest: bytes = b""  # SHA-1 of that capture's payload
    etag: str = ""  # that capture's ETag, as sent
    lastmod: int = 0  # that capture's Last-Modified, Unix seconds
    # The change-rate estimate (p2pcrawl/crawl/refresh.py): visits and changes counted,
    # and the time the changed and the unchanged ones covered; all halved now and then.
    visits: int = 0
    changes: int = 0
    changed_ms: int = 0
    unchanged_ms: int = 0
    changes_seen: int = 0  # changes detected in all, never halved
    misses: int = 0  # visits in a row without a page (gone, errors, refused)

    def __post_init__(self) -> None:
        # Checked on the caller's side (and for every row another peer sends), so a bad
        # record fails where it was made, not in a store thread halfway through a batch.
        if type(self.key) is not bytes or type(self.url) is not str:
            raise ValueError("key must be bytes and url a string")
        if type(self.etag) is not str or type(self.digest) is not bytes:
            raise ValueError("etag must be a string and digest bytes")
        check_key(self.key)
        if type(self.fp) is not int or not 0 <= self.fp < 1 << 64:
            raise ValueError(f"fp must be an unsigned 64-bit integer, got {self.fp}")
        if not self.url or len(self.url) > _MAX_URL:
            raise ValueError("url must be a non-empty string of reasonable length")
        if len(self.etag) > MAX_VALIDATOR:
            raise ValueError(f"etag longer than {MAX_VALIDATOR} characters")
        if len(self.digest) not in (0, _DIGEST_BYTES):
            raise ValueError(f"digest must be empty or {_DIGEST_BYTES} bytes")
        for f in _INT_FIELDS:
            value = getattr(self, f)
            if type(value) is not int or not 0 <= value < 1 << 62:
                raise ValueError(f"{f} must be a non-negative integer, got {value!r}")
        if self.interval <= 0:
            raise ValueError("interval must be positive")

    def row(self, key_id: int) -> tuple[object, ...]:
        """The SQL row (``astuple`` deep-copies, at ten times the cost)."""
        return (
            key_id,
            to_sql_fp(self.fp),
            self.url,
            self.depth,
            self.due,
            self.fetched,
            self.status,
            self.interval,
            self.captured,
            self.digest,
            self.etag,
            self.lastmod,
            self.visits,
            self.changes,
            self.changed_ms,
            self.unchanged_ms,
            self.changes_seen,
            self.misses,
        )


_INT_FIELDS = tuple(f.name for f in fields(Visit) if f.type == "int" and f.name != "fp")


def _visit(row: Sequence[Any]) -> Visit:
    key, fp, url, depth, *rest = row
    return Visit(url, bytes(key), from_sql_fp(fp), depth, *rest)


class VisitStore(CountedStore):
    """The visit history, one SQLite file owned by one worker thread. Open with ``open``."""

    SCHEMA = _SCHEMA
    APPLICATION_ID = APPLICATION_ID
    TABLE = "visits"

    # -- writes ----------------------------------------------------------------------------

    async def record(self, visits: Sequence[Visit]) -> int:
        """Write these rows, replacing what the store held for the same URLs; returns how
        many URLs were new to it. Durable on return."""
        return await self._write(visits, replace=True)

    async def add_missing(self, visits: Sequence[Visit]) -> int:
        """Write the rows of URLs the store does not hold yet (it keeps what it has)."""
        return await self._write(visits, replace=False)

    async def _write(self, visits: Sequence[Visit], *, replace: bool) -> int:
        if not visits:
            return 0
        items = list(visits)

        def job(conn: sqlite3.Connection) -> int:
            ids: dict[bytes, int] = {}
            new = 0
            for v in items:
                key_id = ids.get(v.key) or host_id(conn, v.key, create=True)
                ids[v.key] = key_id
                row = v.row(key_id)
                if conn.execute("INSERT OR IGNORE " + _INSERT, row).rowcount:
                    new += 1
                elif replace:
                    conn.execute("REPLACE " + _INSERT, row)
            return new

        return await self._worker.run(job, on_commit=self._added)

    def _added(self, n: int) -> None:
        self._count += n

    async def merge(self, visits: Sequence[Visit]) -> int:
        """Take rows from another peer (a key handed over): a URL's row is replaced only by
        one of a later visit, so old news cannot undo what this store learned since, and it
        stays due no later than it was: news from elsewhere may bring a visit forward, never
        put one off (a lying peer could otherwise resend a row for ever to hold it off)."""
        if not visits:
            return 0
        items = list(visits)

        def job(conn: sqlite3.Connection) -> int:
            new = 0
            for v in items:
                key_id = host_id(conn, v.key, create=True)
                row = v.row(key_id)
                if conn.execute("INSERT OR IGNORE " + _INSERT, row).rowcount:
                    new += 1
                    continue
                have = conn.execute(
                    "SELECT fetched, due FROM visits WHERE key_id = ? AND fp = ?", row[:2]
                ).fetchone()
                if have is not None and v.fetched > have[0]:
                    conn.execute("REPLACE " + _INSERT, (*row[:4], min(v.due, have[1]), *row[5:]))
            return new

        return await self._worker.run(job, on_commit=self._added)

    async def advance(self, items: Sequence[tuple[bytes, int, int, int]]) -> int:
        """(key, fp, due, changed_at): make a URL due at ``due`` if it is due later and was
        last fetched before ``changed_at`` (a sitemap's lastmod says it changed since);
        returns how many rows moved."""
        rows = [(check_key(k), to_sql_fp(fp), due, at) for k, fp, due, at in items]
        if not rows:
            return 0

        def job(conn: sqlite3.Connection) -> int:
            moved = 0
            for key, fp, due, at in rows:
                key_id = host_id(conn, key, create=False)
                if key_id:
                    moved += conn.execute(
                        "UPDATE visits SET due = ? WHERE key_id = ? AND fp = ? AND due > ?"
                        " AND fetched < ?",
                        (due, key_id, fp, due, at),
                    ).rowcount
            return moved

        return await self._worker.run(job)

    async def remove(self, items: Sequence[tuple[bytes, int]]) -> int:
        """Drop the rows of (key, fp) pairs (a page retired); returns how many went."""
        rows = [(check_key(k), to_sql_fp(fp)) for k, fp in items]
        if not rows:
            return 0

        def job(conn: sqlite3.Connection) -> int:
            gone = 0
            for key, fp in rows:
                key_id = host_id(conn, key, create=False)
                if key_id:
                    sql = "DELETE FROM visits WHERE key_id = ? AND fp = ?"
                    gone += conn.execute(sql, (key_id, fp)).rowcount
            return gone

        return await self._worker.run(job, on_commit=self._removed)

    def _removed(self, n: int) -> None:
        self._count -= n

    async def take_keys(self, keys: Collection[bytes]) -> list[Visit]:
        """Remove and return every row of those keys (the keys move to another peer)."""
        wanted = [check_key(k) for k in dict.fromkeys(keys)]

        def job(conn: sqlite3.Connection) -> list[Visit]:
            out: list[Visit] = []
            for key in wanted:
                key_id = host_id(conn, key, create=False)
                if key_id:
                    rows = conn.execute(_SELECT + " WHERE key_id = ?", (key_id,)).fetchall()
                    out += map(_visit, rows)
                    conn.execute("DELETE FROM visits WHERE key_id = ?", (key_id,))
            return out

        taken = await self._worker.run(job, on_commit=lambda v: self._removed(len(v)))
        return taken

    # -- reads -----------------------------------------------------------------------------

    async def due(self, now: int, limit: int) -> list[Visit]:
        """Up to ``limit`` rows due at ``now``, the longest overdue first."""
        if limit <= 0:
            return []

        def job(conn: sqlite3.Connection) -> list[Visit]:
            rows = conn.execute(
                _SELECT + " WHERE due <= ? ORDER BY due LIMIT ?", (now, limit)
            ).fetchall()
            return [_visit(r) for r in rows]

        return await self._worker.run(job, write=False)

    async def get(self, items: Sequence[tuple[bytes, int]]) -> list[Visit | None]:
        """The row of each (key, fp) pair, or None."""
        probe = [(check_key(k), to_sql_fp(fp)) for k, fp in items]

        def job(conn: sqlite3.Connection) -> list[Visit | None]:
            out: list[Visit | None] = []
            for key, fp in probe:
                key_id = host_id(conn, key, create=False)
                row = (
                    conn.execute(
                        _SELECT + " WHERE key_id = ? AND visits.fp = ?", (key_id, fp)
                    ).fetchone()
                    if key_id
                    else None
                )
                out.append(None if row is None else _visit(row))
            return out

        return await self._worker.run(job, write=False)

    async def visits_for_keys(self, keys: Collection[bytes]) -> list[Visit]:
        """Every row of those keys, left in place (copies for a key's replicas)."""
        wanted = [check_key(k) for k in dict.fromkeys(keys)]

        def job(conn: sqlite3.Connection) -> list[Visit]:
            out: list[Visit] = []
            for key in wanted:
                key_id = host_id(conn, key, create=False)
                if key_id:
                    rows = conn.execute(_SELECT + " WHERE key_id = ?", (key_id,)).fetchall()
                    out += map(_visit, rows)
            return out

        return await self._worker.run(job, write=False)

    async def schedule(
        self, now: int, limit: int, count_upto: int
    ) -> tuple[int, int, list[Visit], int]:
        """(the earliest due time, rows due at ``now`` counted up to ``count_upto``, the
        ``limit`` soonest rows, the earliest due time after ``now``), times 0 when there is
        none: what a scheduler and a status page need, in one round trip over the index."""

        def job(conn: sqlite3.Connection) -> tuple[int, int, list[Visit], int]:
            first = conn.execute("SELECT min(due) FROM visits").fetchone()[0]
            due_now = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM visits WHERE due <= ? LIMIT ?)",
                (now, count_upto),
            ).fetchone()[0]
            rows = conn.execute(_SELECT + " ORDER BY due LIMIT ?", (limit,)).fetchall()
            after = conn.execute("SELECT min(due) FROM visits WHERE due > ?", (now,)).fetchone()
            return int(first or 0), int(due_now), [_visit(r) for r in rows], int(after[0] or 0)

        return await self._worker.run(job, write=False)

    async def keys(self) -> list[bytes]:
        """The keys that have rows here."""

        def job(conn: sqlite3.Connection) -> list[bytes]:
            sql = "SELECT key FROM hosts WHERE id IN (SELECT DISTINCT key_id FROM visits)"
            return [bytes(r[0]) for r in conn.execute(sql)]

        return await self._worker.run(job, write=False)

    async def count(self) -> int:
        """URLs with a history; answered from a counter kept at commit time, no disk read."""
        return self._count

    @property
    def rows(self) -> int:
        """:meth:`count`, for a caller that cannot await (a status page)."""
        return self._count


# -- the wire form -------------------------------------------------------------------------
# What moves a key's history to another peer: msgpack of [version, base, [[key, rows]...]],
# each row a list of its fields with times as offsets from ``base`` (the batch's earliest
# time), so a row costs its URL and ETag, 8 bytes of fingerprint, 20 of digest when it has
# one, and one to five bytes for each other field (benchmarks/revisit.py prints the size).

_WIRE_VERSION = 1
_TIMES = frozenset({"due", "fetched", "captured"})
_ROW_FIELDS = tuple(f.name for f in fields(Visit) if f.name != "key")


def pack_visits(visits: Sequence[Visit]) -> bytes:
    """``visits`` in their compact wire form (grouped by key)."""
    times = [getattr(v, t) for v in visits for t in _TIMES if getattr(v, t)]
    base = min(times, default=0)
    groups: dict[bytes, list[list[object]]] = {}
    for v in visits:
        row: list[object] = []
        for name in _ROW_FIELDS:
            value = getattr(v, name)
            if name in _TIMES:
                value = value - base if value else None
            row.append(value)
        groups.setdefault(v.key, []).append(row)
    return msgspec.msgpack.encode([_WIRE_VERSION, base, [[k, rows] for k, rows in groups.items()]])


def unpack_visits(data: bytes) -> list[Visit]:
    """The rows of :func:`pack_visits`; ValueError for anything that is not exactly that
    (the bytes come from another peer)."""
    try:
        doc = msgspec.msgpack.decode(data)
        version, base, groups = doc
        if version != _WIRE_VERSION or type(base) is not int:
            raise ValueError(f"not a visit batch (version {version!r})")
        out: list[Visit] = []
        for key, rows in groups:
            for row in rows:
                if len(row) != len(_ROW_FIELDS):
                    raise ValueError("a row with the wrong number of fields")
                values = dict(zip(_ROW_FIELDS, row, strict=True))
                for name in _TIMES:
                    values[name] = 0 if values[name] is None else values[name] + base
                out.append(Visit(key=key, **values))
        return out
    except (TypeError, ValueError) as exc:  # msgspec.DecodeError is a ValueError
        raise ValueError(f"malformed visit batch: {exc}") from exc
    except RecursionError as exc:
        raise ValueError("malformed visit batch: nested too deep") from exc
