"""The network view on real peers: status addresses through the DHT, /api/network, the CLI.

Three peers crawl the test web together, each with its own status server; every server's
view must list all three, reachable, with totals that are the sum of their own statuses.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from p2pcrawl.settings import PeerSettings
from p2pcrawl.ui.network import announce_key, decode_announcement, encode_announcement
from tests.conftest import (
    TEST_MIN_PEER_AGE,
    PeerFactory,
    StatusFactory,
    WebFactory,
    crawl_settings_for,
)

pytestmark = pytest.mark.timeout(120)

SECRET = "network-key"
TOKEN = "page-token"


async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def _pages(peer: Any) -> int:
    return int(peer.status()["pages_fetched"])


def _busy(peer: Any) -> bool:
    st = peer.status()
    return bool(st["tasks_queued"] or st["tasks_in_flight"] or st["rpc_in_transit"])


async def _wait_view(
    session: aiohttp.ClientSession, url: str, peers: int, timeout: float = 30.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc: dict[str, Any] = await _get(session, url + "api/network")
        if doc["peers_reachable"] == peers == doc["peers_known"]:
            return doc
        if time.monotonic() > deadline:
            raise AssertionError(f"view incomplete after {timeout} s: {doc}")
        await asyncio.sleep(0.5)


async def test_every_peer_sees_the_whole_network_and_its_totals(
    make_web: WebFactory, make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    web = await make_web(hosts=4)
    crawl = crawl_settings_for(web)
    keyed = PeerSettings(secret=SECRET, rpc_timeout=1.0, min_peer_age=TEST_MIN_PEER_AGE)
    founder = await make_peer(crawl=crawl, peer=keyed)
    boot = ((founder.me.host, founder.me.port),)
    peers = [founder] + [await make_peer(crawl=crawl, peer=keyed, bootstrap=boot) for _ in "ab"]
    servers = [await make_status(p, token=TOKEN) for p in peers]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as s:
        await founder.add_seeds([web.hub_url])
        # A peer may own no host (random IDs), so wait on the total, not on each peer.
        truth = len(web.ground_truth())
        async with asyncio.timeout(60):
            while True:
                if sum(_pages(p) for p in peers) >= truth and not any(_busy(p) for p in peers):
                    break
                await asyncio.sleep(0.2)
        views = [await _wait_view(s, srv.url, 3) for srv in servers]
        await asyncio.sleep(1.1)  # past the view's one-second cache
        views = [await _wait_view(s, srv.url, 3) for srv in servers]
        statuses = [await _get(s, srv.url + "api/status") for srv in servers]

    ids = {p.node_id.hex() for p in peers}
    pages = {st["node_id"]: st["pages_fetched"] for st in statuses}
    assert sum(pages.values()) == len(web.ground_truth())
    for srv, peer, view in zip(servers, peers, views, strict=True):
        assert {row["node_id"] for row in view["peers"]} == ids
        first = view["peers"][0]
        assert first["me"] and first["node_id"] == peer.node_id.hex()
        assert first["page"] == srv.url
        pages_of = {row["node_id"]: row["pages_fetched"] for row in view["peers"]}
        assert pages_of == pages
        assert view["totals"]["pages_fetched"] == sum(pages.values())
        assert view["totals"]["tasks_queued"] == 0
        # Every row links the page of the server that answered for that node.
        links = {row["node_id"]: row["page"] for row in view["peers"]}
        assert links == {p.node_id.hex(): sv.url for p, sv in zip(peers, servers, strict=True)}
        assert abs(sum(row["share"] for row in view["peers"]) - 1.0) < 0.01
        assert view["state"] in ("active", "finished")

    # The DHT holds each peer's announcement, tagged with the network key.
    node = founder.node
    assert node is not None
    for p, srv in zip(peers, servers, strict=True):
        raw = await node.get(announce_key(p.node_id))
        ann = decode_announcement(raw, p.node_id, SECRET)
        assert ann is not None and f"http://{ann.status}/" == srv.url
        assert decode_announcement(raw, p.node_id, "another key") is None

    # The command line prints the same view as a table, and as JSON.
    for extra, check in (([], "table"), (["--json"], "json")):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "p2pcrawl",
            "status",
            "--peer",
            f"127.0.0.1:{servers[1].port}",
            "--token",
            TOKEN,
            "--network",
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err
        text = out.decode()
        if check == "json":
            doc = json.loads(text)
            assert {row["node_id"] for row in doc["peers"]} == ids
        else:
            lines = text.splitlines()
            assert lines[0].split()[:3] == ["node", "state", "share"]
            assert lines[1].startswith(peers[1].node_id.hex()[:8] + "*")
            assert sum(line[:8] in {i[:8] for i in ids} for line in lines) == 3
            assert lines[4].startswith("total") and "3/3 peers answered" in lines[4]


async def test_a_planted_announcement_is_ignored_in_a_keyed_network(
    make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    keyed = PeerSettings(secret=SECRET, rpc_timeout=1.0, min_peer_age=TEST_MIN_PEER_AGE)
    founder = await make_peer(peer=keyed)
    joiner = await make_peer(peer=keyed, bootstrap=((founder.me.host, founder.me.port),))
    server = await make_status(founder)
    # No status server runs for the joiner; someone plants an unkeyed address for it.
    node = founder.node
    assert node is not None
    from protocol import key_for

    planted = encode_announcement(joiner.node_id, "127.0.0.1:9", "")
    node.storage[key_for(announce_key(joiner.node_id))] = planted
    async with aiohttp.ClientSession() as s:
        doc = await _get(s, server.url + "api/network")
    row = next(r for r in doc["peers"] if r["node_id"] == joiner.node_id.hex())
    assert row["reachable"] is False and row["status_addr"] is None
    assert "no status address" in row["problem"]
    assert doc["state"] == "unknown" and doc["peers_reachable"] == 1


async def test_the_network_page_is_served_with_its_own_csp(
    make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    server = await make_status(await make_peer())
    async with aiohttp.ClientSession() as s, s.get(server.url + "network") as resp:
        assert resp.status == 200
        body = await resp.text()
        csp = resp.headers["Content-Security-Policy"]
    assert "<title>p2pcrawl network</title>" in body
    assert "script-src 'sha256-" in csp and "unsafe-inline" not in csp
    assert resp.headers["Referrer-Policy"] == "no-referrer"


async def test_max_network_pages_stops_every_peer_near_the_total(
    make_web: WebFactory, make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    web = await make_web(hosts=2, pages_per_host=60)
    truth = web.ground_truth()
    base = crawl_settings_for(web, delay=0.2)  # about ten pages a second in all
    crawl = replace(base, scope=replace(base.scope, max_network_pages=10))
    founder = await make_peer(crawl=crawl)
    joiner = await make_peer(crawl=crawl, bootstrap=((founder.me.host, founder.me.port),))
    for p in (founder, joiner):
        await make_status(p)
    await founder.add_seeds([web.hub_url])
    deadline = time.monotonic() + 30
    engines = [p.engine for p in (founder, joiner)]
    while not all(e is not None and e.network_limit_reached for e in engines):
        assert time.monotonic() < deadline, [p.status() for p in (founder, joiner)]
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # fetches under way end
    total = sum(int(p.status()["pages_fetched"]) for p in (founder, joiner))  # type: ignore[call-overload]
    await asyncio.sleep(1.0)
    assert sum(int(p.status()["pages_fetched"]) for p in (founder, joiner)) == total  # type: ignore[call-overload]
    assert 10 <= total < len(truth) // 2, total


async def test_a_joiner_is_in_the_founders_view_as_soon_as_it_has_joined(
    make_peer: PeerFactory, make_status: StatusFactory, tmp_path: Any
) -> None:
    # As `p2pcrawl join` runs it: the joiner's status server starts before its peer joins.
    from p2pcrawl.network import Peer, PeerConfig
    from p2pcrawl.ui import StatusServer

    # The default --min-peer-age: the joiner waits seconds in "joining", with one contact.
    founder = await make_peer(peer=PeerSettings())
    server = await make_status(founder)
    joiner = Peer(
        PeerConfig(data_dir=tmp_path / "joiner", bootstrap=((founder.me.host, founder.me.port),))
    )
    joiner_server = StatusServer(joiner, "127.0.0.1", 0)
    await joiner_server.start()
    try:
        await joiner.start()
        # Well inside the minute between two regular announcements.
        async with aiohttp.ClientSession() as s:
            view = await _wait_view(s, server.url, 2, timeout=15.0)
        assert {row["node_id"] for row in view["peers"]} == {
            founder.node_id.hex(),
            joiner.node_id.hex(),
        }
    finally:
        await joiner_server.aclose()
        await joiner.aclose()
