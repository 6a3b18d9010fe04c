"""Keeping the frontier's in-RAM window filled from the task store.

The store is read in order through one cursor, but no host gets more than
``host_queue_window`` URLs of the window: when a host is full, its tasks are skipped by the
cursor and it gets a cursor of its own (an *overflow*), read by its key once its queue is
half empty. Otherwise one host with a long queue at the front of the store would fill the
window, and the crawl would run one connection at a time while the other hosts waited in
the store (two-level scheduling: every host queue has work).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable

from p2pcrawl.crawl.frontier import Frontier, Task
from p2pcrawl.crawl.ledger import Ledger
from p2pcrawl.crawl.sites import queue_of
from p2pcrawl.settings import CrawlSettings, Partition

__all__ = ["WindowRefill"]

# Tasks read from the store in one round trip, at most.
LOAD_BATCH = 2000


class WindowRefill:
    def __init__(
        self,
        settings: CrawlSettings,
        frontier: Frontier,
        ledger: Ledger,
        in_flight: dict[int, Task],
        partition: Partition,
        *,
        lent: Collection[int] = frozenset(),
    ) -> None:
        self.settings = settings
        self.frontier = frontier
        self.ledger = ledger
        self.in_flight = in_flight
        self.lent = lent  # ours, away on loan yet still queued (``ports.LoanPort``)
        self.partition: Partition = partition
        self.wanted = asyncio.Event()
        self.excluded_keys: set[bytes] = set()
        self._host_window = max(2, settings.host_queue_window)
        # Host key -> (host, seq): a host that had a full window when the store cursor passed
        # its tasks; they are read by key after that seq.
        self._overflow: dict[bytes, tuple[str, int]] = {}
        # Host key -> seq: read by key up to here; the store cursor skips those.
        self._loaded_upto: dict[bytes, int] = {}

    @property
    def overflowing(self) -> bool:
        return bool(self._overflow)

    def low(self) -> bool:
        return len(self.frontier) < self.settings.frontier_window // 2

    def after_task(self, key: bytes) -> None:
        """A task of ``key`` left the window: refill if the window or the host ran low."""
        if self.low() or key in self._overflow:
            self.wanted.set()

    def exclude(self, keys: Iterable[bytes]) -> set[bytes]:
        keys = set(keys)
        self.excluded_keys |= keys
        for key in keys:
            self._overflow.pop(key, None)
            self._loaded_upto.pop(key, None)
        return keys

    def include(self, keys: Iterable[bytes]) -> None:
        self.excluded_keys -= set(keys)

    async def run(self) -> None:
        window = self.settings.frontier_window
        while True:
            await self.wanted.wait()
            self.wanted.clear()
            while True:
                room = window - len(self.frontier) - len(self.in_flight)
                if room <= 0:
                    break
                room -= await self._refill_overflowing(room)
                if room <= 0:
                    break
                want = min(room, LOAD_BATCH)
                batch = await self.ledger.load(want)
                for seq, t in batch:
                    if t.key in self.excluded_keys or t.fp in self.in_flight or t.fp in self.lent:
                        continue
                    if t.key in self._overflow:
                        continue  # its own cursor will reach it
                    upto = self._loaded_upto.get(t.key)
                    if upto is not None and seq <= upto:
                        continue  # loaded by its own cursor already
                    host = queue_of(t.url, self.partition)
                    if self._host_full(host):
                        self._overflow[t.key] = (host, seq - 1)
                        continue
                    self.frontier.push(host, t)
                if self._loaded_upto:
                    cursor = self.ledger.cursor
                    for key in [k for k, upto in self._loaded_upto.items() if upto <= cursor]:
                        del self._loaded_upto[key]
                if len(batch) < want:
                    break

    async def _refill_overflowing(self, room: int) -> int:
        """Load the hosts that overflowed the window and have room again; returns how many."""
        loaded = 0
        for key, (host, after) in list(self._overflow.items()):
            if room - loaded <= 0:
                break
            hq = self.frontier.hosts.get(host)
            queued = len(hq.tasks) if hq is not None else 0
            if queued > self._host_window // 2:
                continue
            want = min(self._host_window - queued, room - loaded)
            rows = await self.ledger.load_key(key, after, want)
            if key not in self._overflow or key in self.excluded_keys:
                continue  # handed away while the store was read
            for _, t in rows:
                if t.fp not in self.in_flight and t.fp not in self.lent:
                    self.frontier.push(host, t)
            loaded += len(rows)
            last = rows[-1][0] if rows else after
            if len(rows) < want:
                # Caught up with the store: new tasks of this key come after the main
                # cursor, which must only skip what was loaded here.
                del self._overflow[key]
                self._loaded_upto[key] = last
            else:
                self._overflow[key] = (host, last)
        return loaded

    def _host_full(self, host: str) -> bool:
        if self.partition == "url":
            return False  # a key per URL: nothing to read by host
        hq = self.frontier.hosts.get(host)
        return hq is not None and len(hq.tasks) >= self._host_window
