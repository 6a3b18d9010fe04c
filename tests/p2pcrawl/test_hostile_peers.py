"""Hostile datagrams against a real peer: out-of-scope injections, and a fuzz of its handler.

The peer is in-process (its stores and counters are inspected directly); the datagrams are
well-formed RPCs that a script would send, checked through ``/metrics`` as an operator would.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from typing import Any

import pytest
import umsgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pcrawl.crawl import urls
from p2pcrawl.network import Peer
from p2pcrawl.settings import PeerSettings
from p2pcrawl.ui.metrics import PeerMetrics
from protocol import (
    DEFAULT_WORK_BITS,
    CrawlNode,
    KeyBatch,
    NodeConfig,
    NodeKey,
    TaskItem,
    key_for,
)
from protocol.codec import encode_chunks
from tests.conftest import (
    TEST_SECRET,
    PeerFactory,
    WebFactory,
    crawl_settings_for,
    id_next_to,
    open_identity,
)
from tests.protocol.conftest import MemoryHandler, eventually, recv

pytestmark = pytest.mark.timeout(120)


def metric(peer: Peer, line_start: str) -> float:
    text = PeerMetrics(peer).render()[0].decode()
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


def store_task(sender: bytes, batches: list[KeyBatch]) -> list[bytes]:
    return [
        b"\x00" + secrets.token_bytes(20) + umsgpack.packb(["store_task", [sender, payload]])
        for payload, _ in encode_chunks(batches)
    ]


async def stranger_store_task(addr: tuple[str, int], batches: list[KeyBatch]) -> list[Any]:
    """STORE_TASK from a socket no peer knows, under a fresh random ID; the replies."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        for datagram in store_task(secrets.token_bytes(20), batches):
            sock.sendto(datagram, addr)
        replies = []
        while (got := await recv(sock, 1.0)) is not None:
            if got[0] == 1:
                replies.append(umsgpack.unpackb(got[21:]))
    finally:
        sock.close()
    return replies


async def queued_urls(peer: Peer) -> list[str]:
    assert peer.ledger is not None
    return [t.url for _, t in await peer.ledger.tasks.page(0, 100_000)]


async def test_tasks_outside_the_receivers_scope_are_rejected_and_counted(
    make_peer: PeerFactory, make_web: WebFactory
) -> None:
    web = await make_web()
    peer = await make_peer(crawl=crawl_settings_for(web))
    host = "unrelated.example"
    injected = [TaskItem(f"http://{host}/p{i}", 1) for i in range(300)]
    own_host = web.allow_domains[0]
    deep = [TaskItem(f"http://{own_host}/too-deep", 10_000)]
    replies = await stranger_store_task(
        peer.me.addr, [KeyBatch(key_for(host), injected), KeyBatch(key_for(own_host), deep)]
    )
    assert replies and all("error" not in r and r["new"] == 0 for r in replies)
    await eventually(lambda: peer.parts.handler.rejected["scope"] == 300)
    assert peer.parts.handler.rejected["depth"] == 1
    assert metric(peer, 'p2pcrawl_tasks_rejected_total{reason="scope"}') == 300
    assert metric(peer, 'p2pcrawl_tasks_rejected_total{reason="depth"}') == 1
    assert not [u for u in await queued_urls(peer) if host in u or "too-deep" in u]


# --- the fuzz test -------------------------------------------------------------------------

