"""A stranger on the same machine attacks a network, open and keyed (docs/security.md, "What
an open network guarantees"): each attack of the one small script that once steered an open
network, against real peers on loopback crawling a real test web at full speed, with the
default settings.

The stranger has no network key. In the open network it is what anyone can be there: a node
that answers for any ID it likes (it cannot prove one made from a key next to its target),
and datagrams with forged sources (a raw socket, or handed to the receiving endpoint with the
source they claim where raw sockets are not allowed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web as aioweb

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import urls
from p2pcrawl.network import Peer, announce_key, encode_announcement
from p2pcrawl.network.history import STORE_HISTORY, HistoryArgs, history_chunks
from p2pcrawl.settings import PeerSettings, RevisitSettings
from p2pcrawl.testing import ChangingConfig, ChangingWeb, TestWeb, raw_spoofing, send_spoofed
from protocol import (
    QUIET,
    BootstrapError,
    CrawlNode,
    GiveBack,
    KeyBatch,
    NoArgs,
    NodeConfig,
    NodeKey,
    PeerRef,
    PeerTimeout,
    QuietReply,
    RemoteError,
    key_for,
    wire,
)
from storage import Visit
from tests.conftest import TEST_SECRET, PeerFactory, StatusFactory, WebFactory, crawl_settings_for
from tests.p2pcrawl.test_hostile_peers import metric
from tests.p2pcrawl.test_revisit import settings_for, until
from tests.protocol.conftest import MemoryHandler, eventually

pytestmark = pytest.mark.timeout(90)

MODES = ("open", "keyed")


@pytest.fixture(params=MODES)
def settings(request: pytest.FixtureRequest) -> PeerSettings:
    """The defaults, with a network key or without."""
    return PeerSettings(secret=TEST_SECRET) if request.param == "keyed" else PeerSettings()


@pytest.fixture
async def stranger() -> AsyncIterator[Callable[..., Awaitable[CrawlNode]]]:
    """``await stranger(node_id, bootstrap, key=None)``: the attacker's node, joined if it
    can be (it has no network key), its QUIET always answered "quiet, all done"."""
    nodes: list[CrawlNode] = []

    async def factory(
        node_id: bytes, bootstrap: tuple[str, int], key: NodeKey | None = None
    ) -> CrawlNode:
        node = CrawlNode(node_id, MemoryHandler(), NodeConfig(rpc_timeout=0.5, key=key))

        async def quiet(sender: PeerRef, args: NoArgs) -> QuietReply:
            return QuietReply(quiet=True, done=1_000_000)

        node.serve(QUIET, quiet)
        await node.listen_on("127.0.0.1", 0)
        nodes.append(node)
        with contextlib.suppress(BootstrapError):  # a keyed network does not answer it
            await node.join([bootstrap])
        return node

    yield factory
    for node in nodes:
        await node.aclose()


def _flip_last_bit(node_id: bytes) -> bytes:
    return node_id[:-1] + bytes([node_id[-1] ^ 1])


def _done_claims(web: TestWeb) -> dict[bytes, list[int]]:
    """Every page of the web, by host key: what the stranger says is done."""
    claims: dict[bytes, list[int]] = {}
    for u in sorted(web.ground_truth()):
        claims.setdefault(key_for(urls.host_of(u)), []).append(urls.fingerprint(u))
    return claims


async def _claim_everything_done(attacker: CrawlNode, owner: PeerRef, web: TestWeb) -> None:
    """One round of the forged work claims: ask for a loan and report it all done, hand the
    owner a "done history" as a handoff would, and tell it as its replica would be told."""
    claims = _done_claims(web)
    every_fp = [fp for fps in claims.values() for fp in fps]
    batches = [KeyBatch(k, [], fps) for k, fps in claims.items()]
    # Made one at a time: the attack loop is cancelled at the test's end, and a call made
    # but never awaited would warn (an error under this suite's filterwarnings).
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: attacker.lend(owner, 100),
        lambda: attacker.give_back(
            owner, [GiveBack(lease, every_fp, [], False) for lease in (1, 2, 3)]
        ),
        lambda: attacker.store_task(owner, batches),
        lambda: attacker.store_backup(owner, owner.id, batches),
        lambda: attacker.delete_backup(owner, owner.id, claims),
    ]
    for call in calls:
        with contextlib.suppress(PeerTimeout, RemoteError):
            await call()


def _archived(peers: list[Peer]) -> Counter[str]:
    got: Counter[str] = Counter()
    for p in peers:
        got.update(read_warc_urls(p.config.data_dir / "warc"))
    return got


async def test_forged_work_claims_and_quiet_answers_stop_no_page(
    make_web: WebFactory,
    make_peer: PeerFactory,
    stranger: Callable[..., Awaitable[CrawlNode]],
    settings: PeerSettings,
) -> None:
    """The stranger takes an ID one bit from the owner's, asks for loans every 0.3 s and
    reports them done, hands over "done history" for every page, and answers QUIET with
    "quiet". Every page is still fetched, and the owner calls the crawl finished only then."""
    web = await make_web(hosts=2, pages_per_host=25)
    truth = web.ground_truth()
    owner = await make_peer(crawl=crawl_settings_for(web), peer=settings)
    assert owner.engine is not None and owner.ledger is not None and owner.node is not None
    owner.engine.pause("test")  # the claims arrive before any page is fetched
    await owner.seed([web.hub_url])
    attacker = await stranger(_flip_last_bit(owner.node_id), owner.me.addr)
    await _claim_everything_done(attacker, owner.me, web)

    async def keep_claiming() -> None:
        for _ in range(200):  # bounded: about a minute, far longer than the crawl
            await _claim_everything_done(attacker, owner.me, web)
            await asyncio.sleep(0.3)

    at_finish: list[tuple[int, int]] = []
    claiming = asyncio.create_task(keep_claiming())
    try:
        owner.engine.resume("test")
        await asyncio.wait_for(owner.finished.wait(), 60)
        at_finish.append((owner.ledger.done_count, owner.ledger.queued))
    finally:
        claiming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await claiming
    # Finished only once every page was fetched and recorded (robots.txt and redirects count
    # as done too), none of them on the word of the stranger.
    await asyncio.sleep(1.0)
    assert at_finish == [(owner.ledger.done_count, 0)] and at_finish[0][0] >= len(truth)
    archived = _archived([owner])
    assert set(archived) == truth and max(archived.values()) == 1
    assert owner.node.peers() == []  # the stranger never became a member
    stats = owner.node.stats()
    if settings.secret:
        assert stats["dropped"]["bad_hmac"] > 0  # type: ignore[index]
    else:
        assert owner.parts.lender.lends_answered == 0  # lending is off in an open network


ForgeHistory = Callable[[Peer, list[Visit]], Awaitable[None]]
FORGED_ETAG = '"forged"'


async def _revisited_despite(
    make_peer: PeerFactory, settings: PeerSettings, forge: ForgeHistory
) -> tuple[Peer, list[Visit]]:
    """A peer in continuous mode visits every page of a small web; then ``forge`` sends it
    visit history for each (STORE_HISTORY, as a leaver or a replica would): a visit later
    than the owner's, the next one due in ten years, a made-up ETag. Every page is still
    revisited, and no row ends up due years ahead. Returns the peer and its pages' rows (the
    hub's aside: it sends no validators, so a made-up one stays and costs nothing there)."""
    web = ChangingWeb(ChangingConfig(hosts=1, pages_per_host=3))
    await web.start()
    try:
        crawl = settings_for(web, RevisitSettings(every=1, max_interval=2))
        owner = await make_peer(crawl=crawl, peer=settings)
        assert owner.engine is not None and owner.engine.revisits is not None
        store = owner.engine.revisits.store
        assert store is not None
        pages = web.page_urls()
        keys = {owner.engine.key_of(web.hub_url)}
        await owner.add_seeds([web.hub_url])
        await until(lambda: all(web.requests(u) for u in pages), 20, "every page visited")
        await until(lambda: store.rows > len(pages), 10, "a row for every page and the hub")
        now = int(time.time() * 1000)
        year = 365 * 86_400_000
        forged = [
            dataclasses.replace(v, fetched=now + 60_000, due=now + 10 * year, etag=FORGED_ETAG)
            for v in await store.visits_for_keys(keys)
        ]
        assert len(forged) > len(pages)
        await forge(owner, forged)
        seen = {u: len(web.requests(u)) for u in pages}
        await until(
            lambda: all(len(web.requests(u)) > seen[u] for u in pages), 15, "every page revisited"
        )
        rows = await store.visits_for_keys(keys)
        assert len(rows) == len(forged)
        assert all(v.due < now + 60_000 for v in rows)
        return owner, [v for v in rows if v.url != web.hub_url]
    finally:
        await web.aclose()


