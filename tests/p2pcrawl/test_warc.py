"""WARC output: read back with warcio's own reader, digests checked, files rotated and closed."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

from p2pcrawl import __version__
from p2pcrawl.archive import (
    ORIGINAL_CONTENT_ENCODING,
    ORIGINAL_CONTENT_LENGTH,
    FetchRecord,
    WarcWriteError,
    WarcWriter,
    read_warc_urls,
    stored_response_headers,
    warcio_pair,
)

UA = "p2pcrawl/0.1.0 (+https://example.org/bot)"
NAME_RX = re.compile(r"^p2pcrawl-abcd1234-\d{17}-\d{5}\.warc\.gz$")
PDF = b"%PDF-1.4\n" + bytes(range(256)) * 40 + b"\n%%EOF\n"


def sha1_b32(data: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode()


def make_record(
    url: str = "http://a.test/page?x=1",
    *,
    status: int = 200,
    reason: str = "OK",
    body: bytes = b"<html><a href='/b'>b</a></html>",
    headers: list[tuple[str, str]] | None = None,
    truncated: bool = False,
    ip: str | None = "127.0.0.1",
    fetched_at: float = 1_700_000_000.0,
) -> FetchRecord:
    host = url.split("/")[2]
    return FetchRecord(
        url=url,
        status=status,
        reason=reason,
        http_version="1.1",
        request_headers=[("Host", host), ("User-Agent", UA), ("Accept-Encoding", "gzip, br")],
        response_headers=headers
        if headers is not None
        else [("Content-Type", "text/html"), ("Content-Length", str(len(body)))],
        body=body,
        truncated=truncated,
        ip=ip,
        fetched_at=fetched_at,
    )


def read_records(path: Path) -> Iterator[tuple[Any, bytes]]:
    """(record, raw payload) for every record, with warcio verifying both digests."""
    with path.open("rb") as f:
        for record in ArchiveIterator(f, check_digests="raise"):
            yield record, record.raw_stream.read()


async def write_all(
    tmp_path: Path, records: list[FetchRecord], **kwargs: Any
) -> tuple[WarcWriter, Path]:
    directory = tmp_path / "warc"
    writer = WarcWriter(directory, prefix="abcd1234", **kwargs)
    await writer.start()
    for rec in records:
        await writer.write(rec)
    await writer.aclose()
    return writer, directory


async def test_each_fetch_is_a_response_and_request_pair_with_correct_digests(
    tmp_path: Path,
) -> None:
    html = b"<html>" + b"<p>hello</p>" * 500 + b"</html>"
    records = [
        make_record(
            "http://a.test/",
            body=html,
            headers=[
                ("Content-Type", "text/html; charset=utf-8"),
                ("Content-Encoding", "gzip"),
                ("Transfer-Encoding", "chunked"),
            ],
        ),
        make_record(
            "http://a.test/old",
            status=301,
            reason="Moved Permanently",
            body=b"",
            headers=[("Location", "http://a.test/new"), ("Content-Length", "0")],
        ),
        make_record("http://a.test/missing", status=404, reason="Not Found", body=b"nope"),
        make_record(
            "http://b.test/doc.pdf",
            body=PDF,
            headers=[("Content-Type", "application/pdf"), ("Content-Length", str(len(PDF)))],
        ),
        make_record(
            "http://b.test/huge",
            body=b"x" * 1000,
            headers=[("Content-Type", "text/plain"), ("Content-Length", "5000000")],
            truncated=True,
        ),
    ]
    writer, directory = await write_all(tmp_path, records)

    assert writer.records_written == len(records)
    assert len(writer.files) == 1
    path = writer.files[0]
    assert NAME_RX.match(path.name), path.name
    assert writer.bytes_written == path.stat().st_size

    got = list(read_records(path))
    assert [r.rec_type for r, _ in got] == ["warcinfo"] + ["response", "request"] * len(records)
    for i, rec in enumerate(records):
        response, payload = got[1 + 2 * i]
        request, _ = got[2 + 2 * i]
        rh = response.rec_headers
        assert rh.get_header("WARC-Target-URI") == rec.url
        assert payload == rec.body
        assert rh.get_header("WARC-Payload-Digest") == sha1_b32(rec.body)
        assert (rh.get_header("WARC-Truncated") == "length") is rec.truncated
        assert rh.get_header("WARC-IP-Address") == "127.0.0.1"
        assert rh.get_header("WARC-Date") == "2023-11-14T22:13:20Z"
        assert response.http_headers.get_statuscode() == str(rec.status)
        assert response.http_headers.protocol == "HTTP/1.1"
        assert response.http_headers.get_header("Content-Length") == str(len(rec.body))

        assert request.rec_headers.get_header("WARC-Target-URI") == rec.url
        assert request.rec_headers.get_header("WARC-Concurrent-To") == rh.get_header(
            "WARC-Record-ID"
        )
        assert request.http_headers.get_header("User-Agent") == UA
        assert request.http_headers.get_header("Host") == rec.url.split("/")[2]

    first_response = got[1][0].http_headers
    assert first_response.get_header("Content-Encoding") is None
    assert first_response.get_header("Transfer-Encoding") is None
    assert first_response.get_header(ORIGINAL_CONTENT_ENCODING) == "gzip"
    truncated_response = got[9][0].http_headers
    assert truncated_response.get_header(ORIGINAL_CONTENT_LENGTH) == "5000000"
    # The request line is the origin form the fetcher sent, query included.
    req_line = got[2][0].http_headers
    assert (req_line.protocol, req_line.statusline) == ("GET", "/ HTTP/1.1")

    assert read_warc_urls(directory) == [r.url for r in records]


async def test_request_target_keeps_the_query(tmp_path: Path) -> None:
    writer, _ = await write_all(tmp_path, [make_record("http://a.test/p/q?x=1&y=2")])
    request = next(r for r, _ in read_records(writer.files[0]) if r.rec_type == "request")
    assert request.http_headers.statusline == "/p/q?x=1&y=2 HTTP/1.1"


async def test_warcinfo_first_names_software_version_and_user_agent(tmp_path: Path) -> None:
    writer, _ = await write_all(tmp_path, [make_record()])
    info, payload = next(iter(read_records(writer.files[0])))
    assert info.rec_type == "warcinfo"
    assert info.rec_headers.get_header("WARC-Filename") == writer.files[0].name
    fields = dict(line.split(": ", 1) for line in payload.decode().splitlines() if ": " in line)
    assert fields["software"].startswith(f"p2pcrawl/{__version__}")
    assert fields["http-header-user-agent"] == UA


async def test_explicit_user_agent_wins(tmp_path: Path) -> None:
    writer, _ = await write_all(tmp_path, [make_record()], user_agent="OperatorBot/2")
    _, payload = next(iter(read_records(writer.files[0])))
    assert b"http-header-user-agent: OperatorBot/2\r\n" in payload


async def test_rotation_at_max_bytes_gives_several_readable_files(tmp_path: Path) -> None:
    bodies = [random.Random(i).randbytes(2048) for i in range(30)]  # incompressible
    records = [make_record(f"http://a.test/{i}", body=b) for i, b in enumerate(bodies)]
    writer, directory = await write_all(tmp_path, records, max_bytes=8_000)

    assert len(writer.files) >= 4
    assert sorted(directory.iterdir()) == sorted(writer.files)
    assert [p.name[-13:-8] for p in writer.files] == [f"{i:05d}" for i in range(len(writer.files))]
    total = 0
    for path in writer.files:
        assert NAME_RX.match(path.name)
        kinds = [r.rec_type for r, _ in read_records(path)]
        assert kinds[0] == "warcinfo"
        assert kinds[1:] == ["response", "request"] * ((len(kinds) - 1) // 2)
        total += (len(kinds) - 1) // 2
    assert total == len(records)
    assert read_warc_urls(directory) == [r.url for r in records]
    assert writer.bytes_written == sum(p.stat().st_size for p in writer.files)


async def test_no_file_until_the_first_record(tmp_path: Path) -> None:
    writer, directory = await write_all(tmp_path, [])
    assert writer.files == []
    assert read_warc_urls(directory) == []


async def test_aclose_drains_the_queue_and_is_idempotent(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path, prefix="abcd1234", queue_size=4)
    await writer.start()
    for i in range(50):
        await writer.write(make_record(f"http://a.test/{i}"))
    await writer.aclose()
    await writer.aclose()
    assert writer.records_written == 50
    assert len(read_warc_urls(tmp_path)) == 50
    with pytest.raises(RuntimeError):
        await writer.write(make_record())


async def test_a_durable_write_is_in_the_file_when_it_returns(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path, prefix="abcd1234")
    await writer.start()
    try:
        await writer.write(make_record("http://a.test/1"))
        await writer.write(make_record("http://a.test/2"), durable=True)
        # Not closed yet: the records must already be readable from the open file, in order.
        assert writer.records_written == 2
        assert read_warc_urls(tmp_path) == ["http://a.test/1", "http://a.test/2"]
    finally:
        await writer.aclose()


async def test_write_before_start_is_refused(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path, prefix="abcd1234")
    with pytest.raises(RuntimeError):
        await writer.write(make_record())
    await writer.aclose()


def test_unsafe_prefix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        WarcWriter(tmp_path, prefix="../etc")


async def test_concurrent_writers_from_many_tasks(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path, prefix="abcd1234", queue_size=8, max_bytes=50_000)
    await writer.start()
    urls = [f"http://h{i % 7}.test/p{i}" for i in range(300)]
    await asyncio.gather(*(writer.write(make_record(u, body=u.encode() * 20)) for u in urls))
    await writer.aclose()
    got = read_warc_urls(tmp_path)
    assert sorted(got) == sorted(urls)
    for path in writer.files:
        for record, payload in read_records(path):
            if record.rec_type == "response":
                target = record.rec_headers.get_header("WARC-Target-URI")
                assert payload == target.encode() * 20


async def test_write_waits_when_the_queue_is_full(tmp_path: Path) -> None:
    # Incompressible 4 MiB bodies keep the thread busy, so an unbounded queue would let every
    # write return at once; with the bound, returned writes never exceed slots + finished.
    queue_size = 2
    writer = WarcWriter(tmp_path, prefix="abcd1234", queue_size=queue_size)
    await writer.start()
    body = random.Random(0).randbytes(4 << 20)
    returned = 0
    worst = 0

    async def one(i: int) -> None:
        nonlocal returned, worst
        await writer.write(make_record(f"http://a.test/{i}", body=body))
        returned += 1
        worst = max(worst, returned - writer.records_written)

    await asyncio.gather(*(one(i) for i in range(8)))
    await writer.aclose()
    assert worst <= queue_size
    assert writer.records_written == 8


async def test_a_normally_closed_file_ends_on_a_record_boundary(tmp_path: Path) -> None:
    records = [make_record(f"http://a.test/{i}", body=PDF) for i in range(20)]
    writer, _ = await write_all(tmp_path, records, max_bytes=40_000)
    for path in writer.files:
        raw = path.read_bytes()
        end = 0
        with path.open("rb") as f:
            it = ArchiveIterator(f, check_digests="raise")
            for _ in it:
                assert it.get_record_offset() == end
                end += it.get_record_length()
        assert end == len(raw)
        # One gzip member per WARC record, each decodable from its own offset.
        members = 0
        rest = raw
        while rest:
            d = zlib.decompressobj(zlib.MAX_WBITS | 16)
            d.decompress(rest)
            assert d.eof
            rest = d.unused_data
            members += 1
        assert members == 1 + 2 * (len(gzip.decompress(raw).split(b"WARC-Type: response")) - 1)


async def test_a_failing_disk_is_reported_not_hung(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    writer = WarcWriter(blocker, prefix="abcd1234", queue_size=1)
    await writer.start()
    await writer.write(make_record())
    # The single slot comes back only after the thread has failed on the first record.
    with pytest.raises(WarcWriteError):
        await asyncio.wait_for(writer.write(make_record()), 10)
    with pytest.raises(WarcWriteError):
        await asyncio.wait_for(writer.aclose(), 10)
    assert writer.records_written == 0


DISK_FULL_SCRIPT = """
import asyncio, random, resource, signal, sys
from pathlib import Path
from p2pcrawl.archive import FetchRecord, WarcWriteError, WarcWriter

