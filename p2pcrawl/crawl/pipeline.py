"""How many pages may be between their request and their done record while fetches are quick.

A peer killed loses the pages it requested whose done record had not reached its replicas
yet: its successor fetches them again (docs/membership.md, "What a crash costs"). On a web
that answers faster than the page tails finish, every fetch slot and every tail slot fills,
and that window is the whole pipeline, (1 + ``TAILS_PER_FETCH``) x concurrency pages, whatever
the replica lane's spacing. A fetch starts here only with a ticket, and a ticket is held
until the page is done; ``PIPELINE_PAGES`` of them bound the window at full speed.

A slow fetch (a remote web, a large body) gives its ticket back after ``QUICK_FETCH_S``:
there the fetches themselves are what ``--concurrency`` is for, the tails keep up, and a
ticket held for a whole fetch would cut the fetches under way to the tickets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["GATING_S", "PIPELINE_PAGES", "QUICK_FETCH_S", "Pipeline", "Ticket"]

# Pages between request and done at full speed. 24 keeps a crash's in-flight window under
# half a percent of a 5,000-page web; the cap is reached only where the tails are the
# bottleneck, and there a deeper pipeline adds latency, not pages per second.
PIPELINE_PAGES = 24
# A fetch still under way after this long holds no ticket: it is a slow web's, not a window.
QUICK_FETCH_S = 0.1
# A fetch that waited for a ticket this recently means the tails gate the crawl.
GATING_S = 1.0


class Ticket:
    """One page's place in the pipeline, given back once (``release``), or at once by a
    slow fetch (``started`` arms the timer, ``fetched`` disarms it)."""

    __slots__ = ("_held", "_pipeline", "_timer")

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._held = True
        self._timer: asyncio.TimerHandle | None = None

    def started(self) -> None:
        if self._held and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._pipeline.quick_s, self._slow)

    def fetched(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _slow(self) -> None:
        self._timer = None
        self._pipeline.slow_fetches += 1
        self.release()

    def release(self) -> None:
        self.fetched()
        if self._held:
            self._held = False
            self._pipeline.release()


class _Free(Ticket):
    """The ticket of an unbounded pipeline: nothing to hold, nothing to give back."""

    def started(self) -> None:
        pass

    def fetched(self) -> None:
        pass

    def release(self) -> None:
        pass


class Pipeline:
    """``pages`` tickets; ``None``: unbounded, for a crawl with no replicas to tell (a peer
    alone: its fetch slots and tail slots bound it, and a ticket held until the done record
    would only make its batches smaller, -20% pages a second in ``single_peer.py``)."""

    def __init__(self, pages: int | None = PIPELINE_PAGES, quick_s: float = QUICK_FETCH_S) -> None:
        if (pages is not None and pages < 1) or quick_s <= 0:
            raise ValueError("a pipeline needs at least one page and a positive quick time")
        self.pages = pages
        self.quick_s = quick_s
        self._free = None if pages is None else asyncio.Semaphore(pages)
        self._nothing = _Free(self)  # every ticket of an unbounded pipeline
        self.slow_fetches = 0  # tickets given back by a fetch still under way
        self.waits = 0  # fetches that waited for a ticket
        self._waited_at = float("-inf")  # loop time of the last such wait
        # Told when a fetch waits for a ticket after a quiet ``GATING_S`` (the RPC lanes
        # waiting out a stretched spacing send now: ``network.patience``).
        self.on_gating: Callable[[], None] | None = None

    @property
    def gating(self) -> bool:
        """The tails gate the crawl: every ticket is held, or a fetch waited for one in the
        last ``GATING_S``. Sampled once per flush, "held now" alone missed most of it."""
        if self._free is None:
            return False
        return self._free.locked() or asyncio.get_running_loop().time() - self._waited_at < GATING_S

    async def ticket(self) -> Ticket:
        if self._free is None:
            return self._nothing
        if self._free.locked():
            now = asyncio.get_running_loop().time()
            quiet = now - self._waited_at >= GATING_S
            self.waits += 1
            self._waited_at = now
            if quiet and self.on_gating is not None:
                self.on_gating()
        await self._free.acquire()
        return Ticket(self)

    def release(self) -> None:
        if self._free is not None:
            self._free.release()
