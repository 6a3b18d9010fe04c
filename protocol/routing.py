"""k-buckets that forgive a lost datagram, report membership, and never start I/O themselves.

The table of bmuller/kademlia 2.2.3's ``routing.RoutingTable`` (MIT licence, in
``protocol/KADEMLIA-LICENSE``; buckets in ``kbucket``): bucket splitting of Kademlia §2.4/§4.2
and the replacement cache of §4.1 are kept. What changes:

* A missed reply never evicts here: it is counted (for the status page) and the failure
  detector (``liveness``) decides, on time and indirect probes, when a contact is dead. Stock
  kademlia removes a contact on the first missed reply, and on a lossy or busy network that
  empties routing tables and partitions the DHT (bmuller/kademlia issues #23 and #98).
* Every contact is moved to the tail of its bucket when heard from (Kademlia §2.2: buckets are
  ordered by time last seen); stock kademlia only did that for new contacts.
* A full bucket asks its owner to ping the least-recently-seen contact (``on_full``) instead of
  ``asyncio.ensure_future(protocol.call_ping(...))``: the table owns no tasks.
* Membership changes (add, split promotion, replacement promotion, removal) are reported through
  ``on_added`` / ``on_removed`` so the crawler can recompute which keys it owns.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator

from protocol.kbucket import ID_SPACE, KBucket, Node

__all__ = ["ContactTable"]


class ContactTable:
    def __init__(
        self,
        me: Node,
        ksize: int,
        on_added: Callable[[Node], None],
        on_removed: Callable[[Node, str], None],
        on_full: Callable[[Node], None],
    ) -> None:
        self._on_added = on_added
        self._on_removed = on_removed
        self._on_full = on_full
        self._failures: dict[bytes, int] = {}
        self._last_seen: dict[bytes, float] = {}
        self._departed: dict[bytes, float] = {}  # node id -> monotonic time the mark expires
        self.version = 0  # bumped on every membership or address change, for caches
        self.node = me
        self.ksize = ksize
        self.buckets = [KBucket(0, ID_SPACE, ksize)]

    # --- queries -------------------------------------------------------------------------

    def get_bucket_for(self, node: Node) -> int:
        """The index of the bucket whose range holds ``node``'s ID. (kademlia compared
        ``long_id < upper`` while its ``KBucket.split`` files ``long_id <= mid`` in the lower
        half, so an ID equal to a split point was looked up in the wrong bucket.)"""
        for index, bucket in enumerate(self.buckets):
            if node.long_id <= bucket.range[1]:
                return index
        raise ValueError("node id beyond the 160-bit space")

    def bucket_of(self, node_id: bytes) -> KBucket:
        return self.buckets[self.get_bucket_for(Node(node_id))]

    def members(self) -> list[Node]:
        return [n for b in self.buckets for n in b.nodes.values()]

    def get(self, node_id: bytes) -> Node | None:
        return self.bucket_of(node_id).nodes.get(node_id)

    def is_new_node(self, node: Node) -> bool:
        return self.bucket_of(node.id).is_new_node(node)

    def find_neighbors(
        self, node: Node, k: int | None = None, exclude: Node | None = None
    ) -> list[Node]:
        """The ``k`` (default ``ksize``) members XOR-closest to ``node``, never ``node``
        itself nor a contact at ``exclude``'s address. The buckets are walked outwards from
        ``node``'s own (kademlia's traversal: it marks that bucket as just looked up)."""
        k = k or self.ksize
        nodes: list[tuple[int, bytes, Node]] = []
        for neighbor in self._outwards(node):
            if neighbor.id != node.id and (exclude is None or not neighbor.same_home_as(exclude)):
                heapq.heappush(nodes, (node.distance_to(neighbor), neighbor.id, neighbor))
            if len(nodes) == k:
                break
        return [n for _, _, n in heapq.nsmallest(k, nodes)]

    def _outwards(self, node: Node) -> Iterator[Node]:
        """Members of ``node``'s bucket (newest first), then of the buckets on its left and
        right in turn, nearest first: kademlia's traversal, kept as it is, including that it
        stops once the right side has run out (a bucket at the right end of the table thus
        sees only its left neighbour bucket; answers to FIND_NODE stay what stock peers
        send)."""
        index = self.get_bucket_for(node)
        self.buckets[index].touch_last_updated()
        yield from reversed(list(self.buckets[index].nodes.values()))
        left, right = self.buckets[:index], self.buckets[index + 1 :]
        from_left = True
        while True:
            if from_left and left:
                bucket = left.pop()
                from_left = False
            elif right:
                bucket = right.pop(0)
                from_left = True
            else:
                return
            yield from reversed(list(bucket.nodes.values()))

    def knows(self, node_id: bytes) -> bool:
        bucket = self.bucket_of(node_id)
        return node_id in bucket.nodes or node_id in bucket.replacement_nodes

    def by_address(self, host: str, port: int) -> Node | None:
        """The contact (member or replacement) recorded at this address, if any."""
        for b in self.buckets:
            for n in (*b.nodes.values(), *b.replacement_nodes.values()):
                if n.port == port and n.ip == host:
                    return n
        return None

    def last_seen(self, node_id: bytes) -> float | None:
        return self._last_seen.get(node_id)

    def failures(self, node_id: bytes) -> int:
        return self._failures.get(node_id, 0)

    def lonely_buckets(self, max_age: float = 3600.0) -> list[KBucket]:
        """Buckets without a lookup for ``max_age`` seconds (stock: a fixed hour, §2.3)."""
        cutoff = time.monotonic() - max_age
        return [b for b in self.buckets if b.last_updated < cutoff]

    # --- changes -------------------------------------------------------------------------

    def add_contact(self, node: Node) -> None:
        """Record a contact we just heard from (a reply, or a request it sent us)."""
        self._failures.pop(node.id, None)
        self._last_seen[node.id] = time.monotonic()
        bucket = self.bucket_of(node.id)
        old = bucket.nodes.get(node.id)
        if bucket.add_node(node):
            if old is None:
                self.version += 1
                self._notify_added(node)
            elif (old.ip, old.port) != (node.ip, node.port):
                self.version += 1
            return
        # Full. Per §4.2 split if the bucket covers our own ID or its depth is not 0 mod 5.
        if bucket.has_in_range(self.node) or bucket.depth() % 5 != 0:
            self.split_bucket(self.buckets.index(bucket))
            self.add_contact(node)
            return
        # §2.2: the newcomer waits in the replacement cache; ping the least-recently seen
        # member, which is evicted (and the newest replacement promoted) if it stays silent.
        self._on_full(bucket.head())

    def split_bucket(self, index: int) -> None:
        before = set(self.buckets[index].nodes)
        one, two = self.buckets[index].split()
        self.buckets[index : index + 1] = [one, two]
        for b in self.buckets[index : index + 2]:
            for nid, n in b.nodes.items():
                if nid not in before:  # a replacement promoted by the split
                    self.version += 1
                    self._notify_added(n)

    def remove_contact(self, node: Node, reason: str = "unresponsive") -> None:
        bucket = self.bucket_of(node.id)
        was = bucket.nodes.get(node.id)
        before = set(bucket.nodes)
        bucket.remove_node(node)
        self._failures.pop(node.id, None)
        self._last_seen.pop(node.id, None)
        if was is not None:
            self.version += 1
            self._on_removed(was, reason)
        for nid, n in bucket.nodes.items():
            if nid not in before:  # kademlia promoted the newest replacement
                self.version += 1
                self._notify_added(n)

    def record_failure(self, node: Node) -> int:
        """Count a missed reply (reset by any success); returns the run so far. Eviction is
        the failure detector's decision, not a count's."""
        if not self.knows(node.id):
            return 0
        count = self._failures.get(node.id, 0) + 1
        self._failures[node.id] = count
        return count

    # --- graceful leave --------------------------------------------------------------------

    def mark_departed(self, node_id: bytes, ttl: float) -> None:
        """After GOODBYE: keep ``node_id`` out for ``ttl`` seconds, so hand-off traffic the
        leaver sends after its goodbye does not re-add it."""
        now = time.monotonic()
        for expired in [k for k, until in self._departed.items() if until < now]:
            del self._departed[expired]
        self._departed[node_id] = now + ttl

    def is_departed(self, node_id: bytes) -> bool:
        until = self._departed.get(node_id)
        if until is not None and until < time.monotonic():
            del self._departed[node_id]
            return False
        return until is not None

    def clear_departed(self, node_id: bytes) -> None:
        self._departed.pop(node_id, None)

    # --- reporting -----------------------------------------------------------------------

    def describe(self) -> list[dict[str, object]]:
        """Buckets for the status page: range, members (ID prefix, address, seconds since
        last heard, consecutive failures) and the size of the replacement cache."""
        now = time.monotonic()
        out: list[dict[str, object]] = []
        for bucket in self.buckets:
            low, high = bucket.range
            peers = []
            for n in bucket.nodes.values():
                seen = self._last_seen.get(n.id)
                peers.append(
                    {
                        "id": n.id.hex()[:8],
                        "addr": f"{n.ip}:{n.port}",
                        "last_seen_s": None if seen is None else round(now - seen, 1),
                        "failures": self._failures.get(n.id, 0),
                    }
                )
            out.append(
                {
                    "range": [f"{low:040x}", f"{min(high, 2**160 - 1):040x}"],
                    "peers": peers,
                    "replacements": len(bucket.replacement_nodes),
                }
            )
        return out

    def _notify_added(self, node: Node) -> None:
        self._last_seen.setdefault(node.id, time.monotonic())
        self._on_added(node)
