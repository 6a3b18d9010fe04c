"""A revisit's conditional GET and what its answer means (docs/freshness.md).

A revisit sends ``If-None-Match`` and ``If-Modified-Since`` from the archived capture (RFC
9110 §13.1); what comes back decides the WARC record (:func:`plan_page`):

* 304: a ``revisit`` record, profile server-not-modified (WARC 1.1 §6.7.2);
* 200 whose payload's SHA-1 is the capture's: a ``revisit`` record, identical-payload-digest
  (§6.7.1);
* a changed 200: a full ``response``, named so later revisits can refer to it, whose links
  are routed as usual (new pages are found);
* 404 or 410: the response, and a miss (:mod:`p2pcrawl.crawl.refresh` retires a page gone
  too many times in a row).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime

from p2pcrawl.archive import (
    PROFILE_IDENTICAL,
    PROFILE_NOT_MODIFIED,
    FetchRecord,
    RevisitOf,
    capture_record_id,
    payload_digest_label,
    warc_date,
)
from p2pcrawl.crawl.fetcher import FetchResult
from p2pcrawl.crawl.refresh import Seen
from storage import MAX_VALIDATOR, Visit

__all__ = ["Plan", "conditional_headers", "plan_page", "validators"]

HASH_IN_THREAD = 1 << 20  # bodies from this size on are hashed off the event loop
_GONE = frozenset({404, 410})


@dataclass(frozen=True, slots=True)
class Plan:
    """What a fetched page's tail does in continuous mode: how to archive it, whether to
    follow its links, and what the schedule makes of it."""

    seen: Seen
    follow: bool
    previous: Visit | None
    digest: bytes  # SHA-1 of the payload (2xx), else b""
    at: int  # the fetch's time, ms (the capture's name when the record is a response)
    revisit: RevisitOf | None = None  # archived as a revisit of the previous capture
    capture: bool = False  # archived as a capture later revisits refer to

    def archive(self, record: FetchRecord) -> FetchRecord:
        """The page's plain ``record`` as this plan archives it."""
        if self.revisit is not None:
            return dataclasses.replace(record, revisit=self.revisit)
        if self.capture:
            rid = capture_record_id(record.url, self.at)
            return dataclasses.replace(record, fetched_at=self.at / 1000, record_id=rid)
        return record


async def plan_page(prev: Visit | None, url: str, res: FetchResult) -> Plan:
    """How to archive ``res``, the answer to a fetch of ``url`` whose history is ``prev``
    (None: a first fetch)."""
    at = int(res.fetched_at * 1000)
    status = res.status
    if 200 <= status < 300:
        digest = await _sha1(res.body)
        if prev is not None and prev.captured and prev.digest == digest:
            ref = _revisit_of(url, prev, PROFILE_IDENTICAL, digest)
            return Plan(Seen.UNCHANGED, False, prev, digest, at, revisit=ref)
        seen = Seen.NEW if prev is None else Seen.CHANGED
        return Plan(seen, True, prev, digest, at, capture=True)
    if status == 304 and prev is not None and prev.captured:
        ref = _revisit_of(url, prev, PROFILE_NOT_MODIFIED, prev.digest)
        return Plan(Seen.UNCHANGED, False, prev, b"", at, revisit=ref)
    if 300 <= status < 400 and status != 304:
        same = prev is not None and prev.status == status
        seen = Seen.NEW if prev is None else Seen.UNCHANGED if same else Seen.CHANGED
        return Plan(seen, True, prev, b"", at)
    seen = Seen.GONE if status in _GONE else Seen.FAILED
    return Plan(seen, False, prev, b"", at)


def _revisit_of(url: str, prev: Visit, profile: str, digest: bytes) -> RevisitOf:
    return RevisitOf(
        profile,
        refers_to_uri=url,
        refers_to_date=warc_date(prev.captured / 1000),
        refers_to=capture_record_id(url, prev.captured),
        payload_digest=payload_digest_label(digest) if digest else "",
    )


def conditional_headers(visit: Visit) -> dict[str, str]:
    """The validators of the archived capture, as RFC 9110 §13.1 sends them."""
    headers: dict[str, str] = {}
    if not visit.captured:
        return headers
    if visit.etag:
        headers["If-None-Match"] = visit.etag
    if visit.lastmod:
        headers["If-Modified-Since"] = formatdate(visit.lastmod, usegmt=True)
    return headers


def validators(headers: list[tuple[str, str]], prev: Visit | None) -> tuple[str, int]:
    """The ETag and Last-Modified (Unix seconds) a response carries, bounded: an ETag too
    long to keep, or a date that does not parse, is left out (a 304 may leave them out too,
    and then the capture's stand)."""
    etag, lastmod = (prev.etag, prev.lastmod) if prev else ("", 0)
    for name, value in headers:
        lower = name.lower()
        if lower == "etag":
            etag = value.strip() if len(value.strip()) <= MAX_VALIDATOR else ""
        elif lower == "last-modified":
            try:
                lastmod = max(0, int(parsedate_to_datetime(value).timestamp()))
            except (TypeError, ValueError, IndexError, OverflowError):
                lastmod = 0
    return etag, lastmod


async def _sha1(body: bytes) -> bytes:
    if len(body) < HASH_IN_THREAD:
        return hashlib.sha1(body).digest()
    return await asyncio.to_thread(lambda: hashlib.sha1(body).digest())
