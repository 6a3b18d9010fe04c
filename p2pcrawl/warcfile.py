"""WARC records and files: the format, the rotating file writer, and the writer process.

Records are laid out exactly as warcio's ``WARCWriter`` lays them out (ISO 28500, WARC/1.0), so
digests, lengths and header encoding follow the library that most archive tools read back; a
test compares the bytes. The common case, HTTP headers all ASCII, is serialised here directly:
warcio's per-record Python (header objects, digests streamed through a reader, base32 of each
digest) cost more than compressing the record. Anything else still goes through warcio itself.

Each record is its own gzip member (what warcio and Heritrix write), so any record can be read
from its offset alone. The response, its request and, for a new file, the warcinfo record are
built into one buffer and written with a single ``write()``: a file stops at a record boundary
unless the machine itself dies mid-write.

Nothing here touches asyncio. :class:`WarcFiles` is run by the writer process
(``python -m p2pcrawl.warcfile``, see :func:`serve`), which the event-loop side,
:class:`p2pcrawl.warc.WarcWriter`, feeds over a pipe. A process rather than a thread because a
thread hashing, compressing and writing ~1,000 records a second has to take the GIL back after
every one of those C calls, and each time the event loop waits (benchmarks/README.md).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import marshal
import os
import re
import signal
import struct
import sys
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import IO, Any
from urllib.parse import urlsplit

from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

__all__ = [
    "DEFAULT_COMPRESS_LEVEL",
    "ORIGINAL_CONTENT_ENCODING",
    "ORIGINAL_CONTENT_LENGTH",
    "FetchRecord",
    "WarcFiles",
    "gzip_member",
    "read_warc_urls",
    "serialize_pair",
    "stored_response_headers",
]

# Gzip is most of the writer's CPU, and at ~1,000 pages/s that CPU bounds the crawl. Measured on
# the test web's 30 kB pages (CPU per page, bytes out): zlib level 9 (warcio's) 0.80 ms 8,327 B;
# 6 (zlib's default) 0.73 ms 8,346 B; 4 0.32 ms 8,590 B; 1 0.19 ms 9,199 B. Level 4 keeps the
# files within 3% of level 6 for less than half the CPU. ISA-L does better again: its level 3
# 0.085 ms 8,821 B, level 2 0.058 ms 8,967 B, level 1 0.057 ms 9,021 B. The level stays on
# zlib's 1-9 scale; with ISA-L, zlib level N becomes ISA-L level min(3, N - 1), about as small.
DEFAULT_COMPRESS_LEVEL = 4
_GZIP_WBITS = zlib.MAX_WBITS | 16  # gzip container, not raw zlib
_ISAL_MAX_LEVEL = 3

_isal: ModuleType | None
try:
    from isal import isal_zlib as _isal
except ImportError:  # no isal wheel for this platform: zlib writes the same format
    _isal = None

_SAFE_PREFIX = re.compile(r"^[A-Za-z0-9._-]+$")
_WARC_SUFFIX = ".warc.gz"

# Headers that describe the bytes on the wire, not the decoded payload we store.
_CONTENT_ENCODING = "content-encoding"
_TRANSFER_ENCODING = "transfer-encoding"
_CONTENT_LENGTH = "content-length"
ORIGINAL_CONTENT_ENCODING = "X-Crawler-Original-Content-Encoding"
ORIGINAL_CONTENT_LENGTH = "X-Crawler-Original-Content-Length"


@dataclass(frozen=True, slots=True)
class FetchRecord:
    """One HTTP exchange as the fetcher saw it; the unit the WARC writer archives."""

    url: str
    status: int
    reason: str
    http_version: str
    request_headers: list[tuple[str, str]]
    response_headers: list[tuple[str, str]]
    body: bytes
    truncated: bool = False
    ip: str | None = None
    fetched_at: float = 0.0


class WarcFiles:
    """Append fetch records to rotating ``*.warc.gz`` files in ``directory``; one owner, no
    threads. ``files`` lists every file opened, in order; ``records_written`` counts fetch
    records (each a response plus a request record), ``bytes_written`` compressed bytes."""

    def __init__(
        self,
        directory: Path,
        *,
        prefix: str,
        max_bytes: int = 1 << 30,
        software: str = "p2pcrawl",
        user_agent: str = "",
        compress_level: int = DEFAULT_COMPRESS_LEVEL,
    ) -> None:
        check_options(prefix, max_bytes, compress_level)
        self.directory = directory
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.compress_level = compress_level
        self.software = software
        # Empty: taken from the first record's User-Agent request header, which is what the
        # operator actually sent.
        self.user_agent = user_agent
        self.files: list[Path] = []
        self.records_written = 0
        self.bytes_written = 0
        self._file: IO[bytes] | None = None
        self._file_bytes = 0
        self._serial = 0
        self._warc = WARCWriter(io.BytesIO(), gzip=False)

    def write(self, rec: FetchRecord) -> None:
        """Append ``rec``'s response and request records: in the file (handed to the OS) on
        return, or not at all."""
        parts: list[bytes] = []
        if self._file is None:
            parts.append(self._open_file(rec))
        pair = serialize_pair(rec)
        if pair is not None:
            parts += (gzip_member(record, self.compress_level) for record in pair)
        else:
            response, request = self._build_pair(rec)
            parts.append(self._gzip_record(response))
            parts.append(self._gzip_record(request))
        data = b"".join(parts)
        assert self._file is not None
        try:
            _write_fully(self._file, data)
        except OSError:
            # Disk full or similar mid-record: cut the file back to its last whole record so
            # what is on disk stays readable to the end.
            with contextlib.suppress(OSError):
                os.ftruncate(self._file.fileno(), self._file_bytes)
            raise
        self._file_bytes += len(data)
        self.bytes_written += len(data)
        self.records_written += 1
        if self._file_bytes >= self.max_bytes:
            self.close()

    def close(self) -> None:
        """Sync and close the open file, if any; the next record starts a new one."""
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            os.fsync(f.fileno())
        finally:
            f.close()

    def _open_file(self, first: FetchRecord) -> bytes:
        """Create the next file and return its gzipped warcinfo record."""
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            now = datetime.now(UTC)
            stamp = now.strftime("%Y%m%d%H%M%S") + f"{now.microsecond // 1000:03d}"
            name = f"p2pcrawl-{self.prefix}-{stamp}-{self._serial:05d}{_WARC_SUFFIX}"
            self._serial += 1
            path = self.directory / name
            try:
                # "x": a restarted peer must never append to or overwrite an older file.
                # Unbuffered: each pair reaches the OS in one call, nothing lingers in Python.
                self._file = path.open("xb", buffering=0)
            except FileExistsError:
                continue
            break
        self._file_bytes = 0
        self.files.append(path)
        if not self.user_agent:
            self.user_agent = _header(first.request_headers, "user-agent") or ""
        info = {
            "software": f"{self.software} (warcio)",
            "format": "WARC File Format 1.0",
            "conformsTo": "http://bibnum.bnf.fr/WARC/WARC_ISO_28500_version1_latestdraft.pdf",
            "http-header-user-agent": self.user_agent,
            "robots": "obey",
            "description": f"p2pcrawl node {self.prefix}",
        }
        return self._gzip_record(self._warc.create_warcinfo_record(name, info))

    def _build_pair(self, rec: FetchRecord) -> tuple[Any, Any]:
        date = datetime_to_iso_date(
            datetime.fromtimestamp(rec.fetched_at or time.time(), UTC).replace(tzinfo=None)
        )
        warc_headers: dict[str, str] = {"WARC-Date": date}
        if rec.ip:
            warc_headers["WARC-IP-Address"] = rec.ip
        if rec.truncated:
            # WARC 1.0 §5.13: the payload was cut at the configured size limit.
            warc_headers["WARC-Truncated"] = "length"
        protocol = f"HTTP/{rec.http_version}"
        status_line = f"{rec.status} {_clean(rec.reason)}".rstrip()
        http_headers = StatusAndHeaders(
            status_line, stored_response_headers(rec.response_headers, len(rec.body)), protocol
        )
        response = self._warc.create_warc_record(
            rec.url,
            "response",
            payload=io.BytesIO(rec.body),
            length=len(rec.body),
            warc_headers_dict=warc_headers,
            http_headers=http_headers,
        )
        request_http = StatusAndHeaders(
            f"GET {_request_target(rec.url)} {protocol}",
            [(_clean(k), _clean(v)) for k, v in rec.request_headers],
            is_http_request=True,
        )
        request_headers = {
            "WARC-Date": date,
            "WARC-Concurrent-To": response.rec_headers.get_header("WARC-Record-ID"),
        }
        if rec.ip:
            request_headers["WARC-IP-Address"] = rec.ip
        request = self._warc.create_warc_record(
            rec.url,
            "request",
            payload=io.BytesIO(b""),
            length=0,
            warc_headers_dict=request_headers,
            http_headers=request_http,
        )
        return response, request

    def _gzip_record(self, record: Any) -> bytes:
        buf = io.BytesIO()
        # One WARCWriter reused with a fresh buffer per record: we gzip the record ourselves
        # (see DEFAULT_COMPRESS_LEVEL) and need its bytes to write the pair in one call.
        self._warc.out = buf
        self._warc.write_record(record)
        return gzip_member(buf.getvalue(), self.compress_level)


def serialize_pair(rec: FetchRecord) -> tuple[bytes, bytes] | None:
    """The uncompressed response and request records for ``rec``, byte for byte what warcio's
    ``WARCWriter`` writes for them (warcio 1.7-1.8, WARC/1.0, SHA-1 digests); None when an HTTP
    header is not ASCII, which warcio percent-encodes (RFC 8187) and is left to it."""
    protocol = f"HTTP/{rec.http_version}"
    status_line = f"{rec.status} {_clean(rec.reason)}".rstrip()
    response_http = _http_head(
        f"{protocol} {status_line}", stored_response_headers(rec.response_headers, len(rec.body))
    )
    request_http = _http_head(
        f"GET {_request_target(rec.url)} {protocol}",
        [(_clean(k), _clean(v)) for k, v in rec.request_headers],
    )
    if response_http is None or request_http is None:
        return None
    date = datetime.fromtimestamp(rec.fetched_at or time.time(), UTC).strftime(_WARC_DATE)
    ip = [("WARC-IP-Address", rec.ip)] if rec.ip else []
    body = rec.body
    block = hashlib.sha1(response_http)
    block.update(body)
    response_id = f"<urn:uuid:{uuid.uuid4()}>"
    response = _warc_head(
        [
            ("WARC-Date", date),
            *ip,
            # WARC 1.0 §5.13: the payload was cut at the configured size limit.
            *([("WARC-Truncated", "length")] if rec.truncated else []),
            ("WARC-Type", "response"),
            ("WARC-Record-ID", response_id),
            ("WARC-Target-URI", rec.url),
            ("WARC-Payload-Digest", _sha1_label(hashlib.sha1(body))),
            ("WARC-Block-Digest", _sha1_label(block)),
            ("Content-Type", "application/http; msgtype=response"),
            ("Content-Length", str(len(response_http) + len(body))),
        ]
    )
    request = _warc_head(
        [
            ("WARC-Date", date),
            ("WARC-Concurrent-To", response_id),
            *ip,
            ("WARC-Type", "request"),
            ("WARC-Record-ID", f"<urn:uuid:{uuid.uuid4()}>"),
            ("WARC-Target-URI", rec.url),
            ("WARC-Payload-Digest", _EMPTY_SHA1),
            ("WARC-Block-Digest", _sha1_label(hashlib.sha1(request_http))),
            ("Content-Type", "application/http; msgtype=request"),
            ("Content-Length", str(len(request_http))),
        ]
    )
    return (
        b"".join((response, response_http, body, _RECORD_END)),
        b"".join((request, request_http, _RECORD_END)),
    )


_WARC_DATE = "%Y-%m-%dT%H:%M:%SZ"  # WARC 1.0 §5.4: W3C-ISO8601, seconds
_RECORD_END = b"\r\n\r\n"


def _sha1_label(digest: Any) -> str:
    return "sha1:" + base64.b32encode(digest.digest()).decode("ascii")


_EMPTY_SHA1 = _sha1_label(hashlib.sha1(b""))


def _warc_head(headers: list[tuple[str, str]]) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return f"WARC/1.0\r\n{lines}\r\n".encode()


def _http_head(first_line: str, headers: list[tuple[str, str]]) -> bytes | None:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    text = f"{first_line}\r\n{lines}\r\n"
    return text.encode("ascii") if text.isascii() else None


def gzip_member(data: bytes, level: int = DEFAULT_COMPRESS_LEVEL) -> bytes:
    """``data`` as one gzip member (RFC 1952); ``level`` on zlib's 1-9 scale."""
    if _isal is not None:
        return _isal.compress(data, min(_ISAL_MAX_LEVEL, level - 1), wbits=_GZIP_WBITS)
    return zlib.compress(data, level, wbits=_GZIP_WBITS)


