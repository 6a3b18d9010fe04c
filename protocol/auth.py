"""Datagram framing and cluster authentication, as pure bytes-in/bytes-out functions.

rpcudp frames a datagram as ``kind (1) | msg_id (20) | msgpack body``. Without a secret we keep
exactly that, so a stock ``kademlia.network.Server`` interoperates. With a secret (``--secret``)
a 16-byte HMAC-SHA256 tag follows the message id: ``kind | msg_id | tag | body``. The tag covers
the kind, the id and the body, so a reply cannot be replayed as a request and no field can be
altered. Truncating SHA-256 to 128 bits is the usual trade (RFC 2104 §5 allows truncation to
half the hash length). Replays of a whole datagram inside one cluster are not prevented: the
crawl RPCs are idempotent (the owner deduplicates tasks) and ids are single-use on the caller.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

__all__ = ["ID_LEN", "REPLY", "REQUEST", "TAG_LEN", "Frame", "Framer", "Rejected"]

REQUEST = 0
REPLY = 1
ID_LEN = 20
TAG_LEN = 16
_DOMAIN = b"p2pcrawl/rpc/1"  # keeps these tags useless for any other use of the same secret


class Rejected(Exception):
    """A datagram that must be dropped before parsing; ``reason`` names the stats counter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    msg_id: bytes
    body: bytes


class Framer:
    """Seals outgoing datagrams and opens incoming ones for one cluster secret ("" = none)."""

    def __init__(self, secret: str) -> None:
        self._key = secret.encode("utf-8") if secret else b""

    @property
    def authenticated(self) -> bool:
        return bool(self._key)

    def _tag(self, head: bytes, body: bytes) -> bytes:
        mac = hmac.new(self._key, _DOMAIN, hashlib.sha256)
        mac.update(head)
        mac.update(body)
        return mac.digest()[:TAG_LEN]

    def seal(self, kind: int, msg_id: bytes, body: bytes) -> bytes:
        head = bytes((kind,)) + msg_id
        if not self._key:
            return head + body
        return head + self._tag(head, body) + body

    def open(self, datagram: bytes) -> Frame:
        """Return the frame, or raise Rejected("short" | "bad_kind" | "bad_hmac")."""
        overhead = 1 + ID_LEN + (TAG_LEN if self._key else 0)
        if len(datagram) <= overhead:
            raise Rejected("short")
        kind = datagram[0]
        head = datagram[: 1 + ID_LEN]
        if self._key:
            tag = datagram[1 + ID_LEN : overhead]
            body = datagram[overhead:]
            # Authenticate before even looking at the kind byte: unauthenticated input gets
            # no further parsing at all.
            if not hmac.compare_digest(tag, self._tag(head, body)):
                raise Rejected("bad_hmac")
        else:
            body = datagram[overhead:]
        if kind not in (REQUEST, REPLY):
            raise Rejected("bad_kind")
        return Frame(kind, head[1:], body)
