"""``p2pcrawl export``: what was crawled, read back from the WARC files of data directories.

The WARC files are the crawl's record of truth: a URL counts as done only once its response
record is on disk, so reading them (not the stores) gives exactly what a user can replay.

Three formats:

- ``urls``: each distinct fetched URL once, one per line, in file order.
- ``jsonl``: one JSON object per response record (a capture): url, HTTP status, content
  type, payload length, fetch time, whether the payload was truncated, the robots
  directives that applied (``robots``: ``noarchive``, ``nofollow``, ``noindex``, from the
  meta tags and the ``X-Robots-Tag`` header), the canonical URL the page named
  (``canonical``), and where the record is (WARC file, byte offset and length of its gzip
  member), so a script can seek to it. ``robots`` and ``canonical`` are the crawler's own
  WARC fields (docs/signals.md). A revisit record of continuous mode (docs/freshness.md)
  is a line too, with a ``revisit`` object: its WARC profile and the capture it refers to
  (URI, date, record ID).
- ``cdxj``: a sorted CDXJ index written by ``cdxj-indexer`` (the indexer pywb's own
  ``wb-manager`` uses), so pywb and other wayback tools can replay the WARCs. It is not
  written by hand here: the SURT keys and field names are the indexer's.

``--changed-since TIME`` keeps only the URLs whose content changed since then
(:mod:`p2pcrawl.ui.changes`).

A peer killed mid-write can leave a cut-off last record in its newest file; the export
reports the file and offset on stderr and goes on with the next file.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import xxhash
from cdxj_indexer import CDXJIndexer
from cdxj_indexer.main import SortingWriter
from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

from p2pcrawl.crawl import CANONICAL_FIELD, ROBOTS_FIELD

__all__ = [
    "FORMATS",
    "Capture",
    "ExportError",
    "capture_doc",
    "iter_captures",
    "run_export",
    "warc_files",
    "write_cdxj",
    "write_jsonl",
    "write_urls",
]

FORMATS = ("urls", "jsonl", "cdxj")
WARC_SUFFIX = ".warc.gz"
_CHUNK = 1 << 16

# A damaged record ends the file's iteration with one of these (warcio's parse errors,
# zlib's on a corrupt member, our own _CutShort for what warcio ends quietly).
_DAMAGE = (ArchiveLoadFailed, EOFError, OSError, ValueError, zlib.error)

Warn = Callable[[str], None]


class ExportError(Exception):
    """A source that is not a data directory, a WARC directory or a WARC file."""


@dataclass(frozen=True, slots=True)
class Capture:
    """One response record: a fetched URL and where its record is."""

    url: str
    status: int | None
    content_type: str
    length: int  # payload bytes as stored (decoded, after the HTTP headers)
    fetched_at: str  # WARC-Date, W3C-ISO8601 UTC
    truncated: bool
    robots: list[str]  # directives that applied: noarchive, nofollow, noindex
    canonical: str | None  # the canonical URL the page or its Link header named
    warc_file: str
    warc_offset: int  # of the record's gzip member in warc_file
    warc_length: int  # bytes of that gzip member
    # A revisit record (continuous mode): its profile and the capture it stands for
    # (profile, refers_to_uri, refers_to_date, refers_to); None for a response.
    revisit: dict[str, str] | None = None
    digest: str = ""  # WARC-Payload-Digest (not in the JSON lines: --changed-since's)


def warc_files(sources: Sequence[Path], warn: Warn | None = None) -> list[Path]:
    """The ``*.warc.gz`` files of each source, in name order (which is time order per peer).

    A source is a data directory (its ``warc/`` folder is read), a folder of WARC files, or
    one WARC file. A data directory without WARC files is only noted (its peer may have
    owned nothing yet); any other source without them is an error, and so is finding no
    file at all: a typo should not quietly export nothing.
    """
    out: list[Path] = []
    for src in sources:
        if src.is_file():
            if not src.name.endswith(WARC_SUFFIX):
                raise ExportError(f"{src}: not a {WARC_SUFFIX} file")
            out.append(src)
            continue
        if not src.is_dir():
            raise ExportError(f"{src}: no such file or directory")
        is_data_dir = (src / "warc").is_dir() or (src / "node.json").is_file()
        folder = src / "warc" if (src / "warc").is_dir() else src
        found = sorted(folder.glob(f"*{WARC_SUFFIX}"))
        if not found:
            if not is_data_dir:
                raise ExportError(
                    f"{src}: no {WARC_SUFFIX} files (expected a peer's data directory, "
                    "its warc/ folder, or WARC files)"
                )
            if warn is not None:
                warn(f"{src}: a data directory without WARC files (its peer archived nothing)")
        out.extend(found)
    if not out:
        raise ExportError(f"no {WARC_SUFFIX} files in {', '.join(map(str, sources))}")
    return out


def iter_captures(files: Iterable[Path], warn: Warn) -> Iterator[Capture]:
    """Every response record of ``files``; a damaged file is reported and left early."""
    for path in files:
        with path.open("rb") as fh:
            it = ArchiveIterator(fh)
            offset = 0
            try:
                for record in it:
                    if record.rec_type not in ("response", "revisit"):
                        offset = it.get_record_offset()
                        continue
                    length = 0
                    while chunk := record.raw_stream.read(_CHUNK):
                        length += len(chunk)
                    _check_whole(record)
                    offset = it.get_record_offset()
                    http = record.http_headers
                    status = http.get_statuscode() if http is not None else None
                    warc = record.rec_headers
                    robots = warc.get_header(ROBOTS_FIELD) or ""
                    revisit = (
                        {
                            "profile": warc.get_header("WARC-Profile") or "",
                            "refers_to_uri": warc.get_header("WARC-Refers-To-Target-URI") or "",
                            "refers_to_date": warc.get_header("WARC-Refers-To-Date") or "",
                            "refers_to": warc.get_header("WARC-Refers-To") or "",
                        }
                        if record.rec_type == "revisit"
                        else None
                    )
                    yield Capture(
                        url=record.rec_headers.get_header("WARC-Target-URI") or "",
                        status=int(status) if status and status.isdigit() else None,
                        content_type=(http.get_header("Content-Type") or "") if http else "",
                        length=length,
                        fetched_at=record.rec_headers.get_header("WARC-Date") or "",
                        # A revisit's payload is left out by design, not cut short.
                        truncated=revisit is None and bool(warc.get_header("WARC-Truncated")),
                        robots=[d.strip() for d in robots.split(",") if d.strip()],
                        canonical=warc.get_header(CANONICAL_FIELD),
                        warc_file=str(path),
                        warc_offset=offset,
                        warc_length=it.get_record_length(),
                        revisit=revisit,
                        digest=warc.get_header("WARC-Payload-Digest") or "",
                    )
                _check_tail(it, fh)
            except _DAMAGE as exc:
                warn(_damage_note(path, offset, exc))


class _CutShort(ValueError):
    pass


def _check_whole(record: Any) -> None:
    """warcio ends a record cut off mid-member quietly, with fewer bytes than its
    Content-Length: its payload reader's limit is then not used up."""
    left = getattr(record.raw_stream, "limit", 0)
    if left:
        raise _CutShort(f"{left} bytes of the record missing")


