"""WARC records: the format of one fetched page's ``response`` and ``request`` records.

Records are laid out exactly as warcio's ``WARCWriter`` lays them out (ISO 28500, WARC/1.0), so
digests, lengths and header encoding follow the library that most archive tools read back; a
test compares the bytes. The common case, HTTP headers all ASCII, is serialised here directly:
warcio's per-record Python (header objects, digests streamed through a reader, base32 of each
digest) cost more than compressing the record. Anything else still goes through warcio itself.
Each record is its own gzip member (what warcio and Heritrix write), so any record can be read
from its offset alone.
"""

from __future__ import annotations

import base64
import hashlib
import io
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

__all__ = [
    "DEFAULT_COMPRESS_LEVEL",
    "ORIGINAL_CONTENT_ENCODING",
    "ORIGINAL_CONTENT_LENGTH",
    "PROFILE_IDENTICAL",
    "PROFILE_NOT_MODIFIED",
    "WARC_SUFFIX",
    "FetchRecord",
    "RevisitOf",
    "capture_record_id",
    "gzip_member",
    "payload_digest_label",
    "read_warc_urls",
    "record_pair",
    "revisit_pair",
    "serialize_pair",
    "stored_response_headers",
    "warc_date",
    "warcio_pair",
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

WARC_SUFFIX = ".warc.gz"

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
    # WARC 1.1 §5.13 WARC-Truncated reason: length, time, disconnect; "" = whole.
    truncated: str = ""
    ip: str | None = None
    fetched_at: float = 0.0
    # The WARC-Record-ID to give the response ("" = a fresh one): a capture that later
    # revisit records refer to gets a name its URL and time can rebuild (capture_record_id).
    record_id: str = ""
    # Not a response: a revisit of an archived capture (WARC 1.1 §6.7).
    revisit: RevisitOf | None = None
    # Extra WARC fields of the response record (the crawl's record of a page's robots
    # directives and canonical URL: p2pcrawl.crawl.signals).
    warc_fields: tuple[tuple[str, str], ...] = ()


PROFILE_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
PROFILE_IDENTICAL = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
# Names capture_record_id's UUIDs (version 5): a fixed random namespace of this project.
_CAPTURE_NAMESPACE = uuid.UUID("5c1d0e8a-3f4b-4c55-9a57-8e0f0b6a2d13")


@dataclass(frozen=True, slots=True)
class RevisitOf:
    """What a ``revisit`` record says of the capture it stands for (WARC 1.1 §6.7)."""

    profile: str  # PROFILE_NOT_MODIFIED or PROFILE_IDENTICAL
    refers_to_uri: str  # WARC-Refers-To-Target-URI
    refers_to_date: str  # WARC-Refers-To-Date: that capture's WARC-Date
    refers_to: str = ""  # WARC-Refers-To: that capture's WARC-Record-ID, if known
    payload_digest: str = ""  # WARC-Payload-Digest of the payload ("sha1:...")


def capture_record_id(url: str, at_ms: int) -> str:
    """The WARC-Record-ID of ``url``'s capture at ``at_ms`` (Unix milliseconds): a name-based
    UUID, so the visit history needs only the capture's time to name it in
    ``WARC-Refers-To``. A URL is captured at most once a millisecond, so it is unique."""
    return f"<urn:uuid:{uuid.uuid5(_CAPTURE_NAMESPACE, f'{url} {at_ms}')}>"


def warc_date(seconds: float) -> str:
    """The WARC-Date a record fetched at ``seconds`` (Unix time) carries."""
    return datetime.fromtimestamp(seconds, UTC).strftime(_WARC_DATE)


def payload_digest_label(digest: bytes) -> str:
    """A raw SHA-1 digest as WARC-Payload-Digest writes it."""
    return "sha1:" + base64.b32encode(digest).decode("ascii")


def record_pair(rec: FetchRecord) -> tuple[bytes, bytes]:
    """The uncompressed response (or revisit) and request records for ``rec``."""
    if rec.revisit is not None:
        return revisit_pair(rec)
    return serialize_pair(rec) or warcio_pair(rec)


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
    date = warc_date(rec.fetched_at or time.time())
    ip = [("WARC-IP-Address", rec.ip)] if rec.ip else []
    body = rec.body
    block = hashlib.sha1(response_http)
    block.update(body)
    response_id = rec.record_id or f"<urn:uuid:{uuid.uuid4()}>"
    response = _warc_head(
        [
            ("WARC-Date", date),
            *ip,
            # WARC 1.1 §5.13: why the payload is shorter than the response.
            *([("WARC-Truncated", rec.truncated)] if rec.truncated else []),
            *[(_clean(k), _clean(v)) for k, v in rec.warc_fields],
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
    return payload_digest_label(digest.digest())


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
        out: bytes = _isal.compress(data, min(_ISAL_MAX_LEVEL, level - 1), wbits=_GZIP_WBITS)
        return out
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
    for path in sorted(directory.glob(f"*{WARC_SUFFIX}")):
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


def warcio_pair(rec: FetchRecord) -> tuple[bytes, bytes]:
    """The uncompressed response and request records for ``rec`` as warcio's own ``WARCWriter``
    builds them: the reference :func:`serialize_pair` matches, and the path for headers it
    leaves to warcio."""
    writer = WARCWriter(io.BytesIO(), gzip=False)
    date = datetime_to_iso_date(
        datetime.fromtimestamp(rec.fetched_at or time.time(), UTC).replace(tzinfo=None)
    )
    warc_headers: dict[str, str] = {"WARC-Date": date}
    if rec.record_id:
        warc_headers["WARC-Record-ID"] = rec.record_id
    if rec.ip:
        warc_headers["WARC-IP-Address"] = rec.ip
    if rec.truncated:
        # WARC 1.1 §5.13: why the payload is shorter than the response.
        warc_headers["WARC-Truncated"] = rec.truncated
    for name, value in rec.warc_fields:
        warc_headers[_clean(name)] = _clean(value)
    protocol = f"HTTP/{rec.http_version}"
    status_line = f"{rec.status} {_clean(rec.reason)}".rstrip()
    http_headers = StatusAndHeaders(
        status_line, stored_response_headers(rec.response_headers, len(rec.body)), protocol
    )
    response = writer.create_warc_record(
        rec.url,
        "response",
        payload=io.BytesIO(rec.body),
        length=len(rec.body),
        warc_headers_dict=warc_headers,
        http_headers=http_headers,
    )
    request = _request_record(writer, rec, date, response)
    return _record_bytes(writer, response), _record_bytes(writer, request)


def _request_record(writer: WARCWriter, rec: FetchRecord, date: str, concurrent: Any) -> Any:
    """The ``request`` record of ``rec``'s exchange, concurrent to the record ``concurrent``."""
    request_http = StatusAndHeaders(
        f"GET {_request_target(rec.url)} HTTP/{rec.http_version}",
        [(_clean(k), _clean(v)) for k, v in rec.request_headers],
        is_http_request=True,
    )
    request_headers = {
        "WARC-Date": date,
        "WARC-Concurrent-To": concurrent.rec_headers.get_header("WARC-Record-ID"),
    }
    if rec.ip:
        request_headers["WARC-IP-Address"] = rec.ip
    return writer.create_warc_record(
        rec.url,
        "request",
        payload=io.BytesIO(b""),
        length=0,
        warc_headers_dict=request_headers,
        http_headers=request_http,
    )


def revisit_pair(rec: FetchRecord) -> tuple[bytes, bytes]:
    """The uncompressed ``revisit`` and ``request`` records of a revisit (WARC 1.1 §6.7).

    For an unchanged 200 the block is its HTTP headers with the payload's length, the
    payload left out and ``WARC-Truncated: length`` as the identical-payload-digest profile
    asks; a 304 has no block (server-not-modified, §6.7.3), its conditional request is
    archived beside it. Written by
    warcio (WARC/1.1: the Refers-To fields are 1.1's), fewer than responses and small.
    """
    ref = rec.revisit
    assert ref is not None
    writer = WARCWriter(io.BytesIO(), gzip=False, warc_version="1.1")
    date = warc_date(rec.fetched_at or time.time())
    headers: dict[str, str] = {"WARC-Date": date}
    if rec.ip:
        headers["WARC-IP-Address"] = rec.ip
    headers["WARC-Profile"] = ref.profile
    headers["WARC-Refers-To-Target-URI"] = ref.refers_to_uri
    headers["WARC-Refers-To-Date"] = ref.refers_to_date
    if ref.refers_to:
        headers["WARC-Refers-To"] = ref.refers_to
    if ref.payload_digest:
        headers["WARC-Payload-Digest"] = ref.payload_digest
    if ref.profile == PROFILE_IDENTICAL:
        headers["WARC-Truncated"] = "length"
    if ref.profile == PROFILE_NOT_MODIFIED:
        # No block (§6.7.3 allows it): its payload is the capture's, and so are its headers.
        # A replay tool takes them from the capture then: pywb replays a revisit whose block
        # is a 3xx, the 304 included, as that status with no body.
        revisit = writer.create_warc_record(rec.url, "revisit", warc_headers_dict=headers)
    else:
        status_line = f"{rec.status} {_clean(rec.reason)}".rstrip()
        http_headers = StatusAndHeaders(
            status_line,
            stored_response_headers(rec.response_headers, len(rec.body)),
            f"HTTP/{rec.http_version}",
        )
        revisit = writer.create_warc_record(
            rec.url, "revisit", warc_headers_dict=headers, http_headers=http_headers
        )
    request = _request_record(writer, rec, date, revisit)
    return _record_bytes(writer, revisit), _record_bytes(writer, request)


def _record_bytes(writer: WARCWriter, record: Any) -> bytes:
    buf = io.BytesIO()
    writer.out = buf
    writer.write_record(record)
    return buf.getvalue()


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
