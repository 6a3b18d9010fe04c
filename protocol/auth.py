"""Datagram framing and cluster authentication, as pure bytes-in/bytes-out functions.

rpcudp frames a datagram as ``kind (1) | msg_id (20) | msgpack body``. Without a secret we keep
exactly that, so a stock ``kademlia.network.Server`` interoperates. With a secret (``--secret``)
the frame is::

    kind (1) | msg_id (20) | tag (16) | stamp (8) | source port (2) | source ip (16) | body

``tag`` is HMAC-SHA256, truncated to 128 bits (RFC 2104 §5 allows truncation to half the hash
length), over everything else. So no field can be altered and a reply cannot be replayed as a
request (the kind byte is covered). Two more fields make a captured datagram useless elsewhere:

* ``stamp`` is the sender's wall clock in milliseconds. With the random ``msg_id`` it lets the
  receiver refuse a datagram it has seen before, or one older than its window
  (``replay.ReplayGuard``), without keeping every id forever.
* ``source`` is the address the sender's socket is bound to (the IP is all zeros when it
  listens on a wildcard address and cannot know which of its addresses the kernel picks).
  ``open`` refuses a datagram whose observed source differs: a copy re-sent from another
  address is dropped before anything reads it, so it can neither move the sender's entry in a
  routing table nor draw replies to the copier.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ID_LEN",
    "REPLY",
    "REQUEST",
    "SIGNED",
    "TAG_LEN",
    "Frame",
    "Framer",
    "Rejected",
    "Signed",
    "pack_address",
]

REQUEST = 0
REPLY = 1
SIGNED = 2  # a signed request, on an open network's wire (read back as a REQUEST)
ID_LEN = 20
TAG_LEN = 16
STAMP_LEN = 8
PORT_LEN = 2
IP_LEN = 16  # IPv6, or IPv4 mapped into it (::ffff:a.b.c.d)
_HEAD = 1 + ID_LEN
_SIGNED_HEAD = _HEAD + TAG_LEN + STAMP_LEN + PORT_LEN + IP_LEN
_WILDCARD = bytes(IP_LEN)
_DOMAIN = b"p2pcrawl/rpc/2"  # keeps these tags useless for any other use of the same secret
SIG_LEN = 64
_SIG_AT = _HEAD + STAMP_LEN + PORT_LEN + IP_LEN + ID_LEN  # where a signed request's signature is
_SIGNED_REQUEST_HEAD = _SIG_AT + SIG_LEN
_SIG_DOMAIN = b"p2pcrawl/rpc-signed/1"

Signer = Callable[[bytes], bytes]  # our node key's sign()


class Rejected(Exception):
    """A datagram that must be dropped before parsing; ``reason`` names the stats counter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Signed:
    """A signed request's signature, unchecked: who claims to have signed, and what."""

    signer: bytes
    signature: bytes
    head: bytes  # the frame up to the signature

    def signed_data(self, body: bytes) -> bytes:
        return _SIG_DOMAIN + self.head + body


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    msg_id: bytes
    body: bytes
    stamp_ms: int = 0  # the sender's clock; 0 on an unauthenticated wire
    signed: Signed | None = None  # an open network's signed request


@functools.lru_cache(maxsize=1024)
def _ip16(host: str) -> bytes:
    """``host`` as 16 bytes; a wildcard address (0.0.0.0, ::) as all zeros.

    Cached: every datagram received checks its sender against the source it claims, and
    through ``ipaddress`` that was 3% of a peer's CPU at 8 peers (py-spy, cluster
    benchmark). The hosts are the few peers' addresses the kernel reports."""
    ip = ipaddress.ip_address(host)
    if ip.is_unspecified:
        return _WILDCARD
    if isinstance(ip, ipaddress.IPv4Address):
        return ipaddress.IPv6Address("::ffff:" + str(ip)).packed
    mapped = ip.ipv4_mapped
    if mapped is not None:
        return ipaddress.IPv6Address("::ffff:" + str(mapped)).packed
    return ip.packed


def pack_address(host: str, port: int) -> bytes:
    """The ``source`` field for a socket bound to ``host:port``."""
    return port.to_bytes(PORT_LEN, "big") + _ip16(host)


