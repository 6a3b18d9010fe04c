"""LOAD and the joiner's survey: real nodes on loopback, the probe never admitted, every field
of a report checked, and the reply to a stranger within the amplification bound."""

from __future__ import annotations

import pytest

from protocol import (
    BootstrapError,
    CrawlNode,
    NodeConfig,
    PeerRef,
    RemoteError,
    key_for,
    new_node_id,
)
from protocol.balance import ID_BITS, IdSpace, bit_loads, common_prefix, key_space_share
from protocol.loadreport import (
    LOAD,
    LOAD_RPC,
    MAX_PEERS,
    PROFILE_BYTES,
    LoadReport,
    load_reply,
    report_of,
    serve_load,
)
from protocol.procedures import parse_reply, reply_to_wire
from protocol.survey import survey
from tests.protocol.conftest import FAST, NodeFactory, eventually
from tests.protocol.test_node import free_port


def top(bits: str) -> bytes:
    return (int(bits, 2) << (ID_BITS - len(bits))).to_bytes(20, "big")


def serving(node: CrawlNode, report: LoadReport) -> None:
    async def answer() -> LoadReport:
        return report

    node.serve(LOAD, serve_load(answer))


def nearest(node: CrawlNode) -> tuple[PeerRef, ...]:
    me = node.id
    return tuple(p for p in node.closest_local(me, MAX_PEERS + 1) if p.id != me)


async def mesh(make_node: NodeFactory, ids: list[bytes], secret: str = "") -> list[CrawlNode]:
    nodes = [await make_node(node_id=i, secret=secret) for i in ids]
    for node in nodes[1:]:
        await node.join([nodes[0].me.addr])
    await eventually(lambda: all(len(n.peers()) == len(nodes) - 1 for n in nodes))
    return nodes


def report_to_wire(report: LoadReport) -> dict[str, object]:
    return reply_to_wire(load_reply(report))


def report_from_wire(raw: object) -> LoadReport:
    return report_of(parse_reply(LOAD, raw))


def test_a_report_round_trips_within_the_fraction_step() -> None:
    keys = [(key_for(f"host{i}.example"), float(i + 1)) for i in range(50)]
    total, ones = bit_loads(keys)
    peers = (PeerRef(top("1"), "127.0.0.1", 1), PeerRef(top("01"), "::1", 65535))
    report = LoadReport(int(total), tuple(ones), peers)
    back = report_from_wire(report_to_wire(report))
    assert back.load == report.load and back.peers == peers
    assert back.ones is not None
    assert max(abs(a - b) for a, b in zip(back.ones, ones, strict=True)) <= total / 65535
    assert "ones" not in report_to_wire(LoadReport(0, tuple(ones)))  # no load, no profile


