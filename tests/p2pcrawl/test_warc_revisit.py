"""WARC 1.1 revisit records (§6.7): written by the writer process, read back by warcio with
digests checked, indexed by cdxj-indexer; and the capture names revisits refer to."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

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
    assert records[3][2].get_statuscode() == "304" and records[3][3] == b""
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
