"""After a stall, fetch nothing until what is ours is ours again.

A peer whose event loop stood still (SIGSTOP, a long blocking call) for half the suspicion
timeout or more may have been declared dead meanwhile, and its hosts crawled by the peers
that took them over from their backups (docs/membership.md, "Liveness", rule 5). So it stops
starting fetches, pings everyone (which puts it back in their tables), asks its neighbours to
hand back what is now its own (REFRESH_TASK, with the done fingerprints of what they crawled
in its place: ``join.Join``), and only then fetches on. What it holds on loan waits for each
lender's word the same way (``reporting.Reports.on_stall``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from p2pcrawl.crawl import EventLog
from p2pcrawl.network.ports import Spawn
from protocol import PeerRef, PeerTimeout, RemoteError

__all__ = ["Pausable", "StallResync"]

log = logging.getLogger(__name__)

PAUSE = "stall"  # the engine's pause this module holds


class Pausable(Protocol):
    """The engine's pause (``crawl.Engine``): each reason held and released by its owner."""

    def pause(self, reason: str) -> None: ...

    def resume(self, reason: str) -> None: ...

    def wake(self) -> None: ...


class StallResync:
    def __init__(
        self,
        crawl: Pausable,
        events: EventLog,
        *,
        peers: Callable[[], list[PeerRef]],
        ping: Callable[[PeerRef], Awaitable[object]],
        refresh: Callable[[], Awaitable[None]],
        park_loans: Callable[[], None],
        rebalance_soon: Callable[[], None],
        active: Callable[[], bool],
        spawn: Spawn,
    ) -> None:
        """``ping``: PING a peer (``CrawlNode.ping_peer``); ``refresh``: ask the neighbours
        for our keys (``Join.refresh``); ``park_loans``: fetch nothing borrowed until each
        lender has answered (``Reports.on_stall``)."""
        self.crawl = crawl
        self.events = events
        self._peers = peers
        self._ping = ping
        self._refresh = refresh
        self._park_loans = park_loans
        self._rebalance_soon = rebalance_soon
        self._active = active
        self._spawn = spawn
        self.resyncing = False
        self.resyncs = 0

    def on_stall(self, seconds: float) -> None:
        """Our event loop stood still for ``seconds``: the others may have declared us dead
        and crawled our hosts from their backups meanwhile. Fetch nothing new until the
        neighbours have handed back what is ours, with the done fingerprints of what they
        crawled in our place -- otherwise we would fetch those pages a second time."""
        if self.resyncing or not self._active():
            return
        self.resyncing = True
        self.crawl.pause(PAUSE)
        self._park_loans()
        self.events.add("stalled", seconds=round(seconds, 1))
        self._spawn(self._resync(), "stall-resync")

    async def _resync(self) -> None:
        try:
            # Our requests put us back into the others' tables; their answers refute any
            # suspicion we had of them while we could not read.
            await asyncio.gather(*(self._ping(p) for p in self._peers()), return_exceptions=True)
            await self._refresh()
        except (PeerTimeout, RemoteError, OSError) as exc:
            log.warning("re-sync after a stall failed: %s", exc)
        finally:
            self.resyncing = False
            self.resyncs += 1
            self.crawl.resume(PAUSE)
            if self._active():
                self.crawl.wake()
                self._rebalance_soon()