# A file-size limit makes the kernel fail the write that crosses it, as a full disk would.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))

async def main() -> None:
    writer = WarcWriter(Path(sys.argv[1]), prefix="t", queue_size=1)
    await writer.start()
    try:
        for i in range(100):
            body = random.Random(i).randbytes(3000)
            await writer.write(FetchRecord(f"http://a.test/{i}", 200, "OK", "1.1", [], [], body))
        await writer.aclose()
    except WarcWriteError:
        try:
            await writer.aclose()
        except WarcWriteError:
            pass
        print(writer.records_written)

asyncio.run(main())
"""


def test_a_write_failing_mid_record_leaves_only_whole_records(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    written = int(proc.stdout.strip())
    assert 0 < written < 100
    (path,) = tmp_path.iterdir()
    end = 0
    with path.open("rb") as f:
        it = ArchiveIterator(f, check_digests="raise")
        kinds = []
        for record in it:
            kinds.append(record.rec_type)
            end += it.get_record_length()
    assert end == path.stat().st_size
    assert kinds == ["warcinfo"] + ["response", "request"] * written


def test_stored_headers_describe_the_decoded_payload() -> None:
    headers = [
        ("Content-Type", "text/html"),
        ("content-encoding", "br"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "123"),
        ("Content-Length", "123"),
        ("X-Odd", "caf\udce9"),  # aiohttp's surrogateescape for a raw 0xE9 byte
        ("X-Split", "a\r\nInjected: 1"),
    ]
    out = stored_response_headers(headers, 456)
    assert out == [
        ("Content-Type", "text/html"),
        (ORIGINAL_CONTENT_ENCODING, "br"),
        ("Content-Length", "456"),
        ("X-Odd", "caf\ufffd"),
        ("X-Split", "a  Injected: 1"),
        (ORIGINAL_CONTENT_LENGTH, "123"),
    ]
    assert stored_response_headers([("Content-Length", "3")], 3) == [("Content-Length", "3")]
    assert stored_response_headers([], 0) == [("Content-Length", "0")]


async def test_odd_header_bytes_still_give_a_valid_record(tmp_path: Path) -> None:
    rec = make_record(headers=[("X-Odd", "caf\udce9"), ("Set-Cookie", "n=\u00e9t\u00e9")])
    writer, _ = await write_all(tmp_path, [rec])
    kinds = [r.rec_type for r, _ in read_records(writer.files[0])]
    assert kinds == ["warcinfo", "response", "request"]


async def test_unset_fetch_time_is_stamped_now(tmp_path: Path) -> None:
    writer, _ = await write_all(tmp_path, [make_record(fetched_at=0.0)])
    response = next(r for r, _ in read_records(writer.files[0]) if r.rec_type == "response")
    year = int(response.rec_headers.get_header("WARC-Date")[:4])
    assert year >= datetime.now(UTC).year - 1


@pytest.mark.parametrize("backend", ["isal", "zlib"])
@pytest.mark.parametrize("level", [1, 4, 9])
def test_gzip_member_is_plain_gzip_with_either_deflate(
    monkeypatch: pytest.MonkeyPatch, backend: str, level: int
) -> None:
    import p2pcrawl.archive.records as warcformat

    if backend == "zlib":
        monkeypatch.setattr(warcformat, "_isal", None)
    elif warcformat._isal is None:
        pytest.skip("isal is not installed")
    data = b"WARC/1.0\r\n" + bytes(random.Random(level).randrange(64) for _ in range(50_000))
    member = warcformat.gzip_member(data, level)
    assert gzip.decompress(member) == data
    assert len(member) < len(data)


@pytest.mark.parametrize(
    "rec",
    [
        make_record(),
        make_record(ip=None, truncated=True, body=PDF, reason=""),
        make_record(
            "http://a.test/x?b=2&a=1",
            status=301,
            reason="Moved Permanently",
            body=b"",
            headers=[("Location", "/y"), ("Content-Encoding", "gzip"), ("Content-Length", "9")],
        ),
        make_record(headers=[("X-Split", "a\r\nb"), ("Transfer-Encoding", "chunked")]),
        make_record(fetched_at=1_700_000_000.999),
    ],
)
def test_serialised_records_are_warcios_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rec: FetchRecord
) -> None:
    import uuid

    from p2pcrawl.archive import serialize_pair

    def fixed_ids() -> Iterator[uuid.UUID]:
        n = 0
        while True:
            n += 1
            yield uuid.UUID(int=n)

    ids = fixed_ids()
    monkeypatch.setattr(uuid, "uuid4", lambda: next(ids))
    ours = serialize_pair(rec)
    ids = fixed_ids()
    assert ours == warcio_pair(rec)


def test_non_ascii_headers_are_left_to_warcio() -> None:
    from p2pcrawl.archive import serialize_pair

    rec = make_record(headers=[("Set-Cookie", "n=\u00e9t\u00e9")])
    assert serialize_pair(rec) is None


# --- the writer process ------------------------------------------------------------------


async def test_the_writer_process_ignores_ctrl_c(tmp_path: Path) -> None:
    # Ctrl-C in a terminal signals the whole process group; the peer decides when to stop.
    writer = WarcWriter(tmp_path, prefix="abcd1234")
    await writer.start()
    try:
        await writer.write(make_record("http://a.test/1"), durable=True)
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGINT)
        await asyncio.sleep(0.2)
        await writer.write(make_record("http://a.test/2"), durable=True)
    finally:
        await writer.aclose()
    assert read_warc_urls(tmp_path) == ["http://a.test/1", "http://a.test/2"]


async def test_a_killed_writer_fails_every_waiting_write(tmp_path: Path) -> None:
    writer = WarcWriter(tmp_path, prefix="abcd1234")
    await writer.start()
    await writer.write(make_record("http://a.test/0"), durable=True)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGKILL)
    body = random.Random(1).randbytes(1 << 20)
    results = await asyncio.wait_for(
        asyncio.gather(
            *(
                writer.write(make_record(f"http://a.test/{i}", body=body), durable=True)
                for i in range(1, 6)
            ),
            return_exceptions=True,
        ),
        10,
    )
    assert all(isinstance(r, WarcWriteError) for r in results)
    with pytest.raises(WarcWriteError):
        await writer.write(make_record("http://a.test/late"))
    with pytest.raises(WarcWriteError):
        await asyncio.wait_for(writer.aclose(), 10)
    assert read_warc_urls(tmp_path) == ["http://a.test/0"]


ORPHAN_SCRIPT = """
import asyncio, os, signal, sys
from pathlib import Path
from p2pcrawl.archive import FetchRecord, WarcWriter