SCOPE_HOST = "in-scope.test"
# The peer's ID takes its top bit from SCOPE_HOST's key and the member's takes the other, so
# the peer owns every key whose top bit it shares: SCOPE_HOST's and, chosen so, ELSEWHERE's.
# Tasks for ELSEWHERE then pass every check but the scope.
ELSEWHERE = next(
    h
    for h in (f"elsewhere{i}.example" for i in range(64))
    if (key_for(h)[0] ^ key_for(SCOPE_HOST)[0]) & 0x80 == 0
)
NAMES = ["store_task", "store_backup", "delete_backup", "refresh_task", "ping", "store", "goodbye"]
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.binary(max_size=40),
    st.text(max_size=40),
    st.lists(st.integers(), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
# URLs the codec carries (it checks form, not meaning): canonical or not, in scope or not.
encodable_urls = st.sampled_from(
    [
        f"http://{SCOPE_HOST}/ok",
        f"http://{SCOPE_HOST}/a?b=c",
        f"http://{ELSEWHERE}/x",
        "HTTP://IN-SCOPE.TEST/Upper",
        f"http://{SCOPE_HOST}/a/../b",
    ]
)
url_samples = st.sampled_from(
    [
        f"http://{SCOPE_HOST}/ok",
        f"http://{ELSEWHERE}/x",
        "javascript:alert(1)",
        "http://",
        "HTTP://IN-SCOPE.TEST/Upper",
        f"http://{SCOPE_HOST}/" + "x" * 3000,
        "ftp://in-scope.test/file",
    ]
)
task_urls = st.one_of(url_samples, st.text(max_size=60))


@st.composite
def payloads(draw: st.DrawFn) -> Any:
    """A batch payload as the codec makes it, or a hand-made map that breaks its rules."""
    if draw(st.integers(0, 3)) > 0:
        items = draw(
            st.lists(
                st.builds(
                    TaskItem,
                    encodable_urls,
                    st.integers(0, 60),
                    st.integers(0, 3),
                ),
                min_size=1,
                max_size=3,
            )
        )
        key = draw(st.sampled_from([key_for(SCOPE_HOST), key_for(ELSEWHERE)]))
        try:
            return encode_chunks([KeyBatch(key, items)])[0][0]
        except ValueError:  # the codec refuses it on our side: send raw columns instead
            pass
    return draw(
        st.one_of(
            junk,
            st.fixed_dictionaries(
                {
                    "keys": st.lists(st.binary(min_size=20, max_size=20), max_size=3),
                    "counts": st.lists(st.integers(-5, 2**40), max_size=3),
                    "urls": st.lists(task_urls, max_size=3),
                }
            ),
        )
    )


@st.composite
def requests(draw: st.DrawFn, sender: bytes, owner: bytes) -> list[Any]:
    name = draw(st.sampled_from([*NAMES, *["store_task"] * 4, *["store_backup"] * 2]))
    forged = draw(st.sampled_from([owner, secrets.token_bytes(20), b"short", sender]))
    shapes = {
        "store_task": [sender, draw(payloads())],
        "store_backup": [sender, forged, draw(payloads())],
        "delete_backup": [sender, forged, draw(st.one_of(junk, st.binary(max_size=64)))],
        "refresh_task": [sender],
        "ping": [draw(st.one_of(junk, st.just(sender)))],
        "store": [sender, draw(junk), draw(junk)],
        "goodbye": [draw(st.one_of(junk, st.just(forged)))],
    }
    args: list[Any] = shapes[name]
    if draw(st.integers(0, 9)) == 0:  # the wrong number of arguments
        args = [*args, draw(junk)] if draw(st.booleans()) else args[:-1]
    return [name, args]


@pytest.fixture
async def target(make_peer: PeerFactory, tmp_path: Any) -> Any:
    """A peer, and a member of its routing table whose address the fuzz sends from (a
    stranger would be rate limited after 40 datagrams, which is a rejection, but not the
    handler's)."""
    from p2pcrawl.settings import CrawlSettings, ScopeSettings

    peer_id = await open_identity(tmp_path / "peer0", key_for(SCOPE_HOST), 1)
    peer = await make_peer(
        crawl=CrawlSettings(scope=ScopeSettings(allow_domains=(SCOPE_HOST,))),
        peer=PeerSettings(min_peer_age=0.0, replicas=0),
    )
    assert peer.node_id == peer_id
    key = await asyncio.to_thread(NodeKey.generate, DEFAULT_WORK_BITS)
    member_id = key.node_id(bytes(b ^ 0xFF for b in peer_id), 1)
    member = CrawlNode(member_id, MemoryHandler(), NodeConfig(rpc_timeout=0.5, key=key))
    await member.listen_on("127.0.0.1", 0)
    await member.join([peer.me.addr])
    await eventually(lambda: len(peer.node.peers()) == 1)  # type: ignore[union-attr]
    yield peer, member
    await member.aclose()


def rejections(peer: Peer) -> float:
    assert peer.node is not None
    rpc: dict[str, Any] = peer.node.stats()
    h = peer.parts.handler
    counted = h.malformed + h.refused + sum(h.rejected.values()) + rpc["replies_trimmed"]
    return float(sum(rpc["dropped"].values()) + counted)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_fuzzed_rpcs_never_raise_never_store_invalid_tasks_and_are_counted(
    target: Any, data: st.DataObject
) -> None:
    peer, member = target
    proto = peer.node.rpc
    request = data.draw(requests(member.me.id, member.me.id))
    try:
        body = umsgpack.packb(request)
    except Exception:
        return
    before = rejections(peer)
    received_before = sum(peer.node.stats()["rpc_received"].values())
    proto.endpoint.datagram_received(b"\x00" + secrets.token_bytes(20) + body, member.me.addr)
    await proto.tasks.join()  # the deferred handler runs in its own task
    stats = peer.node.stats()
    assert stats["dropped"].get("handler_error", 0) == 0, request  # nothing raised
    for url in await queued_urls(peer):  # nothing invalid stored
        assert urls.canonicalize(url) == url and urls.hostname_of(url) == SCOPE_HOST, url
    stored = await peer.backups.page(0, 100_000)
    for _, _, t in stored:
        assert urls.canonicalize(t.url) == t.url and urls.hostname_of(t.url) == SCOPE_HOST
    handled = sum(stats["rpc_received"].values()) > received_before
    # Every datagram is either handled or counted as a rejection.
    assert handled or rejections(peer) > before, request


async def test_a_metrics_page_names_the_new_counters(target: Any) -> None:
    peer, _ = target
    text = PeerMetrics(peer).render()[0].decode()
    for name in (
        "p2pcrawl_tasks_rejected_total",
        "p2pcrawl_store_task_busy_total",
        "p2pcrawl_admission_total",
        "p2pcrawl_dht_values",
    ):
        assert name in text


async def test_a_flooding_sender_is_answered_busy_and_loses_nothing(
    make_peer: PeerFactory,
) -> None:
    from p2pcrawl.settings import CrawlSettings, ScopeSettings

    crawl = CrawlSettings(scope=ScopeSettings(allow_domains=("busy.test",)))
    a = await make_peer(
        crawl=crawl, peer=PeerSettings(sender_tasks_per_s=500.0, sender_tasks_burst=100.0)
    )
    assert a.engine is not None and a.ledger is not None
    a.engine.pause("test")  # nothing is fetched: every accepted task stays in the queue
    b = await make_peer(crawl=crawl, bootstrap=(a.me.addr,))
    assert b.engine is not None and b.node is not None
    hosts = [f"h{i}.busy.test" for i in range(200)]
    owned_by_a = [h for h in hosts if b.node.closest_local(key_for(h), 1)[0].id == a.node_id]
    seeds = [f"http://{h}/p{j}" for h in owned_by_a[:10] for j in range(200)]
    tasks = b.engine.seed_tasks(seeds)
    for i in range(0, len(tasks), 400):  # returns once every task was accepted somewhere
        await b.parts.dispatcher.route(tasks[i : i + 400])
    assert a.parts.handler.busy > 0  # the flood was slowed down ...
    assert set(await queued_urls(a)) == set(seeds)  # ... and every task reached its owner
    assert await queued_urls(b) == []
    assert metric(a, "p2pcrawl_store_task_busy_total") == a.parts.handler.busy


async def test_a_new_id_next_to_a_busy_host_takes_nothing_before_the_minimum_age(
    make_peer: PeerFactory,
) -> None:
    """The keyed-network half of the fake-close-ID attack: a key holder may answer for an ID
    next to a host's key, but a new ID takes over keys only once it has been live
    ``min_peer_age``; one that asks for its keys at once and vanishes again gets nothing.
    (In an open network such an ID is not counted at all: ``test_strangers``.)"""
    from p2pcrawl.crawl import Task
    from p2pcrawl.settings import CrawlSettings, ScopeSettings

    crawl = CrawlSettings(scope=ScopeSettings(allow_domains=("busy.test",)))
    # The default minimum age: on.
    a = await make_peer(crawl=crawl, peer=PeerSettings(secret=TEST_SECRET))
    assert a.engine is not None and a.ledger is not None and a.node is not None
    a.engine.pause("test")  # nothing is fetched: every task stays queued
    key = key_for("busy.test")
    page = [f"http://busy.test/p{i}" for i in range(50)]
    assert await a.intake([Task(u, urls.fingerprint(u), key, 1) for u in page]) == 50
    fake = CrawlNode(id_next_to(key), MemoryHandler(), NodeConfig(secret=TEST_SECRET))
    await fake.listen_on("127.0.0.1", 0)
    try:
        await fake.join([a.me.addr])
        await eventually(lambda: a.node.owner_wait(fake.me.id) is not None)  # type: ignore[union-attr]
        answer = await fake.refresh_task(a.me)  # "hand me my host", at once
        assert answer.keys == 0 and answer.retry_after > PeerSettings().min_peer_age - 1
        a.parts.rebalance.due.set()  # a rebalance pass must not hand it anything either
        await asyncio.sleep(0.5)
        assert a.node.closest_local(key, 1) == [a.me]
        assert a.node.peers() == []
    finally:
        await fake.aclose()
    handler = fake.handler
    assert isinstance(handler, MemoryHandler) and handler.tasks == {}
    assert sorted(await queued_urls(a)) == sorted(page)
