"""A captured signed datagram, sent again, changes nothing: from the same address it is a
replay, from another address it does not authenticate."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from protocol import CrawlNode, KeyBatch, TaskItem, key_for, replay
from protocol.auth import REQUEST
from tests.protocol.conftest import NodeFactory, eventually, fp, handler_of, recv

pytestmark = pytest.mark.timeout(30)

KEY = "cluster-key"


def tap(node: CrawlNode) -> list[bytes]:
    """Every datagram ``node`` sends, as it went on the wire (what a sniffer sees)."""
    sent: list[bytes] = []
    transport: Any = node.rpc.endpoint.transport
    real = transport.sendto

    def sendto(data: bytes, addr: Any = None) -> None:
        sent.append(bytes(data))
        real(data, addr)

    transport.sendto = sendto
    return sent


def requests(sent: list[bytes]) -> list[bytes]:
    return [d for d in sent if d[0] == REQUEST]


@pytest.mark.parametrize("answered_s", [replay.ANSWERED_S, 0.0])
async def test_a_replayed_store_backup_does_not_resurrect_a_deleted_backup(
    make_node: NodeFactory, monkeypatch: pytest.MonkeyPatch, answered_s: float
) -> None:
    # While a's reply cache holds the request, the copy is taken for a resend and answered
    # from it; once it has forgotten the request, the replay guard refuses the copy. Either
    # way the handler does not run again.
    monkeypatch.setattr(replay, "ANSWERED_S", answered_s)
    a = await make_node(secret=KEY)
    b = await make_node(secret=KEY)
    await b.join([a.me.addr])
    wire = tap(b)
    task = TaskItem("https://a.example/x", 0)
    assert await b.store_backup(a.me, b.me.id, [KeyBatch(key_for("a.example"), [task])]) == 1
    (store,) = requests(wire)
    assert await b.delete_backup(a.me, b.me.id, {key_for("a.example"): [fp(task.url)]}) == 1
    assert handler_of(a).backups[b.me.id] == {}
    before = a.stats()
    await asyncio.sleep(0.01)  # with answered_s 0, the request is forgotten once time moves
    b.rpc.endpoint.transport.sendto(store, a.me.addr)  # type: ignore[union-attr]
    if answered_s:
        await eventually(lambda: a.stats()["duplicate_requests"] == 1)
    else:
        await eventually(lambda: a.stats()["dropped"].get("replay") == 1)  # type: ignore[attr-defined]
    assert handler_of(a).backups[b.me.id] == {}
    assert a.stats()["rpc_received"] == before["rpc_received"]


async def test_a_datagram_replayed_from_another_address_is_dropped_unanswered(
    make_node: NodeFactory, raw_socket: socket.socket
) -> None:
    a = await make_node(secret=KEY)
    b = await make_node(secret=KEY)
    await b.join([a.me.addr])
    wire = tap(b)
    assert await b.delete_backup(a.me, b.me.id, {key_for("a.example"): [12345]}) == 0
    (delete,) = requests(wire)
    router = a.rpc.router
    seen_before = router.last_seen(b.me.id)
    for _ in range(5):
        raw_socket.sendto(delete, a.me.addr)
    assert await recv(raw_socket, 0.5) is None  # no reply drawn to the copier
    await eventually(lambda: a.stats()["dropped"].get("bad_source") == 5)  # type: ignore[attr-defined]
    assert router.last_seen(b.me.id) == seen_before  # not even "heard from"
    assert [(p.id, p.addr) for p in a.peers()] == [(b.me.id, b.me.addr)]
    # And a fresh request from b still works: nothing about b was disturbed.
    assert await b.delete_backup(a.me, b.me.id, {key_for("a.example"): [12345]}) == 0