async def _send_history(node: CrawlNode, to: PeerRef, rows: list[Visit]) -> None:
    for chunk in history_chunks(rows):
        with contextlib.suppress(PeerTimeout, RemoteError):
            await node.call(to, STORE_HISTORY, HistoryArgs(chunk))


async def test_forged_visit_history_stops_no_revisit(
    make_peer: PeerFactory,
    stranger: Callable[..., Awaitable[CrawlNode]],
    settings: PeerSettings,
) -> None:
    """Two strangers forge the history: one that answers for the owner's ID but one bit, and
    one that proved a fair ID and signs its requests but has not stayed --min-peer-age (and
    leaves at once, before it could be a member near every key of a network of two). Their
    rows are not taken."""

    async def forge(owner: Peer, rows: list[Visit]) -> None:
        key = await asyncio.to_thread(NodeKey.generate, settings.id_work_bits)
        for node_id, nkey in ((_flip_last_bit(owner.node_id), None), (key.node_id(), key)):
            attacker = await stranger(node_id, owner.me.addr, key=nkey)
            if nkey is not None and not settings.secret:
                await eventually(lambda: owner.node.identities.proven(key.node_id()), 5)  # type: ignore[union-attr]
            await _send_history(attacker, owner.me, rows)
            await attacker.aclose()

    owner, rows = await _revisited_despite(make_peer, settings, forge)
    assert all(v.etag != FORGED_ETAG for v in rows)  # the server's validators
    if not settings.secret:
        forged = len(rows) + 1  # the hub's too
        assert metric(owner, "p2pcrawl_history_rows_refused_total") == 2 * forged


