"""``p2pcrawl export`` on a real two-peer crawl of the test web, against its ground truth.

The CDXJ is checked the way a wayback tool uses it: each line's SURT key and timestamp,
then the record fetched at its offset and length with warcio, which must be the response
for that URL.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import surt
from warcio.archiveiterator import ArchiveIterator

from p2pcrawl.ui.export import ExportError, run_export, warc_files
from tests.conftest import PeerFactory, WebFactory, crawl_settings_for

pytestmark = pytest.mark.timeout(120)


async def _wait_finished(peers: list[Any], timeout: float = 60.0) -> None:
    """Nothing queued, in flight or in transit on every peer, for a second."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        sts = [p.status() for p in peers]
        idle = sum(s["pages_fetched"] for s in sts) > 0 and not any(
            s["tasks_queued"] or s["tasks_in_flight"] or s["rpc_in_transit"] for s in sts
        )
        if not idle:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= 1.0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("crawl did not finish")


@pytest.fixture
async def crawl(
    tmp_path: Path, make_web: WebFactory, make_peer: PeerFactory
) -> tuple[Any, list[Path], float, float]:
    """(web, the two peers' data directories, start time, end time) of a finished crawl."""
    web = await make_web(hosts=6)  # hosts spread over both peers (all on one: 1 in 32)
    settings = crawl_settings_for(web)
    first = await make_peer(crawl=settings)
    second = await make_peer(crawl=settings, bootstrap=((first.me.host, first.me.port),))
    started = time.time()
    await first.add_seeds([web.hub_url])
    await _wait_finished([first, second])
    ended = time.time()
    dirs = [first.config.data_dir, second.config.data_dir]
    # The WARC files are complete once the peers' writers are closed.
    await second.aclose()
    await first.aclose()
    return web, dirs, started, ended


def _export(dirs: list[Path], fmt: str) -> tuple[list[str], list[str]]:
    out = io.StringIO()
    notes: list[str] = []
    n = run_export(dirs, fmt, out, notes.append)
    lines = out.getvalue().splitlines()
    assert n == len(lines)
    # Which peer owns which host is random: one may own none and archive nothing.
    return lines, [n for n in notes if "without WARC files" not in n]


def _record_at(path: Path, offset: int, length: int) -> Any:
    """The one record in ``length`` bytes at ``offset``, as a wayback tool reads it."""
    with path.open("rb") as f:
        f.seek(offset)
        member = f.read(length)
    return next(iter(ArchiveIterator(io.BytesIO(member))))


def _iso(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


async def test_export_urls_jsonl_and_cdxj_match_the_ground_truth(
    crawl: tuple[Any, list[Path], float, float],
) -> None:
    web, dirs, started, ended = crawl
    truth = web.expected_status()

    urls, notes = _export(dirs, "urls")
    assert notes == []
    assert len(urls) == len(set(urls)) and set(urls) == set(truth)

    rows, notes = _export(dirs, "jsonl")
    assert notes == []
    docs = [json.loads(line) for line in rows]
    assert sorted(d["url"] for d in docs) == sorted(truth)
    for d in docs:
        status, headers, body = web.render(d["url"])
        if headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)  # the WARC stores the decoded payload
        assert d["status"] == truth[d["url"]] == status, d
        assert d["content_type"] == headers.get("Content-Type", ""), d
        assert d["length"] == len(body), d
        assert d["truncated"] is False
        assert int(started) <= _iso(d["fetched_at"]) <= ended + 1, d
        # The offset and length name the record's own gzip member.
        rec = _record_at(Path(d["warc_file"]), d["warc_offset"], d["warc_length"])
        assert rec.rec_type == "response"
        assert rec.rec_headers.get_header("WARC-Target-URI") == d["url"]
        assert rec.raw_stream.read() == body

    lines, notes = _export(dirs, "cdxj")
    assert notes == []
    assert lines == sorted(lines), "pywb needs a sorted index"
    by_file = {p.name: p for p in warc_files(dirs)}
    seen: dict[str, dict[str, Any]] = {}
    for line in lines:
        key, stamp, doc_text = line.split(" ", 2)
        doc = json.loads(doc_text)
        url = doc["url"]
        assert key == surt.surt(url)
        assert len(stamp) == 14 and stamp.isdigit()
        assert int(doc["status"]) == truth[url]
        assert (
            int(started)
            <= datetime.strptime(stamp, "%Y%m%d%H%M%S").replace(tzinfo=UTC).timestamp()
            <= ended + 1
        )
        rec = _record_at(by_file[doc["filename"]], int(doc["offset"]), int(doc["length"]))
        assert rec.rec_headers.get_header("WARC-Target-URI") == url
        assert rec.http_headers.get_statuscode() == doc["status"]
        seen[url] = doc
    assert set(seen) == set(truth) and len(lines) == len(truth)


