"""This peer's answer to LOAD (``protocol.loadreport``): the pages it owns and where they lie.

A joiner splits the most loaded peer's region on the bit that halves that peer's pages
(``protocol.balance``). The load is the pages this peer owns: queued tasks plus done URLs,
both kept as counters, so it is always fresh. The profile needs every owned key's page count,
a grouped scan of both stores, so it is computed in the background, at most once per
``max_age`` seconds however often it is asked for, and a request waits for a fresh one only
``wait`` seconds (well inside the caller's RPC timeout): past that it gets the last profile,
or the load alone.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable

from p2pcrawl.crawl import Ledger
from p2pcrawl.network.ports import Spawn
from protocol import MAX_PEERS, LoadReport, PeerRef, bit_loads

__all__ = ["LoadInfo"]

log = logging.getLogger(__name__)

MAX_PROFILE_KEYS = 50_000  # beyond this a uniform sample (the URL partition has a key per URL)


class LoadInfo:
    def __init__(
        self,
        ledger: Ledger,
        neighbours: Callable[[int], list[PeerRef]],
        spawn: Spawn,
        *,
        max_age: float = 60.0,
        wait: float = 0.5,
    ) -> None:
        """``neighbours``: the ``n`` contacts of our routing table nearest this node
        (``CrawlNode.neighbours``)."""
        self.ledger = ledger
        self._neighbours = neighbours
        self._spawn = spawn
        self.max_age = max_age
        self.wait = wait
        # (when, total, ones): the last profile, its own total, for scaling to today's load.
        self._profile: tuple[float, float, list[float]] | None = None
        self._fresh: asyncio.Event | None = None  # set when the refresh under way ends

    async def report(self) -> LoadReport:
        ledger = self.ledger
        load = await ledger.tasks.count() + await ledger.done.count()  # counters, no disk
        # The whole routing table, as FIND_NODE answers from it: contacts still too young to
        # own keys are there too, and a joiner must count them or it splits their region.
        peers = tuple(self._neighbours(MAX_PEERS))
        if load == 0:
            return LoadReport(0, None, peers[:MAX_PEERS])
        await self._refresh_if_stale()
        ones: tuple[float, ...] | None = None
        if self._profile is not None and self._profile[1] > 0:
            _, total, raw = self._profile
            ones = tuple(min(load, v * load / total) for v in raw)
        return LoadReport(load, ones, peers[:MAX_PEERS])

    async def _refresh_if_stale(self) -> None:
        cached = self._profile
        if cached is not None and time.monotonic() - cached[0] < self.max_age:
            return
        if self._fresh is None:
            self._fresh = asyncio.Event()
            self._spawn(self._refresh(self._fresh), "load-profile")
        try:
            await asyncio.wait_for(self._fresh.wait(), self.wait)
        except TimeoutError:
            pass  # answer with what we have; the refresh goes on for the next caller

    async def _refresh(self, done: asyncio.Event) -> None:
        try:
            ledger = self.ledger
            counts: Counter[bytes] = Counter(await ledger.tasks.key_counts())
            counts.update(await ledger.done.key_counts())
            items = list(counts.items())
            scale = 1.0
            if len(items) > MAX_PROFILE_KEYS:
                scale = len(items) / MAX_PROFILE_KEYS
                items = random.sample(items, MAX_PROFILE_KEYS)
            total, ones = await asyncio.to_thread(bit_loads, ((k, scale * n) for k, n in items))
            self._profile = (time.monotonic(), total, ones)
        except Exception:
            log.exception("computing the load profile failed; LOAD answers without one")
            self._profile = (time.monotonic(), 0.0, [])  # not again before max_age
        finally:
            self._fresh = None
            done.set()
