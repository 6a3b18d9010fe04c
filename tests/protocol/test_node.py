"""CrawlNode end to end: real UDP peers on 127.0.0.1, a real in-memory handler, no mocks.

Several tests pin a kademlia/rpcudp trap (numbered as in the protocol brief): each one fails
against the stock library behaviour.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import random
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import umsgpack
from kademlia.utils import digest

from protocol import (
    BootstrapError,
    CrawlNode,
    Held,
    KeyBatch,
    NodeConfig,
    PeerRef,
    PeerTimeout,
    RefreshAnswer,
    RemoteError,
    StoreResult,
    TaskItem,
    key_for,
    new_node_id,
)
from protocol.messages import PING_REQ, PingReqArgs
from tests.protocol.conftest import (
    BOOM,
    FAST,
    MemoryHandler,
    NodeFactory,
    eventually,
    fp,
    handler_of,
    recv,
)

pytestmark = pytest.mark.timeout(30)


def batch(host: str, n: int, start: int = 0) -> KeyBatch:
    return KeyBatch(key_for(host), [TaskItem(f"https://{host}/p{i}", 1) for i in range(start, n)])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def pair(make_node: NodeFactory, **config: object) -> tuple[CrawlNode, CrawlNode]:
    a = await make_node(**config)
    b = await make_node(**config)
    await b.join([a.me.addr])
    return a, b


async def test_join_fills_both_tables_and_reports_membership(make_node: NodeFactory) -> None:
    a, b = await pair(make_node)
    c = await make_node()
    assert {p.id for p in await c.join([a.me.addr])} == {a.me.id, b.me.id}
    await eventually(lambda: {p.id for p in a.peers()} == {b.me.id, c.me.id})
    assert {p.id for p in handler_of(a).added} == {b.me.id, c.me.id}
    assert all(p.id != c.me.id for p in a.peers() if p.id == a.me.id)


async def test_join_failures(make_node: NodeFactory) -> None:
    a = await make_node()
    with pytest.raises(BootstrapError):
        await a.join([("127.0.0.1", free_port())])  # nobody there
    with pytest.raises(BootstrapError):
        await a.join([("127.0.0.1", 70000), ("127.0.0.1", 0)])  # unusable ports
    with pytest.raises(BootstrapError):
        await a.join([a.me.addr])  # only ourselves
    b = await make_node()
    assert [p.id for p in await b.join([("localhost", a.me.port)])] == [a.me.id]


async def test_the_four_crawl_rpcs(make_node: NodeFactory) -> None:
    a, b = await pair(make_node)
    ha = handler_of(a)
    ha.refuse.add(key_for("not-mine.example"))
    sent = [batch("a.example", 3), batch("not-mine.example", 2)]
    assert await b.store_task(a.me, sent) == StoreResult(3, 0, [key_for("not-mine.example")])
    assert await b.store_task(a.me, [batch("a.example", 5)]) == StoreResult(2, 3, [])
    assert [t.url for t in ha.tasks[key_for("a.example")]][-1] == "https://a.example/p4"

    assert await b.store_backup(a.me, b.me.id, [batch("c.example", 4)]) == Held(4)
    assert len(ha.backups[b.me.id]) == 4
    gone = [fp("https://c.example/p0"), fp("https://c.example/p1"), 12345]
    assert await b.delete_backup(a.me, b.me.id, {key_for("c.example"): gone}) == 2
    assert len(ha.backups[b.me.id]) == 2
    # The key travels with every fingerprint, held copy or not (12345 had none).
    assert (key_for("c.example"), 12345) in ha.done_seen

    assert await b.refresh_task(a.me) == RefreshAnswer(5)
    assert ha.refresh_from == [b.me]
    assert await b.store_task(a.me, []) == StoreResult(0, 0, [])


async def test_5000_urls_arrive_in_chunks(make_node: NodeFactory) -> None:
    # Trap 2: one rpcudp request is capped at 8 KiB; the node must chunk, not fail.
    a, b = await pair(make_node)
    batches = [
        KeyBatch(
            key_for(f"h{h}.example"),
            [TaskItem(f"https://h{h}.example/{secrets.token_urlsafe(150)}", 1) for _ in range(100)],
        )
        for h in range(50)
    ]
    result = await b.store_task(a.me, batches)
    assert result == StoreResult(5000, 0, [])
    assert b.stats()["rpc_sent"]["store_task"] > 10  # type: ignore[index]
    assert sum(len(v) for v in handler_of(a).tasks.values()) == 5000


async def test_handler_exception_is_a_quick_remote_error(make_node: NodeFactory) -> None:
    # Trap 1: rpcudp sends no reply when a handler raises; the caller waited the full timeout
    # and then evicted a healthy peer.
    a, b = await pair(make_node, rpc_timeout=2.0)
    started = time.monotonic()
    with pytest.raises(RemoteError, match="handler exploded"):
        await b.store_task(a.me, [KeyBatch(key_for("boom.example"), [TaskItem(BOOM, 0)])])
    assert time.monotonic() - started < 0.5
    assert a.me in b.peers()
    assert a.stats()["dropped"] == {"handler_error": 1}


@pytest.mark.parametrize(
    ("request_", "answer"),
    [
        (["frobnicate", []], "unknown rpc"),
        (["ping", []], "takes 1 arguments"),
        (["find_node", [b"x" * 20, "not a key"]], "bad arguments"),
        (["store_task", [b"x" * 20]], "bad arguments"),
        (["store_task", [b"x" * 20, b"not zlib"]], "bad arguments"),
        ([1, 2, 3], "malformed"),
    ],
)
async def test_bad_requests_get_an_error_reply(
    make_node: NodeFactory, raw_socket: socket.socket, request_: object, answer: str
) -> None:
    a = await make_node()
    msg_id = secrets.token_bytes(20)
    raw_socket.sendto(b"\x00" + msg_id + umsgpack.packb(request_), a.me.addr)
    reply = await recv(raw_socket, 1.0)
    assert reply is not None and reply[:21] == b"\x01" + msg_id
    assert answer in umsgpack.unpackb(reply[21:])["error"]


async def test_every_rpc_raises_peer_timeout_on_silence(make_node: NodeFactory) -> None:
    a = await make_node()
    ghost = PeerRef(new_node_id(), "127.0.0.1", free_port())
    calls = [
        a.store_task(ghost, [batch("x.example", 1)]),
        a.store_backup(ghost, a.me.id, [batch("x.example", 1)]),
        a.delete_backup(ghost, a.me.id, {key_for("x.example"): [1]}),
        a.refresh_task(ghost),
        a.goodbye(ghost),
        a.ping_peer(ghost),
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, PeerTimeout) and r.peer == ghost for r in results)
    assert a.stats()["outstanding"] == 0


async def test_failed_calls_make_a_suspect_never_an_eviction(make_node: NodeFactory) -> None:
    # Trap 3: stock kademlia removes a contact on its first missed reply (issues #23, #98).
    # Here no number of failed calls evicts: only the probe loop's verdict does (liveness).
    a, b = await pair(make_node, failures_before_evict=3)
    b_id, b_port = b.me.id, b.me.port
    await b.aclose()
    for _ in range(5):
        with pytest.raises(PeerTimeout):
            await a.ping_peer(b.me)
    assert b.me in a.peers()
    assert a.rpc.liveness.is_suspect(b_id)
    # The same node comes back (same ID, same port): one answer clears the suspicion.
    b = await make_node(node_id=b_id, port=b_port)
    assert await a.ping_peer(b.me) == b_id
    assert not a.rpc.liveness.is_suspect(b_id)
    assert a.rpc.liveness.refuted == 1
    assert handler_of(a).removed == []


async def test_multi_chunk_timeout_counts_once(make_node: NodeFactory) -> None:
    a = await make_node(failures_before_evict=2)
    b = await make_node()
    await b.join([a.me.addr])
    await b.aclose()
    big = [
        KeyBatch(
            key_for("h"), [TaskItem(f"https://h/{secrets.token_hex(60)}", 0) for _ in range(300)]
        )
    ]
    with pytest.raises(PeerTimeout):
        await a.store_task(b.me, big)  # several chunks lost at once: one strike
    assert b.me in a.peers()


async def test_ghost_replaced_when_a_ping_reply_has_another_id(make_node: NodeFactory) -> None:
    # Trap 5: a restart with a new ID at the same address left a ghost entry.
    a, b = await pair(make_node)
    old = b.me
    await b.aclose()
    b2 = await make_node(port=old.port)
    assert await a.ping_peer(old) == b2.me.id
    assert b2.me in a.peers() and old not in a.peers()
    assert (old, "replaced") in handler_of(a).removed


async def test_ghost_replaced_when_the_restarted_node_rejoins(make_node: NodeFactory) -> None:
    a, b = await pair(make_node)
    old = b.me
    await b.aclose()
    b2 = await make_node(port=old.port)
    await b2.join([a.me.addr])
    await eventually(lambda: b2.me in a.peers() and old not in a.peers())
    assert (old, "replaced") in handler_of(a).removed


async def test_ghost_replaced_when_a_crawl_reply_has_another_id(make_node: NodeFactory) -> None:
    a, b = await pair(make_node)
    old = b.me
    await b.aclose()
    b2 = await make_node(port=old.port)
    assert (await a.refresh_task(old)) == RefreshAnswer(0)
    assert b2.me in a.peers() and old not in a.peers()


async def test_goodbye_removes_at_once(make_node: NodeFactory) -> None:
    a, b = await pair(make_node)
    await b.goodbye(a.me)
    assert b.me not in a.peers()
    assert handler_of(a).removed == [(b.me, "goodbye")]
    # Hand-off traffic after the goodbye does not re-add the leaver, nor does a ping (a
    # leaver's liveness round once did: it was made an owner again while it exited)...
    assert (await b.store_task(a.me, [batch("late.example", 2)])).new == 2
    assert await b.ping_peer(a.me) == a.me.id
    assert b.me not in a.peers() and not a.in_table(b.me.id)
    # ...but a rejoin (a lookup of its own ID) does.
    await b.join([a.me.addr])
    assert b.me in a.peers()


async def test_a_departing_node_sends_nothing_of_its_own(make_node: NodeFactory) -> None:
    """After ``depart`` (about to say GOODBYE) a node challenges nobody, probes nobody for
    others and runs no liveness round: only its handoff leaves it."""
    a, b = await pair(make_node, ping_interval=0.2)
    c = await make_node()
    b.depart()
    sent = b.stats()["rpc_sent"].get("ping", 0)  # type: ignore[attr-defined]
    assert await c.ping_peer(b.me) == b.me.id  # a stranger: once, b would challenge it
    answer = await c.call(b.me, PING_REQ, PingReqArgs(a.me.id))
    assert not answer.known  # b pings nobody on another's behalf either
    await asyncio.sleep(5 * b.config.ping_interval)  # no liveness round runs
    assert b.stats()["rpc_sent"].get("ping", 0) == sent  # type: ignore[attr-defined]
    assert not b.in_table(c.me.id)


async def test_closest_includes_self(make_node: NodeFactory) -> None:
    a = await make_node()
    others = [await make_node() for _ in range(3)]
    for o in others:
        await o.join([a.me.addr])
    everyone = [a.me, *(o.me for o in others)]
    assert a.closest_local(a.me.id, 1) == [a.me]
    assert a.closest_local(others[0].me.id, 1) == [others[0].me]
    key = key_for("example.com")
    expected = sorted(
        everyone, key=lambda p: int.from_bytes(p.id, "big") ^ int.from_bytes(key, "big")
    )
    assert a.closest_local(key, 4) == expected
    sent_before = a.stats()["rpc_sent"].get("find_node", 0)  # type: ignore[attr-defined]
    assert await a.closest(key, 2) == expected[:2]  # small table: authoritative, no lookup
    assert a.stats()["rpc_sent"].get("find_node", 0) == sent_before  # type: ignore[attr-defined]


async def test_closest_answers_follow_the_table(make_node: NodeFactory) -> None:
    """closest_local remembers its answers; a contact leaving or joining, and this node's
    own ownership, change them at once."""
    a = await make_node()
    b, c = await make_node(), await make_node()
    for o in (b, c):
        await o.join([a.me.addr])
    key = key_for("cached.example")

    def by_distance(*peers: PeerRef) -> list[PeerRef]:
        k = int.from_bytes(key, "big")
        return sorted(peers, key=lambda p: int.from_bytes(p.id, "big") ^ k)

    assert a.closest_local(key, 3) == by_distance(a.me, b.me, c.me)
    assert a.closest_local(key, 3) == by_distance(a.me, b.me, c.me)  # answered again
    await c.goodbye(a.me)
    assert a.closest_local(key, 3) == by_distance(a.me, b.me)
    assert a.closest_local(key, 3, with_self=False) == [b.me]
    await c.join([a.me.addr])
    assert a.closest_local(key, 3) == by_distance(a.me, b.me, c.me)


async def test_closest_looks_up_when_the_table_is_big(make_node: NodeFactory) -> None:
    key = key_for("example.org")
    k = int.from_bytes(key, "big")
    bits = len(key) * 8

    def near(delta: int) -> bytes:
        return (k ^ delta).to_bytes(len(key), "big")

    # Four nodes next to the key, all in one bucket of ``a`` (whose ID differs from the key
    # in the top bit), which with ksize 2 holds only two of them: ``a`` must ask the network.
    # Fixed IDs: with random ones the closest node is sometimes known to nobody's table.
    ids = [near(8), near(4), near(2), near(1), near(1 << (bits - 1))]
    nodes = [await make_node(node_id=i, ksize=2) for i in ids]
    for n in nodes[1:-1]:
        await n.join([nodes[0].me.addr])
    a = nodes[-1]
    await a.join([nodes[0].me.addr, nodes[1].me.addr])
    assert near(1) not in {p.id for p in a.peers()}  # not known locally: found by the lookup
    sent_before = a.stats()["rpc_sent"].get("find_node", 0)  # type: ignore[attr-defined]
    everyone = sorted(
        (n.me for n in nodes),
        key=lambda p: int.from_bytes(p.id, "big") ^ int.from_bytes(key, "big"),
    )
    result = await a.closest(key, 2)
    assert result == everyone[:2]
    assert a.stats()["rpc_sent"].get("find_node", 0) > sent_before  # type: ignore[attr-defined]
    assert (await a.closest(a.me.id, 1)) == [a.me]


async def test_welcome_hands_values_to_the_right_new_node(make_node: NodeFactory) -> None:
    # Trap 4: stock welcome_if_new measured distances to digest(key), a hash of the stored
    # digest. Here only the correct key makes the newcomer the right holder.
    key: bytes = digest("some key")

    def flip(b: bytes, i: int) -> bytes:
        return b[:-1] + bytes([b[-1] ^ i])

    a = await make_node(node_id=flip(key, 2))
    c = await make_node(node_id=flip(bytes(digest(key)), 1))  # close to the wrongly hashed key
    await c.join([a.me.addr])
    a.storage[key] = "value"
    b = await make_node(node_id=flip(key, 1))  # the closest node to the real key
    await b.join([a.me.addr])
    await eventually(lambda: b.storage.get(key) == "value")


async def test_cancelled_call_leaves_nothing_outstanding(make_node: NodeFactory) -> None:
    # Trap 6: wait_for around an rpcudp call left the future and timer in _outstanding.
    a = await make_node(rpc_timeout=5.0)
    silent = PeerRef(new_node_id(), "127.0.0.1", free_port())
    task = asyncio.create_task(a.refresh_task(silent))
    await eventually(lambda: a.stats()["outstanding"] == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert a.stats()["outstanding"] == 0


async def test_set_without_live_neighbours_returns_false(make_node: NodeFactory) -> None:
    # Trap 7: stock Server.set raised ValueError (max of an empty list) here.
    a = await make_node()
    assert await a.set("k", "v") is False  # nobody known
    a, b = await pair(make_node)
    await b.aclose()
    assert await a.set("k", "v") is False  # somebody known, nobody answers


async def test_state_is_json_and_never_unpickled(make_node: NodeFactory, tmp_path: Path) -> None:
    # Trap 9: stock save_state/load_state use pickle.
    a, b = await pair(make_node)
    path = tmp_path / "state.json"
    b.save_state(path)
    data = json.loads(path.read_text())
    assert data["id"] == b.me.id.hex() and data["neighbors"] == [list(a.me.addr)]
    await b.aclose()
    c = await CrawlNode.load_state(
        path, 0, "127.0.0.1", handler=MemoryHandler(), config=NodeConfig(**FAST)
    )
    try:
        assert c.me.id == b.me.id and [p.id for p in c.peers()] == [a.me.id]
    finally:
        await c.aclose()
    path.write_bytes(pickle.dumps({"id": b"x"}))
    with pytest.raises(ValueError):
        await CrawlNode.load_state(path, 0, handler=MemoryHandler())


async def test_ping_loop_evicts_a_dead_peer(make_node: NodeFactory) -> None:
    # Trap 10: liveness runs in our own loop at ping_interval.
    a, b = await pair(
        make_node,
        ping_interval=0.1,
        rpc_timeout=0.2,
        failures_before_evict=2,
        suspicion_timeout=0.5,
    )
    await b.aclose()
    await eventually(lambda: b.me not in a.peers(), timeout=5.0)
    assert handler_of(a).removed == [(b.me, "unresponsive")]


async def test_refresh_loop_keeps_its_interval(make_node: NodeFactory) -> None:
    # Trap 10: stock refresh_table rescheduled itself with the default 3600 s after one run.
    a = await make_node(refresh_interval=0.1)
    await eventually(lambda: a.stats()["refresh_runs"] >= 3, timeout=2.0)  # type: ignore[operator]


async def test_full_bucket_ping_is_owned_and_closed() -> None:
    # Trap 10: the routing table fired ensure_future(call_ping(head)) with no owner.
    config = NodeConfig(**{**FAST, "ksize": 1})
    a = CrawlNode((1).to_bytes(20, "big"), MemoryHandler(), config)
    await a.listen_on("127.0.0.1", 0)
    others = []
    for first in (0x80, 0xC0):
        node = CrawlNode(bytes([first]) + bytes(18) + b"\x01", MemoryHandler(), config)
        await node.listen_on("127.0.0.1", 0)
        await node.join([a.me.addr])
        others.append(node)
    await eventually(lambda: a.stats()["rpc_sent"].get("ping", 0) >= 1)  # type: ignore[attr-defined]
    for node in (a, *others):
        await node.aclose()
    assert len(a.rpc.tasks) == 0
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_attribute_typo_is_not_a_remote_call(make_node: NodeFactory) -> None:
    # Trap 11: rpcudp's __getattr__ turns any missing attribute into a remote call.
    a = await make_node()
    with pytest.raises(AttributeError):
        a.rpc.find_nodes  # type: ignore[attr-defined]  # noqa: B018


async def test_garbage_datagrams_never_crash_the_node(
    make_node: NodeFactory, raw_socket: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    # Trap 11: rpcudp raised inside an unowned task on malformed msgpack.
    a = await make_node()
    b = await make_node()
    rng = random.Random(20240601)
    junk_requests = [
        [],
        ["ping"],
        ["ping", "x"],
        ["ping", [b"short"]],
        ["store", [b"x" * 20, b"k", [1]]],
        ["store_task", []],
        ["store_task", [b"x" * 20, 5]],
        ["delete_backup", [b"x" * 20, b"x" * 20, b"1234567"]],
        [b"ping", []],
        {"ping": []},
        ["x" * 5000, []],
    ]

    def garbage(i: int) -> bytes:
        head = bytes([rng.choice((0, 1, 2, 255))]) + rng.randbytes(20)
        match i % 6:
            case 0:
                return rng.randbytes(rng.randrange(0, 80))
            case 1:
                return head + rng.randbytes(rng.randrange(0, 300))
            case 2:
                return b"\x00" + rng.randbytes(20) + packed(rng.choice(junk_requests))
            case 3:
                return b"\x01" + rng.randbytes(20) + packed(rng.choice(junk_requests))
            case 4:
                return (
                    b"\x00"
                    + rng.randbytes(20)
                    + rng.choice([b"\x91" * 5000, b"\xdd\xff\xff\xff\xff", b"\xc1"])
                )
            case _:
                return b"\x00" + rng.randbytes(20) + rng.randbytes(rng.choice((8200, 9000)))

    def received() -> int:
        return a.stats()["datagrams_in"]  # type: ignore[return-value]

    def received_exactly(n: int) -> Callable[[], bool]:
        return lambda: received() == n

    def packed(obj: object) -> bytes:
        return bytes(umsgpack.packb(obj))

    with caplog.at_level(logging.ERROR):
        for i in range(2000):
            raw_socket.sendto(garbage(i), a.me.addr)
            if i % 50 == 49:  # let the node drain its socket: this tests parsing, not UDP loss
                await eventually(received_exactly(i + 1))
        dropped = a.stats()["dropped"]
    assert sum(dropped.values()) == 2000, dropped  # type: ignore[attr-defined]
    assert a.stats()["datagrams_in"] == 2000
    assert not [r for r in caplog.records if r.name.startswith("protocol")]
    assert await b.ping_peer(PeerRef(a.me.id, *a.me.addr)) == a.me.id
    assert (await b.store_task(a.me, [batch("still.alive", 1)])).new == 1


async def test_stats_and_buckets(make_node: NodeFactory) -> None:
    a, b = await pair(make_node)
    await b.store_task(a.me, [batch("s.example", 3)])
    s = b.stats()
    assert s["rpc_sent"]["store_task"] == 1  # type: ignore[index]
    assert s["latency_ms"]["store_task"] > 0  # type: ignore[index]
    assert a.stats()["rpc_received"]["store_task"] == 1  # type: ignore[index]
    assert s["peers"] == 1
    (bucket,) = b.buckets()
    assert bucket["range"] == ["0" * 40, "f" * 40]
    peers = bucket["peers"]
    assert isinstance(peers, list)
    (peer,) = peers
    assert peer["id"] == a.me.short and peer["addr"] == f"127.0.0.1:{a.me.port}"
    assert peer["failures"] == 0 and peer["last_seen_s"] < 5


async def test_node_ids_are_validated() -> None:
    with pytest.raises(ValueError):
        CrawlNode(b"short", MemoryHandler(), NodeConfig())
