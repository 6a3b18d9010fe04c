"""WARC output: one ``response`` record and its ``request`` record per fetched page.

Records are laid out exactly as warcio's ``WARCWriter`` lays them out (ISO 28500, WARC/1.0), so
digests, lengths and header encoding follow the library that most archive tools read back; a
test compares the bytes. The common case, HTTP headers all ASCII, is serialised here directly:
warcio's per-record Python (header objects, digests streamed through a reader, base32 of each
digest) cost the writer thread more than compressing the record, and that Python holds the GIL
the event loop needs. Anything else still goes through warcio itself.

One writer thread owns the open file: serialising, hashing (SHA-1 payload and block digests)
and gzip all run there, and hashlib and the deflate libraries release the GIL on large buffers,
so that work can use the second core instead of stalling the event loop. Deflate is ISA-L's
(``isal``) where it is installed: the same gzip members as zlib's, for a quarter of the CPU.
The loop side only enqueues; a semaphore of ``queue_size`` slots bounds the queue, so a slow
disk slows the fetchers down (``await write()`` waits) instead of growing memory.

Each record is its own gzip member (what warcio and Heritrix write), so any record can be read
from its offset alone. The response, its request and, for a new file, the warcinfo record are
built into one buffer and written with a single ``write()``: a file stops at a record boundary
unless the machine itself dies mid-write.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import io
import os
import queue
import re
import threading
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

from p2pcrawl import __version__

__all__ = [
    "FetchRecord",
    "WarcWriteError",
    "WarcWriter",
    "gzip_member",
    "read_warc_urls",
    "serialize_pair",
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


class WarcWriteError(RuntimeError):
    """The writer thread failed (disk full, permissions); later writes are refused."""


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


_STOP = object()
_NOTIFY_EVERY = 16  # records written before the loop is told, even if more are queued


class WarcWriter:
    """Append :class:`FetchRecord` s to rotating ``*.warc.gz`` files from a dedicated thread.

    ``records_written`` counts fetch records (each a response plus a request record),
    ``bytes_written`` the compressed bytes across all files, ``files`` every file opened, in
    order. All three are updated by the writer thread.
    """

    def __init__(
        self,
        directory: Path,
        *,
        prefix: str,
        max_bytes: int = 1 << 30,
        queue_size: int = 256,
        software: str = "p2pcrawl",
        user_agent: str = "",
        compress_level: int = DEFAULT_COMPRESS_LEVEL,
    ) -> None:
        if not _SAFE_PREFIX.match(prefix):
            raise ValueError(f"WARC prefix must be [A-Za-z0-9._-]+, got {prefix!r}")
        if max_bytes <= 0 or queue_size <= 0:
            raise ValueError("max_bytes and queue_size must be positive")
        if not 1 <= compress_level <= 9:
            raise ValueError("compress_level must be 1..9")
        self.directory = directory
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.queue_size = queue_size
        self.compress_level = compress_level
        self.software = software if "/" in software else f"{software}/{__version__}"
        # Empty: taken from the first record's User-Agent request header, which is what the
        # operator actually sent.
        self.user_agent = user_agent
        self.files: list[Path] = []
        self.records_written = 0
        self.bytes_written = 0

        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finished: asyncio.Future[None] | None = None
        self._closing = False
        self._error: BaseException | None = None
        # Touched only by the writer thread.
        self._file: IO[bytes] | None = None
        self._file_bytes = 0
        self._serial = 0
        self._warc = WARCWriter(io.BytesIO(), gzip=False)

    async def start(self) -> None:
        """Start the writer thread; the first file is created with the first record."""
        if self._thread is not None:
            raise RuntimeError("WarcWriter already started")
        self._loop = asyncio.get_running_loop()
        self._slots = asyncio.Semaphore(self.queue_size)
        self._finished = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name="warc-writer", daemon=True)
        self._thread.start()

    async def write(self, record: FetchRecord, *, durable: bool = False) -> None:
        """Queue ``record``; waits while ``queue_size`` records are already pending.

        With ``durable`` it returns only once the record is in the file (handed to the OS,
        so it survives the process being killed): a crawler marks a URL done only after
        its record is safe, or a crash would lose the page.
        """
        if self._slots is None:
            raise RuntimeError("WarcWriter.start() was not awaited")
        if self._closing:
            raise RuntimeError("WarcWriter is closed")
        self._raise_if_failed()
        await self._slots.acquire()
        if self._closing or self._error is not None:
            # Something happened while we waited for a slot: aclose() already queued the
            # sentinel, or the thread failed and this record would only be dropped.
            self._slots.release()
            self._raise_if_failed()
            raise RuntimeError("WarcWriter is closed")
        if not durable:
            self._queue.put(record)
            return
        assert self._loop is not None
        written: asyncio.Future[None] = self._loop.create_future()
        self._queue.put((record, written))
        await written
        self._raise_if_failed()

    async def aclose(self) -> None:
        """Write everything queued, close the file and join the thread. Idempotent."""
        if self._finished is None:
            self._closing = True
            return
        if not self._closing:
            self._closing = True
            self._queue.put(_STOP)
        # shield: a cancelled caller must not leave the file half-closed; the thread finishes
        # the drain regardless and the next aclose() returns at once.
        await asyncio.shield(self._finished)
        if self._thread is not None:
            self._thread.join()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WarcWriteError(f"WARC writer failed: {self._error!r}") from self._error

    # --- writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        # Records written since the loop was last told. It is told when the queue runs dry (or
        # every _NOTIFY_EVERY records): one wake-up of the event loop for all of them, where a
        # slot release and a future each used to cost one per record.
        done: list[asyncio.Future[None] | None] = []
        try:
            while True:
                try:
                    item = self._queue.get(block=not done)
                except queue.Empty:
                    self._notify(functools.partial(self._written, done))
                    done = []
                    continue
                if item is _STOP:
                    break
                written: asyncio.Future[None] | None = None
                if isinstance(item, tuple):
                    item, written = item
                assert isinstance(item, FetchRecord)
                try:
                    if self._error is None:
                        self._write_pair(item)
                except Exception as exc:
                    # Keep consuming so waiting writers are released; they see the error next.
                    self._error = exc
                finally:
                    done.append(written)
                    if len(done) >= _NOTIFY_EVERY:
                        self._notify(functools.partial(self._written, done))
                        done = []
        finally:
            if done:
                self._notify(functools.partial(self._written, done))
            try:
                self._close_file()
            except Exception as exc:
                if self._error is None:
                    self._error = exc
            self._notify(self._set_finished)

    def _notify(self, callback: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to wake

    def _written(self, futures: list[asyncio.Future[None] | None]) -> None:
        """Loop thread: free the slots of these records and wake their durable writers (the
        records are in the file: ``_write_pair`` returned, or failed and set ``_error``)."""
        assert self._slots is not None
        for fut in futures:
            self._slots.release()
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _set_finished(self) -> None:
        assert self._finished is not None
        if not self._finished.done():
            self._finished.set_result(None)

    def _write_pair(self, rec: FetchRecord) -> None:
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
            self._close_file()

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

    def _close_file(self) -> None:
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            os.fsync(f.fileno())
        finally:
            f.close()

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