class Framer:
    """Seals outgoing datagrams and opens incoming ones for one cluster secret ("" = none)."""

    def __init__(self, secret: str, signer: tuple[bytes, Signer] | None = None) -> None:
        """``signer``: our node ID and our key's sign(), to sign requests on an open wire
        (ignored with a secret: the tag already says who may speak)."""
        self._key = secret.encode("utf-8") if secret else b""
        self._signer = None if self._key else signer
        self._source = pack_address("0.0.0.0", 0)
        # The HMAC state after the domain string, copied per datagram instead of rebuilt.
        self._mac = hmac.new(self._key, _DOMAIN, hashlib.sha256) if self._key else None

    @property
    def authenticated(self) -> bool:
        return bool(self._key)

    @property
    def overhead(self) -> int:
        """Bytes a sealed datagram adds to its body."""
        return _SIGNED_HEAD if self._key else _HEAD

    def bind(self, host: str, port: int) -> None:
        """Record the address our socket is bound to; it goes into every sealed datagram."""
        self._source = pack_address(host, port)

    def _tag(self, head: bytes, rest: bytes) -> bytes:
        assert self._mac is not None
        mac = self._mac.copy()
        mac.update(head)
        mac.update(rest)
        return mac.digest()[:TAG_LEN]

    @property
    def signs(self) -> bool:
        return self._signer is not None

    def seal(
        self,
        kind: int,
        msg_id: bytes,
        body: bytes,
        now_ms: int | None = None,
        *,
        sign: bool = False,
    ) -> bytes:
        """The datagram. ``sign``: a request of ours that speaks for us on an open wire."""
        if not self._key:
            if sign and kind == REQUEST and self._signer is not None:
                return self._seal_signed(msg_id, body, now_ms)
            return bytes((kind,)) + msg_id + body
        head = bytes((kind,)) + msg_id
        rest = _stamp(now_ms) + self._source + body
        return head + self._tag(head, rest) + rest

    def _seal_signed(self, msg_id: bytes, body: bytes, now_ms: int | None) -> bytes:
        assert self._signer is not None
        node_id, sign = self._signer
        head = bytes((SIGNED,)) + msg_id + _stamp(now_ms) + self._source + node_id
        return head + sign(_SIG_DOMAIN + head + body) + body

    def open(self, datagram: bytes, source: tuple[str, int] | None = None) -> Frame:
        """Return the frame, or raise Rejected("short" | "bad_kind" | "bad_hmac" |
        "bad_source"). ``source`` is the observed sender address (None skips that check)."""
        if len(datagram) <= _HEAD:
            raise Rejected("short")
        if not self._key:
            if datagram[0] == SIGNED:
                return _open_signed(datagram, source)
            if datagram[0] not in (REQUEST, REPLY):
                raise Rejected("bad_kind")
            return Frame(datagram[0], datagram[1:_HEAD], datagram[_HEAD:])
        if len(datagram) <= _SIGNED_HEAD:
            raise Rejected("bad_hmac")  # too short to carry a tag: most likely an unkeyed peer
        head = datagram[:_HEAD]
        tag = datagram[_HEAD : _HEAD + TAG_LEN]
        rest = datagram[_HEAD + TAG_LEN :]
        # Authenticate before even looking at the kind byte: unauthenticated input gets
        # no further parsing at all.
        if not hmac.compare_digest(tag, self._tag(head, rest)):
            raise Rejected("bad_hmac")
        kind = datagram[0]
        if kind not in (REQUEST, REPLY):
            raise Rejected("bad_kind")
        stamp = int.from_bytes(rest[:STAMP_LEN], "big")
        claimed = rest[STAMP_LEN : STAMP_LEN + PORT_LEN + IP_LEN]
        if source is not None and not _same_source(claimed, source):
            raise Rejected("bad_source")
        return Frame(kind, head[1:], rest[STAMP_LEN + PORT_LEN + IP_LEN :], stamp)


def _stamp(now_ms: int | None) -> bytes:
    return (time.time_ns() // 1_000_000 if now_ms is None else now_ms).to_bytes(STAMP_LEN, "big")


def _open_signed(datagram: bytes, source: tuple[str, int] | None) -> Frame:
    """A signed request, parsed; its signature is the endpoint's to check."""
    if len(datagram) <= _SIGNED_REQUEST_HEAD:
        raise Rejected("short")
    at = _HEAD
    stamp = int.from_bytes(datagram[at : at + STAMP_LEN], "big")
    at += STAMP_LEN
    claimed = datagram[at : at + PORT_LEN + IP_LEN]
    if source is not None and not _same_source(claimed, source):
        raise Rejected("bad_source")
    signer = datagram[_SIG_AT - ID_LEN : _SIG_AT]
    signed = Signed(signer, datagram[_SIG_AT:_SIGNED_REQUEST_HEAD], datagram[:_SIG_AT])
    body = datagram[_SIGNED_REQUEST_HEAD:]
    return Frame(REQUEST, datagram[1:_HEAD], body, stamp, signed)


def _same_source(claimed: bytes, source: tuple[str, int]) -> bool:
    host, port = source
    if int.from_bytes(claimed[:PORT_LEN], "big") != port:
        return False
    ip = claimed[PORT_LEN:]
    if ip == _WILDCARD:
        return True
    try:
        return ip == _ip16(host)
    except ValueError:
        return False
