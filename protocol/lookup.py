"""The iterative lookups of Kademlia §2.3: FIND_NODE and FIND_VALUE, alpha requests at a time.

Taken from bmuller/kademlia 2.2.3 (``crawling.py`` and ``node.NodeHeap``; MIT licence,
copyright (c) 2018 Brian Muller, in ``protocol/KADEMLIA-LICENSE``), typed. Why vendored
rather than imported: docs/architecture.md, "kademlia and rpcudp". The replies reaching
here are already checked (``rpc.Rpc.call_find_node``): a list of ``[id, ip, port]``
triples, or ``{"value": v}``.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from protocol.kbucket import Node

__all__ = ["FindNodeRpc", "FindValueRpc", "NodeHeap", "NodeLookup", "ValueLookup"]

log = logging.getLogger(__name__)

# A call's outcome as the lookups read it: (answered, the reply).
Reply = tuple[bool, Any]


class FindNodeRpc(Protocol):
    """What a FIND_NODE lookup asks of the RPC layer."""

    def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> Awaitable[Reply]: ...


class FindValueRpc(FindNodeRpc, Protocol):
    """What a FIND_VALUE lookup asks of it: it stores the value it finds on the nearest node
    that did not have it (§2.3)."""

    def call_find_value(self, node_to_ask: Node, node_to_find: Node) -> Awaitable[Reply]: ...

    def call_store(self, node_to_ask: Node, key: bytes, value: Any) -> Awaitable[Reply]: ...


class NodeHeap:
    """The ``maxsize`` nodes nearest to ``node`` seen so far, and which were asked."""

    def __init__(self, node: Node, maxsize: int) -> None:
        self.node = node
        self.heap: list[tuple[int, bytes, Node]] = []
        self.contacted: set[bytes] = set()
        self.maxsize = maxsize
        self._ids: set[bytes] = set()

    def remove(self, peers: Iterator[bytes] | list[bytes]) -> None:
        """Forget these IDs (nodes that did not answer)."""
        gone = set(peers)
        if gone:
            self.heap = [e for e in self.heap if e[1] not in gone]
            heapq.heapify(self.heap)
            self._ids -= gone

    def get_node(self, node_id: bytes) -> Node | None:
        return next((n for _, i, n in self.heap if i == node_id), None)

    def have_contacted_all(self) -> bool:
        return not self.get_uncontacted()

    def get_ids(self) -> list[bytes]:
        return [n.id for n in self]

    def mark_contacted(self, node: Node) -> None:
        self.contacted.add(node.id)

    def popleft(self) -> Node | None:
        if not self.heap:
            return None
        _, node_id, node = heapq.heappop(self.heap)
        self._ids.discard(node_id)
        return node

    def push(self, nodes: list[Node]) -> None:
        for node in nodes:
            if node.id not in self._ids:
                self._ids.add(node.id)
                heapq.heappush(self.heap, (self.node.distance_to(node), node.id, node))

    def __len__(self) -> int:
        return min(len(self.heap), self.maxsize)

    def __iter__(self) -> Iterator[Node]:
        return iter([n for _, _, n in heapq.nsmallest(self.maxsize, self.heap)])

    def __contains__(self, node: Node) -> bool:
        return node.id in self._ids

    def get_uncontacted(self) -> list[Node]:
        return [n for n in self if n.id not in self.contacted]


def _nodes(reply: Any) -> list[Node]:
    return [Node(*triple) for triple in reply or []]


class NodeLookup:
    """FIND_NODE: the ``ksize`` nodes nearest to ``node`` that answer."""

    def __init__(self, rpc: FindNodeRpc, node: Node, peers: list[Node], ksize: int, alpha: int):
        self.rpc = rpc
        self.ksize = ksize
        self.alpha = alpha
        self.node = node
        self.nearest = NodeHeap(node, ksize)
        self.last_ids_crawled: list[bytes] = []
        self.nearest.push(peers)

    async def _round(self, call: Callable[[Node, Node], Awaitable[Reply]]) -> dict[bytes, Reply]:
        """Ask the ``alpha`` nearest not yet asked; everyone not yet asked when the nearest
        did not change since the last round (§2.3: the lookup ends once the k nearest
        answered)."""
        count = self.alpha
        if self.nearest.get_ids() == self.last_ids_crawled:
            count = len(self.nearest)
        self.last_ids_crawled = self.nearest.get_ids()
        asked = self.nearest.get_uncontacted()[:count]
        for peer in asked:
            self.nearest.mark_contacted(peer)
        replies = await asyncio.gather(*(call(peer, self.node) for peer in asked))
        return {peer.id: reply for peer, reply in zip(asked, replies, strict=True)}

    async def find(self) -> list[Node]:
        """The ``ksize`` nodes nearest to the target that answered."""
        while True:
            silent = []
            for peer_id, (ok, reply) in (await self._round(self.rpc.call_find_node)).items():
                if not ok:
                    silent.append(peer_id)
                else:
                    self.nearest.push(_nodes(reply))
            self.nearest.remove(silent)
            if self.nearest.have_contacted_all():
                return list(self.nearest)


class ValueLookup(NodeLookup):
    """FIND_VALUE: the value stored under ``node``'s ID, or None."""

    def __init__(self, rpc: FindValueRpc, node: Node, peers: list[Node], ksize: int, alpha: int):
        super().__init__(rpc, node, peers, ksize, alpha)
        self.value_rpc = rpc
        # The nearest node without the value: it is asked to store it (§2.3).
        self.nearest_without_value = NodeHeap(node, 1)

    async def find_value(self) -> Any:
        """The value stored under the target, or None when no node holds it."""
        while True:
            silent = []
            values: list[Any] = []
            for peer_id, (ok, reply) in (await self._round(self.value_rpc.call_find_value)).items():
                if not ok:
                    silent.append(peer_id)
                elif isinstance(reply, dict):
                    values.append(reply["value"])
                else:
                    peer = self.nearest.get_node(peer_id)
                    if peer is not None:
                        self.nearest_without_value.push([peer])
                    self.nearest.push(_nodes(reply))
            self.nearest.remove(silent)
            if values:
                return await self._found(values)
            if self.nearest.have_contacted_all():
                return None

    async def _found(self, values: list[Any]) -> Any:
        counts = Counter(values)
        if len(counts) != 1:
            log.warning("different values for key %s: %s", self.node.id.hex(), values)
        value = counts.most_common(1)[0][0]
        peer = self.nearest_without_value.popleft()
        if peer is not None:
            await self.value_rpc.call_store(peer, self.node.id, value)
        return value
