"""A brand-new joiner chooses its node ID (protocol.survey) through the real join path; a
founder and a restart keep theirs; a peer answers LOAD with what its stores hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from p2pcrawl.network import Peer, PeerConfig
from p2pcrawl.settings import PeerSettings
from protocol import CrawlNode, NodeConfig, key_for
from protocol.balance import IdSpace, bit_loads, key_space_share
from protocol.survey import survey
from tests.protocol.conftest import MemoryHandler

FAST = PeerSettings(rpc_timeout=0.5, id_survey_timeout=5.0, join_retry=1.0)


def saved_id(peer: Peer) -> bytes:
    doc = json.loads((peer.config.data_dir / "node.json").read_text())
    return bytes.fromhex(doc["node_id"])


async def test_joiners_choose_ids_that_share_the_key_space_evenly(
    make_peer: Any, tmp_path: Path
) -> None:
    founder = await make_peer(peer=FAST)
    joiners = [await make_peer(peer=FAST, bootstrap=(founder.me.addr,)) for _ in range(3)]
    peers = [founder, *joiners]
    ids = [p.node_id for p in peers]
    # Random IDs give four equal shares one time in eleven; chosen ones every time.
    assert [key_space_share(i, ids) for i in ids] == [0.25] * 4
    assert [saved_id(p) for p in peers] == ids
    assert all(any(e["kind"] == "id_chosen" for e in p.events.events) for p in joiners)
    # A restart with its data directory keeps the ID, --bootstrap or not.
    last = joiners[-1]
    await last.aclose()
    again = Peer(PeerConfig(data_dir=last.config.data_dir, bootstrap=(founder.me.addr,), peer=FAST))
    try:
        await again.start()
        assert again.node_id == ids[-1]
    finally:
        await again.aclose()


async def test_an_unreachable_bootstrap_saves_no_identity(tmp_path: Path) -> None:
    from tests.protocol.test_node import free_port

    data = tmp_path / "joiner"
    peer = Peer(PeerConfig(data_dir=data, bootstrap=(("127.0.0.1", free_port()),), peer=FAST))
    try:
        await peer.start()
    except Exception as exc:
        assert "no bootstrap peer answered" in str(exc)
    else:
        raise AssertionError("joined nobody")
    finally:
        await peer.aclose()
    assert not (data / "node.json").exists()  # the next attempt chooses afresh
    assert any(e["kind"] == "id_random" for e in peer.events.events)


async def test_a_peer_reports_its_pages_and_a_joiner_splits_them(make_peer: Any) -> None:
    founder = await make_peer(peer=FAST)
    assert founder.ledger is not None
    heavy, light = key_for("heavy.example"), key_for("light.example")
    await founder.ledger.done.add([(heavy, i) for i in range(30)] + [(light, i) for i in range(10)])
    stranger = CrawlNode(bytes(20), MemoryHandler(), NodeConfig(rpc_timeout=0.5))
    await stranger.listen_on("127.0.0.1", 0)
    try:
        report = await stranger.load_report(founder.me)
    finally:
        await stranger.aclose()
    assert report.load == 40 and report.ones is not None
    _, ones = bit_loads([(heavy, 30.0), (light, 10.0)])
    assert max(abs(a - b) for a, b in zip(report.ones, ones, strict=True)) < 0.01
    found = await survey([founder.me.addr], listen=("127.0.0.1", 0), config=FAST.node_config())
    chosen = found.choose()
    space = IdSpace([founder.node_id, chosen])
    assert space.owner(heavy) != space.owner(light)  # the split falls between the two hosts


async def test_a_joiners_log_says_which_id_is_its_probes_and_why_it_chose_its_own(
    make_peer: Any, caplog: Any
) -> None:
    founder = await make_peer(peer=FAST)
    caplog.set_level("INFO")
    joiner = await make_peer(peer=FAST, bootstrap=(founder.me.addr,))
    lines = [r.getMessage() for r in caplog.records]
    probe = next(line for line in lines if line.startswith("probe node "))
    assert "throw-away ID" in probe and joiner.node_id.hex()[:8] not in probe
    chose = next(line for line in lines if line.startswith("chose node ID"))
    assert joiner.node_id.hex()[:8] in chose and "halves the busiest peer" in chose
