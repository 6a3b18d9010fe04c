"""WARC files: fetch records appended to rotating ``*.warc.gz`` files, one owner, no threads.

The response, its request and, for a new file, the warcinfo record are built into one buffer
and written with a single ``write()``: a file stops at a record boundary unless the machine
itself dies mid-write. The writer process (:mod:`p2pcrawl.archive.process`) is this class's owner.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from warcio.warcwriter import WARCWriter

from p2pcrawl.archive.records import (
    DEFAULT_COMPRESS_LEVEL,
    WARC_SUFFIX,
    FetchRecord,
    gzip_member,
    record_pair,
)

__all__ = ["WarcFiles", "check_options"]

_SAFE_PREFIX = re.compile(r"^[A-Za-z0-9._-]+$")


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
        parts += (gzip_member(record, self.compress_level) for record in record_pair(rec))
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
            name = f"p2pcrawl-{self.prefix}-{stamp}-{self._serial:05d}{WARC_SUFFIX}"
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
            self.user_agent = _user_agent_of(first.request_headers) or ""
        info = {
            "software": f"{self.software} (warcio)",
            "format": "WARC File Format 1.0",
            "conformsTo": "http://bibnum.bnf.fr/WARC/WARC_ISO_28500_version1_latestdraft.pdf",
            "http-header-user-agent": self.user_agent,
            "robots": "obey",
            "description": f"p2pcrawl node {self.prefix}",
        }
        warcinfo = self._warc.create_warcinfo_record(name, info)
        buf = io.BytesIO()
        self._warc.out = buf
        self._warc.write_record(warcinfo)
        return gzip_member(buf.getvalue(), self.compress_level)


def check_options(prefix: str, max_bytes: int, compress_level: int) -> None:
    if not _SAFE_PREFIX.match(prefix):
        raise ValueError(f"WARC prefix must be [A-Za-z0-9._-]+, got {prefix!r}")
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    if not 1 <= compress_level <= 9:
        raise ValueError("compress_level must be 1..9")


def _write_fully(f: IO[bytes], data: bytes) -> None:
    # A raw file's write() may take only part of the buffer.
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise OSError("WARC file accepted no bytes")
        view = view[n:]


def _user_agent_of(headers: list[tuple[str, str]]) -> str | None:
    for key, value in headers:
        if key.lower() == "user-agent":
            return value
    return None