def _check_tail(it: Any, fh: IO[bytes]) -> None:
    """warcio also ends quietly when a record is cut inside its headers: bytes are left
    after the last whole record."""
    size = os.fstat(fh.fileno()).st_size
    if it.offset < size:
        raise _CutShort(f"{size - it.offset} bytes at the end are not a whole record")


def _damage_note(path: Path, offset: int | None, exc: BaseException) -> str:
    where = "" if offset is None else f" after offset {offset}"
    return (
        f"{path}: damaged record{where} ({exc}); "
        "the rest of this file is skipped (a peer stopped mid-write leaves this; "
        "its URL was not recorded done and was fetched again)"
    )


def write_urls(captures: Iterable[Capture], out: IO[str]) -> int:
    """Each distinct URL once; returns how many were written."""
    seen: set[int] = set()  # 64-bit hashes: a few dozen bytes per URL, not the URL itself
    n = 0
    for c in captures:
        h = xxhash.xxh3_64_intdigest(c.url.encode("utf-8", "surrogatepass"))
        if h in seen:
            continue
        seen.add(h)
        out.write(c.url + "\n")
        n += 1
    return n


def capture_doc(c: Capture) -> dict[str, Any]:
    """One JSON line's fields: a response's as they always were, a revisit's with its
    ``revisit`` object besides."""
    doc = asdict(c)
    del doc["digest"]
    if doc["revisit"] is None:
        del doc["revisit"]
    return doc


def write_jsonl(captures: Iterable[Capture], out: IO[str]) -> int:
    n = 0
    for c in captures:
        out.write(json.dumps(capture_doc(c), ensure_ascii=False) + "\n")
        n += 1
    return n


class _CheckedIndexer(CDXJIndexer):
    """cdxj-indexer's CDXJ, minus a record cut short (which it would index as whole)."""

    def _create_record_iter(self, input_: Any) -> Any:
        self.it = super()._create_record_iter(input_)
        return self.it

    def _write_line(self, out: Any, index: Any, record: Any, filename: str) -> None:
        # The offset and length fields were read first, so the record has been drained.
        _check_whole(record)
        super()._write_line(out, index, record, filename)


class _CountingWriter:
    """Counts the lines ``SortingWriter`` flushes (it drops exact duplicate lines)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.lines = 0

    def write(self, line: str) -> None:
        self.out.write(line)
        self.lines += 1

    def flush(self) -> None:
        self.out.flush()


def write_cdxj(files: Iterable[Path], out: IO[str], warn: Warn) -> int:
    """A sorted CDXJ index of ``files`` by cdxj-indexer; returns the number of lines.

    Each file is indexed on its own so a damaged one costs only its own tail; the lines of
    all files meet in the indexer's sorting writer, which spills to temporary files past
    32 MiB, so memory stays bounded whatever the crawl's size. The ``filename`` field is the
    file's base name, as in a pywb collection's ``archive/`` folder.
    """
    counted = _CountingWriter(out)
    sorter: Any = SortingWriter(counted)
    for path in files:
        indexer = _CheckedIndexer(sorter, [str(path)])
        try:
            with path.open("rb") as fh:
                indexer.curr_filename = path.name
                indexer.process_one(fh, sorter, str(path))
                indexer.it.read_to_end()
                _check_tail(indexer.it, fh)
        except _DAMAGE as exc:
            warn(_damage_note(path, None, exc))
    sorter.flush()
    return counted.lines


def run_export(
    sources: Sequence[Path],
    fmt: str,
    out: IO[str],
    warn: Warn,
    *,
    changed_since: float | None = None,
) -> int:
    """Write ``fmt`` for ``sources`` to ``out``; returns the number of lines written.
    ``changed_since`` (Unix time): only the URLs whose content changed since then."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    files = warc_files(sources, warn)
    if changed_since is not None:
        from p2pcrawl.ui.changes import write_changes

        if fmt == "cdxj":
            raise ExportError("--changed-since lists URLs (--format urls) or captures (jsonl)")
        return write_changes(iter_captures(files, warn), changed_since, fmt, out)
    if fmt == "cdxj":
        return write_cdxj(files, out, warn)
    captures = iter_captures(files, warn)
    return write_urls(captures, out) if fmt == "urls" else write_jsonl(captures, out)
