"""A lost datagram costs a resend, not a timeout; a request sent twice is served once.

Real UDP nodes on loopback; the loss is one datagram a node's socket does not send, as a link
queued full at its cap drops it.
"""

from __future__ import annotations

from typing import Any

import pytest

from protocol import CrawlNode, KeyBatch, PeerRef, PeerTimeout, StoreResult, TaskItem, key_for
from protocol.auth import REPLY, REQUEST
from tests.protocol.conftest import NodeFactory, handler_of

pytestmark = pytest.mark.timeout(30)


def lose_next(node: CrawlNode, kind: int) -> list[bytes]:
    """The next datagram of ``kind`` that ``node`` sends is lost; returns what was lost."""
    lost: list[bytes] = []
    transport: Any = node.rpc.endpoint.transport
    real = transport.sendto

    def sendto(data: bytes, addr: Any = None) -> None:
        if not lost and data[0] == kind:
            lost.append(bytes(data))
            return
        real(data, addr)

    transport.sendto = sendto
    return lost


def batch(url: str) -> list[KeyBatch]:
    return [KeyBatch(key_for("a.example"), [TaskItem(url, 0)])]


@pytest.fixture(params=["", "cluster-key"], ids=["open", "keyed"])
async def members(make_node: NodeFactory, request: pytest.FixtureRequest) -> list[CrawlNode]:
    """Two nodes in each other's tables (a resend goes only to a member)."""
    a = await make_node(secret=request.param)
    b = await make_node(secret=request.param)
    await b.join([a.me.addr])
    return [a, b]


async def test_a_lost_request_is_answered_after_its_resend(members: list[CrawlNode]) -> None:
    a, b = members
    lost = lose_next(b, REQUEST)
    assert await b.store_task(a.me, batch("https://a.example/x")) == StoreResult(1, 0, [])
    assert len(lost) == 1
    assert b.stats()["requests_resent"] >= 1  # type: ignore[operator]
    assert b.stats()["rpc_failed"] == {}
    assert len(handler_of(a).tasks) == 1


async def test_a_lost_reply_is_sent_again_and_the_request_is_served_once(
    members: list[CrawlNode],
) -> None:
    a, b = members
    before = a.stats()["rpc_received"].get("store_task", 0)  # type: ignore[attr-defined]
    lost = lose_next(a, REPLY)
    # Served a second time, the task would be a duplicate: (0 new, 1 duplicate). The first
    # serving's answer, sent again, says what happened.
    assert await b.store_task(a.me, batch("https://a.example/y")) == StoreResult(1, 0, [])
    assert len(lost) == 1
    assert a.stats()["rpc_received"]["store_task"] == before + 1  # type: ignore[index]
    assert a.stats()["duplicate_requests"] >= 1  # type: ignore[operator]
    assert "replay" not in a.stats()["dropped"]  # type: ignore[operator]
    assert b.stats()["rpc_failed"] == {}


async def test_a_stranger_is_sent_a_request_once(make_node: NodeFactory) -> None:
    # A stranger's address may be forged: one request must not draw more than one datagram.
    a = await make_node()
    b = await make_node()
    lose_next(a, REQUEST)  # b never hears a's ping
    with pytest.raises(PeerTimeout):
        await a.ping_peer(PeerRef(b.me.id, *b.me.addr))
    assert a.stats()["requests_resent"] == 0
