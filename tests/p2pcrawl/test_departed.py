"""A peer that said goodbye stays forgotten (docs/membership.md): with the default timers.

After its GOODBYE a leaving peer still hands off its keys, and while it does, nothing may put
it back into the others' routing tables: a peer re-admitted there is made an owner and a
replica again, is sent tasks, copies and the news of finished pages, and once its process
has exited every one of those calls waits out the RPC timeout until the failure detector
declares it dead. A ping was how a node rejoined (``rpc_ping`` cleared the departed mark),
and the leaver's own liveness round pinged each neighbour that had been silent towards it
for a ping interval, which after its goodbye they all were. Now a node that said GOODBYE
sends only its handoff (``CrawlNode.depart``), and only a lookup of its own ID (a join)
brings it back.
"""

from __future__ import annotations

import asyncio

from p2pcrawl.settings import PeerSettings
from tests.conftest import TEST_MIN_PEER_AGE, PeerFactory


async def test_a_peer_that_said_goodbye_is_not_readmitted_while_it_hands_off(
    make_peer: PeerFactory,
) -> None:
    settings = PeerSettings(min_peer_age=TEST_MIN_PEER_AGE)  # the ping interval at its default
    a = await make_peer(peer=settings)
    assert a.node is not None
    b = await make_peer(peer=settings, bootstrap=(a.node.me.addr,))
    assert b.node is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not a.node.is_member(b.node_id):
        assert loop.time() < deadline, "b never joined a"
        await asyncio.sleep(0.05)
    await b.leave()  # GOODBYE, then the hand-off; b's process would exit after
    assert not a.node.is_member(b.node_id)
    # A hand-off that lasts a few ping intervals (a large queue, a loaded machine).
    await asyncio.sleep(3 * settings.ping_interval + 0.5)
    assert not a.node.is_member(b.node_id), "the leaver is back in a's routing table"
    assert b.node_id not in {p.id for p in a.node.peers()}
