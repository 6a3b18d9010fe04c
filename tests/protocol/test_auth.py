"""Cluster authentication: HMAC-SHA256 on every datagram when a secret is set."""

from __future__ import annotations

import logging
import secrets
import socket

import pytest
import umsgpack

from protocol import BootstrapError, KeyBatch, StoreResult, TaskItem, key_for
from protocol.auth import REPLY, REQUEST, TAG_LEN, Framer, Rejected
from tests.protocol.conftest import NodeFactory, eventually, recv

pytestmark = pytest.mark.timeout(30)


def test_framer_roundtrip_and_tamper() -> None:
    framer = Framer("s3cret")
    msg_id = secrets.token_bytes(20)
    sealed = framer.seal(REQUEST, msg_id, b"body")
    frame = framer.open(sealed)
    assert (frame.kind, frame.msg_id, frame.body) == (REQUEST, msg_id, b"body")
    assert len(sealed) == 1 + 20 + TAG_LEN + 4
    for i in range(len(sealed)):  # any flipped byte: kind, id, tag or body
        tampered = bytearray(sealed)
        tampered[i] ^= 0x01
        with pytest.raises(Rejected) as exc:
            framer.open(bytes(tampered))
        assert exc.value.reason == "bad_hmac"
    with pytest.raises(Rejected, match="bad_hmac"):
        Framer("other").open(sealed)
    # A reply cannot be replayed as a request: the kind byte is covered.
    as_reply = framer.seal(REPLY, msg_id, b"body")
    assert as_reply[21:] != sealed[21:]
    with pytest.raises(Rejected, match="short"):
        framer.open(sealed[: 1 + 20 + TAG_LEN])


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
    assert await recv(raw_socket, 0.3) is None
    await eventually(lambda: a.stats()["dropped"] == {"bad_hmac": 1})