async def main() -> None:
    writer = WarcWriter(Path(sys.argv[1]), prefix="t")
    await writer.start()
    body = bytes(range(256)) * 80
    for i in range(200):
        await writer.write(FetchRecord(f"http://a.test/{i}", 200, "OK", "1.1", [], [], body))
    # Every frame handed to the pipe (the writer may not have read them yet).
    while writer._out or writer._stdin.transport.get_write_buffer_size():
        await asyncio.sleep(0.001)
    print(writer.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no aclose(): the peer dies with records in flight

asyncio.run(main())
"""


def test_a_dying_peer_leaves_whole_records_and_no_writer_behind(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", ORPHAN_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(proc.stdout.strip())
    deadline = time.monotonic() + 20
    while _alive(pid):
        assert time.monotonic() < deadline, "the writer process outlived its peer"
        time.sleep(0.05)
    # Everything sent before the peer died is written, and the file was closed properly.
    assert read_warc_urls(tmp_path) == [f"http://a.test/{i}" for i in range(200)]
    for path in tmp_path.iterdir():
        for _record, _payload in read_records(path):
            pass  # every digest checks out to the end of the file


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has finished


async def test_a_writer_that_cannot_start_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    writer = WarcWriter(tmp_path, prefix="abcd1234")
    with pytest.raises(WarcWriteError, match="did not start"):
        await writer.start()
    await writer.aclose()  # what an owner cleaning up after a failed start does
    assert writer.pid is None
