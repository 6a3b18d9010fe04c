"""WARC 1.1 revisit records (§6.7): written by the writer process, read back by warcio with
digests checked, indexed by cdxj-indexer, replayed by pywb; and the capture names revisits
refer to."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import importlib.util
import io
import json
import os
import sys
from email.utils import formatdate
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator
from warcio.timeutils import iso_date_to_timestamp, timestamp_to_sec

from p2pcrawl.archive import (
    PROFILE_IDENTICAL,
    PROFILE_NOT_MODIFIED,
    FetchRecord,
    RevisitOf,
    WarcWriter,
    capture_record_id,
    payload_digest_label,
    warc_date,
)
from p2pcrawl.crawl import crawl
from p2pcrawl.settings import CrawlSettings, PolitenessSettings, RevisitSettings, ScopeSettings
from p2pcrawl.testing import ChangingConfig, ChangingWeb
from p2pcrawl.ui.export import write_cdxj

URL = "http://a.test/page.html"
BODY = b"<html><body>version one</body></html>"
T0_MS = 1_700_000_000_123
HEADERS = [("Content-Type", "text/html"), ("ETag", '"v1"')]


def capture() -> FetchRecord:
    return FetchRecord(
        URL, 200, "OK", "1.1", [("User-Agent", "ua")], HEADERS, BODY,
        ip="127.0.0.1", fetched_at=T0_MS / 1000, record_id=capture_record_id(URL, T0_MS),
    )  # fmt: skip


def refers(profile: str) -> RevisitOf:
    return RevisitOf(
        profile,
        refers_to_uri=URL,
        refers_to_date=warc_date(T0_MS / 1000),
        refers_to=capture_record_id(URL, T0_MS),
        payload_digest=payload_digest_label(hashlib.sha1(BODY).digest()),
    )


async def test_revisit_records_read_back_with_their_capture(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path, prefix="abcd1234")
    await writer.start()
    try:
        await writer.write(capture(), durable=True)
        not_modified = FetchRecord(
            URL, 304, "Not Modified", "1.1", [("User-Agent", "ua"), ("If-None-Match", '"v1"')],
            [("ETag", '"v1"')], b"", ip="127.0.0.1", fetched_at=T0_MS / 1000 + 60,
            revisit=refers(PROFILE_NOT_MODIFIED),
        )  # fmt: skip
        identical = FetchRecord(
            URL, 200, "OK", "1.1", [("User-Agent", "ua")], HEADERS, BODY,
            fetched_at=T0_MS / 1000 + 120, revisit=refers(PROFILE_IDENTICAL),
        )  # fmt: skip
        await writer.write(not_modified, durable=True)
        await writer.write(identical, durable=True)
    finally:
        await writer.aclose()
    records = []
    with writer.files[0].open("rb") as f:
        for rec in ArchiveIterator(f, check_digests="raise"):
            records.append((rec.rec_type, rec.rec_headers, rec.http_headers, rec.raw_stream.read()))
    kinds = [r[0] for r in records]
    assert kinds == ["warcinfo", "response", "request", "revisit", "request", "revisit", "request"]
    response, revisit_304, revisit_same = records[1][1], records[3][1], records[5][1]
    assert response.get_header("WARC-Record-ID") == capture_record_id(URL, T0_MS)
    for rec, profile in ((revisit_304, PROFILE_NOT_MODIFIED), (revisit_same, PROFILE_IDENTICAL)):
        assert rec.protocol == "WARC/1.1"
        assert rec.get_header("WARC-Profile") == profile
        assert rec.get_header("WARC-Refers-To-Target-URI") == URL
        assert rec.get_header("WARC-Refers-To-Date") == response.get_header("WARC-Date")
        assert rec.get_header("WARC-Refers-To") == response.get_header("WARC-Record-ID")
        assert rec.get_header("WARC-Payload-Digest") == response.get_header("WARC-Payload-Digest")
    # A 304 has no block (§6.7.3): the capture's headers and payload are the revisit's.
    assert records[3][2] is None and records[3][3] == b""
    assert revisit_304.get_header("Content-Length") == "0"
    # Identical payload: the headers of the 200, its payload left out and said so.
    assert records[5][2].get_statuscode() == "200" and records[5][3] == b""
    assert records[5][2].get_header("Content-Length") == str(len(BODY))
    assert revisit_same.get_header("WARC-Truncated") == "length"
    assert revisit_304.get_header("WARC-Truncated") is None
    # The conditional request is archived as sent, concurrent to its revisit.
    assert records[4][1].get_header("WARC-Concurrent-To") == revisit_304.get_header(
        "WARC-Record-ID"
    )
    assert records[4][2].get_header("If-None-Match") == '"v1"'
    out = io.StringIO()
    assert write_cdxj(writer.files, out, lambda m: None) == 3  # warcinfo and requests skipped
    assert out.getvalue().count('"mime": "warc/revisit"') == 2


def test_capture_names_are_stable_and_distinct() -> None:
    a = capture_record_id(URL, T0_MS)
    assert a == capture_record_id(URL, T0_MS)
    assert a != capture_record_id(URL, T0_MS + 1)
    assert a != capture_record_id(URL + "x", T0_MS)
    assert a.startswith("<urn:uuid:") and a.endswith(">")


# pywb's replay, in a process of its own: its apps patch the standard library for gevent
# when imported, which the event loop of this one must not meet.
_PYWB_REPLAY = """
import json, sys
from pywb.manager.manager import main as wb_manager
out, warcs, paths = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
wb_manager(["init", "crawl"])
wb_manager(["add", "crawl", *warcs])
from pywb.apps.frontendapp import FrontEndApp
from werkzeug.test import Client
client = Client(FrontEndApp())
answers = []
for path in paths:
    r = client.get(path)
    answers.append([r.status_code, r.headers.get("Memento-Datetime"), r.get_data().hex()])
