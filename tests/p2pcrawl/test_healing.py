"""Healing: saved contacts, rejoin without --bootstrap, and a split that merges again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from p2pcrawl.network import CONTACTS_FILE, Peer, PeerConfig, read_contacts
from p2pcrawl.settings import PeerSettings
from protocol import CrawlNode
from protocol.kbucket import Node
from tests.conftest import TEST_MIN_PEER_AGE

HEAL = PeerSettings(
    rpc_timeout=0.3,
    ping_interval=0.3,
    suspicion_timeout=1.0,
    heal_interval=0.3,
    heal_max_backoff=1.0,
    min_peer_age=TEST_MIN_PEER_AGE,
)
MERGE_BOUND_S = HEAL.heal_interval + HEAL.heal_max_backoff + 3 * HEAL.rpc_timeout + 1.0


async def wait_for(check: Any, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "not reached in time"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def mesh(make_peer: Any) -> list[Peer]:
    a = await make_peer(peer=HEAL)
    b = await make_peer(peer=HEAL, bootstrap=(a.me.addr,))
    c = await make_peer(peer=HEAL, bootstrap=(a.me.addr,))
    peers = [a, b, c]
    await wait_for(lambda: all(len(p.node.peers()) == 2 for p in peers), 10)
    await wait_for(lambda: all(len(read_contacts(p.config.data_dir)) == 2 for p in peers), 10)
    return peers


def _node(peer: Peer) -> CrawlNode:
    assert peer.node is not None
    return peer.node


async def test_a_split_merges_within_the_bound(make_peer: Any) -> None:
    a, b, c = await mesh(make_peer)
    assert a.node is not None and b.node is not None and c.node is not None
    # The split a burst used to cause: a dropped everyone, everyone dropped a. Nobody talks
    # to anybody across it any more, so without healing it would last for ever.
    proto_a = a.node.rpc
    assert proto_a is not None
    for other in (b, c):
        assert other.node is not None and other.node.rpc is not None
        proto_a.contacts.declare_dead(Node(other.node_id, *other.me.addr))
        other.node.rpc.contacts.declare_dead(Node(a.node_id, *a.me.addr))
    assert a.node.peers() == []
    took = await wait_for(
        lambda: (
            {p.id for p in a.node.peers()} == {b.node_id, c.node_id}
            and all(a.node_id in {p.id for p in _node(x).peers()} for x in (b, c))
        ),
        MERGE_BOUND_S,
    )
    # The merge is a's rejoin: the tables fill while its join still runs (the lookup of its
    # own ID), and the rejoin counts itself once the join returns.
    await wait_for(lambda: a.parts.healing.rejoins >= 1, 3 * HEAL.rpc_timeout + 1.0)
    print(f"merged in {took:.2f} s (bound {MERGE_BOUND_S:.2f} s)")


async def test_a_restarted_peer_rejoins_without_bootstrap(make_peer: Any, tmp_path: Path) -> None:
    a, b, c = await mesh(make_peer)
    data = c.config.data_dir
    await c.aclose()
    assert (data / CONTACTS_FILE).exists()
    again = Peer(PeerConfig(data_dir=data, peer=HEAL))  # no --bootstrap
    try:
        await again.start()
        assert again.node is not None and a.node is not None
        assert {p.id for p in again.node.peers()} == {a.node_id, b.node_id}
        await wait_for(lambda: again.node_id in {p.id for p in a.node.peers()}, 5)
    finally:
        await again.aclose()


async def test_damaged_contacts_are_ignored(tmp_path: Path) -> None:
    (tmp_path / CONTACTS_FILE).write_text('{"contacts": [["1.2.3.4", 70000], ["x", "y"], 5]}')
    assert read_contacts(tmp_path) == []
    (tmp_path / CONTACTS_FILE).write_bytes(b"\xff\x00")
    assert read_contacts(tmp_path) == []