async def test_a_member_lying_about_visit_history_holds_off_no_revisit(
    make_peer: PeerFactory,
) -> None:
    """A member whose word is taken (here a key holder, as a fair-ID member of a small open
    network is: docs/security.md) forges the history, and sends it again every 0.3 s. Its
    rows are taken (their validators, their estimate), cut to what the owner's own schedule
    could have written, and never put a visit off: each page is revisited when the owner's
    own row said, not in ten years, nor 2 s after the liar's latest row. (Its made-up ETag
    may be the latest word on a page: that costs a conditional GET answered whole.)"""
    liars: list[CrawlNode] = []
    tasks: list[asyncio.Task[None]] = []

    async def keep_sending(liar: CrawlNode, to: PeerRef, rows: list[Visit]) -> None:
        for _ in range(100):  # bounded: 30 s, longer than the test waits
            await _send_history(liar, to, rows)
            await asyncio.sleep(0.3)

    async def forge(owner: Peer, rows: list[Visit]) -> None:
        far = bytes(b ^ 0xFF for b in rows[0].key)  # the owner stays the host's owner
        liar = CrawlNode(far, MemoryHandler(), NodeConfig(rpc_timeout=0.5, secret=TEST_SECRET))
        liars.append(liar)
        await liar.listen_on("127.0.0.1", 0)
        await liar.join([owner.me.addr])
        await _send_history(liar, owner.me, rows)
        tasks.append(asyncio.create_task(keep_sending(liar, owner.me, rows)))

    try:
        owner, _ = await _revisited_despite(make_peer, PeerSettings(secret=TEST_SECRET), forge)
        assert metric(owner, "p2pcrawl_history_rows_refused_total") == 0
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for liar in liars:
            await liar.aclose()


async def _status_server_counting_requests() -> tuple[aioweb.AppRunner, int, list[str]]:
    hits: list[str] = []

    async def anything(request: aioweb.Request) -> aioweb.Response:
        hits.append(request.path)
        return aioweb.json_response({"state": "active"})

    app = aioweb.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = aioweb.AppRunner(app)
    await runner.setup()
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port, hits


async def test_a_planted_announcement_draws_no_request(
    make_peer: PeerFactory,
    make_status: StatusFactory,
    settings: PeerSettings,
) -> None:
    """The stranger STOREs a status announcement for another peer's ID with its own server's
    address, under that peer's ID: no peer stores it, and the network view never asks the
    stranger's server."""
    a = await make_peer(peer=settings)
    b = await make_peer(peer=settings, bootstrap=(a.me.addr,))
    server_a = await make_status(a)
    server_b = await make_status(b)
    node = a.node
    assert node is not None
    slot = key_for(announce_key(b.node_id))
    await eventually(lambda: node.storage.get(slot) is not None, timeout=10)  # b's own announcement
    runner, evil_port, hits = await _status_server_counting_requests()
    try:
        key = NodeKey.generate(settings.id_work_bits)
        planted = encode_announcement(
            b.node_id, f"127.0.0.1:{evil_port}", "", sign=key.sign, at=None
        )
        store = [b.node_id, slot, planted]  # in b's name, from the stranger's own socket
        for target in (a, b):
            datagram = bytes([0]) + secrets.token_bytes(20) + wire.packb(["store", store])
            _send_raw(datagram, target.me.addr)
        # And from b's own address, where a raw socket may forge it.
        if raw_spoofing():
            datagram = bytes([0]) + secrets.token_bytes(20) + wire.packb(["store", store])
            send_spoofed(datagram, b.me.addr, a.me.addr)
        await asyncio.sleep(0.5)
        async with aiohttp.ClientSession() as s, s.get(server_a.url + "api/network") as resp:
            assert resp.status == 200
            view = await resp.json()
        row = next(r for r in view["peers"] if r["node_id"] == b.node_id.hex())
        assert row["reachable"] is True and f"http://{row['status_addr']}/" == server_b.url
        assert hits == []
        assert str(evil_port) not in str(node.storage.get(slot))
    finally:
        await runner.cleanup()


