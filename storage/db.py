"""One SQLite file, one thread: how every store talks to disk without blocking the loop.

Why a thread per file rather than ``asyncio.to_thread``: an sqlite3 connection must stay on
the thread that made it, and a single writer per file means no lock contention. Why group
commit: a commit is the expensive part of a write (the WAL append, an fsync at checkpoint
time), so every job that arrives while one transaction is being run or committed joins the
*next* transaction. Two hundred concurrent ``add`` calls therefore cost a handful of commits,
and each caller still returns only after its own rows are committed.

Durability contract. ``journal_mode=WAL`` with ``synchronous=NORMAL`` (the default here): a
committed transaction survives the process being killed at any instant (``kill -9``), which
is the failure a crawler peer must survive. On power loss or an OS crash the last
transactions before the crash may be rolled back (the database stays consistent). Pass
``synchronous="FULL"`` to fsync the WAL on every commit and survive power loss as well, at
the cost of one fsync per group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from storage.failures import (
    StoreClosed,
    StoreCorrupt,
    StoreUnwritable,
    check_synchronous,
    unwritable,
)

__all__ = [
    "BackgroundStep",
    "CountedStore",
    "SqliteWorker",
    "StoreClosed",
    "StoreCorrupt",
    "StoreUnwritable",
    "WorkerStore",
    "check_synchronous",
]

T = TypeVar("T")

_log = logging.getLogger(__name__)


# A unit of work the worker runs between client batches, on its own thread; it returns the
# next step, or None when done. Used for long scans (the done record's rehash) that must not
# hold up writers.
BackgroundStep = Callable[[sqlite3.Connection], "BackgroundStep | None"]


@dataclass(slots=True)
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    write: bool
    on_commit: Callable[[Any], None] | None


_STOP = object()

# (job, value, error) for one finished job, as handed back to the event loop.
_Outcome = tuple[_Job, Any, BaseException | None]


class SqliteWorker:
    """Owns one SQLite file on one daemon thread; runs jobs submitted from the event loop.

    ``run(fn)`` calls ``fn(connection)`` on the worker thread inside a transaction, each job
    under its own savepoint so one failing job does not undo its batch-mates, and resolves
    after the commit. ``on_commit(value)`` runs on the worker thread after the commit and
    before the caller resumes: the place to update in-memory state that must never get ahead
    of the disk.
    """

    def __init__(
        self,
        path: Path,
        *,
        schema: Sequence[str],
        application_id: int,
        synchronous: str = "NORMAL",
        cache_kib: int = 8192,
        max_pending: int = 1024,
        max_batch: int = 512,
    ) -> None:
        self.path = path
        self._schema = tuple(schema)
        self._application_id = application_id
        self._synchronous = check_synchronous(synchronous)
        self._cache_kib = cache_kib
        self._max_batch = max_batch
        # Unbounded, because ``_slots`` already bounds it at max_pending jobs (and the stop
        # marker must always fit). SimpleQueue: its put is one C call, where Queue's takes a
        # Python-level lock and condition on the event loop for every job.
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._slots = asyncio.Semaphore(max_pending)
        self._background: deque[BackgroundStep] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self.commits = 0  # write transactions committed; written by the worker thread only

    async def start(self, setup: Callable[[sqlite3.Connection], None] | None = None) -> None:
        """Open the file on a new thread, check it, create the schema, then run ``setup``
        there too (e.g. counting rows). Raises :class:`StoreCorrupt` for a damaged file."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopped = loop.create_future()
        ready: asyncio.Future[None] = loop.create_future()
        # If our caller is cancelled mid-open, nobody reads ``ready``: mark it consumed.
        ready.add_done_callback(_consume)
        self._thread = threading.Thread(
            target=self._main, args=(ready, setup), name=f"sqlite:{self.path.name}", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.shield(ready)
        except BaseException:
            # Whether the open failed or we were cancelled, do not leave the thread behind.
            self._closing = True
            self._queue.put_nowait(_STOP)
            await asyncio.shield(self._stopped)
            raise

    async def run(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        write: bool = True,
        on_commit: Callable[[T], None] | None = None,
    ) -> T:
        if self._closing or self._loop is None:
            raise StoreClosed(f"{self.path} is closed")
        await self._slots.acquire()
        if self._closing:
            self._slots.release()
            raise StoreClosed(f"{self.path} is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.put_nowait(_Job(fn, future, write, on_commit))
        return await future

    def background(self, step: BackgroundStep) -> None:
        """Queue a background step. Worker thread only (from a job, hook or step)."""
        assert threading.current_thread() is self._thread
        self._background.append(step)

    async def aclose(self) -> None:
        """Finish every job already submitted, close the file and join the thread."""
        if self._stopped is None:
            return
        if not self._closing:
            self._closing = True
            self._queue.put_nowait(_STOP)
        # Shielded: if our caller is cancelled the worker still drains and exits cleanly.
        await asyncio.shield(self._stopped)
        if self._thread is not None:
            self._thread.join()

    # -- worker thread ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, one per batch.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        except sqlite3.Error as exc:
            raise unwritable(self.path, exc) or StoreCorrupt(
                self.path, f"cannot open: {exc}"
            ) from exc
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
            if [r[0] for r in rows] != ["ok"]:
                raise StoreCorrupt(self.path, "quick_check: " + "; ".join(str(r[0]) for r in rows))
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            if app_id not in (0, self._application_id):
                raise StoreCorrupt(
                    self.path,
                    f"application_id {app_id:#x} is another store's, expected "
                    f"{self._application_id:#x}",
                )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreCorrupt(self.path, f"cannot switch to WAL (journal_mode={mode})")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise unwritable(self.path, exc) or StoreCorrupt(self.path, str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        try:
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute(f"PRAGMA cache_size=-{int(self._cache_kib)}")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in self._schema:
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id={int(self._application_id)}")
                conn.execute("COMMIT")
            except BaseException:
                # A failed write may have ended the transaction already ("cannot rollback -
                # no transaction is active"): the first error is the one that says why.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            conn.close()
            raise unwritable(self.path, exc) or StoreCorrupt(self.path, str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _main(
        self,
        ready: asyncio.Future[None],
        setup: Callable[[sqlite3.Connection], None] | None,
    ) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:
            self._post(_resolve, ready, None, exc)
            self._post(_resolve, self._stopped, None, None)
            return
        try:
            if setup is not None:
                setup(conn)
        except BaseException as exc:
            conn.close()
            self._post(_resolve, ready, None, exc)
            self._post(_resolve, self._stopped, None, None)
            return
        self._post(_resolve, ready, None, None)
        try:
            self._serve(conn)
        finally:
            conn.close()
            self._post(_resolve, self._stopped, None, None)

    def _serve(self, conn: sqlite3.Connection) -> None:
        stopping = False
        while not stopping:
            batch: list[_Job] = []
            try:
                # With background work waiting, do not sleep on the queue.
                first = self._queue.get_nowait() if self._background else self._queue.get()
            except queue.Empty:
                first = None
            item = first
            while item is not None:
                if item is _STOP:
                    stopping = True
                    break
                assert isinstance(item, _Job)
                batch.append(item)
                if len(batch) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            if batch:
                self._post(self._deliver, self._run_batch(conn, batch))
            if self._background and not stopping:
                step = self._background.popleft()
                try:
                    nxt = step(conn)
                except Exception:
                    # Background work is an optimisation (e.g. freeing a split Bloom leaf);
                    # losing it must not take the store's writers down with it.
                    _log.exception("%s: background step failed", self.path)
                    nxt = None
                if nxt is not None:
                    self._background.appendleft(nxt)

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Job]) -> list[_Outcome]:
        write = any(job.write for job in batch)
        outcomes: list[_Outcome] = []
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            for job in batch:
                conn.execute("SAVEPOINT job")
                try:
                    value = job.fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    outcomes.append((job, None, exc))
                else:
                    conn.execute("RELEASE job")
                    outcomes.append((job, value, None))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # Nothing of this batch is durable, so every job in it failed.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return [(job, None, exc) for job in batch]
        if write:
            self.commits += 1
        done: list[_Outcome] = []
        for job, value, error in outcomes:
            if error is None and job.on_commit is not None:
                try:
                    job.on_commit(value)
                except Exception as exc:
                    error = exc
            done.append((job, value, error))
        return done

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        # The loop may already be closed when a store was never aclose()d; nobody is
        # waiting then, and the data is committed regardless.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    # -- event loop thread -----------------------------------------------------------------

    def _deliver(self, outcomes: list[_Outcome]) -> None:
        for job, value, error in outcomes:
            self._slots.release()
            _resolve(job.future, value, error)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _resolve(future: asyncio.Future[Any] | None, value: Any, error: BaseException | None) -> None:
    if future is None or future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


S = TypeVar("S", bound="CountedStore")


class WorkerStore:
    """What every store over one SQLite file and its worker thread has in common."""

    def __init__(self, worker: SqliteWorker) -> None:
        self._worker = worker

    @property
    def path(self) -> Path:
        return self._worker.path

    @property
    def commits(self) -> int:
        """Write transactions committed so far (group commit makes this << write calls)."""
        return self._worker.commits

    async def aclose(self) -> None:
        """Finish the jobs already submitted, then close the file."""
        await self._worker.aclose()


class CountedStore(WorkerStore):
    """A store over one table in its own SQLite file, with a row count kept at commit time.

    Subclasses name the schema, the file's application id and the counted table; ``open``
    starts the worker thread and reads the count once.
    """

    SCHEMA: ClassVar[tuple[str, ...]]
    APPLICATION_ID: ClassVar[int]
    TABLE: ClassVar[str]

    def __init__(self, worker: SqliteWorker) -> None:
        super().__init__(worker)
        self._count = 0  # rows committed; kept by the worker thread, read by anyone

    @classmethod
    async def open(cls: type[S], path: Path, *, synchronous: str = "NORMAL") -> S:
        path.parent.mkdir(parents=True, exist_ok=True)
        store = cls(
            SqliteWorker(
                path,
                schema=cls.SCHEMA,
                application_id=cls.APPLICATION_ID,
                synchronous=synchronous,
            )
        )
        await store._worker.start(store._setup)
        return store

    def _setup(self, conn: sqlite3.Connection) -> None:
        self._count = conn.execute(f"SELECT count(*) FROM {self.TABLE}").fetchone()[0]