def stored_response_headers(
    headers: Iterable[tuple[str, str]], payload_len: int
) -> list[tuple[str, str]]:
    """The response headers as stored alongside the *decoded* payload.

    aiohttp hands us the body after undoing chunking and gzip/br, so the stored headers must
    not claim an encoding the payload no longer has (readers would try to decode it again, and
    the payload digest would describe different bytes than the header promises). The original
    Content-Encoding is kept under ``X-Crawler-Original-Content-Encoding``; Transfer-Encoding is
    hop-by-hop (RFC 9112 §6.1) and dropped; Content-Length becomes the stored length.
    """
    out: list[tuple[str, str]] = []
    original_length: str | None = None
    length_at: int | None = None
    for name, value in headers:
        name, value = _clean(name), _clean(value)
        lower = name.lower()
        if lower == _TRANSFER_ENCODING:
            continue
        if lower == _CONTENT_ENCODING:
            out.append((ORIGINAL_CONTENT_ENCODING, value))
            continue
        if lower == _CONTENT_LENGTH:
            if length_at is None:
                original_length = value.strip()
                length_at = len(out)
                out.append(("Content-Length", str(payload_len)))
            continue
        out.append((name, value))
    if length_at is None:
        out.append(("Content-Length", str(payload_len)))
    elif original_length != str(payload_len):
        out.append((ORIGINAL_CONTENT_LENGTH, original_length or ""))
    return out


