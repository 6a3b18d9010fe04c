"""The network view, live: this peer's status address announced in the DHT, the others'
looked up and asked for their status (``/network``, ``/api/network``, ``status --network``).

Any peer can build the whole view: it walks its routing table, looks each node's
announcement up (Kademlia FIND_VALUE, :mod:`~p2pcrawl.network.announce`) and asks that
status server for ``/api/status``, with the token of the server it runs in: a network whose
status servers need a token gives them all the same one. It asks only at the UDP host it knows
the peer by: an announcement naming another host is not that peer's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from p2pcrawl.aio import Memo, every
from p2pcrawl.network import (
    ANNOUNCE_EVERY_S,
    ANNOUNCE_MAX_AGE_S,
    Announcement,
    announce_key,
    announced_address,
    decode_announcement,
    encode_announcement,
    loopback_only,
    same_host,
)
from p2pcrawl.ui.netview import (
    MAX_PEERS,
    PeerRow,
    collect_rows,
    format_network,
    network_state,
    network_view,
)

__all__ = [
    "ANNOUNCE_EVERY_S",
    "ANNOUNCE_MAX_AGE_S",
    "Announcement",
    "NetworkMonitor",
    "PeerRow",
    "announce_key",
    "announced_address",
    "collect_rows",
    "decode_announcement",
    "encode_announcement",
    "format_network",
    "loopback_only",
    "network_state",
    "network_view",
]

log = logging.getLogger(__name__)

LOOKUP_TTL_S = 30.0
VIEW_TTL_S = 1.0  # a page polling every second, from several tabs, costs one round
NETWORK_LIMIT_EVERY_S = 2.0
FAST_ANNOUNCE_S = 5.0  # while the routing table changes (a network forming), announce often


class NetworkMonitor:
    """Announces this peer's status address in the DHT and builds the network view.

    Owned by the status server: ``start`` and ``aclose`` bracket its announce task and its
    HTTP session.
    """

    def __init__(self, peer: Any, status_addr: Callable[[], str], token: str = "") -> None:
        self.peer = peer
        self.status_addr = status_addr
        self.token = token
        self.announced = 0  # announcements stored (locally at least)
        self._lookups: Memo[bytes, tuple[str, float]] = Memo(MAX_PEERS * 2)
        self._udp_hosts: dict[bytes, str] = {}
        self._view: tuple[float, dict[str, Any]] | None = None
        self._view_lock = asyncio.Lock()
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._limit_task: asyncio.Task[None] | None = None
        self._announced_at = -ANNOUNCE_EVERY_S
        self._announced_peers = -1

    async def start(self) -> None:
        import aiohttp

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=3.0)
        )
        self._task = asyncio.ensure_future(
            every(1.0, self._announce_round, first=0.0, failures=logging.DEBUG)
        )
        if self.peer.config.crawl.scope.max_network_pages:
            self._limit_task = asyncio.ensure_future(
                every(NETWORK_LIMIT_EVERY_S, self._check_network_limit)
            )

    async def aclose(self) -> None:
        if self._limit_task is not None:
            self._limit_task.cancel()
            await asyncio.gather(self._limit_task, return_exceptions=True)
            self._limit_task = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- announcing --------------------------------------------------------------------------

    def _secret(self) -> str:
        return str(self.peer.config.peer.secret or "")

    async def announce(self) -> bool:
        """Store this peer's status address in the DHT; False while there is nothing to
        announce yet (the peer is still joining)."""
        from protocol import PeerTimeout, RemoteError, key_for

        node = self.peer.node
        if node is None or self.peer.state not in ("active", "finished"):
            return False
        key = announce_key(self.peer.node_id)
        sign = node.identities.sign if node.identities.required else None
        value = encode_announcement(
            self.peer.node_id, self.status_addr(), self._secret(), sign=sign
        )
        # Kept here too: a lone founder has no neighbour to store it on, and kademlia hands
        # stored values on to the nodes that join later (Kademlia §2.5).
        node.storage[key_for(key)] = value
        self.announced += 1
        if node.peers():
            try:
                await node.set(key, value)
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.debug("status announcement not stored: %s", exc)
        return True

    async def _announce_round(self) -> None:
        """Announce when due, or soon after the routing table changed. The node closes under
        this while the peer stops (logged at debug level); the next round retries."""
        node = self.peer.node
        peers = len(node.peers()) if node is not None and node.listening else -1
        now = time.monotonic()
        due = now - self._announced_at >= ANNOUNCE_EVERY_S
        changed = peers != self._announced_peers and now - self._announced_at >= FAST_ANNOUNCE_S
        # A joiner's server starts before its peer has joined: it counts as announced only
        # once it was (it waited a whole ANNOUNCE_EVERY_S, and the others' views said "not
        # announced yet" that long).
        if peers >= 0 and (due or changed) and await self.announce():
            self._announced_at, self._announced_peers = now, peers

    async def _check_network_limit(self) -> None:
        """--max-network-pages: stop fetching once the peers together fetched that many.

        The total is the network view's, so it counts the peers whose status servers this
        one reaches, and it is read every few seconds: the crawl may overshoot by what the
        network fetches in that time.
        """
        limit = int(self.peer.config.crawl.scope.max_network_pages)
        engine = self.peer.engine
        if engine is None or engine.network_limit_reached or self.peer.node is None:
            return
        try:
            doc = await self.view()
        except Exception:
            log.debug("network view for --max-network-pages failed", exc_info=True)
            return
        total = int(doc["totals"]["pages_fetched"])
        if total >= limit:
            engine.network_limit_reached = True
            log.info(
                "network page limit reached: %d pages fetched by %d peers "
                "(--max-network-pages %d); this peer stops fetching",
                total,
                doc["peers_reachable"],
                limit,
            )
            self.peer.events.add("network_limit", pages=total)

    # -- the view ----------------------------------------------------------------------------

    async def lookup(self, node_id: bytes) -> str | None:
        from protocol import PeerTimeout, RemoteError

        hit = self._lookups.get(node_id)
        now = time.monotonic()
        if hit is not None and now - hit[1] < LOOKUP_TTL_S:
            return hit[0]
        node = self.peer.node
        if node is None:
            return None
        try:
            raw = await node.get(announce_key(node_id))
        except (PeerTimeout, RemoteError, OSError):
            return None
        ids = node.identities
        verify = ids.verify if ids.required else None
        ann = decode_announcement(raw, node_id, self._secret(), verify=verify)
        if ann is None:
            return None
        self._lookups.remember(node_id, (ann.status, now))
        return ann.status

    async def lookup_reachable(self, node_id: bytes) -> str | None:
        addr = await self.lookup(node_id)
        udp_host = self._udp_hosts.get(node_id)
        if addr is not None and udp_host is not None:
            why = loopback_only(addr, udp_host)
            if why is not None:
                raise OSError(why)
            if not same_host(addr.rpartition(":")[0], udp_host):
                raise OSError(f"its announced status address {addr} is not at its own host")
        return addr

    async def recrawl_at(self, node_id: bytes, url: str) -> dict[str, Any] | None:
        """Ask the owner's own status server to seed ``url`` with ``recrawl``; its verdict, or
        None when it cannot be asked (no announcement, unreachable, refused)."""
        import aiohttp

        try:
            addr = await self.lookup_reachable(node_id)
            if addr is None or self._session is None:
                return None
            body = {"urls": [url], "recrawl": True}
            async with self._session.post(f"http://{addr}/api/seed", json=body) as resp:
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.info("asking %s to recrawl %s failed: %s", node_id.hex()[:8], url, exc)
            return None
        if resp.status != 200 or not isinstance(doc, dict):
            return None
        seeds = doc.get("seeds")
        if not isinstance(seeds, list) or len(seeds) != 1 or not isinstance(seeds[0], dict):
            return None
        return dict(seeds[0])

    async def fetch(self, addr: str) -> dict[str, Any]:
        assert self._session is not None
        async with self._session.get(f"http://{addr}/api/status") as resp:
            doc = await resp.json(content_type=None)
            if resp.status != 200 or not isinstance(doc, dict):
                error = doc.get("error") if isinstance(doc, dict) else None
                raise OSError(f"{addr} answered {resp.status}: {error or 'not a status'}")
            return doc

    async def view(self) -> dict[str, Any]:
        async with self._view_lock:
            now = time.monotonic()
            if self._view is not None and now - self._view[0] < VIEW_TTL_S:
                return self._view[1]
            node = self.peer.node
            known = node.peers() if node is not None and node.listening else []
            self._udp_hosts = {p.id: p.host for p in known}
            me = PeerRow(self.peer.node_id.hex(), self.status_addr(), self.peer.status(), me=True)
            others = [p.id for p in known]
            rows = await collect_rows(me, others, self.lookup_reachable, self.fetch)
            doc = network_view(rows)
            self._view = (time.monotonic(), doc)
            return doc
