"""The extended Kademlia protocol: ownership math, crawl RPC messages and the node.

Nothing here knows about HTTP; it moves opaque URL tasks between peers. Import from here:
the submodules are implementation detail (``rpc`` is the only one that touches rpcudp).
"""

from __future__ import annotations

from protocol.backoff import Backoff, backoff_delay
from protocol.errors import BootstrapError, Busy, MessageError, PeerTimeout, RemoteError
from protocol.looplag import LagSnapshot, LoopLagMonitor
from protocol.memo import Memo
from protocol.messages import (
    MAX_URL_LENGTH,
    KeyBatch,
    PeerRef,
    RefreshAnswer,
    StoreResult,
    TaskItem,
    decode_batches,
    encode_batches,
)
from protocol.node import CrawlHandler, CrawlNode, NodeConfig
from protocol.ownership import closest, distance, key_for, new_node_id, owner_and_replicas
from protocol.periodic import every
from protocol.ratelimit import Rate, SourceLimits, TokenBucket
from protocol.tasks import TaskSet
from protocol.throttle import Throttle

__all__ = [
    "MAX_URL_LENGTH",
    "Backoff",
    "BootstrapError",
    "Busy",
    "CrawlHandler",
    "CrawlNode",
    "KeyBatch",
    "LagSnapshot",
    "LoopLagMonitor",
    "Memo",
    "MessageError",
    "NodeConfig",
    "PeerRef",
    "PeerTimeout",
    "Rate",
    "RefreshAnswer",
    "RemoteError",
    "SourceLimits",
    "StoreResult",
    "TaskItem",
    "TaskSet",
    "Throttle",
    "TokenBucket",
    "backoff_delay",
    "closest",
    "decode_batches",
    "distance",
    "encode_batches",
    "every",
    "key_for",
    "new_node_id",
    "owner_and_replicas",
]
