"""The one module that touches rpcudp and ``kademlia.protocol``: a hardened KademliaProtocol.

Everything the library does on the wire is replaced here, once, so the rest of the package
calls typed methods that raise ``PeerTimeout`` / ``RemoteError`` instead of getting
``(False, None)``. Fixes, each pinned by a test in ``tests/protocol``:

* Every request gets a reply. rpcudp sends none when a handler raises, the name is unknown or
  the arity is wrong, so the caller waits the full timeout and then evicts a live peer; we
  reply ``{"error": ...}`` at once.
* Datagrams are authenticated (``auth.Framer``) and parsed defensively: rpcudp's
  ``_solve_datagram`` raises inside an unowned task on bad msgpack; we count and drop.
* ``__getattr__`` no longer turns any attribute (a typo included) into a remote call; the
  RPCs are explicit methods.
* Timeouts come from our own timer per call, and a cancelled caller removes its entry at once
  (``asyncio.wait_for`` around rpcudp's future leaves it in ``_outstanding``).
* ``welcome_if_new`` hashed stored keys a second time (``digest(key)`` on a digest), so it
  handed values to the wrong new nodes (§2.5); its stores, and every other task started
  here, are owned and cancelled on close.
* Replies prove who lives at an address: a ping (or crawl RPC) answered with another ID means
  the contact we knew restarted with a new ID, so the ghost is replaced.
* GOODBYE: a leaving peer is dropped at once instead of after several missed pings.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import umsgpack
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol

from protocol.auth import ID_LEN, REPLY, REQUEST, Framer, Rejected
from protocol.errors import MessageError, PeerTimeout, RemoteError
from protocol.messages import RPC_REQUEST_LIMIT, PeerRef, check_id
from protocol.routing import ContactTable
from protocol.stats import RateLimit, RpcStats
from protocol.tasks import TaskSet

__all__ = ["CrawlProtocol", "CrawlServer", "peer_of"]

log = logging.getLogger(__name__)

# Serves one crawl RPC: (sender, args after the sender id) -> reply map.
CrawlServer = Callable[[PeerRef, list[Any]], Awaitable[dict[str, Any]]]

# Synchronous RPCs answered inline, with their arity after the sender address. ping, store,
# find_node and find_value are Kademlia §2.3; stun is rpcudp's; goodbye is ours.
_ARITY = {"ping": 1, "store": 3, "find_node": 2, "find_value": 2, "stun": 0, "goodbye": 1}
MAX_CONCURRENT_REQUESTS = 256  # crawl handlers in progress; beyond this we answer "busy"
_DHT_VALUE_TYPES = (int, float, bool, str, bytes)  # what kademlia's Server.set accepts


def peer_of(node: Node) -> PeerRef:
    return PeerRef(node.id, node.ip, node.port)


def _address(host: object, port: object) -> tuple[str, int] | None:
    """A sendable (ip, port), or None. Hostnames are refused: sendto would resolve them with
    a blocking DNS call, and a bad port makes asyncio close the whole transport."""
    if type(host) is not str or type(port) is not int or not 0 < port < 65536:
        return None
    try:
        return (str(ipaddress.ip_address(host)), port)
    except ValueError:
        return None


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[tuple[bool, Any]]
    timer: asyncio.TimerHandle
    addr: tuple[str, int]
    rpc: str
    started: float


class CrawlProtocol(KademliaProtocol):
    def __init__(
        self,
        source_node: Node,
        storage: Any,
        ksize: int,
        *,
        rpc_timeout: float,
        failures_before_evict: int,
        secret: str,
        on_added: Callable[[PeerRef], None],
        on_removed: Callable[[PeerRef, str], None],
        departed_ttl: float = 60.0,
    ) -> None:
        super().__init__(source_node, storage, ksize)
        self._wait_timeout = rpc_timeout
        self.router = ContactTable(
            source_node,
            ksize,
            failures_before_evict,
            on_added=lambda n: self._notify(on_added, peer_of(n)),
            on_removed=lambda n, why: self._notify(on_removed, peer_of(n), why),
            on_full=self._check_alive,
        )
        self._framer = Framer(secret)
        self._pending: dict[bytes, _Pending] = {}
        self._crawl: dict[str, CrawlServer] = {}
        self._departed: dict[bytes, float] = {}
        self._departed_ttl = departed_ttl
        self._checking: set[bytes] = set()
        self._busy = 0
        self._secret_warning = RateLimit(30.0)
        self.stats = RpcStats()
        self.tasks = TaskSet("protocol")
        self._closed = asyncio.get_running_loop().create_future()  # set by connection_lost

    def __getattr__(self, name: str) -> Any:
        # rpcudp turns any missing attribute into a remote call; a typo must fail loudly.
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def serve(self, rpc: str, server: CrawlServer) -> None:
        """Register the handler of a crawl RPC (its first argument is the sender's ID)."""
        self._crawl[rpc] = server

    @property
    def my_id(self) -> bytes:
        node_id: bytes = self.source_node.id
        return node_id

    def outstanding(self) -> int:
        return len(self._pending)

    # --- incoming datagrams --------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        addr = (addr[0], addr[1])
        self.stats.datagrams_in += 1
        self.stats.bytes_in += len(data)
        try:
            frame = self._framer.open(data)
        except Rejected as rej:
            self._drop(rej.reason)
            if rej.reason == "bad_hmac" and self._secret_warning.ready():
                log.warning(
                    "dropped a datagram from %s:%s with a bad HMAC: that peer most likely "
                    "runs with a different --secret (%d more suppressed)",
                    addr[0],
                    addr[1],
                    self._secret_warning.suppressed,
                )
                self._secret_warning.suppressed = 0
            return
        if frame.kind == REQUEST and len(frame.body) > RPC_REQUEST_LIMIT:
            self._drop("oversize")
            return
        try:
            obj = umsgpack.unpackb(frame.body)
        except Exception:  # umsgpack raises a dozen types, and RecursionError on deep nesting
            self._drop("malformed")
            return
        if frame.kind == REPLY:
            self._on_reply(frame.msg_id, obj, addr)
        else:
            self._on_request(frame.msg_id, obj, addr)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)

    def error_received(self, exc: Exception) -> None:
        log.debug("socket error: %s", exc)

    def _drop(self, reason: str) -> None:
        self.stats.dropped[reason] += 1

    def _on_reply(self, msg_id: bytes, obj: Any, addr: tuple[str, int]) -> None:
        pending = self._pending.get(msg_id)
        if pending is None or pending.addr != addr:
            self._drop("unexpected_reply")
            return
        del self._pending[msg_id]
        pending.timer.cancel()
        self.stats.latency(pending.rpc, time.monotonic() - pending.started)
        if not pending.future.done():
            pending.future.set_result((True, obj))

    def _on_request(self, msg_id: bytes, obj: Any, addr: tuple[str, int]) -> None:
        if (
            not isinstance(obj, list)
            or len(obj) != 2
            or type(obj[0]) is not str
            or not isinstance(obj[1], list)
        ):
            self._drop("malformed")
            self._reply(msg_id, addr, {"error": "malformed request: expected [name, args]"})
            return
        name, args = obj
        if name in self._crawl:
            self.stats.received[name] += 1
            if self._busy >= MAX_CONCURRENT_REQUESTS:
                self._drop("busy")
                self._reply(msg_id, addr, {"error": "busy"})
                return
            self._busy += 1
            self.tasks.spawn(self._serve_crawl(name, msg_id, args, addr), name)
            return
        if name not in _ARITY:
            self._drop("unknown_rpc")
            self._reply(msg_id, addr, {"error": f"unknown rpc {name[:64]!r}"})
            return
        self.stats.received[name] += 1
        if len(args) != _ARITY[name]:
            self._drop("bad_args")
            self._reply(msg_id, addr, {"error": f"{name} takes {_ARITY[name]} arguments"})
            return
        try:
            result = getattr(self, f"rpc_{name}")(addr, *args)
        except MessageError as exc:
            self._drop("bad_args")
            result = {"error": f"bad arguments: {exc}"}
        except Exception as exc:
            log.exception("rpc_%s failed", name)
            self._drop("handler_error")
            result = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        self._reply(msg_id, addr, result)

    async def _serve_crawl(
        self, name: str, msg_id: bytes, args: list[Any], addr: tuple[str, int]
    ) -> None:
        try:
            if not args:
                raise MessageError("missing sender id")
            sender = Node(check_id(args[0], "sender id"), addr[0], addr[1])
            self._welcome_sender(sender)
            reply = await self._crawl[name](peer_of(sender), args[1:])
            reply["id"] = self.my_id
        except MessageError as exc:
            self._drop("bad_args")
            reply = {"error": f"bad arguments: {exc}"}
        except Exception as exc:
            log.exception("crawl rpc %s from %s:%s failed", name, *addr)
            self._drop("handler_error")
            reply = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            self._busy -= 1
        self._reply(msg_id, addr, reply)

    def _reply(self, msg_id: bytes, addr: tuple[str, int], obj: Any) -> None:
        try:
            body = umsgpack.packb(obj)
        except Exception:
            body = umsgpack.packb({"error": "reply not encodable"})
        self._send(REPLY, msg_id, body, addr)

    def _send(self, kind: int, msg_id: bytes, body: bytes, addr: tuple[str, int]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        datagram = self._framer.seal(kind, msg_id, body)
        self.stats.datagrams_out += 1
        self.stats.bytes_out += len(datagram)
        self.transport.sendto(datagram, addr)

    # --- Kademlia §2.3 RPCs (and goodbye), answered inline ---------------------------------

    def rpc_stun(self, sender: tuple[str, int]) -> list[Any]:
        return list(sender)

    def rpc_ping(self, sender: tuple[str, int], nodeid: object) -> bytes:
        node_id = check_id(nodeid, "node id")
        self._departed.pop(node_id, None)  # a ping is how a node (re)joins
        self._welcome_sender(Node(node_id, *sender))
        return self.my_id

    def rpc_store(
        self, sender: tuple[str, int], nodeid: object, key: object, value: object
    ) -> bool:
        source = Node(check_id(nodeid, "node id"), *sender)
        if type(value) not in _DHT_VALUE_TYPES:
            raise MessageError("value must be int, float, bool, str or bytes")
        self._welcome_sender(source)
        self.storage[check_id(key, "key")] = value
        return True

    def rpc_find_node(self, sender: tuple[str, int], nodeid: object, key: object) -> list[Any]:
        source = Node(check_id(nodeid, "node id"), *sender)
        target = Node(check_id(key, "key"))
        self._welcome_sender(source)
        neighbors = self.router.find_neighbors(target, exclude=source)
        return [[n.id, n.ip, n.port] for n in neighbors]

    def rpc_find_value(self, sender: tuple[str, int], nodeid: object, key: object) -> Any:
        value = self.storage.get(check_id(key, "key"), None)
        if value is None:
            return self.rpc_find_node(sender, nodeid, key)
        self._welcome_sender(Node(check_id(nodeid, "node id"), *sender))
        return {"value": value}

    def rpc_goodbye(self, sender: tuple[str, int], nodeid: object) -> dict[str, Any]:
        node_id = check_id(nodeid, "node id")
        known = self.router.get(node_id)
        # Only believe a goodbye from the address we know the node at.
        if known is not None and (known.ip, known.port) == sender:
            self.router.remove_contact(known, "goodbye")
        if known is None or (known.ip, known.port) == sender:
            self._prune_departed()
            self._departed[node_id] = time.monotonic() + self._departed_ttl
        return {"id": self.my_id, "ok": True}

    # --- outgoing calls ------------------------------------------------------------------

    def _call(self, addr: tuple[Any, Any], rpc: str, args: list[Any]) -> asyncio.Future[Any]:
        """Send one request; the future resolves to (True, reply) or, on timeout, (False, None)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        dest = _address(addr[0], addr[1])
        if dest is None or self.transport is None or self.transport.is_closing():
            self.stats.failed[rpc] += 1
            future.set_result((False, None))
            return future
        body = umsgpack.packb([rpc, args])
        if len(body) > RPC_REQUEST_LIMIT:  # rpcudp's limit: stock peers would refuse it
            raise MessageError(f"{rpc} request of {len(body)} bytes exceeds {RPC_REQUEST_LIMIT}")
        msg_id = secrets.token_bytes(ID_LEN)
        timer = loop.call_later(self._wait_timeout, self._expire, msg_id)
        self._pending[msg_id] = _Pending(future, timer, dest, rpc, time.monotonic())
        future.add_done_callback(functools.partial(self._settled, msg_id))
        self.stats.sent[rpc] += 1
        self._send(REQUEST, msg_id, body, dest)
        return future

    def _settled(self, msg_id: bytes, future: asyncio.Future[Any]) -> None:
        if future.cancelled():  # the caller gave up: forget the call now, not at the timeout
            pending = self._pending.pop(msg_id, None)
            if pending is not None:
                pending.timer.cancel()

    def _expire(self, msg_id: bytes) -> None:
        pending = self._pending.pop(msg_id, None)
        if pending is None:
            return
        self.stats.failed[pending.rpc] += 1
        if not pending.future.done():
            pending.future.set_result((False, None))

    # The stock RPC names, explicit (kademlia's Server and crawling modules call these).
    def ping(self, address: tuple[str, int], nodeid: bytes) -> asyncio.Future[Any]:
        return self._call(address, "ping", [nodeid])

    def store(
        self, address: tuple[str, int], nodeid: bytes, key: bytes, value: Any
    ) -> asyncio.Future[Any]:
        return self._call(address, "store", [nodeid, key, value])

    def find_node(self, address: tuple[str, int], nodeid: bytes, key: bytes) -> asyncio.Future[Any]:
        return self._call(address, "find_node", [nodeid, key])

    def find_value(
        self, address: tuple[str, int], nodeid: bytes, key: bytes
    ) -> asyncio.Future[Any]:
        return self._call(address, "find_value", [nodeid, key])

    async def request(
        self, peer: PeerRef, rpc: str, args: list[Any], *, record: bool = True
    ) -> dict[str, Any]:
        """Call crawl RPC ``rpc`` on ``peer``; the reply map, or PeerTimeout / RemoteError.

        ``record=False`` leaves liveness accounting to the caller (one multi-chunk operation
        must count as one success or failure, not one per datagram).
        """
        ok, data = await self._call(peer.addr, rpc, [self.my_id, *args])
        node = Node(peer.id, peer.host, peer.port)
        if not ok:
            if record:
                self.contact_failed(node)
            raise PeerTimeout(peer, peer.addr, rpc)
        if isinstance(data, dict) and "error" in data:
            self.stats.errors[rpc] += 1
            if record:
                self.welcome_if_new(node)  # it answered: alive, whatever it thought of us
            raise RemoteError(peer, rpc, str(data["error"])[:200])
        if not isinstance(data, dict):
            raise RemoteError(peer, rpc, "malformed reply")
        responder = data.get("id")
        if type(responder) is bytes and len(responder) == ID_LEN and responder != peer.id:
            self._replace(node, Node(responder, peer.host, peer.port))
        elif record:
            self.welcome_if_new(node)
        return data

    async def call_ping(self, node_to_ask: Node) -> tuple[bool, Any]:
        ok, data = await self.ping((node_to_ask.ip, node_to_ask.port), self.my_id)
        if not ok or type(data) is not bytes or len(data) != ID_LEN:
            self.contact_failed(node_to_ask)
            return (False, None)
        if data != node_to_ask.id:
            # Someone else answers at that address: the contact we knew is gone (a restart
            # with a new ID). Without this the ghost stays until it fails N times elsewhere.
            self._replace(node_to_ask, Node(data, node_to_ask.ip, node_to_ask.port))
        else:
            self.welcome_if_new(node_to_ask)
        return (True, data)

    async def ping_address(self, addr: tuple[str, int]) -> bytes | None:
        """Ping an address whose ID we don't know (bootstrap); welcome whoever answers."""
        ok, data = await self.ping(addr, self.my_id)
        if not ok or type(data) is not bytes or len(data) != ID_LEN:
            return None
        self._replace(None, Node(data, addr[0], addr[1]))
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
            self.contact_failed(node_to_ask)
            return (False, None)
        self.welcome_if_new(node_to_ask)
        return (True, data is True)

    def _lookup_reply(self, node: Node, ok: bool, data: Any, allow_value: bool) -> tuple[bool, Any]:
        """Validate a FIND_NODE / FIND_VALUE reply before kademlia's crawler trusts it:
        its ``Node(*triple)`` would crash on garbage, and a bad port closes our transport."""
        if not ok:
            self.contact_failed(node)
            return (False, None)
        self.welcome_if_new(node)
        if allow_value and isinstance(data, dict) and "value" in data:
            if type(data["value"]) in _DHT_VALUE_TYPES:
                return (True, {"value": data["value"]})
            return (True, [])
        found = []
        for entry in data if isinstance(data, list) else []:
            if not isinstance(entry, list) or len(entry) != 3:
                continue
            node_id, host, port = entry
            addr = _address(host, port)
            valid_id = type(node_id) is bytes and len(node_id) == ID_LEN
            # We are never a candidate in our own lookups.
            if valid_id and node_id != self.my_id and addr is not None:
                found.append([node_id, addr[0], addr[1]])
        return (True, found)

    def handle_call_response(self, result: tuple[bool, Any], node: Node) -> tuple[bool, Any]:
        """Stock hook, kept for any library path: one failure no longer evicts."""
        if not result[0]:
            self.contact_failed(node)
        else:
            self.welcome_if_new(node)
        return result

    # --- routing table upkeep ------------------------------------------------------------

    def contact_failed(self, node: Node) -> None:
        if self.router.record_failure(node):
            log.info("evicted %s after %d failed calls", peer_of(node), self.router.evict_after)

    def welcome_if_new(self, node: Node) -> None:
        """Record a contact that answered us; hand a new one the values it should hold (§2.5)."""
        if node.id == self.my_id or self._is_departed(node.id):
            return
        if not self.router.is_new_node(node):
            self.router.add_contact(node)  # §2.2: move to the tail as most recently seen
            return
        for key, value in self.storage:
            keynode = Node(key)  # stock: Node(digest(key)), a digest of the stored digest
            neighbors = self.router.find_neighbors(keynode)
            if neighbors:
                last = neighbors[-1].distance_to(keynode)
                new_node_close = node.distance_to(keynode) < last
                first = neighbors[0].distance_to(keynode)
                this_closest = self.source_node.distance_to(keynode) < first
            if not neighbors or (new_node_close and this_closest):
                self.tasks.spawn(self.call_store(node, key, value), "welcome-store")
        self.router.add_contact(node)

    def _welcome_sender(self, node: Node) -> None:
        """A request arrived from ``node``. If we know another ID at its address, the claim is
        checked by pinging the old contact: the reply says who really lives there now."""
        if node.id == self.my_id or self._is_departed(node.id):
            return
        if self.router.is_new_node(node):
            ghost = self.router.by_address(node.ip, node.port)
            if ghost is not None and ghost.id != node.id:
                self._check_alive(ghost)
                return
        self.welcome_if_new(node)

    def _replace(self, old: Node | None, new: Node) -> None:
        """A reply from ``new``'s address proved that ``new`` lives there: forget anyone else."""
        ghost = old if old is not None else self.router.by_address(new.ip, new.port)
        if ghost is not None and ghost.id != new.id and self.router.knows(ghost.id):
            log.info(
                "%s now answers at %s:%s; dropping %s",
                peer_of(new),
                new.ip,
                new.port,
                peer_of(ghost).short,
            )
            self.router.remove_contact(ghost, "replaced")
        self._departed.pop(new.id, None)
        self.welcome_if_new(new)

    def _check_alive(self, node: Node) -> None:
        """Ping ``node`` in an owned task, at most one check per contact at a time."""
        if node.id in self._checking:
            return
        self._checking.add(node.id)

        async def check() -> None:
            try:
                await self.call_ping(node)
            finally:
                self._checking.discard(node.id)

        self.tasks.spawn(check(), "check-alive")

    def _is_departed(self, node_id: bytes) -> bool:
        until = self._departed.get(node_id)
        if until is None:
            return False
        if until < time.monotonic():
            del self._departed[node_id]
            return False
        return True

    def _prune_departed(self) -> None:
        now = time.monotonic()
        for node_id in [k for k, until in self._departed.items() if until < now]:
            del self._departed[node_id]

    def _notify(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("membership callback %r failed", callback)

    # --- shutdown ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Cancel and await our tasks, fail calls still waiting, close the socket."""
        self.tasks.cancel()
        for pending in self._pending.values():
            pending.timer.cancel()
            if not pending.future.done():
                pending.future.set_result((False, None))
        self._pending.clear()
        await self.tasks.aclose()
        if self.transport is not None:
            self.transport.close()
            await self._closed  # the socket is released only after the next loop iteration
