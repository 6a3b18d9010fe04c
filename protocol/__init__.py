"""The extended Kademlia protocol: ownership math, crawl RPC messages and the node.

Nothing here knows about HTTP; it moves opaque URL tasks between peers. Import from here:
the submodules are implementation detail.
"""

from __future__ import annotations

from protocol.backoff import Backoff, backoff_delay
from protocol.balance import bit_loads
from protocol.errors import BootstrapError, Busy, MessageError, PeerTimeout, RemoteError
from protocol.loadreport import LOAD_RPC, MAX_PEERS, LoadReport, serve_load
from protocol.loans import (
    KEEPALIVE_S,
    LEASE_S,
    LEND_REPLY_BUDGET,
    LEND_RPC,
    LOAN_BYTES_MOST,
    MAX_LENT_ROBOTS,
    MAX_LOANS,
    MAX_REPORTS,
    MAX_ROBOTS_TTL,
    MAX_WANT,
    RETURN_RPC,
    GiveBack,
    LentRobots,
    Loan,
    check_lend_request,
    check_return_request,
    loan_to_wire,
    one_chunk,
    returns_to_wire,
)
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
from protocol.model import MAX_KNOWN
from protocol.node import CrawlHandler, CrawlNode, NodeConfig
from protocol.ownership import closest, distance, key_for, new_node_id, owner_and_replicas
from protocol.periodic import every
from protocol.ratelimit import Rate, SourceLimits, TokenBucket
from protocol.survey import Survey, survey
from protocol.taskset import TaskSet
from protocol.throttle import Throttle

__all__ = [
    "KEEPALIVE_S",
    "LEASE_S",
    "LEND_REPLY_BUDGET",
    "LEND_RPC",
    "LOAD_RPC",
    "LOAN_BYTES_MOST",
    "MAX_KNOWN",
    "MAX_LENT_ROBOTS",
    "MAX_LOANS",
    "MAX_PEERS",
    "MAX_REPORTS",
    "MAX_ROBOTS_TTL",
    "MAX_URL_LENGTH",
    "MAX_WANT",
    "RETURN_RPC",
    "Backoff",
    "BootstrapError",
    "Busy",
    "CrawlHandler",
    "CrawlNode",
    "GiveBack",
    "KeyBatch",
    "LagSnapshot",
    "LentRobots",
    "LoadReport",
    "Loan",
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
    "Survey",
    "TaskItem",
    "TaskSet",
    "Throttle",
    "TokenBucket",
    "backoff_delay",
    "bit_loads",
    "check_lend_request",
    "check_return_request",
    "closest",
    "decode_batches",
    "distance",
    "encode_batches",
    "every",
    "key_for",
    "loan_to_wire",
    "new_node_id",
    "one_chunk",
    "owner_and_replicas",
    "returns_to_wire",
    "serve_load",
    "survey",
]
