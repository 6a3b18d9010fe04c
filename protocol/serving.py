"""The receiving side of the four crawl RPCs, and the handler contract.

The RPCs are those of "Distributed Crawler Based on the Improved Kademlia Protocol", §2.2.2.

The node decodes and validates each request here, calls the crawler's ``CrawlHandler`` and
turns its answer into a small reply map. A ``MessageError`` raised here becomes an error reply
("bad arguments"), any other exception an error reply naming it: the caller always hears back.

Handlers run while the caller waits (``rpc_timeout``), so they must only enqueue work: a slow
handler makes the caller count a timeout against a live peer.

A request that does not speak for its sender (an open wire's unsigned request naming a node
whose ID was proven to us: ``rpc.Rpc.serve_deferred``) is served as a stranger's would be:
its tasks are taken (a stranger may offer tasks), the fingerprints it says are done are not:
STORE_TASK and STORE_BACKUP lose them, DELETE_BACKUP does nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

from protocol.errors import MessageError
from protocol.messages import (
    DELETE_BACKUP,
    REFRESH_TASK,
    STORE_BACKUP,
    STORE_TASK,
    BackupReply,
    Held,
    KeyBatch,
    PeerRef,
    RefreshAnswer,
    RefreshReply,
    StoreResult,
    StoreTaskReply,
    backup_reply,
    decode_batches,
    refresh_reply,
    store_reply,
)
from protocol.procedures import Count, CrawlServer, NoArgs, parse_args, typed

__all__ = ["CrawlHandler", "NoWork", "crawl_servers"]


class CrawlHandler(Protocol):
    """Implemented by the peer; the node calls it for every incoming crawl RPC."""

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        """STORE_TASK: take the tasks we own; refuse keys we are not the closest node for."""
        ...

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> Held:
        """STORE_BACKUP: hold copies for ``owner``; returns how many were stored, and the
        fingerprints of those not stored because they are done already."""
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
        """A node became a member: it may own keys (``members``)."""
        ...

    def contact_added(self, peer: PeerRef) -> None:
        """A node entered the routing table, too young to own keys: it may hold copies."""
        ...

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        """A node left the routing table, member or not: "unresponsive", "goodbye" or
        "replaced"."""
        ...


class NoWork:
    """A ``CrawlHandler`` that takes no work: it refuses every task and holds no backup (a
    joiner's probe; a benchmark's receiver overrides what it measures)."""

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        return StoreResult(0, 0, [b.key for b in batches])

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> Held:
        return Held(0)

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        return 0

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer:
        return RefreshAnswer(0)

    def peer_added(self, peer: PeerRef) -> None:
        pass

    def contact_added(self, peer: PeerRef) -> None:
        pass

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        pass


def _count(value: object, what: str) -> Count:
    if type(value) is not int or value < 0:
        raise TypeError(f"{what} must return a non-negative int, not {value!r}")
    return Count(value)


def crawl_servers(handler: CrawlHandler) -> dict[str, CrawlServer]:
    """The four crawl RPCs, by wire name, bound to ``handler``."""

    async def store_task(sender: PeerRef, raw: list[Any], attested: bool) -> StoreTaskReply:
        batches = _claims_of(decode_batches(parse_args(STORE_TASK, raw).payload), attested)
        result = await handler.handle_store_task(sender, batches)
        if not isinstance(result, StoreResult):
            raise TypeError(f"handle_store_task must return a StoreResult, not {result!r}")
        return store_reply(result, {b.key for b in batches})

    async def store_backup(sender: PeerRef, raw: list[Any], attested: bool) -> BackupReply:
        args = parse_args(STORE_BACKUP, raw)
        batches = _claims_of(decode_batches(args.payload), attested)
        held = await handler.handle_store_backup(sender, args.owner, batches)
        if not isinstance(held, Held):
            raise TypeError(f"handle_store_backup must return Held, not {held!r}")
        return backup_reply(held)  # at most MAX_KNOWN of them: the reply fits its datagram

    async def delete_backup(sender: PeerRef, raw: list[Any], attested: bool) -> Count:
        args = parse_args(DELETE_BACKUP, raw)
        done: dict[bytes, list[int]] = {}
        for b in decode_batches(args.payload):
            if b.tasks:
                raise MessageError("delete_backup carries fingerprints only")
            done.setdefault(b.key, []).extend(b.done)
        if not attested:
            return Count(0)
        n = await handler.handle_delete_backup(sender, args.owner, done)
        return _count(n, "handle_delete_backup")

    async def refresh_task(sender: PeerRef, args: NoArgs) -> RefreshReply:
        answer = await handler.handle_refresh_task(sender)
        if not isinstance(answer, RefreshAnswer):
            raise TypeError(f"handle_refresh_task must return a RefreshAnswer, not {answer!r}")
        return refresh_reply(answer)

    return {
        STORE_TASK.name: store_task,
        STORE_BACKUP.name: store_backup,
        DELETE_BACKUP.name: delete_backup,
        REFRESH_TASK.name: typed(REFRESH_TASK, refresh_task),
    }


def _claims_of(batches: list[KeyBatch], attested: bool) -> list[KeyBatch]:
    """The batches as taken from their sender: without their done fingerprints if the request
    does not speak for it."""
    return batches if attested else [KeyBatch(b.key, b.tasks) for b in batches if b.tasks]