def read_warc_urls(directory: Path) -> list[str]:
    """Every response record's ``WARC-Target-URI`` across ``directory/*.warc.gz``, in file order."""
    urls: list[str] = []
    for path in sorted(directory.glob(f"*{_WARC_SUFFIX}")):
        with path.open("rb") as f:
            try:
                for record in ArchiveIterator(f):
                    if record.rec_type == "response":
                        urls.append(record.rec_headers.get_header("WARC-Target-URI"))
            except (EOFError, OSError, zlib.error, ValueError):
                # A peer killed mid-write leaves a partial last record; the URL it held was
                # not yet marked done, so it is fetched again elsewhere and nothing is lost.
                continue
    return urls


def _write_fully(f: IO[bytes], data: bytes) -> None:
    # A raw file's write() may take only part of the buffer.
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise OSError("WARC file accepted no bytes")
        view = view[n:]


def _header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _clean(text: str) -> str:
    """Make a header name/value safe to store.

    aiohttp decodes raw header bytes with surrogateescape; warcio's percent-encoding of non-ASCII
    values cannot encode lone surrogates, and a CR or LF would end the header block early.
    """
    if not text.isascii():
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if "\r" in text or "\n" in text:
        text = text.replace("\r", " ").replace("\n", " ")
    return text


