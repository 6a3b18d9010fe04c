"""``CrawlNode``: a Kademlia node that also moves crawl tasks.

The improved protocol of "Distributed Crawler Based on the Improved Kademlia Protocol", §2.2.

The node joins like any Kademlia node (ping a bootstrap contact, then FIND_NODE on its own ID,
§2.3), answers the stock RPCs so plain kademlia peers interoperate, and adds STORE_TASK,
STORE_BACKUP, DELETE_BACKUP, REFRESH_TASK (``calls`` / ``serving``) and GOODBYE. It is a
composition of the objects that do the work, and the one place that wires them:

* ``rpc`` (``rpc.Rpc``): the datagram endpoint and the routing table with its rules;
* ``members`` (``members.Members``): who counts as a member, and whether this node owns
  anything yet (the admission timers and the ownership hold);
* ``owners`` (``owners.Owners``): who owns a key, and the one cache of it;
* ``calls`` (``calls.CrawlCalls``): the crawl RPCs' sending side;
* ``upkeep`` (``upkeep.Upkeep``): the liveness and refresh loops, the event-loop lag monitor
  and the socket's statistics.

It owns every task it starts; ``aclose()`` cancels and awaits them all, then closes the socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from protocol.calls import CrawlCalls
from protocol.datagram import open_udp
from protocol.dht import digest, get_value, set_value
from protocol.errors import BootstrapError
from protocol.identities import Identities
from protocol.kbucket import Node
from protocol.liveness import LivenessConfig
from protocol.loadreport import LoadReport
from protocol.loans import GiveBack, Loan
from protocol.lookup import NodeLookup
from protocol.looplag import LoopLagMonitor
from protocol.members import Members
from protocol.messages import Held, KeyBatch, QuietReply, RefreshAnswer, StoreResult
from protocol.model import PeerRef, check_id
from protocol.nodeconfig import NodeConfig
from protocol.owners import Owners
from protocol.procedures import Args, Procedure, Reply, attesting, typed
from protocol.rpc import Rpc
from protocol.rpcstats import RpcStats
from protocol.serving import CrawlHandler, crawl_servers
from protocol.sockstats import widen_buffers
from protocol.state import SavedState, read_state, write_state
from protocol.taskset import TaskSet
from protocol.upkeep import Upkeep
from protocol.valuestore import BoundedStorage

PROBE_ROLE = (
    "probe node (a throw-away ID that asks the network for its load, so that this peer can "
    "choose its own ID; it closes before the peer starts)"
)

__all__ = ["CrawlHandler", "CrawlNode", "NodeConfig"]

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Args)
R = TypeVar("R", bound=Reply)


class CrawlNode:
    def __init__(
        self,
        node_id: bytes,
        handler: CrawlHandler,
        config: NodeConfig | None = None,
        *,
        silent: bool = False,
    ) -> None:
        """``silent``: answer every request with an error and admit nobody's challenge of
        this node (a joiner's short-lived probe, ``survey``)."""
        self.config = cfg = config or NodeConfig()
        self.handler = handler
        # How the log names it: a joiner's probe listens under an ID of its own first.
        self._role = PROBE_ROLE if silent else "node"
        self._self = Node(check_id(node_id))
        self._me: PeerRef | None = None
        self.storage = BoundedStorage(cfg.store_limits)
        self.rpc = Rpc(
            self._self,
            self.storage,
            cfg.ksize,
            rpc_timeout=cfg.rpc_timeout,
            liveness=LivenessConfig(
                suspicion_timeout=cfg.suspicion_timeout,
                min_failed_rounds=cfg.failures_before_evict,
                indirect_probes=cfg.indirect_probes,
            ),
            secret=cfg.secret,
            on_added=lambda peer: self.members.contact_added(peer),
            on_removed=lambda peer, why: self.members.contact_removed(peer, why),
            departed_ttl=cfg.departed_ttl,
            admission=cfg.admission,
            inbound=cfg.inbound,
            silent=silent,
            key=cfg.key,
            work_bits=cfg.work_bits,
        )
        for name, server in crawl_servers(handler).items():
            self.rpc.serve(name, server)
        self.members = Members(
            self.rpc.router,
            cfg.min_owner_age,
            on_added=handler.peer_added,
            on_removed=handler.peer_removed,
            on_contact=handler.contact_added,
            identities=self.rpc.identities,
        )
        self.owners = Owners(self.members, lambda: self.me, self._lookup, cfg.ksize)
        self.calls = CrawlCalls(self.rpc)
        # A stall longer than the suspicion timeout may have got us declared dead: the
        # crawler re-checks what it owns before fetching on (``on_stall``).
        self.on_stall: Callable[[float], None] | None = None
        self.upkeep = Upkeep(
            self.rpc,
            ksize=cfg.ksize,
            alpha=cfg.alpha,
            ping_interval=cfg.ping_interval,
            refresh_interval=cfg.refresh_interval,
            indirect_probes=cfg.indirect_probes,
            stall_after=cfg.suspicion_timeout / 2,
            on_stall=self._stalled,
            republish=self.set_digest,
        )
        self._loops = TaskSet("node")

    @property
    def id(self) -> bytes:
        return self._self.id

    @property
    def ksize(self) -> int:
        return self.config.ksize

    @property
    def alpha(self) -> int:
        return self.config.alpha

    @property
    def lag(self) -> LoopLagMonitor:
        """The process's event-loop lag (one monitor: the status page reads this one)."""
        return self.upkeep.lag

    @property
    def rpc_stats(self) -> RpcStats:
        return self.rpc.stats

    @property
    def identities(self) -> Identities:
        """Who proved which ID on an open wire, and our own key's signature."""
        return self.rpc.identities

    # --- lifecycle -----------------------------------------------------------------------

    async def listen(self, port: int, interface: str = "0.0.0.0") -> None:
        if self._me is not None:
            raise RuntimeError("already listening")
        transport = await open_udp(
            self.rpc.endpoint, interface, port, drain=self.config.inbound.drain
        )
        sock = transport.get_extra_info("socket")
        widen_buffers(sock)
        host, real_port = transport.get_extra_info("sockname")[:2]
        self._self.ip, self._self.port = host, real_port
        self._me = PeerRef(self.id, host, real_port)
        log.info("%s %s listening on %s:%s", self._role, self._me.short, host, real_port)
        await self.upkeep.start(sock, self._loops)

    async def listen_on(self, host: str, port: int) -> PeerRef:
        """Listen on ``host:port`` (port 0 picks a free one); returns ``me``."""
        await self.listen(port, host)
        return self.me

    @property
    def listening(self) -> bool:
        return self._me is not None

    @property
    def me(self) -> PeerRef:
        if self._me is None:
            raise RuntimeError("not listening yet")
        return self._me

    async def aclose(self) -> None:
        """Cancel and await every task the node owns, then close the socket."""
        self.members.close()
        self.upkeep.close()
        await self._loops.aclose()
        await self.rpc.aclose()

    def serve(self, proc: Procedure[A, R], handler: Callable[[PeerRef, A], Awaitable[R]]) -> None:
        """Serve one more crawl RPC: ``handler`` gets the sender and the checked arguments
        (``procedures``) and returns the reply."""
        self.rpc.serve(proc.name, typed(proc, handler))

    def serve_claims(
        self, proc: Procedure[A, R], handler: Callable[[PeerRef, A, bool], Awaitable[R]]
    ) -> None:
        """As ``serve``, for an RPC that says which work is finished: ``handler`` is also told
        whether the request speaks for its sender (``rpc.CLAIMS``)."""
        self.rpc.serve(proc.name, attesting(proc, handler), claims=True)

    # --- joining -------------------------------------------------------------------------

    async def join(self, addrs: Sequence[tuple[str, int]]) -> list[PeerRef]:
        """Ping every bootstrap address, then FIND_NODE(self) through those that answered
        (§2.3: this fills our table and announces us to the nodes near our ID)."""
        self.members.joining = True
        self.rpc.departing = False  # a node that said goodbye and joins again is back
        try:
            return await self._join(addrs)
        finally:
            self.members.joining = False

    async def _join(self, addrs: Sequence[tuple[str, int]]) -> list[PeerRef]:
        resolved = await self._resolve(addrs)
        answers = await asyncio.gather(*(self.rpc.ping_address(a) for a in resolved))
        nodes = [
            Node(node_id, host, port)
            for node_id, (host, port) in zip(answers, resolved, strict=True)
            if node_id is not None and node_id != self.id
        ]
        if not nodes:
            raise BootstrapError(
                f"no bootstrap peer answered at {', '.join(f'{h}:{p}' for h, p in addrs)} "
                "(wrong address, peer down, or a different --secret)"
            )
        await NodeLookup(self.rpc, self._self, nodes, self.ksize, self.alpha).find()
        # The lookup's contacts enter the table through admission challenges, and on an open
        # wire prove their IDs; wait for both (each a round trip or two, retried a little).
        await self.rpc.admission.settle(3 * self.config.rpc_timeout)
        await self.rpc.identities.settle(3 * self.config.rpc_timeout)
        return self.peers()

    async def _resolve(self, addrs: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        """Hostnames to IP addresses without blocking the loop (sendto would block on DNS)."""
        loop = asyncio.get_running_loop()
        transport = self.rpc.endpoint.transport
        if transport is None:
            raise RuntimeError("not listening yet")
        family = transport.get_extra_info("socket").family
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

    # --- members and owners (``members``, ``owners``) ------------------------------------

    def peers(self) -> list[PeerRef]:
        """Every member: established contacts of the routing table (never this node)."""
        return self.members.peers()

    def is_member(self, peer_id: bytes) -> bool:
        """The one answer to "is this peer a member?": what ``peers`` lists."""
        return self.members.is_member(peer_id)

    def member(self, peer_id: bytes) -> PeerRef | None:
        """The member with this ID at the address the table knows now, or None."""
        return self.members.member(peer_id)

    def owner_wait(self, peer_id: bytes) -> float | None:
        return self.members.owner_wait(peer_id)

    def established_before(self, peer_id: bytes) -> bool:
        return self.members.established_before(peer_id)

    def establish_early(self, peer_id: bytes) -> bool:
        return self.members.establish_early(peer_id)

    def depart(self) -> None:
        """About to say GOODBYE: from now on this node sends only what its handoff sends
        (no liveness round, lookup, admission challenge or indirect probe)."""
        self.upkeep.stop()
        self.rpc.contacts.departing = True

    def hold_ownership(self) -> None:
        self.members.hold_ownership()

    def take_ownership(self) -> bool:
        return self.members.take_ownership()

    def closest_local(self, key: bytes, n: int, *, with_self: bool | None = None) -> list[PeerRef]:
        return self.owners.closest_local(key, n, with_self=with_self)

    def closest_contacts(self, key: bytes, n: int) -> list[PeerRef]:
        """Where a key's copies go: the nearest contacts, young ones too (``owners``)."""
        return self.owners.closest_contacts(key, n)

    def in_table(self, peer_id: bytes) -> bool:
        """In the routing table, young or established."""
        return self.members.in_table(peer_id)

    async def closest(self, key: bytes, n: int) -> list[PeerRef]:
        return await self.owners.closest(key, n)

    async def owner(self, key: bytes, *, fresh: bool = False) -> PeerRef:
        """The one answer to "who owns this key?", cached (``owners``)."""
        return await self.owners.owner(key, fresh=fresh)

    def forget_owner(self, key: bytes) -> None:
        self.owners.forget(key)

    def neighbours(self, n: int) -> list[PeerRef]:
        """The ``n`` contacts of the routing table nearest this node (established or not)."""
        return [PeerRef(c.id, c.ip, c.port) for c in self.rpc.router.find_neighbors(self._self, n)]

    def suspects(self) -> list[bytes]:
        """IDs of contacts the failure detector suspects now (``liveness``)."""
        return self.rpc.liveness.suspects()

    def strained(self) -> bool:  # our own health in doubt: a flood or a stall (LocalHealth)
        return self.rpc.liveness.health.score > 0

    def silences(self) -> dict[bytes, float]:
        """The contacts suspected now, and how long each has been silent (seconds)."""
        return self.rpc.liveness.silences()

    async def _lookup(self, key: bytes) -> list[Node]:
        target = Node(key)
        start = self.rpc.router.find_neighbors(target, self.ksize)
        return await NodeLookup(self.rpc, target, start, self.ksize, self.alpha).find()

    # --- the crawl RPCs (``calls``) ------------------------------------------------------

    async def store_task(self, peer: PeerRef, batches: Sequence[KeyBatch]) -> StoreResult:
        return await self.calls.store_task(peer, batches)

    async def store_backup(self, peer: PeerRef, owner: bytes, batches: Sequence[KeyBatch]) -> Held:
        return await self.calls.store_backup(peer, owner, batches)

    async def delete_backup(
        self, peer: PeerRef, owner: bytes, done: Mapping[bytes, Sequence[int]]
    ) -> int:
        return await self.calls.delete_backup(peer, owner, done)

    async def refresh_task(self, peer: PeerRef) -> RefreshAnswer:
        return await self.calls.refresh_task(peer)

    async def load_report(self, peer: PeerRef, *, pad: bool = True) -> LoadReport:
        return await self.calls.load_report(peer, pad=pad)

    async def lend(self, peer: PeerRef, want: int, have: int | None = None, hosts: int = 1) -> Loan:
        return await self.calls.lend(peer, want, have, hosts)

    async def give_back(
        self, peer: PeerRef, reports: Sequence[GiveBack]
    ) -> list[tuple[bool, bool]]:
        return await self.calls.give_back(peer, reports)

    async def goodbye(self, peer: PeerRef) -> None:
        await self.calls.goodbye(peer)

    async def ping_peer(self, peer: PeerRef) -> bytes:
        return await self.calls.ping_peer(peer)

    async def quiet(self, peer: PeerRef) -> QuietReply:
        return await self.calls.quiet(peer)

    async def call(self, peer: PeerRef, proc: Procedure[A, R], args: A) -> R:
        """Any crawl RPC: its checked reply, or PeerTimeout / RemoteError."""
        return await self.calls.call(peer, proc, args)

    # --- the Kademlia value store (``dht``) ----------------------------------------------

    async def get(self, key: str | bytes) -> Any:
        return await get_value(self.rpc, digest(key), self.ksize, self.alpha)

    async def set(self, key: str | bytes, value: Any) -> bool:
        return await self.set_digest(digest(key), value)

    async def set_digest(self, dkey: bytes, value: Any) -> bool:
        return await set_value(self.rpc, dkey, value, self.ksize, self.alpha)

    def save_state(self, fname: str | os.PathLike[str]) -> None:
        """ID and neighbours as JSON (kademlia used pickle, which runs code when loaded)."""
        neighbors = [(n.ip, n.port) for n in self.rpc.router.find_neighbors(self._self)]
        write_state(fname, SavedState(self.id, self.ksize, self.alpha, neighbors))

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

    # --- introspection -------------------------------------------------------------------

    def _stalled(self, seconds: float) -> None:
        log.warning("event loop stalled for %.1f s: others may have declared us dead", seconds)
        if self.on_stall is not None:
            self.on_stall(seconds)

    def stats(self) -> dict[str, object]:
        """RPC counts by name (sent, received, failed, errors), mean latency, datagrams
        dropped by reason, and a few gauges."""
        rpc, upkeep = self.rpc, self.upkeep
        out = rpc.stats.snapshot()
        out.update(
            peers=len(self.members.nodes()),
            outstanding=rpc.endpoint.outstanding(),
            tasks=len(rpc.tasks),
            admission=dict(rpc.admission.counts),
            identities=dict(rpc.identities.counts),
            goodbyes_refuted=rpc.goodbyes_refuted,
            dht_values=len(self.storage),
            dht_refused=self.storage.refused,
            ping_rounds=upkeep.ping_rounds,
            refresh_runs=upkeep.refresh_runs,
            liveness=rpc.liveness.snapshot(),
            loop_stalls=upkeep.lag.stalls,
        )
        return out

    def buckets(self) -> list[dict[str, object]]:
        """The routing table for the status page (see ``ContactTable.describe``)."""
        return self.rpc.router.describe()
