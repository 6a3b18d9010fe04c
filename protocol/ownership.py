"""Who owns a key: the pure XOR math of Kademlia §2.1, with no sockets.

Keys and node IDs share one 160-bit space (SHA-1, exactly like kademlia's ``digest``), so a URL
task's owner is simply the live node whose ID is XOR-closest to the task's key, and its replicas
are the next ``r`` closest ("Distributed Crawler Based on the Improved Kademlia Protocol",
§2.2.1: the backup queue lives on the owner's neighbours).
"""

from __future__ import annotations

import hashlib
import heapq
import secrets
from collections.abc import Iterable

__all__ = ["ID_BYTES", "closest", "distance", "key_for", "new_node_id", "owner_and_replicas"]

ID_BYTES = 20  # 160 bits, Kademlia §2.1


def new_node_id() -> bytes:
    """A fresh node ID from the OS CSPRNG.

    kademlia's Server defaults to ``digest(random.getrandbits(255))``: Mersenne Twister output
    is predictable, which lets an attacker place IDs next to chosen keys.
    """
    return secrets.token_bytes(ID_BYTES)


def key_for(s: str) -> bytes:
    """The 160-bit key of a string (a host or a URL); same hash as kademlia.utils.digest."""
    return hashlib.sha1(s.encode("utf-8")).digest()


def distance(a: bytes, b: bytes) -> int:
    """XOR distance of Kademlia §2.1, as an integer."""
    if len(a) != len(b):
        raise ValueError(f"IDs of different lengths: {len(a)} and {len(b)}")
    return int.from_bytes(a, "big") ^ int.from_bytes(b, "big")


def closest(key: bytes, ids: Iterable[bytes], n: int) -> list[bytes]:
    """The ``n`` distinct IDs XOR-closest to ``key``, closest first."""
    if n <= 0:
        return []
    k = int.from_bytes(key, "big")
    unique = set(ids)
    for i in unique:
        if len(i) != len(key):
            raise ValueError(f"ID of length {len(i)} next to a key of length {len(key)}")
    return heapq.nsmallest(n, unique, key=lambda i: int.from_bytes(i, "big") ^ k)


def owner_and_replicas(
    key: bytes, ids: Iterable[bytes], replicas: int
) -> tuple[bytes, list[bytes]]:
    """The owner of ``key`` and its ``replicas`` backup holders among ``ids``.

    ``ids`` must include the caller's own ID: the caller is a candidate owner like any other.
    """
    ranked = closest(key, ids, max(replicas, 0) + 1)
    if not ranked:
        raise ValueError("no candidate IDs: ids must include the local node")
    return ranked[0], ranked[1:]
