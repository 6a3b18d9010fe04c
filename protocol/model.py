"""The vocabulary the crawl RPCs speak, and the rule each field must satisfy.

Values arrive from the network, so every check here is strict and cheap: the codec calls them
on whole columns at once where it can (one regex pass over all URLs of a chunk).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from protocol.errors import MessageError
from protocol.ownership import ID_BYTES

__all__ = [
    "FP_LIMIT",
    "MAX_KNOWN",
    "MAX_SMALL_INT",
    "MAX_URL_LENGTH",
    "KeyBatch",
    "PeerRef",
    "StoreResult",
    "TaskItem",
    "check_fingerprint",
    "check_id",
    "check_url",
    "check_url_lines",
]

MAX_URL_LENGTH = 2048  # ASCII characters = bytes, so one URL always fits one datagram
MAX_SMALL_INT = 0xFFFF  # depth and hops
MAX_KNOWN = 512  # fingerprints in one STORE_TASK answer's "known" (4 KiB of u64s)
FP_LIMIT = 1 << 64


@dataclass(frozen=True, slots=True)
class PeerRef:
    """A node as the crawler sees it: ID plus UDP address. Hashable, so usable in sets."""

    id: bytes
    host: str
    port: int

    @property
    def addr(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def short(self) -> str:
        return self.id.hex()[:8]

    def __str__(self) -> str:
        return f"{self.short}@{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class TaskItem:
    """One URL to crawl. ``hops`` counts the redirects followed to reach it (a redirect
    target is the same document moved, so it keeps the depth and the crawler caps the hops)."""

    url: str
    depth: int
    hops: int = 0


@dataclass(slots=True)
class KeyBatch:
    """Everything about one partition key: its tasks and the fingerprints of finished URLs.

    The key is the unit that moves between peers on join and leave (docs/architecture.md,
    "Ownership").
    """

    key: bytes
    tasks: list[TaskItem]
    done: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Reply to STORE_TASK: how many tasks were new, how many the owner already had, and the
    keys it refused (it is not the closest node for them, or they are out of scope).
    ``known``: fingerprints of links the owner holds that the sender need not send it (at
    most ``MAX_KNOWN``; optional on the wire, see ``p2pcrawl.network.known``)."""

    new: int
    duplicate: int
    refused_keys: list[bytes]
    known: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Held:
    """Reply to STORE_BACKUP: how many copies the replica stored, and the fingerprints of
    the copies it did not store because it knows them as done (at most ``MAX_KNOWN``): an
    owner that had none of the key's history learns it from them."""

    stored: int
    done: list[int] = field(default_factory=list)


MAX_REFRESH_WAIT_S = 3600.0  # the longest "ask again later" a REFRESH_TASK reply may say


@dataclass(frozen=True, slots=True)
class RefreshAnswer:
    """Reply to REFRESH_TASK: how many keys will follow, or (``retry_after`` > 0) "not yet,
    ask again in that many seconds": the asker is not admitted yet, or is younger than the
    minimum age before a new ID takes over keys (docs/security.md). Nothing follows then."""

    keys: int
    retry_after: float = 0.0

    def __post_init__(self) -> None:
        if self.keys < 0 or not 0.0 <= self.retry_after <= MAX_REFRESH_WAIT_S:
            raise ValueError(f"bad refresh answer {self}")
        if self.retry_after and self.keys:
            raise ValueError("a refresh answer that says 'later' promises no keys")


# Canonical URLs are percent-encoded printable ASCII; refusing whitespace and control
# characters also keeps hostile input out of logs and WARC headers, and makes "\n" a safe
# separator on the wire. The length bounds are MAX_URL_LENGTH minus the scheme.
_URL = (
    r"(?:[hH][tT][tT][pP]://(?![/?#])[!-~]{1,2041}"
    r"|[hH][tT][tT][pP][sS]://(?![/?#])[!-~]{1,2040})"
)
_URL_RE = re.compile(_URL)
_URL_LINES_RE = re.compile(rf"(?:{_URL}\n)*{_URL}")


def check_id(value: object, what: str = "id") -> bytes:
    if type(value) is not bytes or len(value) != ID_BYTES:
        raise MessageError(f"{what} must be {ID_BYTES} bytes")
    return value


def check_url(value: object) -> str:
    """Raise MessageError unless ``value`` is an acceptable task URL."""
    if type(value) is not str or not _URL_RE.fullmatch(value):
        raise MessageError(
            f"url must be printable ASCII http(s)://host... of at most {MAX_URL_LENGTH} "
            f"characters: {str(value)[:80]!r}"
        )
    return value


def check_url_lines(urls: list[str], joined: str) -> None:
    """Check a whole column of URLs given also as ``"\\n".join(urls)``: one C-level regex
    pass instead of a Python call per URL. The separator count catches a URL that smuggles
    in its own newline."""
    if not _URL_LINES_RE.fullmatch(joined) or joined.count("\n") != len(urls) - 1:
        for u in urls:
            check_url(u)
        raise MessageError("url column does not split back into the same URLs")


def check_fingerprint(value: object) -> int:
    if type(value) is not int or not 0 <= value < FP_LIMIT:
        raise MessageError("fingerprint must be an int in [0, 2**64)")
    return value
