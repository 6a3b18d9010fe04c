"""The node's UDP read path under a flood: a readiness event drains the socket (bounded), and a
source sending junk goes unread while members never do."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import pytest

from protocol.datagram import open_udp
from tests.protocol.conftest import NodeFactory, eventually

pytestmark = pytest.mark.timeout(30)


class Batches(asyncio.DatagramProtocol):
    """Counts the datagrams read per readiness event: a ``call_soon`` queued by the first
    datagram of an event runs before the loop's next readiness callbacks."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self._open = False
        self.errors: list[Exception] = []
        self.lost = asyncio.Event()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if not self._open:
            self._open = True
            self.batches.append(0)
            asyncio.get_running_loop().call_soon(self._close)
        self.batches[-1] += 1

    def _close(self) -> None:
        self._open = False

    def error_received(self, exc: Exception) -> None:
        self.errors.append(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()


@pytest.mark.parametrize(("drain", "queued", "first"), [(128, 20, [20]), (8, 20, [8, 8])])
async def test_one_readiness_event_takes_a_bounded_batch(
    drain: int, queued: int, first: list[int], raw_socket: socket.socket
) -> None:
    proto = Batches()
    transport = await open_udp(proto, "127.0.0.1", 0, drain=drain)
    try:
        addr = transport.get_extra_info("sockname")
        for i in range(queued):  # all in the socket's queue before the loop reads any
            raw_socket.sendto(bytes([i]) * 10, addr)
        await eventually(lambda: sum(proto.batches) == queued)
        # asyncio's own transport reads one per event: [1] * queued.
        assert proto.batches[: len(first)] == first
        transport.sendto(b"reply", raw_socket.getsockname())
        assert raw_socket.recv(100) == b"reply"
    finally:
        transport.close()
    await asyncio.wait_for(proto.lost.wait(), 5)
    assert transport.get_extra_info("socket").fileno() == -1  # closed with the transport


async def test_paused_transport_reads_nothing_until_resumed(raw_socket: socket.socket) -> None:
    proto = Batches()
    transport = await open_udp(proto, "127.0.0.1", 0)
    try:
        transport.pause_reading()
        raw_socket.sendto(b"held", transport.get_extra_info("sockname"))
        await asyncio.sleep(0.05)
        assert proto.batches == []
        transport.resume_reading()
        await eventually(lambda: proto.batches == [1])
    finally:
        transport.abort()
    await asyncio.wait_for(proto.lost.wait(), 5)


async def test_a_junk_source_goes_unread_and_a_member_never_does(
    make_node: NodeFactory, raw_socket: socket.socket
) -> None:
    a = await make_node(secret="cluster-key")
    b = await make_node(secret="cluster-key")
    await b.join([a.me.addr])
    await eventually(lambda: bool(a.peers()))
    junk = os.urandom(200)
    for _ in range(600):  # three times the burst a source may send of datagrams that fail
        raw_socket.sendto(junk, a.me.addr)
    dropped = a.rpc_stats.dropped
    await eventually(lambda: dropped["bad_hmac"] + dropped["junk_source"] == 600)
    assert dropped["junk_source"] > 0  # the stranger's last ones were not even opened
    # A member's address sending as much junk (a forger may use it) is still opened, every
    # datagram of it, and the member is answered.
    held = dropped["junk_source"]
    transport: Any = b.rpc.endpoint.transport
    for _ in range(600):
        transport.sendto(junk, a.me.addr)
    await eventually(lambda: dropped["bad_hmac"] + dropped["junk_source"] == 1200)
    assert dropped["junk_source"] == held
    assert await b.ping_peer(a.me) == a.me.id