def _request_target(url: str) -> str:
    """The origin-form request target (RFC 9112 §3.2.1) the fetcher sent for ``url``."""
    parts = urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return target


def check_options(prefix: str, max_bytes: int, compress_level: int) -> None:
    if not _SAFE_PREFIX.match(prefix):
        raise ValueError(f"WARC prefix must be [A-Za-z0-9._-]+, got {prefix!r}")
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    if not 1 <= compress_level <= 9:
        raise ValueError("compress_level must be 1..9")


# --- the writer process ----------------------------------------------------------------------
#
# The event loop sends records down the process's stdin; the process answers on its stdout.
# Both directions are frames: a 4-byte little-endian length, then a ``marshal``-ed tuple
# (marshal: C speed for a 30 kB body, and both ends are the same interpreter). Answers:
#   ("ready",)                     first, once the process is set up
#   ("file", path)                 a new file was opened (sent before records written to it)
#   ("written", n, records, bytes) the next n records sent are in the file (or failed, below)
#   ("error", text)                writing failed; every record after it is dropped, not written
# A record counts as written only once ``write()`` has handed it to the OS, so it survives
# this process or the peer being killed; "written" answers are what lets a page count as done.

FRAME = struct.Struct("<I")
MAX_FRAME = 1 << 30  # a record is at most max-body plus headers; anything near this is a bug
# An answer goes out once the records read so far are written, or after this much writing
# if more are waiting: one wake-up of the event loop for a run of records, yet no record
# waits long behind others for its answer (the page it belongs to is not done until then).
_ANSWER_AFTER_S = 0.001
_READ_CHUNK = 1 << 20


