"""``CrawlNode``: a kademlia ``Server`` that also moves crawl tasks (seed 001's improved protocol).

The node joins like any Kademlia node (ping a bootstrap contact, then FIND_NODE on its own ID,
§2.3), answers the stock RPCs so plain kademlia peers interoperate, and adds STORE_TASK,
STORE_BACKUP, DELETE_BACKUP, REFRESH_TASK and GOODBYE with typed async methods.

It owns two loops instead of kademlia's ``call_later`` chain (which forgets its interval after
the first run): a liveness loop that pings the closest neighbours and silent contacts every
``ping_interval``, feeding the failure counts that decide eviction, and a refresh loop that
looks up lonely buckets and our own ID every ``refresh_interval`` (§2.3).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kademlia.crawling import NodeSpiderCrawl
from kademlia.network import Server
from kademlia.node import Node

from protocol.errors import BootstrapError, PeerTimeout, RemoteError
from protocol.messages import (
    KeyBatch,
    PeerRef,
    StoreResult,
    check_id,
    count_from_wire,
    encode_chunks,
    encode_fps,
    store_result_from_wire,
)
from protocol.ownership import closest as closest_ids
from protocol.rpc import CrawlProtocol, peer_of
from protocol.service import CrawlHandler, crawl_servers
from protocol.state import SavedState, read_state, write_state
from protocol.tasks import TaskSet

__all__ = ["CrawlHandler", "CrawlNode", "NodeConfig"]

log = logging.getLogger(__name__)

CHUNK_WINDOW = 8  # chunks of one call in flight: a burst must fit the receiver's socket buffer
NEIGHBOUR_PINGS = 8  # closest contacts checked every ping_interval (the likely replicas)
STALE_PINGS = 16  # at most this many long-silent contacts checked per round
SOCKET_BUFFER = 2 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class NodeConfig:
    ksize: int = 20
    alpha: int = 3
    rpc_timeout: float = 2.0
    failures_before_evict: int = 3
    secret: str = ""
    ping_interval: float = 5.0
    refresh_interval: float = 60.0


class CrawlNode(Server):
    protocol: CrawlProtocol | None
    transport: asyncio.DatagramTransport | None

    def __init__(
        self, node_id: bytes, handler: CrawlHandler, config: NodeConfig | None = None
    ) -> None:
        self.config = config or NodeConfig()
        super().__init__(
            ksize=self.config.ksize, alpha=self.config.alpha, node_id=check_id(node_id)
        )
        self.handler = handler
        self._loops = TaskSet("node")
        self._me: PeerRef | None = None
        self._peers_cache: tuple[int, dict[bytes, Node]] = (-1, {})
        self._refresh_runs = 0
        self._ping_rounds = 0

    # --- lifecycle -----------------------------------------------------------------------

    def _create_protocol(self) -> CrawlProtocol:
        proto = CrawlProtocol(
            self.node,
            self.storage,
            self.ksize,
            rpc_timeout=self.config.rpc_timeout,
            failures_before_evict=self.config.failures_before_evict,
            secret=self.config.secret,
            on_added=self.handler.peer_added,
            on_removed=self.handler.peer_removed,
            departed_ttl=max(self.config.refresh_interval, 30.0),
        )
        for name, server in crawl_servers(self.handler).items():
            proto.serve(name, server)
        return proto

    async def listen(self, port: int, interface: str = "0.0.0.0") -> None:
        if self.transport is not None:
            raise RuntimeError("already listening")
        loop = asyncio.get_running_loop()
        transport, self.protocol = await loop.create_datagram_endpoint(
            self._create_protocol, local_addr=(interface, port)
        )
        self.transport = transport
        sock = transport.get_extra_info("socket")
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:  # best effort: bursts of 8 KiB chunks overflow the 208 KiB Linux default
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
            except OSError:
                pass
        host, real_port = transport.get_extra_info("sockname")[:2]
        self.node.ip, self.node.port = host, real_port
        self._me = PeerRef(self.node.id, host, real_port)
        log.info("node %s listening on %s:%s", self._me.short, host, real_port)
        self._loops.spawn(self._every(self.config.ping_interval, self._ping_round), "ping")
        self._loops.spawn(self._every(self.config.refresh_interval, self._refresh_once), "refresh")

    async def listen_on(self, host: str, port: int) -> PeerRef:
        await self.listen(port, host)
        return self.me

    @property
    def me(self) -> PeerRef:
        if self._me is None:
            raise RuntimeError("not listening yet")
        return self._me

    def refresh_table(self, interval: float = 0.0) -> None:
        """Stock entry point: one owned refresh now (our loop keeps the configured interval)."""
        self._loops.spawn(self._refresh_once(), "refresh-now")

    def stop(self) -> None:
        """Synchronous best effort (stock API); prefer ``await aclose()``."""
        self._loops.cancel()
        if self.protocol is not None:
            self.protocol.tasks.cancel()
        super().stop()

    async def aclose(self) -> None:
        await self._loops.aclose()
        if self.protocol is not None:
            await self.protocol.aclose()
        super().stop()

    # --- joining -------------------------------------------------------------------------

    async def join(self, addrs: Sequence[tuple[str, int]]) -> list[PeerRef]:
        """Ping every bootstrap address, then FIND_NODE(self) through those that answered."""
        proto = self._proto()
        resolved = await self._resolve(addrs)
        answers = await asyncio.gather(*(proto.ping_address(a) for a in resolved))
        nodes = [
            Node(node_id, host, port)
            for node_id, (host, port) in zip(answers, resolved, strict=True)
            if node_id is not None and node_id != self.node.id
        ]
        if not nodes:
            raise BootstrapError(
                f"no bootstrap peer answered at {', '.join(f'{h}:{p}' for h, p in addrs)} "
                "(wrong address, peer down, or a different --secret)"
            )
        await NodeSpiderCrawl(proto, self.node, nodes, self.ksize, self.alpha).find()
        return self.peers()

    async def _resolve(self, addrs: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        """Hostnames to IP addresses without blocking the loop (sendto would block on DNS)."""
        loop = asyncio.get_running_loop()
        if self.transport is None:
            raise RuntimeError("not listening yet")
        family = self.transport.get_extra_info("socket").family
        out: list[tuple[str, int]] = []
        for host, port in addrs:
            if type(port) is not int or not 0 < port < 65536:  # getaddrinfo wraps 70000 to 4464
                log.warning("bootstrap address %s:%s has no valid port", host, port)
                continue
            try:
                infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM)
            except (OSError, UnicodeError, OverflowError, TypeError) as exc:
                log.warning("bootstrap address %s:%s unusable: %s", host, port, exc)
                continue
            if infos:
                found = (str(infos[0][4][0]), int(infos[0][4][1]))
                if found not in out:
                    out.append(found)
        return out

    async def bootstrap(self, addrs: Sequence[tuple[str, int]]) -> list[Node]:
        """Stock API, routed through ``join``; returns no error when nobody answers."""
        try:
            await self.join(addrs)
        except BootstrapError:
            return []
        return list(self._members().values())

    # --- crawl RPCs ----------------------------------------------------------------------

    async def store_task(self, peer: PeerRef, batches: Sequence[KeyBatch]) -> StoreResult:
        """STORE_TASK in as many chunks as needed; the results summed.

        Re-sending after a PeerTimeout is safe: the owner deduplicates (reported as
        ``duplicate``), so the caller need not know which chunks arrived.
        """
        chunks = encode_chunks(batches)
        replies = await self._chunked(peer, "store_task", [[p] for p, _ in chunks])
        new = dup = 0
        refused: list[bytes] = []
        for reply, (_, keys) in zip(replies, chunks, strict=True):
            result = _parse(peer, "store_task", store_result_from_wire, reply, keys)
            new += result.new
            dup += result.duplicate
            refused.extend(k for k in result.refused_keys if k not in refused)
        return StoreResult(new, dup, refused)

    async def store_backup(self, peer: PeerRef, owner: bytes, batches: Sequence[KeyBatch]) -> int:
        check_id(owner, "owner")
        chunks = encode_chunks(batches)
        replies = await self._chunked(peer, "store_backup", [[owner, p] for p, _ in chunks])
        return sum(_parse(peer, "store_backup", count_from_wire, r) for r in replies)

    async def delete_backup(self, peer: PeerRef, owner: bytes, fps: Sequence[int]) -> int:
        check_id(owner, "owner")
        chunks = encode_fps(fps)
        replies = await self._chunked(peer, "delete_backup", [[owner, c] for c in chunks])
        return sum(_parse(peer, "delete_backup", count_from_wire, r) for r in replies)

    async def refresh_task(self, peer: PeerRef) -> int:
        reply = await self._proto().request(peer, "refresh_task", [])
        return _parse(peer, "refresh_task", count_from_wire, reply)

    async def goodbye(self, peer: PeerRef) -> None:
        """Graceful leave: ``peer`` drops us from its routing table at once."""
        await self._proto().request(peer, "goodbye", [])

    async def ping_peer(self, peer: PeerRef) -> bytes:
        """The ID that answers at ``peer.addr``; if it differs from ``peer.id``, the table
        already replaced the old contact."""
        ok, node_id = await self._proto().call_ping(Node(peer.id, peer.host, peer.port))
        if not ok:
            raise PeerTimeout(peer, peer.addr, "ping")
        answered: bytes = node_id
        return answered

    async def _chunked(self, peer: PeerRef, rpc: str, arglists: list[list[Any]]) -> list[Any]:
        """Send one request per chunk, ``CHUNK_WINDOW`` at a time, and wait for all of them.

        Liveness is counted once per operation: a burst that loses some datagrams to a full
        socket buffer is not three strikes against a live peer.
        """
        proto = self._proto()
        window = asyncio.Semaphore(CHUNK_WINDOW)

        async def one(args: list[Any]) -> dict[str, Any]:
            async with window:
                return await proto.request(peer, rpc, args, record=False)

        results = await asyncio.gather(*(one(a) for a in arglists), return_exceptions=True)
        node = Node(peer.id, peer.host, peer.port)
        if results and all(isinstance(r, PeerTimeout) for r in results):
            proto.contact_failed(node)
        elif results:
            proto.welcome_if_new(node)
        for kind in (PeerTimeout, RemoteError, BaseException):
            for r in results:
                if isinstance(r, kind):
                    raise r
        return results

    # --- membership ----------------------------------------------------------------------

    def _members(self) -> dict[bytes, Node]:
        router = self._proto().router
        version, members = self._peers_cache
        if version != router.version:
            members = {n.id: n for n in router.members()}
            self._peers_cache = (router.version, members)
        return members

    def peers(self) -> list[PeerRef]:
        return [peer_of(n) for n in self._members().values()]

    def closest_local(self, key: bytes, n: int) -> list[PeerRef]:
        """The ``n`` nodes closest to ``key`` that we know, this node included."""
        members = self._members()
        ids = closest_ids(key, [*members, self.node.id], n)
        return [self.me if i == self.node.id else peer_of(members[i]) for i in ids]

    async def closest(self, key: bytes, n: int) -> list[PeerRef]:
        """Like ``closest_local``, but with an iterative FIND_NODE lookup (§2.3) once the table
        is too big to know everyone (``ksize`` contacts or more)."""
        members = self._members()
        if len(members) < self.ksize:
            return self.closest_local(key, n)
        proto = self._proto()
        target = Node(key)
        start = proto.router.find_neighbors(target, self.ksize)
        found = await NodeSpiderCrawl(proto, target, start, self.ksize, self.alpha).find()
        pool = {node.id: peer_of(node) for node in found}
        pool.update({i: peer_of(node) for i, node in self._members().items()})
        pool[self.node.id] = self.me
        return [pool[i] for i in closest_ids(key, pool, n)]

    # --- stock DHT API, fixed ------------------------------------------------------------

    async def set_digest(self, dkey: bytes, value: Any) -> bool:
        """kademlia's set_digest, except that no live neighbour means False (stock raises
        ValueError from ``max([])``) and only successful stores count (stock's
        ``any([(False, None)])`` is always true)."""
        proto = self._proto()
        node = Node(dkey)
        nearest = proto.router.find_neighbors(node)
        if not nearest:
            return False
        nodes = await NodeSpiderCrawl(proto, node, nearest, self.ksize, self.alpha).find()
        if not nodes:
            return False
        if self.node.distance_to(node) < max(n.distance_to(node) for n in nodes):
            self.storage[dkey] = value
        results = await asyncio.gather(*(proto.call_store(n, dkey, value) for n in nodes))
        return any(ok and stored for ok, stored in results)

    def save_state(self, fname: str | os.PathLike[str]) -> None:
        write_state(
            fname,
            SavedState(self.node.id, self.ksize, self.alpha, self.bootstrappable_neighbors()),
        )

    @classmethod
    async def load_state(
        cls,
        fname: str | os.PathLike[str],
        port: int,
        interface: str = "0.0.0.0",
        *,
        handler: CrawlHandler,
        config: NodeConfig | None = None,
    ) -> CrawlNode:
        """Restore ID and neighbours from JSON, listen, and rejoin through the neighbours."""
        state = read_state(fname)
        base = config or NodeConfig()
        cfg = NodeConfig(
            ksize=state.ksize,
            alpha=state.alpha,
            rpc_timeout=base.rpc_timeout,
            failures_before_evict=base.failures_before_evict,
            secret=base.secret,
            ping_interval=base.ping_interval,
            refresh_interval=base.refresh_interval,
        )
        node = cls(state.node_id, handler, cfg)
        await node.listen(port, interface)
        if state.neighbors:
            try:
                await node.join(state.neighbors)
            except BootstrapError as exc:
                log.warning("saved neighbours did not answer: %s", exc)
        return node

    # --- background loops ----------------------------------------------------------------

    async def _every(self, interval: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except Exception:  # a dead loop would silently stop liveness checks
                log.exception("background job %s failed", job.__name__)

    async def _ping_round(self) -> None:
        proto = self._proto()
        router = proto.router
        now = time.monotonic()

        def silent_for(node: Node) -> float:
            return now - (router.last_seen(node.id) or 0.0)

        members = list(self._members().values())
        near = closest_ids(self.node.id, [n.id for n in members], NEIGHBOUR_PINGS)
        by_id = {n.id: n for n in members}
        targets = [by_id[i] for i in near if silent_for(by_id[i]) >= self.config.ping_interval]
        stale = sorted(
            (n for n in members if silent_for(n) > self.config.refresh_interval),
            key=silent_for,
            reverse=True,
        )
        targets += [n for n in stale[:STALE_PINGS] if n not in targets]
        await asyncio.gather(*(proto.call_ping(n) for n in targets))
        self._ping_rounds += 1

    async def _refresh_once(self) -> None:
        """§2.3: look up a random ID in each bucket idle for ``refresh_interval``, plus our own
        ID (finds new close neighbours); then republish stored values older than an hour."""
        proto = self._proto()
        targets = [self.node.id]
        for bucket in proto.router.lonely_buckets(self.config.refresh_interval):
            low, high = bucket.range
            rid = min(low + secrets.randbelow(high - low + 1), 2**160 - 1)
            targets.append(rid.to_bytes(20, "big"))
        crawls = []
        for target in targets:
            node = Node(target)
            nearest = proto.router.find_neighbors(node, self.alpha)
            if nearest:
                crawls.append(NodeSpiderCrawl(proto, node, nearest, self.ksize, self.alpha).find())
        await asyncio.gather(*crawls)
        for dkey, value in self.storage.iter_older_than(3600):
            await self.set_digest(dkey, value)
        self._refresh_runs += 1

    # --- introspection -------------------------------------------------------------------

    def _proto(self) -> CrawlProtocol:
        if self.protocol is None:
            raise RuntimeError("not listening yet")
        return self.protocol

    def stats(self) -> dict[str, object]:
        proto = self._proto()
        out = proto.stats.snapshot()
        out.update(
            peers=len(self._members()),
            outstanding=proto.outstanding(),
            tasks=len(proto.tasks),
            ping_rounds=self._ping_rounds,
            refresh_runs=self._refresh_runs,
        )
        return out

    def buckets(self) -> list[dict[str, object]]:
        router = self._proto().router
        now = time.monotonic()
        out: list[dict[str, object]] = []
        for bucket in router.buckets:
            low, high = bucket.range
            peers = []
            for n in bucket.nodes.values():
                seen = router.last_seen(n.id)
                peers.append(
                    {
                        "id": n.id.hex()[:8],
                        "addr": f"{n.ip}:{n.port}",
                        "last_seen_s": None if seen is None else round(now - seen, 1),
                        "failures": router.failures(n.id),
                    }
                )
            out.append(
                {
                    "range": [f"{low:040x}", f"{min(high, 2**160 - 1):040x}"],
                    "peers": peers,
                    "replacements": len(bucket.replacement_nodes),
                }
            )
        return out


def _parse(peer: PeerRef, rpc: str, parser: Callable[..., Any], reply: Any, *extra: Any) -> Any:
    """Turn a reply that breaks the wire rules into RemoteError (the peer is alive but odd)."""
    try:
        return parser(reply, *extra)
    except ValueError as exc:
        raise RemoteError(peer, rpc, f"malformed reply: {exc}") from None
