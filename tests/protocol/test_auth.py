"""Cluster authentication: HMAC-SHA256 on every datagram when a secret is set."""

from __future__ import annotations

import logging
import secrets
import socket

import pytest
import umsgpack

from protocol import BootstrapError, KeyBatch, StoreResult, TaskItem, key_for
from protocol.auth import REPLY, REQUEST, TAG_LEN, Framer, Rejected
from protocol.replay import ReplayGuard
from tests.protocol.conftest import NodeFactory, eventually, recv

pytestmark = pytest.mark.timeout(30)


def test_framer_roundtrip_and_tamper() -> None:
    framer = Framer("s3cret")
    msg_id = secrets.token_bytes(20)
    sealed = framer.seal(REQUEST, msg_id, b"body", now_ms=1234)
    frame = framer.open(sealed)
    assert (frame.kind, frame.msg_id, frame.body, frame.stamp_ms) == (
        REQUEST,
        msg_id,
        b"body",
        1234,
    )
    assert len(sealed) == 1 + 20 + TAG_LEN + 8 + 2 + 16 + 4
    for i in range(len(sealed)):  # any flipped byte: kind, id, tag or body
        tampered = bytearray(sealed)
        tampered[i] ^= 0x01
        with pytest.raises(Rejected) as exc:
            framer.open(bytes(tampered))
        assert exc.value.reason == "bad_hmac"
    with pytest.raises(Rejected, match="bad_hmac"):
        Framer("other").open(sealed)
    # A reply cannot be replayed as a request: the kind byte is covered.
    as_reply = framer.seal(REPLY, msg_id, b"body", now_ms=1234)
    assert as_reply[21:] != sealed[21:]
    with pytest.raises(Rejected, match="bad_hmac"):
        framer.open(sealed[: 1 + 20 + TAG_LEN + 8 + 2 + 16])
    with pytest.raises(Rejected, match="short"):
        framer.open(sealed[:21])


def test_signed_datagrams_are_bound_to_the_senders_address() -> None:
    sender = Framer("s3cret")
    sender.bind("127.0.0.1", 4000)
    sealed = sender.seal(REQUEST, secrets.token_bytes(20), b"body")
    assert Framer("s3cret").open(sealed, ("127.0.0.1", 4000)).body == b"body"
    for elsewhere in [("127.0.0.1", 4001), ("127.0.0.2", 4000), ("::1", 4000)]:
        with pytest.raises(Rejected, match="bad_source"):
            Framer("s3cret").open(sealed, elsewhere)
    # IPv4 seen through a dual-stack socket is the same address.
    assert Framer("s3cret").open(sealed, ("::ffff:127.0.0.1", 4000)).body == b"body"
    # A socket on a wildcard address cannot know its source IP: only the port is bound.
    wild = Framer("s3cret")
    wild.bind("0.0.0.0", 4000)
    sealed = wild.seal(REQUEST, secrets.token_bytes(20), b"body")
    assert Framer("s3cret").open(sealed, ("10.1.2.3", 4000)).body == b"body"
    with pytest.raises(Rejected, match="bad_source"):
        Framer("s3cret").open(sealed, ("10.1.2.3", 4001))


def test_replay_guard_refuses_repeats_and_stamps_outside_the_window() -> None:
    guard = ReplayGuard(window_ms=1000, capacity=100)
    ids = [secrets.token_bytes(20) for _ in range(3)]
    assert guard.check(ids[0], 10_000, 10_000) is None
    assert guard.check(ids[0], 10_000, 10_000) == "replay"
    assert guard.check(ids[0], 10_000, 10_900) == "replay"  # still inside the window
    assert guard.check(ids[0], 10_000, 11_001) == "stale"  # past it: refused without the cache
    assert guard.check(ids[1], 12_002, 11_001) == "stale"  # from too far in the future
    assert guard.check(ids[1], 11_500, 11_001) is None
    assert guard.check(ids[2], 10_999, 11_001) is None
    assert len(guard) == 2  # the first id expired: its stamp is refused anyway


def test_replay_guard_when_full_raises_its_horizon_instead_of_forgetting() -> None:
    guard = ReplayGuard(window_ms=60_000, capacity=4)
    ids = [secrets.token_bytes(20) for _ in range(6)]
    for i, msg_id in enumerate(ids[:4]):
        assert guard.check(msg_id, 1000 + i, 1000) is None
    assert guard.check(ids[4], 1010, 1000) is None  # evicts ids[0] (stamp 1000)
    assert len(guard) == 4 and guard.horizon_ms == 1000
    assert guard.check(ids[0], 1000, 1000) == "stale"  # forgotten, still refused
    assert guard.check(ids[1], 1001, 1000) == "replay"
    assert guard.check(ids[5], 999, 1000) == "stale"  # behind the horizon


def test_no_secret_is_stock_rpcudp_framing() -> None:
    msg_id = secrets.token_bytes(20)
    assert Framer("").seal(REQUEST, msg_id, b"x") == b"\x00" + msg_id + b"x"
    with pytest.raises(Rejected, match="bad_kind"):
        Framer("").open(b"\x07" + msg_id + b"x")


async def test_same_secret_works(make_node: NodeFactory) -> None:
    a = await make_node(secret="cluster-key")
    b = await make_node(secret="cluster-key")
    assert [p.id for p in await b.join([a.me.addr])] == [a.me.id]
    batch = KeyBatch(key_for("a.example"), [TaskItem("https://a.example/", 0)])
    assert await b.store_task(a.me, [batch]) == StoreResult(1, 0, [])
    assert "bad_hmac" not in a.stats()["dropped"]  # type: ignore[operator]


@pytest.mark.parametrize("other", ["wrong-key", ""])
async def test_different_secret_cannot_join(
    make_node: NodeFactory, caplog: pytest.LogCaptureFixture, other: str
) -> None:
    a = await make_node(secret="cluster-key")
    b = await make_node(secret=other)
    with caplog.at_level(logging.WARNING, logger="protocol"), pytest.raises(BootstrapError):
        await b.join([a.me.addr])
    assert a.stats()["dropped"] == {"bad_hmac": 1}
    assert a.peers() == []
    (warning,) = [r.getMessage() for r in caplog.records if "HMAC" in r.getMessage()]
    assert f"127.0.0.1:{b.me.port}" in warning and "--secret" in warning


async def test_tampered_datagram_is_dropped(
    make_node: NodeFactory, raw_socket: socket.socket
) -> None:
    a = await make_node(secret="cluster-key")
    framer = Framer("cluster-key")
    framer.bind(*raw_socket.getsockname())
    me = secrets.token_bytes(20)
    good = framer.seal(REQUEST, secrets.token_bytes(20), umsgpack.packb(["ping", [me]]))
    raw_socket.sendto(good, a.me.addr)
    reply = await recv(raw_socket, 1.0)
    assert reply is not None and framer.open(reply).kind == REPLY
    assert umsgpack.unpackb(framer.open(reply).body) == a.me.id

    tampered = bytearray(
        framer.seal(REQUEST, secrets.token_bytes(20), umsgpack.packb(["ping", [me]]))
    )
    tampered[-1] ^= 0x40
    raw_socket.sendto(bytes(tampered), a.me.addr)
    while (got := await recv(raw_socket, 0.3)) is not None:
        assert framer.open(got).kind == REQUEST  # only a's challenge to the first ping
    await eventually(lambda: a.stats()["dropped"] == {"bad_hmac": 1})
