"""STORE_HISTORY's payload: visit rows in chunks that each fit one datagram, and a receiver
that refuses anything else with one clear error (docs/freshness.md, "When keys move")."""

from __future__ import annotations

import dataclasses
import zlib

import msgspec
import pytest

from p2pcrawl.network.history import (
    MAX_INFLATED,
    PAYLOAD_LIMIT,
    bounded,
    history_chunks,
    read_history_chunk,
)
from protocol import MessageError
from storage import Visit, pack_visits

NOW = 1_700_000_000_000


def row(i: int, key: bytes = b"k" * 20) -> Visit:
    return Visit(
        url=f"http://site-{i % 7}.example/section/{i}/page-{i * 7919}.html",
        key=key,
        fp=i * 2654435761 % (1 << 64),
        depth=i % 5,
        due=NOW + 60_000 + i,
        fetched=NOW - i,
        status=200,
        interval=60_000,
        captured=NOW - i,
        digest=bytes(20),
        etag=f'"{i:x}-5f3a"',
        lastmod=NOW // 1000 - i,
        visits=i % 9,
        changes=i % 3,
    )


def test_rows_travel_in_chunks_that_fit_a_datagram_and_come_back_whole() -> None:
    rows = [row(i, key=bytes([i % 3]) * 20) for i in range(3000)]
    chunks = history_chunks(rows)
    assert len(chunks) > 1 and all(len(c) <= PAYLOAD_LIMIT for c in chunks)
    back = [v for c in chunks for v in read_history_chunk(c)]
    assert sorted(back, key=lambda v: v.fp) == sorted(rows, key=lambda v: v.fp)
    # What a URL's history costs on the wire, compressed (benchmarks/revisit.py prints it).
    assert sum(map(len, chunks)) / len(rows) < 60
    assert history_chunks([]) == []


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not zlib at all",
        zlib.compress(b"\x93\x01\x00\x90"[:-1]),  # cut short
        zlib.compress(msgspec.msgpack.encode([9, 0, []])),  # another version
        zlib.compress(pack_visits([row(1)])) + b"trailing",
        zlib.compress(bytes(MAX_INFLATED + 1)),  # inflates past the bound
    ],
)
def test_a_bad_payload_is_refused_with_one_error(payload: bytes) -> None:
    with pytest.raises(MessageError, match="store_history"):
        read_history_chunk(payload)


def test_a_row_from_another_peer_is_cut_to_what_this_peers_schedule_could_write() -> None:
    """Visited no later than now, an interval of at most the longest, due within it: an
    honest row passes unchanged, a forged one cannot hold its page off for years."""
    high = 3_600_000
    honest = row(1)
    forged = dataclasses.replace(
        row(2), fetched=NOW + 86_400_000, due=NOW + 10**12, interval=10**11
    )
    early = dataclasses.replace(row(3), due=NOW - 5)
    out = bounded([honest, forged, early], NOW, high)
    assert out[0] == honest and out[2] == early
    assert (out[1].fetched, out[1].interval, out[1].due) == (NOW, high, NOW + high)
    assert (
        dataclasses.replace(
            out[1], fetched=forged.fetched, interval=forged.interval, due=forged.due
        )
        == forged
    )
