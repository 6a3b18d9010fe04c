"""Continuous mode: crawled pages come back into the crawl when they are due, and are asked
for with conditional GETs (docs/freshness.md).

A page finished in continuous mode stays in the done record (a link to it is still a
duplicate) and gets a row in the visit history (:class:`storage.VisitStore`), which is also
the durable queue of revisits. :meth:`Revisits.run` reads due rows into the frontier as
tasks, like any other: politeness, robots.txt (fetched again once its cache expires, RFC
9309 §2.4: at most 24 h), the per-host budgets and ``--max-disk`` hold for them as for a
first fetch. A revisit is a conditional GET, and its answer decides its WARC record
(:mod:`~p2pcrawl.crawl.conditional`); :mod:`~p2pcrawl.crawl.refresh` decides when the page
is due next. A revisit leaves
the engine only once its next row is written (:meth:`Revisits.settle_page`); a crash in
between leaves the old row due, so the page is revisited after the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from p2pcrawl.crawl import urls
from p2pcrawl.crawl.conditional import Plan, plan_page, validators
from p2pcrawl.crawl.fetcher import FetchResult
from p2pcrawl.crawl.frontier import Frontier, Task
from p2pcrawl.crawl.ledger import Ledger
from p2pcrawl.crawl.links import make_task
from p2pcrawl.crawl.refill import WindowRefill
from p2pcrawl.crawl.refresh import Bounds, Estimate, Seen, next_visit
from p2pcrawl.crawl.stats import RevisitStats
from p2pcrawl.settings import CrawlSettings, Partition
from storage import Visit, VisitStore

__all__ = ["EngineSide", "Revisits"]

IDLE_WAKE_S = 5.0  # the longest the scheduler sleeps without looking at the store
PAUSED_WAKE_S = 0.25  # how often it looks whether a pause ended
UPCOMING = 10  # the soonest due pages the status page lists
DUE_COUNT_UPTO = 100_000  # "due now" is counted up to this (a bounded index scan)
DIRTY_LIMIT = 50_000  # rows held for the replicas between two sends


class EngineSide(Protocol):
    """What of its engine the revisit side uses (the engine itself, typed here so the two
    modules do not import each other)."""

    settings: CrawlSettings
    ledger: Ledger
    frontier: Frontier
    refill: WindowRefill
    in_flight: dict[int, Task]
    partition: Partition

    @property
    def paused(self) -> bool: ...
    @property
    def exhausted(self) -> bool: ...
    @property
    def idle(self) -> bool: ...
    async def finish(
        self, tasks: list[Task], *, hurry: bool = False, body: bytes | None = None
    ) -> None: ...
    def over_host_budget(self, url: str) -> bool: ...
    def key_of(self, url: str) -> bytes: ...


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


class Revisits:
    """The revisit side of one engine: its scheduler loop, and the hooks the fetch path
    calls for a page whose URL has (or will have) a visit history."""

    def __init__(self, engine: EngineSide) -> None:
        s = engine.settings.revisit
        self.engine = engine
        self.bounds = Bounds(_ms(s.every), _ms(s.low), _ms(s.high), s.retire_after)
        self.window = s.window
        self.store: VisitStore | None = None
        # Due visits handed to the frontier and not yet settled, by fingerprint.
        self.pending: dict[int, Visit] = {}
        self.stats = RevisitStats()
        self.wake = asyncio.Event()
        # The store's schedule as last read (Unix seconds; None: no history at all).
        self.next_due_at: float | None = None
        self.due_now = 0
        self.upcoming: list[tuple[str, float]] = []
        self._recorded: set[int] = set()  # first visits settled, on their way to the ledger
        # Whether a key is this peer's to revisit (a networked peer holds its replicas'
        # copies of other owners' rows too); a lone peer owns every key.
        self.owns: Callable[[bytes], bool] = lambda key: True
        # Rows written since the replicas last heard (network/history.py sends them), at
        # most DIRTY_LIMIT: past it the oldest go unsent, and a replica that takes the key
        # over revisits those pages early. None: nobody listens (a lone peer).
        self.dirty: dict[int, Visit] | None = None

    async def start(self) -> None:
        self.store = await self.engine.ledger.open_visits()

    @property
    def tracked(self) -> int:
        """Pages with a history here."""
        return self.store.rows if self.store is not None else 0

    # -- the scheduler ---------------------------------------------------------------------

    async def run(self) -> None:
        """Owned by the engine: load due pages into the frontier, sleep until the next."""
        while True:
            self.wake.clear()
            # Paused (a join, a stall): nothing wakes the scheduler when the pause ends.
            delay = PAUSED_WAKE_S if self.engine.paused else await self._look()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.wake.wait()

    async def _look(self) -> float:
        """Load what is due; returns how long to sleep before the next look."""
        now = time.time()
        loaded_all = await self._load(now)
        next_new = await self._read_schedule(now)
        if not loaded_all or len(self.pending) >= self.window or next_new is None:
            return IDLE_WAKE_S  # (a full window: until a revisit settles, it sets ``wake``)
        return min(IDLE_WAKE_S, max(0.0, next_new - time.time()))

    async def _load(self, now: float) -> bool:
        """Push due pages into the frontier; False when some are left for lack of room."""
        engine, store = self.engine, self.store
        assert store is not None
        room = self.window - len(self.pending)
        if engine.paused or engine.exhausted or room <= 0:
            return room > 0
        limit = room + len(self.pending)
        rows = await store.due(_ms(now), limit)
        excluded = engine.refill.excluded_keys
        moved: list[Visit] = []
        for v in rows:
            if v.fp in self.pending or v.fp in engine.in_flight:
                continue
            if len(self.pending) >= self.window:
                return False
            if v.key in excluded and self.owns(v.key):
                # Handed away, and ours again: the peer it went to crashed. A takeover's
                # backups bring the key back with its unfinished tasks; a host all done has
                # none, only these rows (a handoff under way names another owner).
                engine.refill.include({v.key})
            if v.key in excluded or not self.owns(v.key):
                # Its key moved to another peer, or this is a replica's copy: the row waits
                # here, out of the way, for the day the key is ours (a crash takeover).
                moved.append(dataclasses.replace(v, due=_ms(now) + v.interval))
                continue
            self.pending[v.fp] = v
            engine.frontier.push(urls.host_of(v.url), Task(v.url, v.fp, v.key, v.depth))
        if moved:
            await store.record(moved)
        return len(rows) < limit

    async def _read_schedule(self, now: float) -> float | None:
        """Refresh what the status page shows; returns when a page not yet loaded is due."""
        assert self.store is not None
        first, due_now, soonest, after = await self.store.schedule(
            _ms(now), UPCOMING, DUE_COUNT_UPTO
        )
        self.next_due_at = first / 1000 if first else None
        self.due_now = due_now
        self.upcoming = [(v.url, v.due / 1000) for v in soonest]
        return after / 1000 if after else None

    def nothing_due_until(self) -> float | None:
        """The crawl-side fact a peer reports as ``state: "waiting"``: nothing is queued,
        due or under way here until this Unix time; None while something is."""
        engine = self.engine
        if self.pending or not engine.idle or self.next_due_at is None:
            return None
        if self.next_due_at <= time.time():
            return None
        return self.next_due_at

    # -- the fetch path's hooks ------------------------------------------------------------

    def visit_of(self, task: Task) -> Visit | None:
        """The history of a due page being revisited (None for a first fetch)."""
        return None if task.lease else self.pending.get(task.fp)

    async def plan(self, task: Task, res: FetchResult) -> Plan | None:
        """How to archive ``res``; None for a page fetched on loan (its owner keeps the
        history)."""
        return None if task.lease else await plan_page(self.pending.get(task.fp), task.url, res)

    async def settle_page(self, task: Task, plan: Plan, res: FetchResult) -> None:
        """The page's record is on disk: write its next visit (durable on return), then,
        for a first fetch, record it done."""
        prev = plan.previous
        captured = plan.seen in (Seen.NEW, Seen.CHANGED) and bool(plan.digest)
        kept = (
            validators(res.headers, None if captured else prev)
            if captured or plan.seen is Seen.UNCHANGED
            else (prev.etag, prev.lastmod)
            if prev
            else ("", 0)
        )
        if prev is not None:
            self.stats.count_revisit(time.time())
            if res.status == 304:
                self.stats.not_modified += 1
            elif plan.seen is Seen.UNCHANGED:
                self.stats.unchanged += 1
            elif plan.seen is Seen.CHANGED:
                self.stats.changed += 1
        else:
            self.stats.first_visits += 1
        if plan.seen is Seen.GONE:
            self.stats.gone += 1
        elif plan.seen is Seen.FAILED:
            self.stats.failed += 1
        await self._write(
            task,
            prev,
            plan.seen,
            plan.at,
            res.status,
            capture=(plan.at, plan.digest) if captured else None,
            validators=kept,
        )
        if prev is None:
            self._recorded.add(task.fp)
            await self.engine.finish([task], body=res.body)

    async def settle(self, tasks: Sequence[Task], *, elsewhere: bool) -> list[Task]:
        """Tasks that end without a page here (robots.txt, an error, a budget; or, with
        ``elsewhere``, fetched by a borrower): a due page is scheduled again (postponed or
        missed); a new one gets a history with no validators. Returns the tasks the ledger
        records done (the first fetches)."""
        first: list[Task] = []
        bare: list[Visit] = []
        now = _ms(time.time())
        for t in tasks:
            if t.lease:
                first.append(t)  # a borrowed page: its lender keeps the history
                continue
            if t.fp in self._recorded:
                self._recorded.discard(t.fp)
                first.append(t)
                continue
            prev = self.pending.get(t.fp)
            if prev is None:
                first.append(t)
                row = self._row(t, None, Seen.NEW, now, 0, None, ("", 0), fetched=0)
                assert row is not None  # a new page is never retired
                bare.append(row)
                continue
            postponed = elsewhere or self.engine.over_host_budget(t.url)
            seen = Seen.POSTPONED if postponed else Seen.FAILED
            if postponed:
                self.stats.postponed += 1
            else:
                self.stats.failed += 1
            await self._write(t, prev, seen, now, prev.status, None, (prev.etag, prev.lastmod))
        if bare:
            assert self.store is not None
            self.stats.first_visits += await self.store.add_missing(bare)
            self._woken_by(bare)
            self.note_dirty(bare)
        return first

    async def refused(self, task: Task) -> bool:
        """The address guard refused a page: a due one counts a miss (True: handled)."""
        prev = self.visit_of(task)
        if prev is None:
            return False
        self.stats.failed += 1
        now = _ms(time.time())
        await self._write(task, prev, Seen.FAILED, now, 0, None, (prev.etag, prev.lastmod))
        return True

    def release(self, tasks: list[Task]) -> list[Task]:
        """Window tasks of keys handed away: the due pages among them leave the window
        (their rows stay due); returns the others."""
        out = []
        for t in tasks:
            if self.pending.pop(t.fp, None) is None or t.lease:
                out.append(t)
        self.wake.set()
        return out

    async def hint_changed(self, changed: Sequence[tuple[str, float]]) -> int:
        """A sitemap's ``<lastmod>`` (or any other word) says each ``(url, changed_at)``
        changed at that Unix time: a page last visited before it is due now. Returns how
        many were moved."""
        assert self.store is not None
        engine, now = self.engine, _ms(time.time())
        moved = await self.store.advance(
            [
                (engine.key_of(url), make_task(url, 0, engine.partition).fp, now, _ms(at))
                for url, at in changed
            ]
        )
        self.stats.hinted += moved
        if moved:
            self.wake.set()
        return moved

    async def merge(self, rows: Sequence[Visit]) -> int:
        """Rows from another peer (a key handed over, a replica's copy); returns how many
        were new here."""
        assert self.store is not None
        new = await self.store.merge(rows)
        if rows:
            # A key handed to us (no task of it need come first) is ours to crawl again.
            self.engine.refill.include({v.key for v in rows if self.owns(v.key)})
            self._woken_by(rows)
        return new

    # -- writing the history ---------------------------------------------------------------

    async def _write(
        self,
        task: Task,
        prev: Visit | None,
        seen: Seen,
        now: int,
        status: int,
        capture: tuple[int, bytes] | None,
        validators: tuple[str, int],
    ) -> None:
        assert self.store is not None
        row = self._row(task, prev, seen, now, status, capture, validators)
        try:
            if row is None:
                assert prev is not None
                await self.store.remove([(prev.key, prev.fp)])
                self.stats.retired += 1
            else:
                await self.store.record([row])
                self._woken_by([row])
                self.note_dirty([row])
        finally:
            if self.pending.pop(task.fp, None) is not None and len(self.pending) < self.window // 2:
                self.wake.set()

    def _row(
        self,
        task: Task,
        prev: Visit | None,
        seen: Seen,
        now: int,
        status: int,
        capture: tuple[int, bytes] | None,
        validators: tuple[str, int],
        *,
        fetched: int | None = None,
    ) -> Visit | None:
        """The page's next history row, or None to retire it (the policy is refresh's)."""
        est = (
            Estimate(prev.visits, prev.changes, prev.changed_ms, prev.unchanged_ms)
            if prev
            else Estimate()
        )
        elapsed = now - prev.fetched if prev is not None and prev.fetched else 0
        nxt = next_visit(
            seen,
            interval=prev.interval if prev else self.bounds.base,
            estimate=est,
            misses=prev.misses if prev else 0,
            elapsed=max(0, elapsed),
            bounds=self.bounds,
        )
        if nxt.retire:
            return None
        captured, digest = capture or ((prev.captured, prev.digest) if prev else (0, b""))
        etag, lastmod = validators
        return Visit(
            url=task.url,
            key=task.key,
            fp=task.fp,
            depth=task.depth,
            due=now + nxt.interval,
            fetched=now if fetched is None else fetched,
            status=status,
            interval=nxt.interval,
            captured=captured,
            digest=digest,
            etag=etag,
            lastmod=lastmod,
            visits=nxt.estimate.visits,
            changes=nxt.estimate.changes,
            changed_ms=nxt.estimate.changed_ms,
            unchanged_ms=nxt.estimate.unchanged_ms,
            changes_seen=(prev.changes_seen if prev else 0) + (seen is Seen.CHANGED),
            misses=nxt.misses,
        )

    def note_dirty(self, rows: Sequence[Visit]) -> None:
        dirty = self.dirty
        if dirty is None:
            return
        for row in rows:
            dirty.pop(row.fp, None)
            dirty[row.fp] = row
        while len(dirty) > DIRTY_LIMIT:
            del dirty[next(iter(dirty))]

    def take_dirty(self) -> list[Visit]:
        """The rows written since the last call (for the replicas)."""
        if not self.dirty:
            return []
        rows = list(self.dirty.values())
        self.dirty.clear()
        return rows

    def _woken_by(self, rows: Sequence[Visit]) -> None:
        """A new row due before the scheduler's next look wakes it."""
        soonest = min(v.due for v in rows) / 1000
        if self.next_due_at is None or soonest < self.next_due_at:
            self.next_due_at = soonest
            self.wake.set()

    # -- what the user sees ----------------------------------------------------------------

    def status(self) -> dict[str, object]:
        st = self.stats
        now = time.time()
        answered = st.not_modified + st.unchanged + st.changed
        return {
            "every_s": self.bounds.base / 1000,
            "min_s": self.bounds.low / 1000,
            "max_s": self.bounds.high / 1000,
            "tracked": self.tracked,
            "due_now": self.due_now,
            "in_window": len(self.pending),
            "next_due_at": self.next_due_at,
            "upcoming": [{"url": u, "due_at": round(t, 3)} for u, t in self.upcoming],
            "revisits": st.revisits,
            "revisits_per_hour": st.per_hour(now),
            "not_modified": st.not_modified,
            "not_modified_share": round(st.not_modified / answered, 4) if answered else None,
            "unchanged": st.unchanged,
            "changes_detected": st.changed,
            "gone": st.gone,
            "failed": st.failed,
            "postponed": st.postponed,
            "retired": st.retired,
            "first_visits": st.first_visits,
            "sitemap_hints": st.hinted,
        }
