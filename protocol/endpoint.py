"""Request/reply over UDP datagrams, where every request gets an answer: rpcudp's job, redone.

``Endpoint`` is a standalone asyncio datagram protocol. It speaks rpcudp's framing (so stock
kademlia peers interoperate: docs/architecture.md, "kademlia and rpcudp") and none of its code.
What it serves is asked of a ``Server`` (``rpc.Rpc``); what differs from rpcudp:

* Datagrams are authenticated first (``auth.Framer``), signed requests are checked for replays
  (``replay.ReplayGuard``), and everything is parsed defensively; rpcudp's
  ``_solve_datagram`` raised inside an unowned task on bad msgpack. Every drop is counted by
  reason (``stats``) and nothing a peer sends can raise out of ``datagram_received``. A
  stranger whose datagrams keep failing to open goes unread for a while (``datagram``).
* A handler exception, an unknown name or a wrong arity gets ``{"error": ...}`` back at once;
  rpcudp sent no reply, so the caller waited out its timeout and then evicted a live peer.
* Each call has its own timer, and a cancelled caller removes its entry immediately
  (``asyncio.wait_for`` around an rpcudp future left it in ``_outstanding``).
* Calls go through ``call`` with an explicit name (rpcudp's ``__getattr__`` turned any missing
  attribute, typos included, into a remote call).
* Requests are rate limited per source (``InboundLimits``): generously for members of the
  routing table, tightly for strangers, whose replies are also kept within ``AMPLIFICATION``
  times the size of their request, so a forged source address cannot turn us into an
  amplifier. Calls of our own waiting for a reply are capped (``outstanding.MAX_PENDING``).
* A request to a member still unanswered after ``outstanding.RESEND_AT`` fractions of its
  timeout is sent again, the same datagram. A link queued full at its cap drops datagrams (a
  peer downloading at its cap loses some of the UDP it receives), and a call that waited out
  its whole timeout held up the page whose links it carried: in the cluster benchmark, 11-18
  RPCs per 1,700 pages went unanswered at 8 peers. The receiver serves each request once: a copy
  of one it is serving is ignored, a copy of one it answered lately gets that reply again
  (``replay.Answered``, bounded in time, count and bytes) and never reaches the replay
  guard. At most once, as RPC over a lossy datagram service must be.
* On an open wire a node with a key signs its crawl RPC requests (``auth``, ``nodekey``). A
  signed request is checked after the rate limits, against the signer's key if the node
  knows it (``keys``): a bad signature is dropped (``bad_signature``), a good one names the
  sender the request may speak for (``Server.serve_deferred``'s ``signer``) and is refused
  as a replay like a keyed one; a signer the node does not know yet speaks for nobody.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol import wire
from protocol.auth import ID_LEN, REPLY, REQUEST, Frame, Framer, Rejected, Signer
from protocol.codec import RPC_REQUEST_LIMIT
from protocol.datagram import DRAIN, JunkSources
from protocol.errors import Busy, MessageError
from protocol.nodekey import verify
from protocol.outstanding import Outstanding
from protocol.ratelimit import Rate, SourceLimits
from protocol.replay import Answered, ReplayGuard
from protocol.rpcstats import RpcStats
from protocol.taskset import TaskSet
from protocol.throttle import Throttle

__all__ = [
    "AMPLIFICATION",
    "MAX_CONCURRENT_REQUESTS",
    "Endpoint",
    "InboundLimits",
    "Server",
    "sendable",
]

log = logging.getLogger(__name__)

MAX_CONCURRENT_REQUESTS = 256  # deferred handlers in progress; beyond this we answer "busy"
AMPLIFICATION = 2  # a stranger's reply is at most this many times its request's size


@dataclass(frozen=True, slots=True)
class InboundLimits:
    """Requests per second a source may make. A member of the routing table is limited per
    address; a stranger per address, per IP across its ports, and all strangers together."""

    member: Rate = field(default_factory=lambda: Rate(per_s=5000.0, burst=10_000.0))
    stranger: Rate = field(default_factory=lambda: Rate(per_s=20.0, burst=40.0))
    stranger_ip: Rate = field(default_factory=lambda: Rate(per_s=200.0, burst=400.0))
    strangers: Rate = field(default_factory=lambda: Rate(per_s=1000.0, burst=2000.0))
    # Datagrams that fail to open a stranger may send before it goes unread (None: never).
    junk: Rate | None = field(default_factory=lambda: Rate(per_s=100.0, burst=200.0))
    drain: int = DRAIN  # datagrams read per wakeup of the event loop (``datagram``)


def sendable(host: object, port: object) -> tuple[str, int] | None:
    """A sendable (ip, port), or None. Hostnames are refused: sendto would resolve them with
    a blocking DNS call, and a bad port makes asyncio close the whole transport."""
    if type(host) is not str or type(port) is not int or not 0 < port < 65536:
        return None
    return _sendable(host, port)


@functools.lru_cache(maxsize=4096)
def _sendable(host: str, port: int) -> tuple[str, int] | None:
    # Every request is addressed through here, to the same few dozen peers: parsed through
    # ``ipaddress`` each time, 3.5 us a call; remembered, 0.1 us.
    try:
        return (str(ipaddress.ip_address(host)), port)
    except ValueError:
        return None


class Server(Protocol):
    """What an ``Endpoint`` serves (``rpc.Rpc``)."""

    def inline(self, name: str) -> tuple[int, Callable[..., Any]] | None:
        """(arity, handler) of an RPC answered synchronously: ``handler(addr, *args)``."""

    def deferred(self, name: str) -> bool:
        """True if ``name`` is served by ``serve_deferred`` in a task of its own."""

    def from_member(self, addr: tuple[str, int]) -> bool:
        """True if ``addr`` is a proven contact (higher rate, replies of any size, resends)."""

    async def serve_deferred(
        self, name: str, args: list[Any], addr: tuple[str, int], signer: bytes | None
    ) -> Any:
        """The reply to a deferred RPC: anything ``wire.packb`` writes (a reply Struct).
        ``signer``: the node whose valid signature the request carries, if any."""

    def late_reply(self, addr: tuple[str, int]) -> None:
        """A reply to one of our calls came from ``addr`` after the call had timed out."""


class Endpoint(asyncio.DatagramProtocol):
    def __init__(
        self,
        server: Server,
        *,
        tasks: TaskSet,
        rpc_timeout: float,
        secret: str = "",
        inbound: InboundLimits | None = None,
        signer: tuple[bytes, Signer] | None = None,
        keys: Callable[[bytes], Ed25519PublicKey | None] = lambda _: None,
    ) -> None:
        """``signer``: our ID and our key's sign(), to sign requests on an open wire;
        ``keys``: the public key of a node whose ID was proven to us (``identities``)."""
        self._server = server
        self.transport: asyncio.DatagramTransport | None = None
        limits = inbound or InboundLimits()
        self._members_in = SourceLimits(limits.member)
        self._strangers_in = SourceLimits(limits.stranger)
        self._stranger_ips_in = SourceLimits(limits.stranger_ip)
        self._all_strangers_in = SourceLimits(limits.strangers, max_sources=1)
        self._junk = None if limits.junk is None else JunkSources(limits.junk)
        self.reply_budget: int | None = None  # bytes an inline handler may answer with
        self.rpc_timeout = rpc_timeout
        self._framer = Framer(secret, signer)
        self._keys = keys
        self._replays = ReplayGuard()
        self._answered = Answered()
        self._busy = 0
        self._secret_warning = Throttle(burst=1, window=30.0)
        self._closed = asyncio.Event()  # set by connection_lost
        self.stats = RpcStats()
        self._outstanding = Outstanding(self.stats, self._sendto, late=server.late_reply)
        self.tasks = tasks  # the deferred handlers; ``aclose`` closes it

    @property
    def keyed(self) -> bool:
        """Whether the wire is keyed: every datagram we read was sealed with the secret."""
        return self._framer.authenticated

    # --- incoming --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        host, port = transport.get_extra_info("sockname")[:2]
        self._framer.bind(host, port)  # signed datagrams name the address they come from

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        addr = (addr[0], addr[1])
        self.stats.datagrams_in += 1
        self.stats.bytes_in += len(data)
        junk = self._junk
        if junk is not None and junk.held(addr):
            self._drop("junk_source")  # dropped unread: its last ones failed to open
            return
        try:
            frame = self._framer.open(data, addr)
        except Rejected as rej:
            self._drop(rej.reason)
            if junk is not None and not self._server.from_member(addr):
                junk.junk(addr)
            held = self._secret_warning.admit() if rej.reason == "bad_hmac" else None
            if held is not None:
                log.warning(
                    "dropped a datagram from %s:%s with a bad HMAC: that peer most likely "
                    "runs with a different --secret (%d more suppressed)",
                    addr[0],
                    addr[1],
                    held,
                )
            return
        if frame.kind == REQUEST and len(frame.body) > RPC_REQUEST_LIMIT:
            self._drop("oversize")  # rpcudp's limit, kept so stock peers see the same rules
            return
        copy = (
            self._answered.get(frame.msg_id, addr, time.monotonic())
            if frame.kind == REQUEST
            else None
        )
        if copy is None and frame.kind == REQUEST and self._framer.authenticated:
            refused = self._replays.check(frame.msg_id, frame.stamp_ms, time.time_ns() // 10**6)
            if refused is not None:  # "replay" or "stale": no reply, no state touched
                self._drop(refused)
                return
        budget: int | None = None
        if frame.kind == REQUEST:
            if self._server.from_member(addr):
                allowed = self._members_in.allow(addr)
            else:
                budget = AMPLIFICATION * len(data)
                allowed = (
                    self._strangers_in.allow(addr)
                    and self._stranger_ips_in.allow(addr[0])
                    and self._all_strangers_in.allow(None)
                )
            if not allowed:  # dropped unanswered: a reply to a flood is more flood
                self._drop("rate_limited")
                return
        signer: bytes | None = None
        if frame.signed is not None and copy is None:
            keep, signer = self._signer(frame)
            if not keep:
                return
        if copy is not None:
            # The sender did not hear from us in time: answer again, never serve twice. A
            # copy of a request still being served gets its reply when that is done.
            self.stats.duplicate_requests += 1
            if copy.reply is not None:
                self._sendto(copy.reply, addr)
            return
        if frame.kind == REPLY:  # decoded by the call it answers, to the type it expects
            refused = self._outstanding.answer(frame.msg_id, frame.body, addr)
            if refused is not None:
                self._drop(refused)
            return
        try:
            obj = wire.unpackb(frame.body)
        except Exception:  # the decoder raises many types: DecodeError, RecursionError...
            self._drop("malformed")
            return
        self._answered.add(frame.msg_id, addr, time.monotonic())
        self._on_request(frame.msg_id, obj, addr, budget, signer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed.set()

    def error_received(self, exc: Exception) -> None:
        log.debug("socket error: %s", exc)

    def _drop(self, reason: str) -> None:
        self.stats.dropped[reason] += 1

    def _signer(self, frame: Frame) -> tuple[bool, bytes | None]:
        """(keep, signer): whether to serve a signed request at all (not with a bad signature,
        nor a replay), and the node it speaks for: its signer if we know its key, else
        nobody (None)."""
        signed = frame.signed
        assert signed is not None
        key = self._keys(signed.signer)
        if key is None:
            return True, None
        if not verify(key, signed.signature, signed.signed_data(frame.body)):
            self._drop("bad_signature")
            return False, None
        refused = self._replays.check(frame.msg_id, frame.stamp_ms, time.time_ns() // 10**6)
        if refused is not None:
            self._drop(refused)
            return False, None
        return True, signed.signer

    def _on_request(
        self,
        msg_id: bytes,
        obj: Any,
        addr: tuple[str, int],
        budget: int | None = None,
        signer: bytes | None = None,
    ) -> None:
        if (
            not isinstance(obj, list)
            or len(obj) != 2
            or type(obj[0]) is not str
            or not isinstance(obj[1], list)
        ):
            self._drop("malformed")
            self._reply(msg_id, addr, {"error": "malformed request"}, budget)
            return
        name, args = obj
        if self._server.deferred(name):
            self.stats.received[name] += 1
            if self._busy >= MAX_CONCURRENT_REQUESTS:
                self._drop("busy")
                self._reply(msg_id, addr, {"error": "busy"}, budget)
                return
            self._busy += 1
            self.tasks.spawn(self._run_deferred(name, msg_id, args, addr, budget, signer), name)
            return
        inline = self._server.inline(name)
        if inline is None:  # not counted by name: arbitrary names must not grow our stats
            self._drop("unknown_rpc")
            self._reply(msg_id, addr, {"error": f"unknown rpc {name[:64]!r}"}, budget)
            return
        self.stats.received[name] += 1
        arity, handler = inline
        if len(args) != arity:
            self._drop("bad_args")
            self._reply(msg_id, addr, {"error": f"{name} takes {arity} arguments"}, budget)
            return
        self.reply_budget = None if budget is None else budget - self._framer.overhead
        try:
            result = handler(addr, *args)
        except MessageError as exc:
            self._drop("bad_args")
            result = {"error": f"bad arguments: {exc}"}
        except Exception as exc:
            log.exception("rpc %s failed", name)
            self._drop("handler_error")
            result = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            self.reply_budget = None
        self._reply(msg_id, addr, result, budget)

    async def _run_deferred(
        self,
        name: str,
        msg_id: bytes,
        args: list[Any],
        addr: tuple[str, int],
        budget: int | None,
        signer: bytes | None,
    ) -> None:
        try:
            reply: Any = await self._server.serve_deferred(name, args, addr, signer)
        except Busy:
            self._drop("busy")
            reply = {"error": "busy"}
        except MessageError as exc:
            self._drop("bad_args")
            reply = {"error": f"bad arguments: {exc}"}
        except Exception as exc:
            log.exception("rpc %s from %s:%s failed", name, *addr)
            self._drop("handler_error")
            reply = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            self._busy -= 1
        self._reply(msg_id, addr, reply, budget)

    def _reply(
        self, msg_id: bytes, addr: tuple[str, int], obj: Any, budget: int | None = None
    ) -> None:
        try:
            body = wire.packb(obj)
        except Exception:
            body = wire.packb({"error": "reply not encodable"})
        if budget is not None and len(body) + self._framer.overhead > budget:
            # A stranger gets no more than AMPLIFICATION times what it sent.
            self.stats.replies_trimmed += 1
            body = wire.packb({"error": "too large"})
            if len(body) + self._framer.overhead > budget:
                return
        self._send(REPLY, msg_id, body, addr)

    def _send(
        self, kind: int, msg_id: bytes, body: bytes, addr: tuple[str, int], sign: bool = False
    ) -> bytes:
        """Seal and send one datagram; returns it (b"" if the socket is closed)."""
        if self.transport is None or self.transport.is_closing():
            return b""
        datagram = self._framer.seal(kind, msg_id, body, sign=sign)
        if kind == REPLY:
            self._answered.replied(msg_id, datagram)
        self._sendto(datagram, addr)
        return datagram

    def _sendto(self, datagram: bytes, addr: tuple[str, int]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.stats.datagrams_out += 1
        self.stats.bytes_out += len(datagram)
        self.transport.sendto(datagram, addr)

    # --- outgoing --------------------------------------------------------------------------

    def call(
        self,
        addr: tuple[Any, Any],
        rpc: str,
        args: list[Any],
        timeout: float | None = None,
        decode: Callable[[bytes], Any] = wire.unpackb,
        *,
        sign: bool = False,
    ) -> asyncio.Future[tuple[bool, Any]]:
        """Send one request; the future resolves to (True, reply) or, on timeout, (False, None)
        (rpcudp's convention, which the lookups rely on). ``timeout`` overrides the RPC
        timeout for a call whose answer itself waits on another call (PING-REQ); ``decode``
        reads the reply (a typed procedure's decoder: ``procedures``); ``sign``: on an open
        wire, sign it with our key (a crawl RPC that speaks for us)."""
        dest = sendable(addr[0], addr[1])
        if (
            dest is None
            or self.transport is None
            or self.transport.is_closing()
            or self._outstanding.full
        ):
            self.stats.failed[rpc] += 1
            failed: asyncio.Future[tuple[bool, Any]] = asyncio.get_running_loop().create_future()
            failed.set_result((False, None))
            return failed
        body = wire.packb([rpc, args])
        if len(body) > RPC_REQUEST_LIMIT:  # a bug in the caller: the codec chunks below this
            raise MessageError(f"{rpc} request of {len(body)} bytes exceeds {RPC_REQUEST_LIMIT}")
        msg_id = secrets.token_bytes(ID_LEN)
        wait = self.rpc_timeout if timeout is None else timeout
        # Resent only to a proven contact: a stranger's address may be forged, and one
        # request must not draw more than one datagram at it.
        future = self._outstanding.add(
            msg_id, dest, rpc, wait, decode, resends=self._server.from_member(dest)
        )
        self.stats.sent[rpc] += 1
        self._outstanding.sent(msg_id, self._send(REQUEST, msg_id, body, dest, sign))
        return future

    def outstanding(self) -> int:
        return len(self._outstanding)

    async def aclose(self) -> None:
        """Cancel and await our tasks, fail calls still waiting, close the socket."""
        self.tasks.cancel()
        self._outstanding.fail_all()
        await self.tasks.aclose()
        if self.transport is not None:
            self.transport.close()
            await self._closed.wait()  # the socket is released on the next loop iteration
