"""Where a peer's status server is, announced in the DHT's value store.

Each peer stores its status address under ``p2pcrawl/status/v1/<node id>`` (Kademlia STORE)
and refreshes it every :data:`ANNOUNCE_EVERY_S`. A value in the DHT can be stored by any node
that reaches the store, and a network view must not send the operator's token to an address
a stranger planted (one did: the victim's ``/api/network`` then asked the stranger's server).
So an announcement is accepted only for the announcer's own ID and source address:

* it is signed: in a network with a key (``--secret``) with an HMAC over its fields made with
  that key; in an open network with the announcing node's own key (``protocol.nodekey``),
  which the reader knows once the node has proven its ID. One without a valid signature,
  for another node, or older than :data:`ANNOUNCE_MAX_AGE_S` is ignored;
* a peer's value store takes an announcement only from the node it names, sent from the IP
  address it names, and no other value displaces one (``store_guard``);
* the network view asks a status server only at the UDP host it knows the peer by
  (``ui.network``).

The status token itself is never announced.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from p2pcrawl.network.netkey import is_loopback
from protocol import key_for

__all__ = [
    "ANNOUNCE_EVERY_S",
    "ANNOUNCE_MAX_AGE_S",
    "Announcement",
    "announce_key",
    "announced_address",
    "decode_announcement",
    "encode_announcement",
    "loopback_only",
    "same_host",
    "store_guard",
]

# Checks a node's signature over some bytes: (node id, signature, data) -> valid.
NodeVerify = Callable[[bytes, bytes, bytes], bool]

ANNOUNCE_PREFIX = "p2pcrawl/status/v1/"
ANNOUNCE_EVERY_S = 60.0
ANNOUNCE_MAX_AGE_S = 600.0  # ten refreshes missed: the peer is gone or cut off
MAX_ANNOUNCEMENT_BYTES = 1024


def announce_key(node_id: bytes) -> str:
    return ANNOUNCE_PREFIX + node_id.hex()


@dataclass(frozen=True, slots=True)
class Announcement:
    node_id: bytes
    status: str  # HOST:PORT of the status server, as other peers should reach it
    at: float  # unix time the peer made it


def _signed(node_id: bytes, status: str, at: float) -> bytes:
    return f"{ANNOUNCE_PREFIX}|{node_id.hex()}|{status}|{at:.3f}".encode()


def _tag(secret: str, node_id: bytes, status: str, at: float) -> str:
    msg = _signed(node_id, status, at)
    return hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def encode_announcement(
    node_id: bytes,
    status: str,
    secret: str,
    at: float | None = None,
    *,
    sign: Callable[[bytes], bytes] | None = None,
) -> str:
    """The announcement as stored: tagged with ``secret`` if there is one, else signed with
    ``sign`` (our node key's) if given."""
    at = round(time.time() if at is None else at, 3)
    doc: dict[str, object] = {"node": node_id.hex(), "status": status, "at": at}
    if secret:
        doc["mac"] = _tag(secret, node_id, status, at)
    elif sign is not None:
        doc["sig"] = sign(_signed(node_id, status, at)).hex()
    return json.dumps(doc, separators=(",", ":"))


def _document(raw: object) -> dict[str, Any] | None:
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str) or len(raw) > MAX_ANNOUNCEMENT_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def decode_announcement(
    raw: object,
    node_id: bytes,
    secret: str,
    now: float | None = None,
    *,
    verify: NodeVerify | None = None,
) -> Announcement | None:
    """The announcement ``node_id`` made, or None when ``raw`` is not one (checked: it comes
    from the network). With a key it must carry that key's tag, and with ``verify`` (an
    open network whose peers prove their IDs) the node's own signature; either way it must
    be recent."""
    doc = _document(raw)
    if doc is None:
        return None
    status, at, node = doc.get("status"), doc.get("at"), doc.get("node")
    if node != node_id.hex() or not isinstance(status, str) or not _valid_hostport(status):
        return None
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None
    if secret:
        mac = doc.get("mac")
        expected = _tag(secret, node_id, status, float(at))
        if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
            return None
    elif verify is not None:
        sig = doc.get("sig")
        try:
            signature = bytes.fromhex(sig) if isinstance(sig, str) else b""
        except ValueError:
            return None
        if not verify(node_id, signature, _signed(node_id, status, float(at))):
            return None
    if secret or verify is not None:
        now = time.time() if now is None else now
        if not -ANNOUNCE_MAX_AGE_S / 10 <= now - at <= ANNOUNCE_MAX_AGE_S:
            return None
    return Announcement(node_id, status, float(at))


def _named_node(value: object) -> bytes | None:
    """The node an announcement-shaped value names, or None if it is not one."""
    doc = _document(value)
    if doc is None or "status" not in doc:
        return None
    node = doc.get("node")
    if not isinstance(node, str) or len(node) != 40:
        return None
    try:
        return bytes.fromhex(node)
    except ValueError:
        return None


def store_guard(
    secret: str, proven: Callable[[bytes], bool], verify: NodeVerify
) -> Callable[[bytes, Any, bytes, tuple[str, int], Any], bool]:
    """The value store's rule for announcements (``protocol``'s ``BoundedStorage.guard``):
    whether to store ``value`` under ``key``, sent by node ``sender`` from ``addr``, where
    ``held`` is stored now (or None). An announcement is taken only from the node it names,
    from the IP address it names, checked as a reader checks it (its key's signature where
    we know the key); any other value may not displace one."""

    def guard(key: bytes, value: Any, sender: bytes, addr: tuple[str, int], held: Any) -> bool:
        node = _named_node(value)
        if node is None:
            return held is None or _named_node(held) is None
        if node != sender or key != key_for(announce_key(node)):
            return False
        check = verify if not secret and proven(node) else None
        ann = decode_announcement(value, node, secret, verify=check)
        return ann is not None and same_host(ann.status.rpartition(":")[0], addr[0])

    return guard


def _valid_hostport(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        return False
    return len(host) <= 255 and all(c.isalnum() or c in ".-[]:" for c in host)


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def announced_address(status_host: str, status_port: int, udp_host: str) -> str:
    """What other peers should dial: a status server bound to every interface is reached
    at the address the peer is known by in the DHT (its UDP host)."""
    host = udp_host if _is_wildcard(status_host) else status_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{status_port}"


def same_host(announced: str, known: str) -> bool:
    """Whether the host a status address names is the one a peer is known by."""
    host = announced.strip("[]")
    if host.lower() == "localhost":
        return is_loopback(known)
    try:
        a, b = ipaddress.ip_address(host), ipaddress.ip_address(known.strip("[]"))
    except ValueError:
        return host == known
    mapped_a = a.ipv4_mapped if isinstance(a, ipaddress.IPv6Address) else None
    mapped_b = b.ipv4_mapped if isinstance(b, ipaddress.IPv6Address) else None
    return (mapped_a or a) == (mapped_b or b)


def loopback_only(status_addr: str, udp_host: str) -> str | None:
    """Why ``status_addr`` cannot be reached from here: a loopback status server of a peer
    on another machine (its UDP address is not loopback) would be this machine's own."""
    host = status_addr.rpartition(":")[0]
    if is_loopback(host) and not is_loopback(udp_host):
        return (
            f"its status server listens on {status_addr}, loopback only; start that peer with "
            "--status 0.0.0.0:PORT --status-token T to see it here"
        )
    return None
