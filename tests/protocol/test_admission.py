"""Hostile scripts against one node on loopback: invented contacts, stolen IDs, floods.

Each script is a plain UDP socket speaking the stock (unkeyed) wire, as an attacker would.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from typing import Any

import pytest
import umsgpack

from protocol import PeerRef
from protocol.endpoint import InboundLimits
from protocol.ratelimit import Rate, SourceLimits
from protocol.valuestore import BoundedStorage, StoreLimits
from tests.protocol.conftest import NodeFactory, eventually, handler_of, recv

pytestmark = pytest.mark.timeout(60)

OPEN_GATES = InboundLimits(
    stranger=Rate(1e6, 1e6), stranger_ip=Rate(1e6, 1e6), strangers=Rate(1e6, 1e6)
)


def request(name: str, args: list[Any], msg_id: bytes | None = None) -> bytes:
    packed: bytes = umsgpack.packb([name, args])
    return b"\x00" + (msg_id or secrets.token_bytes(20)) + packed


async def drain(sock: socket.socket, quiet: float = 0.3) -> list[bytes]:
    out = []
    while (got := await recv(sock, quiet)) is not None:
        out.append(got)
    return out


def sockets(n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        out.append(s)
    return out


async def test_invented_ids_that_do_not_answer_never_enter_the_table(
    make_node: NodeFactory, raw_socket: socket.socket
) -> None:
    a = await make_node()
    for _ in range(30):  # pings that name a new ID each; the script never answers a challenge
        raw_socket.sendto(request("ping", [secrets.token_bytes(20)]), a.me.addr)
    await drain(raw_socket)
    proto = a.rpc
    assert proto is not None
    await proto.admission.settle(2.0)
    assert proto.router.members() == [] and a.peers() == []
    counts = a.stats()["admission"]
    assert counts["failed"] >= 1  # type: ignore[index]
    assert handler_of(a).added == []


async def test_a_stolen_id_from_another_address_does_not_move_the_contact(
    make_node: NodeFactory, raw_socket: socket.socket
) -> None:
    a = await make_node()
    b = await make_node()
    await b.join([a.me.addr])
    await eventually(lambda: [p.id for p in a.peers()] == [b.me.id])
    # The script claims b's ID from its own address, and even answers the challenge with it.
    raw_socket.sendto(request("ping", [b.me.id]), a.me.addr)
    for got in await drain(raw_socket, 0.5):
        if got[0] == 0:  # a's challenge: answer it as b would
            raw_socket.sendto(b"\x01" + got[1:21] + umsgpack.packb(b.me.id), a.me.addr)
    proto = a.rpc
    assert proto is not None
    await proto.admission.settle(2.0)
    assert [(p.id, p.addr) for p in a.peers()] == [(b.me.id, b.me.addr)]
    assert a.stats()["admission"]["move_refused"] == 1  # type: ignore[index]


async def test_a_real_stranger_is_admitted_after_answering_the_challenge(
    make_node: NodeFactory,
) -> None:
    a = await make_node()
    b = await make_node()
    assert await b.ping_peer(PeerRef(a.me.id, *a.me.addr)) == a.me.id
    await eventually(lambda: [p.id for p in a.peers()] == [b.me.id])
    assert a.stats()["admission"] == {"challenged": 1, "admitted": 1}


async def test_a_new_contact_takes_over_keys_only_after_the_minimum_age(
    make_node: NodeFactory,
) -> None:
    a = await make_node(min_owner_age=0.6)
    b = await make_node(min_owner_age=0.6)
    await b.join([a.me.addr])
    assert [p.id for p in b.peers()] == [a.me.id]  # found while joining: established at once
    await eventually(lambda: len(a.rpc.router.members()) == 1)
    started = time.monotonic()
    assert a.peers() == [] and a.closest_local(b.me.id, 1) == [a.me]
    assert handler_of(a).added == []
    await eventually(lambda: [p.id for p in a.peers()] == [b.me.id], timeout=3.0)
    assert time.monotonic() - started >= 0.4
    assert [p.id for p in handler_of(a).added] == [b.me.id]
    assert a.closest_local(b.me.id, 1)[0].id == b.me.id


async def test_a_joining_node_owns_no_key_until_it_takes_ownership(
    make_node: NodeFactory,
) -> None:
    a = await make_node()
    b = await make_node()
    b.hold_ownership()  # what a joining peer does before it joins
    await b.join([a.me.addr])
    # Even its own ID's keys go to the established node until the handoffs are done ...
    assert b.closest_local(b.me.id, 1) == [a.me]
    assert [p.id for p in await b.closest(b.me.id, 2)] == [a.me.id]
    assert b.closest_local(b.me.id, 1, with_self=True) == [b.me]  # ... unless asked for
    assert b.take_ownership() and not b.take_ownership()
    assert b.closest_local(b.me.id, 1) == [b.me]


async def test_owner_wait_counts_down_from_admission(make_node: NodeFactory) -> None:
    a = await make_node(min_owner_age=0.6)
    b = await make_node()
    assert a.owner_wait(b.me.id) is None  # not in the table: a REFRESH_TASK hears "later"
    assert not a.establish_early(b.me.id)
    await b.join([a.me.addr])
    await eventually(lambda: a.owner_wait(b.me.id) is not None)
    wait = a.owner_wait(b.me.id)
    assert wait is not None and 0.3 < wait <= 0.6
    assert not a.establish_early(b.me.id) and a.peers() == []
    await eventually(lambda: a.owner_wait(b.me.id) == 0.0, timeout=3.0)
    assert a.establish_early(b.me.id)
    assert [p.id for p in a.peers()] == [b.me.id]


async def test_a_ping_flood_from_one_source_is_rate_limited_and_unanswered(
    make_node: NodeFactory, raw_socket: socket.socket
) -> None:
    a = await make_node()
    me = secrets.token_bytes(20)
    for _ in range(500):
        raw_socket.sendto(request("ping", [me]), a.me.addr)
    replies = [d for d in await drain(raw_socket) if d[0] == 1]
    dropped = a.stats()["dropped"]
    assert dropped["rate_limited"] >= 400  # type: ignore[index]
    assert len(replies) <= 60  # the stranger's burst (40) and what refilled meanwhile


async def test_replies_to_strangers_are_no_larger_than_twice_their_request(
    make_node: NodeFactory, raw_socket: socket.socket
) -> None:
    a = await make_node()
    others = [await make_node() for _ in range(12)]
    for o in others:
        await o.join([a.me.addr])
    await eventually(lambda: len(a.peers()) == 12)
    ask = request("find_node", [secrets.token_bytes(20), secrets.token_bytes(20)])
    raw_socket.sendto(ask, a.me.addr)
    (reply,) = [d for d in await drain(raw_socket) if d[0] == 1]
    contacts = umsgpack.unpackb(reply[21:])
    assert 0 < len(contacts) < 12 and len(reply) <= 2 * len(ask)
    # A member asking the same gets the whole answer.
    assert len(await others[0].closest(secrets.token_bytes(20), 20)) == 13


async def test_a_store_flood_keeps_the_value_store_bounded(make_node: NodeFactory) -> None:
    limits = StoreLimits(max_items=300, max_bytes=1 << 20, per_source_items=50)
    a = await make_node(store_limits=limits, inbound=OPEN_GATES)
    a.storage.put(b"k" * 20, "kept")  # stored before the flood; must survive it
    senders = sockets(10)
    try:
        for s in senders:
            for _ in range(100):
                key, value = secrets.token_bytes(20), secrets.token_bytes(7000)
                s.sendto(request("store", [secrets.token_bytes(20), key, value]), a.me.addr)
                await asyncio.sleep(0)
            await drain(s, 0.05)
        await eventually(lambda: a.stats()["rpc_received"].get("store") == 1000)  # type: ignore[attr-defined]
    finally:
        for s in senders:
            s.close()
    store = a.storage
    assert isinstance(store, BoundedStorage)
    assert len(store) <= 300 and store.bytes <= 1 << 20
    assert store.refused >= 700
    assert store.get(b"k" * 20) == "kept"


def test_source_limits_forget_the_least_recent_source_when_full() -> None:
    now = [0.0]
    limits = SourceLimits(Rate(per_s=1.0, burst=2.0), max_sources=2, clock=lambda: now[0])
    assert limits.allow("a") and limits.allow("a") and not limits.allow("a")
    now[0] = 1.0
    assert limits.allow("a") and not limits.allow("a")  # one token refilled per second
    assert limits.allow("b") and limits.allow("c") and len(limits) == 2  # "a" pushed out


def test_value_store_limits_per_source_and_replacement() -> None:
    store = BoundedStorage(StoreLimits(max_items=10, per_source_items=2))
    src = ("127.0.0.1", 9)
    assert store.put(b"1" * 20, "x", src) and store.put(b"2" * 20, "x", src)
    assert not store.put(b"3" * 20, "x", src)  # over this source's count
    assert store.put(b"1" * 20, "y", src)  # replacing its own value is fine
    assert store.put(b"3" * 20, "x", ("127.0.0.1", 10))
    assert len(store) == 3 and store.get(b"1" * 20) == "y"


async def test_a_new_contact_flood_of_real_answerers_is_admitted_only_at_the_limited_rate(
    make_node: NodeFactory,
) -> None:
    # 150 addresses on one IP, each claiming its own ID and answering its challenge correctly
    # (what one machine can do in an open network): the table grows by the per-IP burst only.
    a = await make_node(inbound=OPEN_GATES)
    flood = sockets(150)
    ids = {s.getsockname(): secrets.token_bytes(20) for s in flood}
    try:
        for s in flood:
            s.sendto(request("ping", [ids[s.getsockname()]]), a.me.addr)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for s in flood:
                try:
                    got = s.recv(65536)
                except BlockingIOError:
                    continue
                if got[0] == 0:  # a challenge: answer with the claimed ID
                    s.sendto(b"\x01" + got[1:21] + umsgpack.packb(ids[s.getsockname()]), a.me.addr)
            await asyncio.sleep(0.01)
    finally:
        for s in flood:
            s.close()
    proto = a.rpc
    assert proto is not None
    counts = a.stats()["admission"]
    members = len(proto.router.members())
    # The per-IP bucket: a burst of 32, then 8/s over the ~2 s the flood lasted.
    assert 20 <= members <= 32 + 8 * 3, counts
    assert counts["limited"] >= 150 - members - 30  # type: ignore[index]


async def test_calls_awaiting_replies_are_capped(
    make_node: NodeFactory, raw_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    import protocol.outstanding

    monkeypatch.setattr(protocol.outstanding, "MAX_PENDING", 10)
    a = await make_node(rpc_timeout=1.0)
    proto = a.rpc
    assert proto is not None
    silent = raw_socket.getsockname()  # receives, never answers
    calls = [proto.ping(silent, a.me.id) for _ in range(25)]
    assert proto.endpoint.outstanding() == 10
    failed_at_once = [c for c in calls if c.done()]  # type: ignore[attr-defined]
    assert len(failed_at_once) == 15
    assert all(c.result() == (False, None) for c in failed_at_once)  # type: ignore[attr-defined]
    await asyncio.gather(*calls)
    assert proto.endpoint.outstanding() == 0


async def test_an_id_established_before_is_established_again_at_once(
    make_node: NodeFactory,
) -> None:
    a = await make_node(min_owner_age=30.0)
    b = await make_node()
    await b.join([a.me.addr])
    await eventually(lambda: len(a.rpc.router.members()) == 1)
    assert a.peers() == []  # young: 30 s to go
    a.members._establish(b.me)  # what the timer does when the 30 s are up
    assert [p.id for p in a.peers()] == [b.me.id]
    proto = a.rpc
    assert proto is not None
    node = proto.router.get(b.me.id)
    assert node is not None
    proto.router.remove_contact(node, "unresponsive")  # evicted (a restart, say) ...
    assert a.peers() == []
    assert await b.ping_peer(PeerRef(a.me.id, *a.me.addr)) == a.me.id  # ... and back
    await eventually(lambda: [p.id for p in a.peers()] == [b.me.id])  # no new wait
    assert [p.id for p, why in handler_of(a).removed] == [b.me.id]
