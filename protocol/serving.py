"""The receiving side of the four crawl RPCs, and the handler contract.

The RPCs are those of "Distributed Crawler Based on the Improved Kademlia Protocol", §2.2.2.

The node decodes and validates each request here, calls the crawler's ``CrawlHandler`` and
turns its answer into a small reply map. A ``MessageError`` raised here becomes an error reply
("bad arguments"), any other exception an error reply naming it: the caller always hears back.

Handlers run while the caller waits (``rpc_timeout``), so they must only enqueue work: a slow
handler makes the caller count a timeout against a live peer.
"""

from __future__ import annotations

from typing import Any, Protocol

from protocol.errors import MessageError
from protocol.messages import (
    KeyBatch,
    PeerRef,
    RefreshAnswer,
    StoreResult,
    check_id,
    decode_batches,
    refresh_to_wire,
    store_result_to_wire,
)
from protocol.rpc import CrawlServer

__all__ = ["CrawlHandler", "NoWork", "crawl_servers"]


class CrawlHandler(Protocol):
    """Implemented by the peer; the node calls it for every incoming crawl RPC."""

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        """STORE_TASK: take the tasks we own; refuse keys we are not the closest node for."""
        ...

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        """STORE_BACKUP: hold copies for ``owner``; returns how many were stored."""
        ...

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        """DELETE_BACKUP: ``owner`` finished these URLs (fingerprints by host key): drop the
        copies and remember them as done, copy or not; returns how many copies were dropped."""
        ...

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer:
        """REFRESH_TASK: re-send (STORE_TASK, from an owned task) what is now closer to
        ``sender``; answers how many keys will be sent, or when to ask again."""
        ...

    def peer_added(self, peer: PeerRef) -> None:
        """A node entered the routing table."""
        ...

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        """A node left the routing table: "unresponsive", "goodbye" or "replaced"."""
        ...


class NoWork:
    """A ``CrawlHandler`` that takes no work: it refuses every task and holds no backup (a
    joiner's probe; a benchmark's receiver overrides what it measures)."""

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        return StoreResult(0, 0, [b.key for b in batches])

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        return 0

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        return 0

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer:
        return RefreshAnswer(0)

    def peer_added(self, peer: PeerRef) -> None:
        pass

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        pass


def _args(args: list[Any], n: int, rpc: str) -> list[Any]:
    if len(args) != n:
        raise MessageError(f"{rpc} takes {n} arguments after the sender id, got {len(args)}")
    return args


def _count(value: object, what: str) -> dict[str, Any]:
    if type(value) is not int or value < 0:
        raise TypeError(f"{what} must return a non-negative int, not {value!r}")
    return {"n": value}


def crawl_servers(handler: CrawlHandler) -> dict[str, CrawlServer]:
    """The four crawl RPCs, by wire name, bound to ``handler``."""

    async def store_task(sender: PeerRef, args: list[Any]) -> dict[str, Any]:
        (payload,) = _args(args, 1, "store_task")
        batches = decode_batches(payload)
        result = await handler.handle_store_task(sender, batches)
        if not isinstance(result, StoreResult):
            raise TypeError(f"handle_store_task must return a StoreResult, not {result!r}")
        return store_result_to_wire(result, {b.key for b in batches})

    async def store_backup(sender: PeerRef, args: list[Any]) -> dict[str, Any]:
        owner, payload = _args(args, 2, "store_backup")
        owner = check_id(owner, "owner")
        batches = decode_batches(payload)
        n = await handler.handle_store_backup(sender, owner, batches)
        return _count(n, "handle_store_backup")

    async def delete_backup(sender: PeerRef, args: list[Any]) -> dict[str, Any]:
        owner, payload = _args(args, 2, "delete_backup")
        owner = check_id(owner, "owner")
        done: dict[bytes, list[int]] = {}
        for b in decode_batches(payload):
            if b.tasks:
                raise MessageError("delete_backup carries fingerprints only")
            done.setdefault(b.key, []).extend(b.done)
        n = await handler.handle_delete_backup(sender, owner, done)
        return _count(n, "handle_delete_backup")

    async def refresh_task(sender: PeerRef, args: list[Any]) -> dict[str, Any]:
        _args(args, 0, "refresh_task")
        answer = await handler.handle_refresh_task(sender)
        if not isinstance(answer, RefreshAnswer):
            raise TypeError(f"handle_refresh_task must return a RefreshAnswer, not {answer!r}")
        return refresh_to_wire(answer)

    return {
        "store_task": store_task,
        "store_backup": store_backup,
        "delete_backup": delete_backup,
        "refresh_task": refresh_task,
    }
