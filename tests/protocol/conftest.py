"""Fixtures for protocol tests: real UDP nodes on 127.0.0.1, port 0, and a dict-backed handler."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import pytest

from protocol import (
    CrawlNode,
    Held,
    KeyBatch,
    NodeConfig,
    PeerRef,
    RefreshAnswer,
    StoreResult,
    TaskItem,
    new_node_id,
)

BOOM = "https://boom.example/raise"  # a URL that makes MemoryHandler raise

# Background loops are slow by default so they don't interfere; tests that need them say so.
FAST: dict[str, Any] = {"rpc_timeout": 0.3, "ping_interval": 30.0, "refresh_interval": 60.0}


def fp(url: str) -> int:
    return int.from_bytes(hashlib.sha1(url.encode()).digest()[:8], "big")


class MemoryHandler:
    """A real CrawlHandler that keeps everything in dicts (no mocking: it does the work)."""

    def __init__(self) -> None:
        self.tasks: dict[bytes, list[TaskItem]] = {}
        self.seen: set[str] = set()
        self.backups: dict[bytes, dict[int, TaskItem]] = {}
        self.refuse: set[bytes] = set()
        self.done_seen: set[tuple[bytes, int]] = set()
        self.refresh_from: list[PeerRef] = []
        self.added: list[PeerRef] = []
        self.removed: list[tuple[PeerRef, str]] = []

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        new = dup = 0
        refused: list[bytes] = []
        for b in batches:
            if b.key in self.refuse:
                refused.append(b.key)
                continue
            for t in b.tasks:
                if t.url == BOOM:
                    raise RuntimeError("handler exploded")
                if t.url in self.seen:
                    dup += 1
                else:
                    self.seen.add(t.url)
                    self.tasks.setdefault(b.key, []).append(t)
                    new += 1
        return StoreResult(new, dup, refused)

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> Held:
        held = self.backups.setdefault(owner, {})
        for b in batches:
            for t in b.tasks:
                held[fp(t.url)] = t
        return Held(sum(len(b.tasks) for b in batches))

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        held = self.backups.get(owner, {})
        self.done_seen.update((k, f) for k, fps in done.items() for f in fps)
        return sum(held.pop(f, None) is not None for fps in done.values() for f in fps)

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer:
        self.refresh_from.append(sender)
        return RefreshAnswer(sum(len(v) for v in self.tasks.values()))

    def peer_added(self, peer: PeerRef) -> None:
        self.added.append(peer)

    def contact_added(self, peer: PeerRef) -> None:
        pass

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        self.removed.append((peer, reason))


def handler_of(node: CrawlNode) -> MemoryHandler:
    return cast(MemoryHandler, node.handler)


NodeFactory = Callable[..., Awaitable[CrawlNode]]


@pytest.fixture
async def make_node() -> AsyncIterator[NodeFactory]:
    """``await make_node(node_id=..., port=..., **NodeConfig fields)``; all closed at teardown."""
    nodes: list[CrawlNode] = []

    async def factory(node_id: bytes | None = None, port: int = 0, **config: Any) -> CrawlNode:
        node = CrawlNode(
            node_id or new_node_id(), MemoryHandler(), NodeConfig(**{**FAST, **config})
        )
        await node.listen_on("127.0.0.1", port)
        nodes.append(node)
        return node

    yield factory
    for node in nodes:
        await node.aclose()


async def eventually(check: Callable[[], bool], timeout: float = 3.0) -> None:
    """Wait until ``check()`` holds (the network is asynchronous); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


@pytest.fixture
def raw_socket() -> Any:
    """A plain UDP socket for sending hand-made datagrams."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


async def recv(sock: socket.socket, timeout: float) -> bytes | None:
    """One datagram from ``sock``, or None after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.sock_recv(sock, 65536), timeout)
    except TimeoutError:
        return None
