"""WARC output: one ``response`` (or, revisiting, ``revisit``) and one ``request`` record per
fetched URL.

The event loop hands records to :class:`WarcWriter`, which feeds a writer process of its own
(:mod:`~p2pcrawl.archive.process`) over a pipe; that process serialises them
(:mod:`~p2pcrawl.archive.records`, byte for byte what warcio writes) into rotating gzip
files (:mod:`~p2pcrawl.archive.files`). A page counts as done only once the writer said its
record was handed to the operating system.
"""

from __future__ import annotations

from p2pcrawl.archive.files import WarcFiles, check_options
from p2pcrawl.archive.framing import (
    FRAME_HEAD,
    MAX_FRAME,
    frame,
    next_frame,
    read_frame,
    read_frame_fd,
    write_frames_fd,
)
from p2pcrawl.archive.records import (
    ORIGINAL_CONTENT_ENCODING,
    ORIGINAL_CONTENT_LENGTH,
    PROFILE_IDENTICAL,
    PROFILE_NOT_MODIFIED,
    WARC_SUFFIX,
    FetchRecord,
    RevisitOf,
    capture_record_id,
    gzip_member,
    payload_digest_label,
    read_warc_urls,
    serialize_pair,
    stored_response_headers,
    warc_date,
    warcio_pair,
)
from p2pcrawl.archive.writer import WarcWriteError, WarcWriter

__all__ = [
    "FRAME_HEAD",
    "MAX_FRAME",
    "ORIGINAL_CONTENT_ENCODING",
    "ORIGINAL_CONTENT_LENGTH",
    "PROFILE_IDENTICAL",
    "PROFILE_NOT_MODIFIED",
    "WARC_SUFFIX",
    "FetchRecord",
    "RevisitOf",
    "WarcFiles",
    "WarcWriteError",
    "WarcWriter",
    "capture_record_id",
    "check_options",
    "frame",
    "gzip_member",
    "next_frame",
    "payload_digest_label",
    "read_frame",
    "read_frame_fd",
    "read_warc_urls",
    "serialize_pair",
    "stored_response_headers",
    "warc_date",
    "warcio_pair",
    "write_frames_fd",
]
