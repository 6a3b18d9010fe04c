"""Contacts and k-buckets (Kademlia §2.2, §2.4, §4.1): ``Node`` and ``KBucket``.

Taken from bmuller/kademlia 2.2.3 (``node.py`` and ``routing.py``; MIT licence, copyright
(c) 2018 Brian Muller, in ``protocol/KADEMLIA-LICENSE``), typed, with slots, and with the
bucket depth computed on integers instead of bit strings. Why vendored rather than imported:
docs/architecture.md, "kademlia and rpcudp". The table of buckets is ``routing.ContactTable``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from itertools import chain

__all__ = ["ID_SPACE", "KBucket", "Node"]

ID_SPACE = 2**160  # node IDs and keys: 160-bit integers (Kademlia §2.1)
REPLACEMENT_FACTOR = 5  # a bucket's replacement cache holds this many times k contacts


class Node:
    """A contact: an ID and, for a contact we can reach, its UDP address. A lookup target is a
    ``Node`` without an address (``ip`` "", ``port`` 0)."""

    __slots__ = ("id", "ip", "long_id", "port")

    def __init__(self, node_id: bytes, ip: str = "", port: int = 0) -> None:
        self.id = node_id
        self.ip = ip
        self.port = port
        self.long_id = int.from_bytes(node_id, "big")

    def same_home_as(self, other: Node) -> bool:
        return self.ip == other.ip and self.port == other.port

    def distance_to(self, other: Node) -> int:
        """XOR distance (Kademlia §2.1)."""
        return self.long_id ^ other.long_id

    def __iter__(self) -> Iterator[object]:
        return iter((self.id, self.ip, self.port))

    def __repr__(self) -> str:
        return repr([self.long_id, self.ip, self.port])

    def __str__(self) -> str:
        return f"{self.ip}:{self.port}"


class KBucket:
    """Up to ``ksize`` contacts of one range of IDs, least recently seen first, and a
    replacement cache of the newest contacts that did not fit (§4.1)."""

    def __init__(self, low: int, high: int, ksize: int) -> None:
        self.range = (low, high)
        self.nodes: OrderedDict[bytes, Node] = OrderedDict()
        self.replacement_nodes: OrderedDict[bytes, Node] = OrderedDict()
        self.ksize = ksize
        self.max_replacement_nodes = ksize * REPLACEMENT_FACTOR
        self.last_updated = time.monotonic()

    def touch_last_updated(self) -> None:
        self.last_updated = time.monotonic()

    def split(self) -> tuple[KBucket, KBucket]:
        """Two buckets of half the range each; members and replacements are filed again
        (a replacement may become a member of a half with room)."""
        midpoint = (self.range[0] + self.range[1]) // 2
        one = KBucket(self.range[0], midpoint, self.ksize)
        two = KBucket(midpoint + 1, self.range[1], self.ksize)
        for node in chain(self.nodes.values(), self.replacement_nodes.values()):
            (one if node.long_id <= midpoint else two).add_node(node)
        return one, two

    def remove_node(self, node: Node) -> None:
        """Drop ``node``; a member's place goes to the newest replacement."""
        self.replacement_nodes.pop(node.id, None)
        if self.nodes.pop(node.id, None) is not None and self.replacement_nodes:
            newnode_id, newnode = self.replacement_nodes.popitem()
            self.nodes[newnode_id] = newnode

    def has_in_range(self, node: Node) -> bool:
        return self.range[0] <= node.long_id <= self.range[1]

    def is_new_node(self, node: Node) -> bool:
        return node.id not in self.nodes

    def add_node(self, node: Node) -> bool:
        """Add or refresh ``node`` (moved to the tail: most recently seen, §2.2). False when
        the bucket is full: the node waits in the replacement cache instead."""
        if node.id in self.nodes:
            del self.nodes[node.id]
            self.nodes[node.id] = node
        elif len(self.nodes) < self.ksize:
            self.nodes[node.id] = node
        else:
            self.replacement_nodes.pop(node.id, None)
            self.replacement_nodes[node.id] = node
            while len(self.replacement_nodes) > self.max_replacement_nodes:
                self.replacement_nodes.popitem(last=False)
            return False
        return True

    def depth(self) -> int:
        """How many leading bits every member's ID shares (§4.2 splits on it)."""
        ids = [n.long_id for n in self.nodes.values()]
        return 160 - (min(ids) ^ max(ids)).bit_length()

    def head(self) -> Node:
        """The least recently seen member."""
        return next(iter(self.nodes.values()))

    def __len__(self) -> int:
        return len(self.nodes)
