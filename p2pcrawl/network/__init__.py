"""The peer: one crawler in a network of equals, wired to the DHT node and its neighbours.

:class:`Peer` owns the stores, the crawl engine and the node; links go to their owners
through the :class:`Dispatcher`, accepted tasks are copied to the replicas
(:mod:`~p2pcrawl.network.replication`), and joins, leaves and crashes move host keys between
peers (:class:`Membership`). docs/architecture.md draws the whole path.
"""

from __future__ import annotations

from p2pcrawl.network.dispatch import Dispatcher, to_batches
from p2pcrawl.network.identity import DataDirError, load_or_create_identity, lock_data_dir
from p2pcrawl.network.membership import HandoffReport, Membership
from p2pcrawl.network.netkey import (
    KEY_FILE,
    KeyDecision,
    NetworkKeyError,
    decide_key,
    is_loopback,
    join_command,
)
from p2pcrawl.network.peer import Peer, PeerConfig, State

__all__ = [
    "KEY_FILE",
    "DataDirError",
    "Dispatcher",
    "HandoffReport",
    "KeyDecision",
    "Membership",
    "NetworkKeyError",
    "Peer",
    "PeerConfig",
    "State",
    "decide_key",
    "is_loopback",
    "join_command",
    "load_or_create_identity",
    "lock_data_dir",
    "to_batches",
]