with open(out, "w") as f:
    json.dump(answers, f)
"""


def pywb_python() -> str | None:
    """The interpreter of an environment with pywb: ``P2PCRAWL_PYWB_PYTHON``, or this one.
    pywb lives apart from p2pcrawl (.ci/run makes it its own venv): its brotlipy installs a
    ``brotli`` package over Brotli's module, and aiohttp's br decoding breaks."""
    configured = os.environ.get("P2PCRAWL_PYWB_PYTHON")
    if configured:
        return configured
    return sys.executable if importlib.util.find_spec("pywb") else None


@pytest.mark.skipif(
    pywb_python() is None,
    reason="no pywb: set P2PCRAWL_PYWB_PYTHON to the python of a venv with pywb (CI does)",
)
async def test_pywb_indexes_a_continuous_crawl_and_replays_its_revisits(tmp_path: Path) -> None:
    """A real crawl in continuous mode, indexed by pywb's wb-manager: a revisit of either
    profile, asked for at its own time, replays as the payload of the capture it refers
    to."""
    web = ChangingWeb(ChangingConfig(hosts=1, pages_per_host=2))
    await web.start()
    try:
        settings = CrawlSettings(
            politeness=PolitenessSettings(delay=0.0, politeness_factor=0.0),
            scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
            revisit=RevisitSettings(every=1, max_interval=1),
        )
        summary = await crawl([web.hub_url], settings, tmp_path / "peer", run_for=2.0)
    finally:
        await web.aclose()
    payloads: dict[str, bytes] = {}  # capture record ID -> payload
    revisits: list[tuple[str, str, str, str]] = []  # (URL, timestamp, profile, refers to)
    stamps: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in summary.warc_files:
        with path.open("rb") as f:
            for rec in ArchiveIterator(f, check_digests="raise"):
                head = rec.rec_headers
                if rec.rec_type not in ("response", "revisit"):
                    continue
                url = head.get_header("WARC-Target-URI")
                stamp = iso_date_to_timestamp(head.get_header("WARC-Date"))
                stamps[url, stamp] += 1
                if rec.rec_type == "response":
                    payloads[head.get_header("WARC-Record-ID")] = rec.content_stream().read()
                else:
                    profile, refers = (
                        head.get_header("WARC-Profile"),
                        head.get_header("WARC-Refers-To"),
                    )
                    revisits.append((url, stamp, profile, refers))
    # pywb finds captures by the second: a revisit that shares its second with another
    # capture of its URL could be answered by either.
    asked = [r for r in revisits if stamps[r[0], r[1]] == 1]
    assert {p for _, _, p, _ in asked} == {PROFILE_NOT_MODIFIED, PROFILE_IDENTICAL}, revisits
    collection = tmp_path / "pywb"
    collection.mkdir()
    out = tmp_path / "answers.json"
    paths = [f"/crawl/{stamp}id_/{url}" for url, stamp, _, _ in asked]
    proc = await asyncio.create_subprocess_exec(
        pywb_python() or sys.executable, "-c", _PYWB_REPLAY, str(out),
        json.dumps([str(p) for p in summary.warc_files]), json.dumps(paths),
        cwd=collection, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    # Every response and revisit record is in pywb's index.
    index = (collection / "collections/crawl/indexes/index.cdxj").read_text().splitlines()
    assert len(index) == sum(stamps.values())
    assert sum('"mime": "warc/revisit"' in line for line in index) == len(revisits)
    for (url, stamp, profile, refers), (status, memento, body) in zip(
        asked, json.loads(out.read_text()), strict=True
    ):
        assert status == 200, (url, profile)
        # The revisit itself answered (its time), with the payload of its capture.
        assert memento == formatdate(timestamp_to_sec(stamp), usegmt=True), (url, profile)
        assert bytes.fromhex(body) == payloads[refers], (url, profile)