def encode_record(rec: FetchRecord) -> bytes:
    payload = marshal.dumps(
        (
            rec.url,
            rec.status,
            rec.reason,
            rec.http_version,
            # Exact strs: marshal refuses str subclasses such as multidict's istr.
            [(str(k), str(v)) for k, v in rec.request_headers],
            [(str(k), str(v)) for k, v in rec.response_headers],
            bytes(rec.body),
            rec.truncated,
            rec.ip,
            rec.fetched_at,
        )
    )
    return FRAME.pack(len(payload)) + payload


def decode_record(payload: bytes | bytearray) -> FetchRecord:
    url, status, reason, version, req, resp, body, truncated, ip, fetched_at = marshal.loads(
        payload
    )
    return FetchRecord(url, status, reason, version, req, resp, body, truncated, ip, fetched_at)


def encode_answer(*fields: str | int) -> bytes:
    payload = marshal.dumps(fields)
    return FRAME.pack(len(payload)) + payload


def serve(files: WarcFiles, source: int, answers: int) -> None:
    """Write every record framed on fd ``source`` until it closes, answering on ``answers``."""
    buf = bytearray()
    failed = False
    while True:
        chunk = os.read(source, _READ_CHUNK)
        if not chunk:
            break
        buf += chunk
        out: list[bytes] = []
        pending = 0
        pos = 0
        answered_at = time.monotonic()
        while len(buf) - pos >= FRAME.size:
            (size,) = FRAME.unpack_from(buf, pos)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes")
            end = pos + FRAME.size + size
            if len(buf) < end:
                break
            rec = decode_record(buf[pos + FRAME.size : end])
            pos = end
            if not failed:
                before = len(files.files)
                try:
                    files.write(rec)
                except Exception as exc:
                    # The records before this one are written and answered as such; this
                    # and every later one are answered after the error, so their writers
                    # see it. Reading goes on so that nobody waits forever.
                    failed = True
                    if pending:
                        out.append(_written(files, pending))
                        pending = 0
                    out.append(encode_answer("error", f"{type(exc).__name__}: {exc}"))
                out += (encode_answer("file", str(p)) for p in files.files[before:])
            pending += 1
            if time.monotonic() - answered_at >= _ANSWER_AFTER_S:
                out.append(_written(files, pending))
                _send(answers, b"".join(out))
                out, pending = [], 0
                answered_at = time.monotonic()
        del buf[:pos]
        if pending:
            out.append(_written(files, pending))
        if out:
            _send(answers, b"".join(out))
    if buf:
        raise ValueError(f"input ended inside a frame ({len(buf)} bytes left)")


def _written(files: WarcFiles, n: int) -> bytes:
    return encode_answer("written", n, files.records_written, files.bytes_written)


def _send(fd: int, data: bytes) -> None:
    try:
        _write_fully_fd(fd, data)
    except BrokenPipeError:
        pass  # the peer is gone; keep writing what it sent until its pipe closes


def _write_fully_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main(argv: list[str] | None = None) -> int:
    """The writer process: ``python -m p2pcrawl.warcfile '<json options>'``."""
    args = sys.argv[1:] if argv is None else argv
    opts = json.loads(args[0])
    # Ctrl-C reaches the whole process group and a service manager may signal every process
    # of the peer: this one stops when the peer closes its stdin (or dies), after writing
    # everything it was sent, never halfway through.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Answers get a private copy of stdout; anything a library prints goes to stderr instead
    # of into the frame stream.
    answers = os.dup(1)
    os.dup2(2, 1)
    with contextlib.suppress(OSError):
        import fcntl

        # Fewer, larger reads: one 30 kB record fills half of a default 64 kB pipe.
        fcntl.fcntl(0, fcntl.F_SETPIPE_SZ, 1 << 20)
    files = WarcFiles(
        Path(opts["directory"]),
        prefix=opts["prefix"],
        max_bytes=opts["max_bytes"],
        software=opts["software"],
        user_agent=opts["user_agent"],
        compress_level=opts["compress_level"],
    )
    _send(answers, encode_answer("ready"))
    try:
        serve(files, 0, answers)
    finally:
        try:
            files.close()
        except Exception as exc:
            _send(answers, encode_answer("error", f"{type(exc).__name__}: {exc}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