def _send_raw(datagram: bytes, dest: tuple[str, int]) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(datagram, dest)


def _deliver_forged(datagram: bytes, source: tuple[str, int], target: Peer) -> None:
    """``datagram`` at ``target`` as if from ``source``: through a raw socket where this
    process may open one, else handed to its endpoint as that socket would have."""
    if raw_spoofing():
        send_spoofed(datagram, source, target.me.addr)
    else:
        assert target.node is not None
        target.node.rpc.endpoint.datagram_received(datagram, source)


async def test_a_spoofed_goodbye_drops_no_live_peer(
    make_web: WebFactory, make_peer: PeerFactory, settings: PeerSettings
) -> None:
    """GOODBYEs in each peer's name, from its own address, sent to the other while both
    crawl: neither drops the other, and no page is fetched twice."""
    web = await make_web(hosts=4, pages_per_host=20)
    crawl = crawl_settings_for(web, delay=0.05)
    a = await make_peer(crawl=crawl, peer=settings)
    b = await make_peer(crawl=crawl, peer=settings, bootstrap=(a.me.addr,))
    assert a.node is not None and b.node is not None
    await eventually(lambda: a.node.peers() != [] and b.node.peers() != [], timeout=15)  # type: ignore[union-attr]
    await a.seed([web.hub_url])
    for _ in range(3):
        for victim, named in ((a, b), (b, a)):
            body = wire.packb(["goodbye", [named.node_id]])
            _deliver_forged(bytes([0]) + secrets.token_bytes(20) + body, named.me.addr, victim)
        await asyncio.sleep(0.3)
    await asyncio.wait_for(asyncio.gather(a.finished.wait(), b.finished.wait()), 60)
    for p, other in ((a, b), (b, a)):
        assert [q.id for q in p.node.peers()] == [other.node_id]  # type: ignore[union-attr]
        assert not [e for e in p.events.events if e["kind"] in ("peer_left", "peer_lost")]
    archived = _archived([a, b])
    assert set(archived) == web.ground_truth() and max(archived.values()) == 1
    if not settings.secret:
        refuted = [metric(p, "p2pcrawl_goodbyes_refuted_total") for p in (a, b)]
        assert refuted == [3.0, 3.0]


async def test_the_patient_sybil_next_to_a_busy_host_gets_none_of_it(
    make_web: WebFactory,
    make_peer: PeerFactory,
    stranger: Callable[..., Awaitable[CrawlNode]],
    settings: PeerSettings,
) -> None:
    """An ID next to the busy host's key (all but its last bit chosen), from a key with its
    puzzle solved, stays past the minimum age while the owner crawls the host: it never
    counts as a member, so it is handed no task and no backup, and the owner crawls it all.
    (In the keyed network a stranger has no key and is not heard at all; a key holder may
    take any ID: docs/security.md.)"""
    web = await make_web(hosts=1, pages_per_host=80)
    host = web.allow_domains[0]
    crawl = crawl_settings_for(web, delay=0.08)  # the host takes longer than the minimum age
    owner = await make_peer(crawl=crawl, peer=settings)
    assert owner.node is not None
    key = await asyncio.to_thread(NodeKey.generate, settings.id_work_bits)
    sybil_id = key.node_id(key_for(host), 159)
    sybil = await stranger(sybil_id, owner.me.addr, key=key)
    await owner.seed([web.hub_url])
    await asyncio.sleep(settings.min_peer_age + 1.0)
    with contextlib.suppress(PeerTimeout, RemoteError):
        await sybil.refresh_task(owner.me)  # "hand me my keys"
    await asyncio.wait_for(owner.finished.wait(), 60)
    handler = sybil.handler
    assert isinstance(handler, MemoryHandler)
    assert handler.tasks == {} and handler.backups == {}
    assert owner.node.peers() == [] and owner.node.closest_local(key_for(host), 1) == [owner.me]
    archived = _archived([owner])
    assert set(archived) == web.ground_truth() and max(archived.values()) == 1
    if not settings.secret:
        outcome = 'p2pcrawl_identities_total{outcome="too many chosen bits"}'
        assert metric(owner, outcome) >= 1


async def test_raw_spoofing_reaches_a_loopback_socket(tmp_path: Path) -> None:
    """The forged-source tool itself: a datagram arrives with the source it names."""
    if not raw_spoofing():
        pytest.skip("no raw sockets here: the tests hand forged datagrams to the endpoint")
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(2.0)
        send_spoofed(b"forged", ("127.0.0.1", 4242), sock.getsockname())
        assert sock.recvfrom(64) == (b"forged", ("127.0.0.1", 4242))
