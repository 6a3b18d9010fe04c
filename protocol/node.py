"""``CrawlNode``: a kademlia ``Server`` that also moves crawl tasks.

The improved protocol of "Distributed Crawler Based on the Improved Kademlia Protocol", §2.2.

The node joins like any Kademlia node (ping a bootstrap contact, then FIND_NODE on its own ID,
§2.3), answers the stock RPCs so plain kademlia peers interoperate, and adds STORE_TASK,
STORE_BACKUP, DELETE_BACKUP, REFRESH_TASK (``calls`` / ``service``) and GOODBYE. It owns every
task it starts: the liveness and refresh loops (``upkeep``) and, through the protocol, every
handler and check; ``aclose()`` cancels and awaits them all, then closes the socket.

What the crawler sees of the routing table (``peers``, ``closest_local``, ``closest`` and the
``peer_added`` callback) leaves out contacts admitted less than ``min_owner_age`` seconds ago:
a new ID takes over keys only once it has stayed live that long, so a node that appears next
to a busy key and vanishes again cannot catch the key's queue on the way. Contacts found while
this node joins count as established at once: a joiner has nothing older to compare with.
So does an ID that was established before and comes back (a restart with its data directory):
it proved itself already, and making it wait would leave its own queue and the replicas'
takeover of it crawling the same hosts. A contact old enough that asks for its keys
(REFRESH_TASK) is counted at once, even if its timer has not run yet (``establish_early``).

The rule holds for this node about itself too: while it joins (``hold_ownership`` until
``take_ownership``) it names itself owner of nothing, so the keys it will own stay with their
old owner until that owner has handed them over; otherwise the newcomer would crawl a host
while its old owner, which does not count the newcomer yet, crawls it too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kademlia.crawling import NodeSpiderCrawl
from kademlia.network import Server
from kademlia.node import Node

from protocol.admission import AdmissionLimits
from protocol.calls import CrawlCalls
from protocol.endpoint import InboundLimits
from protocol.errors import BootstrapError
from protocol.liveness import LagMonitor, LivenessConfig, socket_drops, socket_inode
from protocol.membership import peer_of
from protocol.model import PeerRef, check_id
from protocol.ownership import closest as closest_ids
from protocol.rpc import CrawlProtocol
from protocol.service import CrawlHandler, crawl_servers
from protocol.state import SavedState, read_state, write_state
from protocol.tasks import TaskSet
from protocol.upkeep import ProbeRound, every, ping_round, probe_suspects, refresh_once
from protocol.valuestore import BoundedStorage, StoreLimits

__all__ = ["CrawlHandler", "CrawlNode", "NodeConfig"]

log = logging.getLogger(__name__)

PROVEN_IDS = 4096  # established IDs remembered after they leave the table
SOCKET_BUFFER = 2 * 1024 * 1024  # bursts of 8 KiB chunks overflow the 208 KiB Linux default
CLOSEST_CACHE = 8192  # keys whose closest nodes are remembered until the table changes


@dataclass(frozen=True, slots=True)
class NodeConfig:
    ksize: int = 20
    alpha: int = 3
    rpc_timeout: float = 2.0
    # Liveness (``liveness``): a suspect is declared dead after this many failed probe
    # rounds *and* ``suspicion_timeout`` seconds (times the local health multiplier).
    failures_before_evict: int = 3
    suspicion_timeout: float = 10.0
    indirect_probes: int = 3
    secret: str = ""
    ping_interval: float = 5.0
    refresh_interval: float = 60.0
    min_owner_age: float = 0.0  # seconds a new contact must stay live before it owns keys
    store_limits: StoreLimits = field(default_factory=StoreLimits)
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    inbound: InboundLimits = field(default_factory=InboundLimits)


class CrawlNode(CrawlCalls, Server):
    protocol: CrawlProtocol | None
    transport: asyncio.DatagramTransport | None
    # What serves our socket; a joiner's probe (``survey``) swaps in one that answers nothing.
    protocol_class: type[CrawlProtocol] = CrawlProtocol
    # How the log names it: a joiner's probe listens under an ID of its own first.
    role = "node"

    def __init__(
        self, node_id: bytes, handler: CrawlHandler, config: NodeConfig | None = None
    ) -> None:
        self.config = config or NodeConfig()
        cfg = self.config
        super().__init__(
            ksize=cfg.ksize,
            alpha=cfg.alpha,
            node_id=check_id(node_id),
        )
        # Set here, not passed: kademlia's ``storage or ForgetfulStorage()`` would take an
        # empty store (len 0) for no store at all.
        self.storage: BoundedStorage = BoundedStorage(cfg.store_limits)
        self.handler = handler
        self._admitted: dict[bytes, asyncio.TimerHandle | None] = {}  # None once established
        self._admitted_at: dict[bytes, float] = {}  # loop time a contact entered the table
        self._established_version = 0
        self._owner_ready = True  # False while joining: this node owns no key yet
        self._joining = False
        # IDs established before, most recent last (bounded: an attacker's IDs are new ones).
        self._proven: OrderedDict[bytes, None] = OrderedDict()
        self._loops = TaskSet("node")
        self._me: PeerRef | None = None
        self._members_cache: tuple[int, dict[bytes, Node]] = (-1, {})
        # closest_local's answers while the members stay the same: (key, n, self included)
        # -> PeerRefs, tagged with the members' version and our own address.
        self._closest_tag: tuple[int, PeerRef | None] = (-1, None)
        self._closest_cache: dict[tuple[bytes, int, bool], tuple[PeerRef, ...]] = {}
        self._refresh_runs = 0
        self._ping_rounds = 0
        # A stall longer than the suspicion timeout may have got us declared dead: the
        # crawler re-checks what it owns before fetching on (``on_stall``).
        self.on_stall: Callable[[float], None] | None = None
        self.lag = LagMonitor(stall_after=self.config.suspicion_timeout / 2, on_stall=self._stalled)
        self._sock_inode: int | None = None
        self._sock_drops: int | None = None
        self._junk_seen = 0
        self.last_round = ProbeRound()

    # --- lifecycle -----------------------------------------------------------------------

    def _create_protocol(self) -> CrawlProtocol:
        proto = self.protocol_class(
            self.node,
            self.storage,
            self.ksize,
            rpc_timeout=self.config.rpc_timeout,
            liveness=LivenessConfig(
                suspicion_timeout=self.config.suspicion_timeout,
                min_failed_rounds=self.config.failures_before_evict,
                indirect_probes=self.config.indirect_probes,
            ),
            secret=self.config.secret,
            on_added=self._contact_added,
            on_removed=self._contact_removed,
            departed_ttl=max(self.config.refresh_interval, 30.0),
            admission=self.config.admission,
            inbound=self.config.inbound,
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
            try:  # best effort: capped by net.core.rmem_max / wmem_max
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
            except OSError:
                pass
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < SOCKET_BUFFER:
            log.warning(
                "UDP receive buffer capped at %d KiB (sysctl net.core.rmem_max): bursts of "
                "task chunks may be dropped and retried",
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 1024,
            )
        host, real_port = transport.get_extra_info("sockname")[:2]
        self.node.ip, self.node.port = host, real_port
        self._me = PeerRef(self.node.id, host, real_port)
        log.info("%s %s listening on %s:%s", self.role, self._me.short, host, real_port)
        self._sock_inode = socket_inode(sock.fileno())
        self._sock_drops = await asyncio.to_thread(socket_drops, self._sock_inode)
        self._loops.spawn(self.lag.run(), "lag")
        self._loops.spawn(every(self.config.ping_interval, self._ping_round), "ping")
        self._loops.spawn(every(self.config.refresh_interval, self._refresh_once), "refresh")

    async def listen_on(self, host: str, port: int) -> PeerRef:
        """Listen on ``host:port`` (port 0 picks a free one); returns ``me``."""
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
        """Cancel and await every task the node owns, then close the socket."""
        for timer in self._admitted.values():
            if timer is not None:
                timer.cancel()
        await self._loops.aclose()
        if self.protocol is not None:
            await self.protocol.aclose()
        super().stop()

    # --- joining -------------------------------------------------------------------------

    async def join(self, addrs: Sequence[tuple[str, int]]) -> list[PeerRef]:
        """Ping every bootstrap address, then FIND_NODE(self) through those that answered
        (§2.3: this fills our table and announces us to the nodes near our ID)."""
        proto = self._proto()
        self._joining = True
        try:
            return await self._join(proto, addrs)
        finally:
            self._joining = False

    async def _join(self, proto: CrawlProtocol, addrs: Sequence[tuple[str, int]]) -> list[PeerRef]:
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
        # The lookup's contacts enter the table through admission challenges; wait for them
        # (each is one ping, so a few timeouts bound this).
        await proto.admission.settle(3 * self.config.rpc_timeout)
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
            except (OSError, UnicodeError) as exc:
                log.warning("bootstrap address %s:%s unusable: %s", host, port, exc)
                continue
            found = (str(infos[0][4][0]), int(infos[0][4][1]))
            if found not in out:
                out.append(found)
        return out

    async def bootstrap(self, addrs: Sequence[tuple[str, int]]) -> list[Node]:
        """Stock API, routed through ``join``; returns [] when nobody answers."""
        try:
            await self.join(addrs)
        except BootstrapError:
            return []
        return list(self._members().values())

    # --- membership ----------------------------------------------------------------------

    def _proto(self) -> CrawlProtocol:
        if self.protocol is None:
            raise RuntimeError("not listening yet")
        return self.protocol

    def _members(self) -> dict[bytes, Node]:
        """The established members of the routing table."""
        router = self._proto().router
        version, members = self._members_cache
        now = router.version + self._established_version
        if version != now:
            members = {
                n.id: n
                for n in router.members()
                if n.id in self._admitted and self._admitted[n.id] is None
            }
            self._members_cache = (now, members)
        return members

    def _contact_added(self, peer: PeerRef) -> None:
        self._admitted_at.setdefault(peer.id, asyncio.get_running_loop().time())
        if self.config.min_owner_age <= 0 or self._joining or peer.id in self._proven:
            self._establish(peer)
            return
        if peer.id not in self._admitted:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(self.config.min_owner_age, self._establish, peer)
            self._admitted[peer.id] = timer

    def owner_wait(self, peer_id: bytes) -> float | None:
        """Seconds until the contact may own keys: 0 once established, None if it is not in
        the routing table (not admitted yet, or gone)."""
        if peer_id not in self._admitted:
            return None
        if self._admitted[peer_id] is None:
            return 0.0
        age = asyncio.get_running_loop().time() - self._admitted_at.get(peer_id, 0.0)
        return max(0.0, self.config.min_owner_age - age)

    def establish_early(self, peer_id: bytes) -> bool:
        """Make sure a contact that has reached the minimum age counts as an owner now, even
        if its timer has not run yet (it asked for its keys: REFRESH_TASK, and is about to
        be answered from ``closest_local``). False if it is absent or too young."""
        if self.owner_wait(peer_id) != 0.0:
            return False
        timer = self._admitted.get(peer_id)
        node = self._proto().router.get(peer_id)
        if timer is not None and node is not None:
            timer.cancel()
            self._establish(peer_of(node))
        return True

    def hold_ownership(self) -> None:
        """Own no key until ``take_ownership``: this node is joining."""
        if self._owner_ready:
            self._owner_ready = False
            self._established_version += 1

    def take_ownership(self) -> bool:
        """Own the keys closest to this node from now on; True if that is a change."""
        if self._owner_ready:
            return False
        self._owner_ready = True
        self._established_version += 1
        return True

    def _establish(self, peer: PeerRef) -> None:
        if peer.id in self._admitted and self._admitted[peer.id] is None:
            return
        if self._proto().router.get(peer.id) is None:
            self._admitted.pop(peer.id, None)  # left before it was established
            return
        self._admitted[peer.id] = None
        self._proven[peer.id] = None
        self._proven.move_to_end(peer.id)
        if len(self._proven) > PROVEN_IDS:
            self._proven.popitem(last=False)
        self._established_version += 1
        self.handler.peer_added(peer)

    def _contact_removed(self, peer: PeerRef, reason: str) -> None:
        self._admitted_at.pop(peer.id, None)
        if peer.id not in self._admitted:
            return
        timer = self._admitted.pop(peer.id)
        if timer is None:  # the crawler only hears of contacts it was told about
            self._established_version += 1
            self.handler.peer_removed(peer, reason)
        else:
            timer.cancel()

    def peers(self) -> list[PeerRef]:
        """Everyone in the routing table (never this node)."""
        return [peer_of(n) for n in self._members().values()]

    def is_member(self, peer_id: bytes) -> bool:
        """In the routing table and established: what ``peers`` lists, without the list."""
        return peer_id in self._members()

    def closest_local(self, key: bytes, n: int, *, with_self: bool | None = None) -> list[PeerRef]:
        """The ``n`` known nodes XOR-closest to ``key``, this node included (kademlia's own
        lookups never return the local node) unless it is joining (``hold_ownership``);
        ``with_self`` overrides that."""
        members = self._members()
        mine = self._owner_ready if with_self is None else with_self
        # Asked per key, for every page finished and every batch stored or copied: the XOR
        # sort over the table was a measurable share of a peer's CPU at eight peers.
        tag = (self._members_cache[0], self._me)
        if tag != self._closest_tag or len(self._closest_cache) >= CLOSEST_CACHE:
            self._closest_tag, self._closest_cache = tag, {}
        hit = self._closest_cache.get((key, n, mine))
        if hit is None:
            ids = closest_ids(key, [*members, self.node.id] if mine else list(members), n)
            hit = tuple(self.me if i == self.node.id else peer_of(members[i]) for i in ids)
            self._closest_cache[(key, n, mine)] = hit
        return list(hit)

    async def closest(self, key: bytes, n: int) -> list[PeerRef]:
        """Like ``closest_local``; once the table may not know everyone (``ksize`` contacts or
        more) an iterative FIND_NODE lookup (§2.3) is merged in first."""
        members = self._members()
        if len(members) < self.ksize:
            return self.closest_local(key, n)
        proto = self._proto()
        target = Node(key)
        start = proto.router.find_neighbors(target, self.ksize)
        found = await NodeSpiderCrawl(proto, target, start, self.ksize, self.alpha).find()
        pool = {node.id: peer_of(node) for node in found}
        pool.update({i: peer_of(node) for i, node in self._members().items()})
        if self._owner_ready:
            pool[self.node.id] = self.me
        else:
            pool.pop(self.node.id, None)
        return [pool[i] for i in closest_ids(key, pool, n)]

    # --- stock DHT API, fixed ------------------------------------------------------------

    async def set_digest(self, dkey: bytes, value: Any) -> bool:
        """kademlia's set_digest, except that no live neighbour means False (stock raised
        ValueError from ``max([])``) and only successful stores count (stock's
        ``any([(False, None)])`` was always true)."""
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
        """ID and neighbours as JSON (stock: pickle, which runs code when loaded)."""
        neighbors = self.bootstrappable_neighbors()
        write_state(fname, SavedState(self.node.id, self.ksize, self.alpha, neighbors))

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
        cfg = replace(config or NodeConfig(), ksize=state.ksize, alpha=state.alpha)
        node = cls(state.node_id, handler, cfg)
        await node.listen(port, interface)
        if state.neighbors:
            try:
                await node.join(state.neighbors)
            except BootstrapError as exc:
                log.warning("saved neighbours did not answer: %s", exc)
        return node

    # --- background loops and introspection ----------------------------------------------

    async def _ping_round(self) -> None:
        """Ping, probe the suspects, then fold what this round saw into our local health."""
        proto, cfg = self._proto(), self.config
        seen = ProbeRound()
        await ping_round(proto, cfg.ping_interval, cfg.refresh_interval, seen)
        await probe_suspects(proto, cfg.indirect_probes, seen)
        proto.liveness.health.round(
            loop_lag=self.lag.take(),
            socket_drops=await self._new_socket_drops(),
            junk=self._new_junk(),
            missed_nacks=seen.missed_nacks,
            probes_ok=len(seen.ok),
            probes_failed=len(seen.failed - seen.ok),
        )
        self.last_round = seen
        self._ping_rounds += 1

    async def _new_socket_drops(self) -> int:
        """Datagrams the kernel dropped on our socket since the last round (0 if unknown)."""
        if self._sock_inode is None:
            return 0
        total = await asyncio.to_thread(socket_drops, self._sock_inode)
        if total is None:
            return 0
        before, self._sock_drops = self._sock_drops, total
        return 0 if before is None else max(0, total - before)

    def _new_junk(self) -> int:
        total = sum(self._proto().stats.dropped.values())
        before, self._junk_seen = self._junk_seen, total
        return total - before

    def _stalled(self, seconds: float) -> None:
        log.warning("event loop stalled for %.1f s: others may have declared us dead", seconds)
        if self.on_stall is not None:
            try:
                self.on_stall(seconds)
            except Exception:
                log.exception("stall callback failed")

    async def _refresh_once(self) -> None:
        proto, cfg = self._proto(), self.config
        await refresh_once(proto, self.ksize, self.alpha, cfg.refresh_interval, self.set_digest)
        self._refresh_runs += 1

    def stats(self) -> dict[str, object]:
        """RPC counts by name (sent, received, failed, errors), mean latency, datagrams
        dropped by reason, and a few gauges."""
        proto = self._proto()
        out = proto.stats.snapshot()
        out.update(
            peers=len(self._members()),
            outstanding=proto.outstanding(),
            tasks=len(proto.tasks),
            admission=dict(proto.admission.counts),
            dht_values=len(self.storage),
            dht_refused=getattr(self.storage, "refused", 0),
            ping_rounds=self._ping_rounds,
            refresh_runs=self._refresh_runs,
            liveness=proto.liveness.snapshot(),
            loop_stalls=self.lag.stalls,
        )
        return out

    def buckets(self) -> list[dict[str, object]]:
        """The routing table for the status page (see ``ContactTable.describe``)."""
        return self._proto().router.describe()
