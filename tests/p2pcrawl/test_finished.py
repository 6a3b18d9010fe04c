"""The finished state of in-process peers: each works it out for itself, and a peer that did
no work of its own still sees the finish after the others have left."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from p2pcrawl.crawl import urls
from p2pcrawl.network import save_identity
from p2pcrawl.network.quiescence import TICK_S
from protocol import PeerRef, key_for
from tests.conftest import KEYED, PeerFactory, WebFactory, crawl_settings_for, id_outranked_by
from tests.protocol.conftest import eventually

pytestmark = pytest.mark.timeout(90)


async def test_a_peer_that_did_no_work_sees_the_finish_after_the_others_left(
    make_web: WebFactory, make_peer: PeerFactory, tmp_path: Path
) -> None:
    web = await make_web(hosts=1, pages_per_host=10)
    crawl = crawl_settings_for(web)
    a = await make_peer(crawl=crawl, peer=KEYED)
    # b's ID is a's with one bit flipped where a agrees with the host's key: a owns the host,
    # b owns nothing and fetches nothing.
    b_id = id_outranked_by(a.node_id, key_for(urls.host_of(web.hub_url)))
    (tmp_path / "peer1").mkdir()
    save_identity(tmp_path / "peer1", b_id)
    b = await make_peer(crawl=crawl, peer=KEYED, bootstrap=(a.me.addr,))
    await a.seed([web.hub_url])
    both = (a, b)
    await eventually(lambda: all(p.parts.quiescence.finished.is_set() for p in both), timeout=40)
    assert b.crawl_stats is not None and b.crawl_stats.pages_fetched == 0
    assert a.crawl_stats is not None and a.crawl_stats.pages_fetched > 0
    # a leaves as `join --exit-when-finished` does once it sees the finish: b, alone now,
    # has done nothing itself, yet the network it saw finish is still finished.
    await a.say_goodbye()
    await a.aclose()
    assert b.node is not None
    await eventually(lambda: b.node is not None and b.node.peers() == [], timeout=5)
    await eventually(lambda: not b.finished.is_set(), timeout=5)  # membership moved
    await eventually(lambda: b.finished.is_set(), timeout=15)
    assert b.status()["state"] == "finished"


async def test_a_finished_network_asks_quiet_less_and_less_often(
    make_web: WebFactory, make_peer: PeerFactory
) -> None:
    """Asking every peer every tick would cost N(N-1) QUIETs a tick for as long as the
    network idles; while nothing changes, the asking slows down."""
    web = await make_web(hosts=2, pages_per_host=5)
    crawl = crawl_settings_for(web)
    a = await make_peer(crawl=crawl)
    b = await make_peer(crawl=crawl, bootstrap=(a.me.addr,))
    await a.seed([web.hub_url])
    both = (a, b)
    await eventually(lambda: all(p.parts.quiescence.finished.is_set() for p in both), timeout=40)

    def quiet_sent() -> int:
        protos = [p.node.rpc for p in both if p.node is not None]
        return sum(proto.stats.sent["quiet"] for proto in protos if proto is not None)

    await asyncio.sleep(3 * TICK_S)  # past the first doublings
    before = quiet_sent()
    await asyncio.sleep(12 * TICK_S)
    # Every tick: 2 peers x 12 ticks = 24. Backing off: at most a few each.
    assert quiet_sent() - before <= 8
    assert all(p.status()["state"] == "finished" for p in both)


async def test_a_quiet_peer_asks_again_once_the_last_busy_peer_went_quiet(
    make_web: WebFactory, make_peer: PeerFactory
) -> None:
    """Only a quiet peer asks QUIET, so a peer asked by one it waited for knows that one is
    quiet now. Asking every peer again after each such ask cost a round from every quiet peer
    whenever one more went quiet (N^3 QUIETs at a crawl's end); the next round is due when
    the last one it waited for has asked."""
    web = await make_web(hosts=1, pages_per_host=3)
    crawl = crawl_settings_for(web)
    a = await make_peer(crawl=crawl)
    b = await make_peer(crawl=crawl, bootstrap=(a.me.addr,))
    await a.seed([web.hub_url])
    await eventually(
        lambda: a.finished.is_set() and b.finished.is_set(),
        timeout=40,
    )
    assert a.node is not None and a.node.rpc is not None
    stats = a.node.rpc.stats
    q = a.parts.quiescence
    # As if two more peers had last answered "not quiet", with a's next round far off (b's
    # own asks do not count: a waits for nothing from b).
    x, y = (PeerRef(os.urandom(20), "127.0.0.1", port) for port in (9, 10))
    q._waiting = {x.id, y.id}
    q._next_poll = float("inf")
    sent = stats.sent["quiet"]
    q.answer(x.id)
    await asyncio.sleep(3 * TICK_S)
    assert stats.sent["quiet"] == sent, "asked again while still waiting for one"
    q.answer(y.id)
    await eventually(lambda: stats.sent["quiet"] > sent, timeout=3 * TICK_S)
    assert q.finished.is_set()
