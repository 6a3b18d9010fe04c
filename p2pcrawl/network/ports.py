"""The narrow interfaces the peer's collaborators share, and the helpers on them.

Each collaborator of the peer is built with the few things it uses, typed here or where it
is defined: ``protocol.CrawlNode`` implements :class:`Ownership` and the RPC callables, the
crawl engine the crawl-side protocols, and the peer (``peer.Peer``, ``parts.assemble``) is
the one place that wires them. Unit tests hand a collaborator small fakes of these instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from p2pcrawl.crawl import Frontier, RobotsCache, Scope, Task
from p2pcrawl.settings import CrawlSettings
from protocol import KeyBatch, PeerRef, StoreResult, TaskItem

__all__ = [
    "FrontierView",
    "Ownership",
    "ScopeView",
    "Spawn",
    "StoreTask",
    "owner_id",
    "to_batches",
]

# STORE_TASK to a peer (``CrawlNode.store_task``).
StoreTask = Callable[[PeerRef, Sequence[KeyBatch]], Awaitable[StoreResult]]
# Run a coroutine as a task the peer owns (cancelled and awaited when it stops).
Spawn = Callable[[Coroutine[Any, Any, None], str], object]


class Ownership(Protocol):
    """Who owns a key as this node sees it (``CrawlNode``; ``protocol.owners``)."""

    @property
    def me(self) -> PeerRef: ...

    def closest_local(
        self, key: bytes, n: int, *, with_self: bool | None = None
    ) -> list[PeerRef]: ...


class FrontierView(Protocol):
    """Our crawler's frontier and what it fetches now (``crawl.Engine``): lending's view."""

    @property
    def settings(self) -> CrawlSettings: ...

    @property
    def frontier(self) -> Frontier: ...

    @property
    def in_flight(self) -> Mapping[int, Task]: ...

    @property
    def robots(self) -> RobotsCache: ...

    @property
    def paused(self) -> bool: ...


class ScopeView(Protocol):
    """Our crawler's own scope and limits (``crawl.Engine``)."""

    @property
    def settings(self) -> CrawlSettings: ...

    @property
    def scope(self) -> Scope: ...

    @property
    def scope_from_seeds(self) -> bool: ...


def owner_id(ownership: Ownership, key: bytes) -> bytes | None:
    """The ID of ``key``'s owner among the members this node knows (itself included)."""
    found = ownership.closest_local(key, 1)
    return found[0].id if found else None


def to_batches(tasks: Sequence[Task], done: dict[bytes, list[int]] | None = None) -> list[KeyBatch]:
    """Tasks and done fingerprints as the crawl RPCs carry them: one batch per key."""
    by_key: dict[bytes, KeyBatch] = {}
    for t in tasks:
        b = by_key.get(t.key)
        if b is None:
            b = by_key[t.key] = KeyBatch(key=t.key, tasks=[])
        b.tasks.append(TaskItem(url=t.url, depth=t.depth, hops=t.hops))
    for key, fps in (done or {}).items():
        b = by_key.get(key)
        if b is None:
            b = by_key[key] = KeyBatch(key=key, tasks=[])
        b.done.extend(fps)
    return list(by_key.values())