@pytest.mark.parametrize(
    ("reply", "field"),
    [
        ([1], "object"),
        ({}, "load"),
        ({"load": -1}, "load"),
        ({"load": 2**60}, "load"),
        ({"load": 1.5}, "load"),
        ({"load": True}, "load"),
        ({"load": 1, "peers": "x"}, "peers"),
        ({"load": 1, "peers": [[top("1"), "10.0.0.1"]]}, "peers"),
        ({"load": 1, "peers": [[b"x" * 19, "10.0.0.1", 1]]}, "peers"),
        ({"load": 1, "peers": [[top("1"), "host.example", 1]]}, "peers"),
        ({"load": 1, "peers": [[top("1"), "10.0.0.1", 0]]}, "peers"),
        ({"load": 1, "peers": [[top("1"), "10.0.0.1", 1]] * (MAX_PEERS + 1)}, "peers"),
        ({"load": 1, "ones": b"\0" * (PROFILE_BYTES - 1)}, "ones"),
        ({"load": 1, "ones": [0] * ID_BITS}, "ones"),
        ({"load": 0, "ones": b"\0" * PROFILE_BYTES}, "ones"),
    ],
)
def test_every_field_of_a_reply_is_checked(reply: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        report_from_wire(reply)


@pytest.mark.parametrize("secret", ["", "network key"])
async def test_a_stranger_gets_the_full_report_only_when_it_pads(
    make_node: NodeFactory, secret: str
) -> None:
    # b is not in a's table: a stranger to it
    a, b = await make_node(secret=secret), await make_node(secret=secret)
    ones = tuple(float(i % 7) for i in range(ID_BITS))
    # The largest reply: a full profile and MAX_PEERS contacts at the longest IPv6 addresses.
    widest = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    listed = tuple(PeerRef(bytes([i]) * 20, widest, 65535) for i in range(MAX_PEERS))
    serving(a, LoadReport(2**40, ones, listed))
    with pytest.raises(RemoteError, match="too large"):
        await b.load_report(a.me, pad=False)
    report = await b.load_report(a.me)
    assert report.load == 2**40 and report.ones is not None and report.peers == listed
    assert a.rpc.stats.replies_trimmed == 1


async def test_a_bad_pad_is_refused(make_node: NodeFactory) -> None:
    a, b = await make_node(), await make_node()
    serving(a, LoadReport(0))
    ok, reply = await b.rpc.endpoint.call(a.me.addr, LOAD_RPC, [b.id, "not bytes"])
    assert ok and "pad" in reply["error"]


@pytest.mark.parametrize("secret", ["", "network key"])
async def test_the_probe_learns_everyone_and_is_never_admitted(
    make_node: NodeFactory, secret: str
) -> None:
    nodes = await mesh(make_node, [top("00"), top("01"), top("1")], secret)
    for node in nodes:
        serving(node, LoadReport(0, None, nearest(node)))
    config = NodeConfig(**{**FAST, "secret": secret})
    found = await survey([nodes[0].me.addr], listen=("127.0.0.1", 0), config=config)
    ids = {n.id for n in nodes}
    assert found.known == ids and set(found.reports) == ids
    # No load anywhere yet: the joiner halves the largest region, top("1")'s half.
    chosen = found.choose()
    assert common_prefix(chosen, top("1")) == 1
    assert {key_space_share(i, [*ids, chosen]) for i in [*ids, chosen]} == {0.25}
    # The probe answered every admission challenge with an error: nobody added it.
    for node in nodes:
        await node.rpc.admission.settle(1.0)
        assert {p.id for p in node.peers()} == ids - {node.id}
        assert node.rpc.admission.counts["failed"] >= 1


async def test_the_probe_learns_a_network_its_lookups_alone_would_not(
    make_node: NodeFactory,
) -> None:
    # A stranger's FIND_NODE answers hold a few contacts; the LOAD replies list the rest.
    nodes = await mesh(make_node, [new_node_id() for _ in range(10)])
    for node in nodes:
        serving(node, LoadReport(0, None, nearest(node)))
    found = await survey([nodes[0].me.addr], listen=("127.0.0.1", 0), config=NodeConfig(**FAST))
    assert found.known == {n.id for n in nodes} == set(found.reports)


async def test_a_probe_whose_table_may_miss_nodes_looks_up_random_keys(
    make_node: NodeFactory,
) -> None:
    nodes = [await make_node(ksize=2) for _ in range(6)]
    for node in nodes[1:]:
        await node.join([nodes[0].me.addr])
    for node in nodes:
        serving(node, LoadReport(0, None, nearest(node)))
    config = NodeConfig(**{**FAST, "ksize": 2})
    found = await survey([nodes[0].me.addr], listen=("127.0.0.1", 0), config=config)
    assert found.known == {n.id for n in nodes}


async def test_the_probe_splits_the_most_loaded_peer_by_its_load(make_node: NodeFactory) -> None:
    nodes = await mesh(make_node, [top("0"), top("1")])
    # top("0") holds 10 pages on keys whose bit 5 is 1 and 10 on keys whose bit 5 is 0: only a
    # split at bit 5 halves its pages; top("1") holds less, though as much key space.
    heavy = [(top("0000011"), 10.0), (top("0000000"), 10.0)]
    total, ones = bit_loads(heavy)
    serving(nodes[0], LoadReport(int(total), tuple(ones), nearest(nodes[0])))
    serving(nodes[1], LoadReport(3, None, nearest(nodes[1])))
    found = await survey([nodes[1].me.addr], listen=("127.0.0.1", 0), config=NodeConfig(**FAST))
    chosen = found.choose()
    assert common_prefix(chosen, top("0")) == 5
    space = IdSpace([*found.known, chosen])
    assert {space.owner(k) for k, _ in heavy} == {top("0"), chosen}


async def test_a_survey_without_an_answer_is_a_bootstrap_error(make_node: NodeFactory) -> None:
    with pytest.raises(BootstrapError):
        await survey(
            [("127.0.0.1", free_port())], listen=("127.0.0.1", 0), config=NodeConfig(**FAST)
        )
