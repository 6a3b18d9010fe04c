"""Where a peer's status server is, announced in the DHT's value store.

Each peer stores its status address under ``p2pcrawl/status/v1/<node id>`` (Kademlia STORE)
and refreshes it every :data:`ANNOUNCE_EVERY_S`. In a network with a key (``--secret``) an
announcement carries an HMAC over its fields made with that key, and one without a valid
tag, for another node, or older than :data:`ANNOUNCE_MAX_AGE_S` is ignored: a value in the
DHT can be stored by any node that reaches the store, and a network view must not send the
operator's token to an address a stranger planted. Without a key (loopback networks)
announcements are taken as they are. The status token itself is never announced.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import time
from dataclasses import dataclass

__all__ = [
    "ANNOUNCE_EVERY_S",
    "ANNOUNCE_MAX_AGE_S",
    "Announcement",
    "announce_key",
    "announced_address",
    "decode_announcement",
    "encode_announcement",
    "loopback_only",
]

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


def _tag(secret: str, node_id: bytes, status: str, at: float) -> str:
    msg = f"{ANNOUNCE_PREFIX}|{node_id.hex()}|{status}|{at:.3f}".encode()
    return hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def encode_announcement(node_id: bytes, status: str, secret: str, at: float | None = None) -> str:
    at = round(time.time() if at is None else at, 3)
    doc: dict[str, object] = {"node": node_id.hex(), "status": status, "at": at}
    if secret:
        doc["mac"] = _tag(secret, node_id, status, at)
    return json.dumps(doc, separators=(",", ":"))


def decode_announcement(
    raw: object, node_id: bytes, secret: str, now: float | None = None
) -> Announcement | None:
    """The announcement ``node_id`` made, or None when ``raw`` is not one (checked: it comes
    from the network, and with a key it must carry that key's tag and be recent)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str) or len(raw) > MAX_ANNOUNCEMENT_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
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
        now = time.time() if now is None else now
        if not -ANNOUNCE_MAX_AGE_S / 10 <= now - at <= ANNOUNCE_MAX_AGE_S:
            return None
    return Announcement(node_id, status, float(at))


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


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_only(status_addr: str, udp_host: str) -> str | None:
    """Why ``status_addr`` cannot be reached from here: a loopback status server of a peer
    on another machine (its UDP address is not loopback) would be this machine's own."""
    host = status_addr.rpartition(":")[0]
    if _is_loopback(host) and not _is_loopback(udp_host):
        return (
            f"its status server listens on {status_addr}, loopback only; start that peer with "
            "--status 0.0.0.0:PORT --status-token T to see it here"
        )
    return None
