"""The network view's pure parts: announcements, rows, totals, state and the table."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from p2pcrawl.ui.network import (
    ANNOUNCE_MAX_AGE_S,
    PeerRow,
    announce_key,
    announced_address,
    collect_rows,
    decode_announcement,
    encode_announcement,
    format_network,
    loopback_only,
    network_view,
)

A = bytes.fromhex("aa" * 20)
B = bytes.fromhex("bb" * 20)


def test_an_unkeyed_announcement_round_trips_and_is_checked() -> None:
    raw = encode_announcement(A, "127.0.0.1:8081", "")
    ann = decode_announcement(raw, A, "")
    assert ann is not None and ann.status == "127.0.0.1:8081" and ann.node_id == A
    assert decode_announcement(raw.encode(), A, "") == ann
    assert announce_key(A) == "p2pcrawl/status/v1/" + "aa" * 20
    # Planted under A's key but naming B, or not an address: ignored.
    assert decode_announcement(raw, B, "") is None
    for bad in (
        None,
        42,
        "not json",
        "[]",
        json.dumps({"node": A.hex(), "status": "no-port", "at": 1.0}),
        json.dumps({"node": A.hex(), "status": "h:99999", "at": 1.0}),
        json.dumps({"node": A.hex(), "status": "<script>:80", "at": 1.0}),
        json.dumps({"node": A.hex(), "status": "h:80", "at": True}),
        "x" * 5000,
        b"\xff\xfe",
    ):
        assert decode_announcement(bad, A, "") is None, bad


def test_a_keyed_announcement_needs_the_key_and_must_be_recent() -> None:
    now = 1_800_000_000.0
    raw = encode_announcement(A, "10.0.0.5:8080", "s3cret", at=now)
    assert decode_announcement(raw, A, "s3cret", now=now + 5) is not None
    # Another key, no tag, a changed address, or too old: refused.
    assert decode_announcement(raw, A, "other", now=now) is None
    untagged = encode_announcement(A, "10.0.0.5:8080", "", at=now)
    assert decode_announcement(untagged, A, "s3cret", now=now) is None
    forged = json.loads(raw)
    forged["status"] = "203.0.113.9:8080"
    assert decode_announcement(json.dumps(forged), A, "s3cret", now=now) is None
    stale = now + ANNOUNCE_MAX_AGE_S + 1
    assert decode_announcement(raw, A, "s3cret", now=stale) is None


def test_the_announced_address_is_one_others_can_dial() -> None:
    assert announced_address("127.0.0.1", 8080, "127.0.0.1") == "127.0.0.1:8080"
    assert announced_address("0.0.0.0", 8080, "192.0.2.7") == "192.0.2.7:8080"
    assert announced_address("::", 8080, "2001:db8::1") == "[2001:db8::1]:8080"
    assert announced_address("192.0.2.9", 9, "192.0.2.7") == "192.0.2.9:9"


def _status(node: bytes, state: str, pages: int, **extra: Any) -> dict[str, Any]:
    return {
        "node_id": node.hex(),
        "state": state,
        "pages_fetched": pages,
        "pages_per_s": 1.5,
        "tasks_queued": 3,
        "tasks_in_flight": 1,
        "backups_held": 2,
        "done": pages,
        "errors": 1,
        "bytes_fetched": 10 * pages,
        **extra,
    }


def test_the_view_sums_totals_shares_and_the_network_state() -> None:
    me = PeerRow(B.hex(), "127.0.0.1:1", _status(B, "active", 30), me=True)
    other = PeerRow(A.hex(), "127.0.0.1:2", _status(A, "active", 10, loop_lag_p99_ms=4.0))
    doc = network_view([other, me], now=5.0)
    assert [p["node_id"] for p in doc["peers"]] == [B.hex(), A.hex()]  # the asked peer first
    assert [p["share"] for p in doc["peers"]] == [0.75, 0.25]
    assert doc["totals"]["pages_fetched"] == 40 and doc["totals"]["tasks_queued"] == 6
    assert doc["totals"]["pages_per_s"] == 3.0 and doc["totals"]["backups_held"] == 4
    assert doc["state"] == "active" and doc["peers_reachable"] == 2
    assert doc["peers"][1]["loop_lag_ms"] == 4.0 and doc["peers"][0]["loop_lag_ms"] is None
    assert doc["peers"][0]["page"] == "http://127.0.0.1:1/"

    done = [
        PeerRow(B.hex(), "x:1", _status(B, "finished", 30), me=True),
        PeerRow(A.hex(), "x:2", _status(A, "finished", 10)),
    ]
    assert network_view(done)["state"] == "finished"
    half = [done[0], PeerRow(A.hex(), "x:2", _status(A, "active", 10))]
    assert network_view(half)["state"] == "active"
    # A peer that cannot be read keeps the network from looking finished.
    lost = [done[0], PeerRow(A.hex(), None, None, "no answer")]
    view = network_view(lost)
    assert view["state"] == "unknown" and view["peers_reachable"] == 1
    assert view["peers"][1]["reachable"] is False and view["peers"][1]["state"] == "unknown"


def _revisit(per_hour: int, not_modified: int, unchanged: int, changed: int, due: float) -> Any:
    return {
        "revisits_per_hour": per_hour,
        "revisits": not_modified + unchanged + changed,
        "not_modified": not_modified,
        "unchanged": unchanged,
        "changes_detected": changed,
        "tracked": 10,
        "due_now": 0,
        "next_due_at": due,
    }


def test_a_continuous_network_is_waiting_with_its_revisits_summed() -> None:
    rows = [
        PeerRow(B.hex(), "x:1", _status(B, "waiting", 30, revisit=_revisit(60, 6, 2, 2, 900.0))),
        PeerRow(A.hex(), "x:2", _status(A, "finished", 10, revisit=_revisit(30, 3, 0, 3, 700.0))),
    ]
    doc = network_view(rows, now=600.0)
    # Never "finished" while some peer has revisits to come; "waiting" outranks "finished".
    assert doc["state"] == "waiting"
    assert network_view([rows[0], PeerRow(A.hex(), "x:2", _status(A, "active", 1))])["state"] == (
        "active"
    )
    rv = doc["revisit"]
    assert rv["revisits_per_hour"] == 90 and rv["changes_detected"] == 5
    assert rv["not_modified_share"] == round(9 / 16, 4)  # over all answers, not a mean of shares
    assert rv["next_due_at"] == 700.0 and rv["tracked"] == 20
    assert doc["peers"][1]["revisit"]["revisits_per_hour"] == 60  # rows keep their own
    line = format_network(doc).splitlines()[-2]
    assert line.startswith("revisits: 90/hour, answered 304: 56%, changes detected: 5")
    assert line.endswith("next due: in 100s")
    assert "revisit" not in network_view([PeerRow(A.hex(), "x:2", _status(A, "active", 1))])


async def test_collect_rows_bounds_every_peer_and_keeps_its_problem() -> None:
    me = PeerRow(B.hex(), "127.0.0.1:1", _status(B, "active", 1), me=True)
    c, d, e, f = (bytes([i]) * 20 for i in (0xC, 0xD, 0xE, 0xF))
    addrs = {A: "h:1", c: "h:2", d: "h:3", f: "h:5"}

    async def lookup(node: bytes) -> str | None:
        return addrs.get(node)

    async def fetch(addr: str) -> dict[str, Any]:
        if addr == "h:2":
            await asyncio.sleep(10)
        if addr == "h:3":
            raise OSError("connection refused")
        if addr == "h:5":
            return _status(A, "active", 1)  # someone else's server at that address
        return _status(A, "active", 7)

    rows = await collect_rows(me, [A, c, d, e, f, A], lookup, fetch, timeout=0.2)
    by_id = {r.node_id: r for r in rows}
    assert len(rows) == 6 and rows[0] is me
    assert by_id[A.hex()].status is not None and by_id[A.hex()].problem == ""
    assert by_id[c.hex()].problem.startswith("no answer within")
    assert by_id[d.hex()].problem == "connection refused"
    assert "no status address" in by_id[e.hex()].problem
    assert "another node" in by_id[f.hex()].problem and by_id[f.hex()].status is None


def test_format_network_prints_one_line_per_peer_and_totals() -> None:
    rows = [
        PeerRow(B.hex(), "127.0.0.1:1", _status(B, "active", 30), me=True),
        PeerRow(A.hex(), None, None, "no answer within 3 s"),
    ]
    text = format_network(network_view(rows))
    lines = text.splitlines()
    assert lines[0].split() == [
        "node",
        "state",
        "share",
        "pages",
        "pages/s",
        "queued",
        "backups",
        "errors",
        "page",
    ]
    assert lines[1].startswith("bbbbbbbb*") and "100%" in lines[1]
    assert "http://127.0.0.1:1/" in lines[1]
    assert lines[2].startswith("aaaaaaaa") and "no answer within 3 s" in lines[2]
    assert lines[3].startswith("total") and "1/2 peers answered" in lines[3]


@pytest.mark.parametrize("secret", ["", "k"])
def test_announcements_fit_a_dht_value(secret: str) -> None:
    raw = encode_announcement(A, "[2001:db8::1]:65535", secret)
    assert len(raw) < 300
    assert decode_announcement(raw, A, secret) is not None


def test_a_loopback_status_server_of_a_remote_peer_is_explained() -> None:
    why = loopback_only("127.0.0.1:8080", "192.0.2.7")
    assert why is not None and "loopback only" in why and "--status 0.0.0.0:PORT" in why
    assert loopback_only("127.0.0.1:8080", "127.0.0.1") is None  # all on one machine
    assert loopback_only("192.0.2.7:8080", "192.0.2.7") is None
    assert loopback_only("[::1]:8080", "2001:db8::1") is not None


def test_the_network_page_says_what_a_share_is_and_how_ids_are_chosen() -> None:
    from importlib import resources

    page = resources.files("p2pcrawl.ui").joinpath("static/network.html").read_text()
    text = " ".join(page.split())
    assert "random node ID" not in text  # joiners choose theirs
    assert "A peer's share is its part of the pages fetched" in text
    assert "a joiner takes the one that halves the busiest" in text
