"""The peer's door for the node: what neighbours send, passed to whoever serves it.

The node (``protocol.CrawlNode``) needs its ``CrawlHandler`` when it is built, and what
serves the crawl RPCs needs the node (to tell whether this peer owns a key, to copy what
it takes to the replicas). So the node is built with this door, and the door is opened once
those parts exist, before the node listens: the crawl RPCs go to the peer's handler
(``handlers.PeerHandler``), and the news of members coming and going to its roster
(``roster.Roster``). A request that arrives before the door is open is answered with an
error; none can, since the node is not listening yet.
"""

from __future__ import annotations

from typing import Protocol

from protocol import KeyBatch, PeerRef, RefreshAnswer, StoreResult

__all__ = ["Inbox"]


class CrawlRpcs(Protocol):
    """The crawl RPCs as this peer serves them (``handlers.PeerHandler``)."""

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult: ...

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int: ...

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int: ...

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer: ...


class Arrivals(Protocol):
    """Who hears of members coming and going (``roster.Roster``)."""

    def arrived(self, peer: PeerRef) -> None: ...

    def departed(self, peer: PeerRef, reason: str) -> None: ...


class Inbox:
    """The node's ``CrawlHandler``."""

    def __init__(self) -> None:
        self._rpcs: CrawlRpcs | None = None
        self._arrivals: Arrivals | None = None

    def open(self, rpcs: CrawlRpcs, arrivals: Arrivals) -> None:
        self._rpcs, self._arrivals = rpcs, arrivals

    def _served(self) -> CrawlRpcs:
        if self._rpcs is None:
            raise RuntimeError("this peer does not serve requests yet")
        return self._rpcs

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        return await self._served().handle_store_task(sender, batches)

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        return await self._served().handle_store_backup(sender, owner, batches)

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        return await self._served().handle_delete_backup(sender, owner, done)

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer:
        return await self._served().handle_refresh_task(sender)

    def peer_added(self, peer: PeerRef) -> None:
        if self._arrivals is not None:
            self._arrivals.arrived(peer)

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        if self._arrivals is not None:
            self._arrivals.departed(peer, reason)
