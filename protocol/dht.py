"""The Kademlia value store's network side (§2.3): STORE a value on the nodes nearest its key,
and FIND_VALUE it back. What kademlia's ``Server.get`` and ``set_digest`` did, with two fixes:
no live neighbour means False (kademlia raised ``ValueError`` from ``max([])``), and only a
STORE that was answered ``True`` counts (kademlia's ``any([(False, None)])`` was always true).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from protocol.kbucket import Node
from protocol.lookup import NodeLookup, ValueLookup
from protocol.rpc import DHT_VALUE_TYPES, Rpc

__all__ = ["digest", "get_value", "set_value"]


def digest(key: str | bytes) -> bytes:
    """The 160-bit key a value is stored under (kademlia's ``digest``: SHA-1)."""
    return hashlib.sha1(key if isinstance(key, bytes) else key.encode("utf-8")).digest()


async def get_value(rpc: Rpc, dkey: bytes, ksize: int, alpha: int) -> Any:
    """The value stored under ``dkey``: this node's own copy, or the network's; None if
    nobody holds one."""
    local = rpc.storage.get(dkey)
    if local is not None:
        return local
    node = Node(dkey)
    nearest = rpc.router.find_neighbors(node)
    if not nearest:
        return None
    return await ValueLookup(rpc, node, nearest, ksize, alpha).find_value()


async def set_value(rpc: Rpc, dkey: bytes, value: Any, ksize: int, alpha: int) -> bool:
    """STORE ``value`` on the ``ksize`` nodes nearest ``dkey`` (and here, if this node is
    nearer than the farthest of them); True if at least one of them stored it."""
    if type(value) not in DHT_VALUE_TYPES:
        raise TypeError("a DHT value is an int, float, bool, str or bytes")
    node = Node(dkey)
    nearest = rpc.router.find_neighbors(node)
    if not nearest:
        return False
    nodes = await NodeLookup(rpc, node, nearest, ksize, alpha).find()
    if not nodes:
        return False
    if rpc.source_node.distance_to(node) < max(n.distance_to(node) for n in nodes):
        rpc.storage.put(dkey, value)
    results = await asyncio.gather(*(rpc.call_store(n, dkey, value) for n in nodes))
    return any(ok and stored for ok, stored in results)
