"""The peer: one crawler in a network of equals, wired to the DHT node and its neighbours.

:class:`Peer` opens the stores and starts the parts that :mod:`~p2pcrawl.network.parts`
wires: links go to their owners through the :class:`Dispatcher`, accepted tasks are copied
to the replicas (:mod:`~p2pcrawl.network.replication`), and joins, stalls, crashes and leaves
move host keys between peers (``join``, ``stall``, ``rebalance``, ``leave``).
docs/architecture.md draws the whole path.
"""

from __future__ import annotations

from p2pcrawl.network.announce import (
    ANNOUNCE_EVERY_S,
    ANNOUNCE_MAX_AGE_S,
    Announcement,
    announce_key,
    announced_address,
    decode_announcement,
    encode_announcement,
    loopback_only,
    same_host,
)
from p2pcrawl.network.dispatch import Dispatcher
from p2pcrawl.network.healing import CONTACTS_FILE, read_contacts
from p2pcrawl.network.history import history_chunks, read_history_chunk
from p2pcrawl.network.identity import (
    DataDirError,
    load_or_create_identity,
    lock_data_dir,
    save_identity,
)
from p2pcrawl.network.leave import HandoffReport
from p2pcrawl.network.loanbook import MAX_UNSETTLED
from p2pcrawl.network.netkey import (
    KEY_FILE,
    KeyDecision,
    NetworkKeyError,
    decide_key,
    is_loopback,
    join_command,
    new_key,
)
from p2pcrawl.network.parts import Parts
from p2pcrawl.network.peer import Peer, PeerConfig, State

__all__ = [
    "ANNOUNCE_EVERY_S",
    "ANNOUNCE_MAX_AGE_S",
    "CONTACTS_FILE",
    "KEY_FILE",
    "MAX_UNSETTLED",
    "Announcement",
    "DataDirError",
    "Dispatcher",
    "HandoffReport",
    "KeyDecision",
    "NetworkKeyError",
    "Parts",
    "Peer",
    "PeerConfig",
    "State",
    "announce_key",
    "announced_address",
    "decide_key",
    "decode_announcement",
    "encode_announcement",
    "history_chunks",
    "is_loopback",
    "join_command",
    "load_or_create_identity",
    "lock_data_dir",
    "loopback_only",
    "new_key",
    "read_contacts",
    "read_history_chunk",
    "same_host",
    "save_identity",
]
