"""The RPC layer: the endpoint on the socket and the contacts it learns, and every RPC's surface.

``Rpc`` holds the datagram endpoint (``endpoint.Endpoint``, which it serves) and the routing
table with its rules (``contacts.Contacts``, which it feeds whatever it hears), and adds:

* Kademlia §2.3 (PING, STORE, FIND_NODE, FIND_VALUE) with every argument validated -- the
  stock handlers crash on a wrong type and then never reply -- and GOODBYE;
* the crawl RPCs, registered by the node (``serve``), whose first argument is the sender's ID.
  On an open wire where this node has a key (``identities``) that ID is taken at its word
  only from a request the node signed: anything else is served as a stranger's, without
  what it says about finished work (``attested``), and moves nobody in the routing table;
* GOODBYE is believed only once the leaver is confirmed: on a keyed wire, or signed by the
  leaver's proven key, at once; otherwise once a ping to the leaver's address is not
  answered as usual (a node that said goodbye answers pings with an error until it joins
  again), so a goodbye sent from a forged address drops nobody;
* the calling side: explicit ``ping``/``store``/``find_node``/``find_value``, replies validated
  before the lookups (``lookup``) turn them into Nodes (``Node(*triple)`` would crash on
  garbage, and a bad port closes our socket), and ``request`` for crawl RPCs, which raises
  ``PeerTimeout``/``RemoteError`` instead of returning rpcudp's ``(False, None)``.

The Kademlia RPCs keep kademlia's wire format, so a stock ``kademlia`` node interoperates
(``tests/protocol/test_interop.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from protocol import probes, wire
from protocol.admission import Admission, AdmissionLimits
from protocol.auth import ID_LEN
from protocol.contacts import Contacts, peer_of
from protocol.endpoint import Endpoint, InboundLimits, sendable
from protocol.errors import MessageError, PeerTimeout, RemoteError
from protocol.identities import IDENTIFY, Identities
from protocol.kbucket import Node
from protocol.liveness import Detector, LivenessConfig
from protocol.messages import GOODBYE, PING_REQ, GoodbyeReply
from protocol.model import PeerRef, check_id
from protocol.nodekey import DEFAULT_WORK_BITS, NodeKey, estimate_size
from protocol.probes import PROBE_TIMEOUT
from protocol.procedures import Args, CrawlServer, Malformed, Procedure, Reply, parse_args, typed
from protocol.routing import ContactTable
from protocol.rpcstats import RpcStats
from protocol.taskset import TaskSet
from protocol.valuestore import BoundedStorage

__all__ = ["DHT_VALUE_TYPES", "Rpc", "peer_of"]

A = TypeVar("A", bound=Args)
R = TypeVar("R", bound=Reply)

# RPCs answered inline, with their arity. ping, store, find_node and find_value are Kademlia
# §2.3; stun is rpcudp's.
_ARITY = {"ping": 1, "store": 3, "find_node": 2, "find_value": 2, "stun": 0}
# Crawl RPCs whose requests say which work is finished: served without that when they do not
# speak for their sender (``serving``; more are added with ``Rpc.serve(claims=True)``).
CLAIMS = frozenset({"store_task", "store_backup", "delete_backup"})
DHT_VALUE_TYPES = (int, float, bool, str, bytes)  # what kademlia's Server.set accepts


class Rpc:
    def __init__(
        self,
        source_node: Node,
        storage: BoundedStorage,
        ksize: int,
        *,
        rpc_timeout: float,
        liveness: LivenessConfig,
        secret: str,
        on_added: Callable[[PeerRef], None],
        on_removed: Callable[[PeerRef, str], None],
        departed_ttl: float = 60.0,
        admission: AdmissionLimits | None = None,
        inbound: InboundLimits | None = None,
        silent: bool = False,
        key: NodeKey | None = None,
        work_bits: int = DEFAULT_WORK_BITS,
    ) -> None:
        """``silent``: serve nothing, every request gets an error at once (a joiner's probe,
        ``survey``: an admission challenge of it fails, so nobody admits it). ``key``: our
        node key on an open wire (``identities``; ignored with a ``secret``); ``work_bits``:
        the least puzzle work a contact's ID needs there."""
        self.source_node = source_node
        self.storage = storage
        self.tasks = TaskSet("protocol")
        self._ksize = ksize
        self.identities = Identities(
            None if secret else key,
            source_node.id,
            ask=lambda peer, args: self.request(peer, IDENTIFY, args, sign=False),
            size=self.network_size,
            present=lambda node_id: self.router.knows(node_id),
            tasks=self.tasks,
            work_bits=work_bits,
        )
        own = self.identities.own
        self.endpoint = Endpoint(
            self,
            tasks=self.tasks,
            rpc_timeout=rpc_timeout,
            secret=secret,
            inbound=inbound,
            signer=None if own is None else (source_node.id, own.sign),
            keys=self.identities.key_of,
        )
        self.contacts = Contacts(
            source_node,
            ksize,
            values=storage,
            ping=self.call_ping,
            store=self.call_store,
            probe=self.probe,
            tasks=self.tasks,
            liveness=liveness,
            on_added=on_added,
            on_removed=on_removed,
            admission=admission,
        )
        self._silent = silent
        self._departed_ttl = departed_ttl
        self._rpc_timeout = rpc_timeout
        self._crawl: dict[str, CrawlServer] = {
            PING_REQ.name: typed(
                PING_REQ, lambda sender, args: probes.serve_ping_req(self, sender, args)
            ),
            IDENTIFY.name: typed(IDENTIFY, self.identities.serve),
        }
        self._member_addrs: tuple[int, frozenset[tuple[str, int]]] = (-1, frozenset())
        self._claims = CLAIMS
        # We said goodbye: pings get an error until we join again, so that whoever checks
        # our goodbye (``_serve_goodbye``) finds us gone.
        self.departing = False
        self.goodbyes_refuted = 0  # goodbyes not believed: the leaver answered as usual

    @property
    def my_id(self) -> bytes:
        return self.source_node.id

    @property
    def router(self) -> ContactTable:
        return self.contacts.router

    @property
    def liveness(self) -> Detector:
        return self.contacts.liveness

    @property
    def admission(self) -> Admission:
        return self.contacts.admission

    @property
    def stats(self) -> RpcStats:
        return self.endpoint.stats

    def network_size(self) -> int:
        """How many nodes the network has, as our routing table sees it (``nodekey``): where
        IDs are proven, from the proven ones only (an ID chosen at will next to ours would
        make the network look as large as it likes)."""
        ids = self.identities
        known = (n.id for n in self.router.members() if not ids.required or ids.proven(n.id))
        return estimate_size(self.my_id, known, self._ksize)

    def serve(self, rpc: str, server: CrawlServer, *, claims: bool = False) -> None:
        """Register the handler of a crawl RPC (``claims``: its requests say which work is
        finished, as those of ``CLAIMS`` do)."""
        self._crawl[rpc] = server
        if claims:
            self._claims |= {rpc}

    async def aclose(self) -> None:
        """Cancel and await our tasks, fail calls still waiting, close the socket."""
        await self.endpoint.aclose()

    # --- serving (``endpoint.Server``) -------------------------------------------------------

    def inline(self, name: str) -> tuple[int, Callable[..., Any]] | None:
        if self._silent or name not in _ARITY:
            return None
        handler: Callable[..., Any] = getattr(self, f"rpc_{name}")
        return _ARITY[name], handler

    def deferred(self, name: str) -> bool:
        return not self._silent and (name in self._crawl or name == GOODBYE.name)

    def from_member(self, addr: tuple[str, int]) -> bool:
        version, addrs = self._member_addrs
        if version != self.router.version:
            addrs = frozenset((n.ip, n.port) for n in self.router.members())
            self._member_addrs = (self.router.version, addrs)
        return addr in addrs

    async def serve_deferred(
        self, name: str, args: list[Any], addr: tuple[str, int], signer: bytes | None = None
    ) -> Reply:
        if not args:
            raise MessageError("missing sender id")
        sender = Node(check_id(args[0], "sender id"), addr[0], addr[1])
        identities = self.identities
        attested = identities.attests(sender.id, signer)
        if name == GOODBYE.name:
            reply: Reply = await self._serve_goodbye(peer_of(sender), args[1:], attested)
        else:
            if attested or not identities.proven(sender.id):
                # Every crawl RPC is also contact (§2.2); a request that names a proven node
                # without its signature is not that node's, and refutes no suspicion of it.
                self.contacts.welcome_sender(sender)
            elif name in self._claims:
                self.stats.unattested[name] += 1
            reply = await self._crawl[name](peer_of(sender), args[1:], attested)
        reply.id = self.my_id  # lets the caller spot a restarted node with a new ID
        return reply

    async def ping_req(self, helper: Node, target: Node) -> probes.Answer:
        """``probes.ping_req``."""
        return await probes.ping_req(self, helper, target)

    def rpc_stun(self, sender: tuple[str, int]) -> list[Any]:
        return list(sender)

    def rpc_ping(self, sender: tuple[str, int], nodeid: object) -> bytes:
        if self.departing:
            raise MessageError("this node has left the network")
        # A ping does not bring back a node that said GOODBYE: a leaver still handing off
        # (or its liveness round, once) would be made an owner and a replica again.
        self.contacts.welcome_sender(Node(check_id(nodeid, "node id"), *sender))
        return self.my_id

    def rpc_store(
        self, sender: tuple[str, int], nodeid: object, key: object, value: object
    ) -> bool:
        source = Node(check_id(nodeid, "node id"), *sender)
        if type(value) not in DHT_VALUE_TYPES:
            raise MessageError("value must be int, float, bool, str or bytes")
        self.contacts.welcome_sender(source)
        return self.storage.put(check_id(key, "key"), value, sender, source.id)

    def rpc_find_node(self, sender: tuple[str, int], nodeid: object, key: object) -> list[Any]:
        source = Node(check_id(nodeid, "node id"), *sender)
        target = Node(check_id(key, "key"))
        if target.id == source.id:
            # A lookup of its own ID is how a node (re)joins (§2.3): one that said GOODBYE
            # comes back only this way, never by a stray ping.
            self.router.clear_departed(source.id)
        self.contacts.welcome_sender(source)
        neighbors = self.router.find_neighbors(target, exclude=source)
        found = [[n.id, n.ip, n.port] for n in neighbors]
        budget = self.endpoint.reply_budget
        if budget is not None:  # a stranger: no more than its request's worth of contacts
            while found and len(wire.packb(found)) > budget:
                found.pop()
        return found

    def rpc_find_value(self, sender: tuple[str, int], nodeid: object, key: object) -> Any:
        value = self.storage.get(check_id(key, "key"), None)
        budget = self.endpoint.reply_budget
        if value is None or (budget is not None and len(wire.packb(value)) > budget):
            return self.rpc_find_node(sender, nodeid, key)
        self.contacts.welcome_sender(Node(check_id(nodeid, "node id"), *sender))
        return {"value": value}

    async def _serve_goodbye(self, sender: PeerRef, raw: list[Any], attested: bool) -> Reply:
        """GOODBYE: drop the sender at once if the goodbye is surely its own (a keyed wire, or
        its signature), else once a ping to it goes unanswered or answers with an error."""
        parse_args(GOODBYE, raw)  # none beyond the sender's ID
        known = self.router.get(sender.id)
        # Only a contact we know, at the address we know it by: strangers' goodbyes must not
        # grow the departed list.
        if known is None or (known.ip, known.port) != sender.addr:
            return GoodbyeReply(ok=True)
        sure = self.endpoint.keyed or (attested and self.identities.required)
        if not sure:
            ok, data = await self.ping(sender.addr, self.my_id)
            if ok and data == sender.id:
                self.goodbyes_refuted += 1
                return GoodbyeReply(ok=False)
        self.contacts.said_goodbye(sender.id, sender.addr, self._departed_ttl)
        return GoodbyeReply(ok=True)

    # --- calling ---------------------------------------------------------------------------

    # The Kademlia RPCs, by their wire names (§2.3).
    def ping(self, address: tuple[str, int], nodeid: bytes) -> Awaitable[tuple[bool, Any]]:
        return self.endpoint.call(address, "ping", [nodeid])

    def store(
        self, address: tuple[str, int], nodeid: bytes, key: bytes, value: Any
    ) -> Awaitable[tuple[bool, Any]]:
        return self.endpoint.call(address, "store", [nodeid, key, value])

    def find_node(
        self, address: tuple[str, int], nodeid: bytes, key: bytes
    ) -> Awaitable[tuple[bool, Any]]:
        return self.endpoint.call(address, "find_node", [nodeid, key])

    def find_value(
        self, address: tuple[str, int], nodeid: bytes, key: bytes
    ) -> Awaitable[tuple[bool, Any]]:
        return self.endpoint.call(address, "find_value", [nodeid, key])

    async def request(
        self,
        peer: PeerRef,
        proc: Procedure[A, R],
        args: A,
        *,
        record: bool = True,
        sign: bool = True,
    ) -> R:
        """Call crawl RPC ``proc`` on ``peer``: its checked reply, or PeerTimeout /
        RemoteError (a reply that breaks the rules too: the peer is alive but odd).

        ``record=False`` leaves liveness accounting to the caller (one multi-chunk operation
        must count as one success or failure, not one per datagram). On an open wire our
        requests are signed, so that they speak for us; ``sign=False`` for one that need
        not (a question, which a stock kademlia node should answer with an error).
        """
        rpc = proc.name
        wire_args = [self.my_id, *proc.args_to_wire(args)]
        ok, data = await self.endpoint.call(
            peer.addr, rpc, wire_args, decode=proc.decode_reply, sign=sign
        )
        node = Node(peer.id, peer.host, peer.port)
        if not ok:
            if record:
                self.contacts.contact_failed(node)
            raise PeerTimeout(peer, peer.addr, rpc)
        if isinstance(data, dict) and "error" in data:
            self.stats.errors[rpc] += 1
            if record:
                self.contacts.welcome_if_new(node)  # it answered: alive, whatever it thought of us
            raise RemoteError(peer, rpc, str(data["error"])[:200])
        if not isinstance(data, proc.reply):
            if record:
                self.contacts.welcome_if_new(node)
            why = data.error if isinstance(data, Malformed) else "not a map"
            raise RemoteError(peer, rpc, f"malformed reply: {why}"[:300])
        responder = data.id
        if type(responder) is bytes and len(responder) == ID_LEN and responder != peer.id:
            self.contacts.replace(node, Node(responder, peer.host, peer.port))
        elif record:
            self.contacts.welcome_if_new(node, proven=responder == peer.id)
        return data

    async def probe_ping(self, node: Node, timeout: float = PROBE_TIMEOUT) -> bool:
        """``probes.probe_ping``."""
        return await probes.probe_ping(self, node, timeout)

    def late_reply(self, addr: tuple[str, int]) -> None:
        """A reply came after its call had timed out (``endpoint``): whoever lives at that
        address is alive, only slow (Lifeguard: a late ack is an ack for liveness)."""
        node = self.router.by_address(*addr)
        if node is not None:
            self.liveness.heard(node.id)

    async def call_ping(self, node_to_ask: Node) -> tuple[bool, Any]:
        ok, data = await self.ping((node_to_ask.ip, node_to_ask.port), self.my_id)
        if not ok or type(data) is not bytes or len(data) != ID_LEN:
            self.contacts.contact_failed(node_to_ask)
            return (False, None)
        if data != node_to_ask.id:
            # Someone else answers at that address: the contact we knew is gone (a restart
            # with a new ID). Stock kept the ghost until it failed elsewhere.
            self.contacts.replace(node_to_ask, Node(data, node_to_ask.ip, node_to_ask.port))
        else:
            self.contacts.welcome_if_new(node_to_ask, proven=True)
        return (True, data)

    async def probe(self, addr: tuple[str, int]) -> bytes | None:
        """The ID that answers a ping at ``addr``, or None; the table is left alone (an
        admission challenge decides what to do with the answer)."""
        ok, data = await self.ping(addr, self.my_id)
        if not ok or type(data) is not bytes or len(data) != ID_LEN:
            return None
        answered: bytes = data
        return answered

    async def ping_address(self, addr: tuple[str, int]) -> bytes | None:
        """Ping an address whose ID we don't know (bootstrap); welcome whoever answers."""
        ok, data = await self.ping(addr, self.my_id)
        if not ok or type(data) is not bytes or len(data) != ID_LEN:
            return None
        self.contacts.replace(None, Node(data, addr[0], addr[1]))
        node_id: bytes = data
        return node_id

    async def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> tuple[bool, Any]:
        addr = (node_to_ask.ip, node_to_ask.port)
        ok, data = await self.find_node(addr, self.my_id, node_to_find.id)
        return self._lookup_reply(node_to_ask, ok, data, allow_value=False)

    async def call_find_value(self, node_to_ask: Node, node_to_find: Node) -> tuple[bool, Any]:
        addr = (node_to_ask.ip, node_to_ask.port)
        ok, data = await self.find_value(addr, self.my_id, node_to_find.id)
        return self._lookup_reply(node_to_ask, ok, data, allow_value=True)

    async def call_store(self, node_to_ask: Node, key: bytes, value: Any) -> tuple[bool, Any]:
        ok, data = await self.store((node_to_ask.ip, node_to_ask.port), self.my_id, key, value)
        if not ok:
            self.contacts.contact_failed(node_to_ask)
            return (False, None)
        self.contacts.welcome_if_new(node_to_ask)
        return (True, data is True)

    def _lookup_reply(self, node: Node, ok: bool, data: Any, allow_value: bool) -> tuple[bool, Any]:
        if not ok:
            self.contacts.contact_failed(node)
            return (False, None)
        self.contacts.welcome_if_new(node)
        if allow_value and isinstance(data, dict) and "value" in data:
            if type(data["value"]) in DHT_VALUE_TYPES:
                return (True, {"value": data["value"]})
            return (True, [])
        found = []
        for entry in data if isinstance(data, list) else []:
            if not isinstance(entry, list) or len(entry) != 3:
                continue
            node_id, host, port = entry
            addr = sendable(host, port)
            valid_id = type(node_id) is bytes and len(node_id) == ID_LEN
            # We are never a candidate in our own lookups.
            if valid_id and node_id != self.my_id and addr is not None:
                found.append([node_id, addr[0], addr[1]])
        return (True, found)