async def test_export_reports_a_damaged_file_and_keeps_the_rest(
    tmp_path: Path, crawl: tuple[Any, list[Path], float, float]
) -> None:
    _, dirs, _, _ = crawl
    whole, _ = _export(dirs, "jsonl")
    captures = [json.loads(r) for r in whole]
    victim = max(warc_files(dirs), key=lambda p: p.stat().st_size)
    last = max(
        (d for d in captures if d["warc_file"] == str(victim)), key=lambda d: d["warc_offset"]
    )
    intact = victim.read_bytes()
    start, size = last["warc_offset"], last["warc_length"]
    # A peer killed mid-write cuts its last record anywhere: inside the WARC headers, inside
    # the payload; a disk error can leave garbage instead.
    damages = {
        "in the headers": intact[: start + 30],
        "in the payload": intact[: start + size // 2],
        "garbage": intact[:start] + b"\0" * 300,
    }
    for what, data in damages.items():
        victim.write_bytes(data)
        rows, notes = _export(dirs, "jsonl")
        assert len(notes) == 1 and str(victim) in notes[0], (what, notes)
        assert "damaged record" in notes[0], (what, notes)
        kept = {json.loads(r)["url"] for r in rows}
        assert kept == {d["url"] for d in captures} - {last["url"]}, what
        cdx, notes = _export(dirs, "cdxj")
        assert len(notes) == 1 and str(victim) in notes[0], (what, notes)
        assert {json.loads(line.split(" ", 2)[2])["url"] for line in cdx} == kept, what
    # Cut in the gzip trailer (its CRC), the record's content is all there: it is kept,
    # as warcio and pywb read it.
    victim.write_bytes(intact[: start + size - 4])
    rows, notes = _export(dirs, "jsonl")
    assert notes == [] and {json.loads(r)["url"] for r in rows} == {d["url"] for d in captures}
    victim.write_bytes(intact)
    assert _export(dirs, "jsonl") == (whole, [])


def test_export_names_a_source_without_warc_files(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"no \.warc\.gz files"):
        run_export([tmp_path], "jsonl", io.StringIO(), print)
    (tmp_path / "node.json").write_text("{}")
    notes: list[str] = []
    with pytest.raises(ExportError, match=r"no \.warc\.gz files in"):
        run_export([tmp_path], "jsonl", io.StringIO(), notes.append)
    assert notes and "data directory without WARC files" in notes[0]
    with pytest.raises(ExportError, match="no such file"):
        run_export([tmp_path / "missing"], "urls", io.StringIO(), print)
    plain = tmp_path / "x.txt"
    plain.write_text("x")
    with pytest.raises(ExportError, match=r"not a \.warc\.gz"):
        run_export([plain], "urls", io.StringIO(), print)
    good = tmp_path / "a.warc.gz"
    good.write_bytes(gzip.compress(b""))
    with pytest.raises(ExportError, match="unknown format"):
        run_export([good], "csv", io.StringIO(), print)


async def test_the_export_command_writes_the_same_as_the_library(
    tmp_path: Path, crawl: tuple[Any, list[Path], float, float]
) -> None:
    _, dirs, _, _ = crawl
    for fmt in ("urls", "jsonl", "cdxj"):
        expected, _ = _export(dirs, fmt)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "p2pcrawl",
            "export",
            "--format",
            fmt,
            *map(str, dirs),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err
        assert out.decode().splitlines() == expected
        target = tmp_path / f"out.{fmt}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "p2pcrawl",
            "export",
            "--format",
            fmt,
            "-o",
            str(target),
            *map(str, dirs),
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        assert proc.returncode == 0 and f"wrote {len(expected)} lines" in err.decode()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "p2pcrawl",
        "export",
        str(tmp_path / "nowhere"),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert (
        err.decode().strip()
        == f"p2pcrawl: error: {tmp_path / 'nowhere'}: no such file or directory"
    )
