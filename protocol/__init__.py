"""The extended Kademlia protocol: ownership math, crawl RPC messages and the node.

Nothing here knows about HTTP; it moves opaque URL tasks between peers. Import from here:
the submodules are implementation detail.
"""

from __future__ import annotations

from protocol.backoff import Backoff, backoff_delay
from protocol.balance import bit_loads
from protocol.endpoint import InboundLimits
from protocol.errors import BootstrapError, Busy, MessageError, PeerTimeout, RemoteError
from protocol.loadreport import LOAD, MAX_PEERS, LoadReport, serve_load
from protocol.loans import (
    GIVE_BACK,
    KEEPALIVE_S,
    LEASE_S,
    LEND,
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
    GiveBackArgs,
    GiveBackReply,
    LendArgs,
    LendReply,
    LentRobots,
    Loan,
    loan_reply,
    one_chunk,
    returns_reply,
)
from protocol.looplag import LagSnapshot, LoopLagMonitor
from protocol.memo import Memo
from protocol.messages import (
    MAX_URL_LENGTH,
    MAX_VOUCH,
    QUIET,
    VOUCH,
    Held,
    KeyBatch,
    PeerRef,
    QuietReply,
    RefreshAnswer,
    StoreResult,
    TaskItem,
    Vouched,
    VouchReply,
    Wanted,
    decode_batches,
    encode_batches,
)
from protocol.model import MAX_KNOWN
from protocol.node import CrawlHandler, CrawlNode, NodeConfig
from protocol.nodekey import DEFAULT_WORK_BITS, NodeKey, chosen_bits, joiner_depth
from protocol.ownership import closest, distance, key_for, new_node_id, owner_and_replicas
from protocol.periodic import every
from protocol.procedures import Args, NoArgs, Procedure, Reply
from protocol.ratelimit import Rate, SourceLimits, TokenBucket
from protocol.survey import Survey, survey
from protocol.taskset import TaskSet
from protocol.throttle import Throttle

__all__ = [
    "DEFAULT_WORK_BITS",
    "GIVE_BACK",
    "KEEPALIVE_S",
    "LEASE_S",
    "LEND",
    "LEND_REPLY_BUDGET",
    "LEND_RPC",
    "LOAD",
    "LOAN_BYTES_MOST",
    "MAX_KNOWN",
    "MAX_LENT_ROBOTS",
    "MAX_LOANS",
    "MAX_PEERS",
    "MAX_REPORTS",
    "MAX_ROBOTS_TTL",
    "MAX_URL_LENGTH",
    "MAX_VOUCH",
    "MAX_WANT",
    "QUIET",
    "RETURN_RPC",
    "VOUCH",
    "Args",
    "Backoff",
    "BootstrapError",
    "Busy",
    "CrawlHandler",
    "CrawlNode",
    "GiveBack",
    "GiveBackArgs",
    "GiveBackReply",
    "Held",
    "InboundLimits",
    "KeyBatch",
    "LagSnapshot",
    "LendArgs",
    "LendReply",
    "LentRobots",
    "LoadReport",
    "Loan",
    "LoopLagMonitor",
    "Memo",
    "MessageError",
    "NoArgs",
    "NodeConfig",
    "NodeKey",
    "PeerRef",
    "PeerTimeout",
    "Procedure",
    "QuietReply",
    "Rate",
    "RefreshAnswer",
    "RemoteError",
    "Reply",
    "SourceLimits",
    "StoreResult",
    "Survey",
    "TaskItem",
    "TaskSet",
    "Throttle",
    "TokenBucket",
    "VouchReply",
    "Vouched",
    "Wanted",
    "backoff_delay",
    "bit_loads",
    "chosen_bits",
    "closest",
    "decode_batches",
    "distance",
    "encode_batches",
    "every",
    "joiner_depth",
    "key_for",
    "loan_reply",
    "new_node_id",
    "one_chunk",
    "owner_and_replicas",
    "returns_reply",
    "serve_load",
    "survey",
]
