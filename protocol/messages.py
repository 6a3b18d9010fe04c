"""What the crawl RPCs carry, and the rules a payload must pass before anyone trusts it.

Why a module of its own: rpcudp refuses requests whose msgpack framing exceeds 8 KiB
(``MalformedMessage``) and UDP drops what does not arrive whole, so the one-URL-per-RPC design
of seed 001 is both slow and fragile. Tasks travel as *batches per partition key*, msgpack'd
and zlib-compressed (URLs of one host share long prefixes and compress several-fold), cut into
chunks that each fit one datagram. Decoding is strict because the payload comes from the
network: every field is type- and range-checked, and decompression is capped (a 8 KiB zlib
bomb can inflate to megabytes).

Layout of a decompressed payload, columnar so msgpack (pure Python here) costs per key, not
per URL: ``[1, [[key, "url\\nurl...", depths u16[], hops u16[], done u64[]], ...]]``.
"""

from __future__ import annotations

import re
import struct
import zlib
from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import umsgpack

from protocol.errors import MessageError
from protocol.ownership import ID_BYTES

__all__ = [
    "MAX_URL_LENGTH",
    "PAYLOAD_LIMIT",
    "RPC_REQUEST_LIMIT",
    "KeyBatch",
    "PeerRef",
    "StoreResult",
    "TaskItem",
    "check_id",
    "check_url",
    "count_from_wire",
    "decode_batches",
    "decode_fps",
    "encode_batches",
    "encode_chunks",
    "encode_fps",
    "store_result_from_wire",
    "store_result_to_wire",
]

MAX_URL_LENGTH = 2048  # ASCII characters = bytes, so one URL always fits one datagram
MAX_SMALL_INT = 0xFFFF  # depth and hops
FP_LIMIT = 1 << 64
WIRE_VERSION = 1

RPC_REQUEST_LIMIT = 8192  # rpcudp: len(packb([name, args])) must not exceed this
# Room for the framing around the payload: [name, [sender_id, owner_id, payload]] costs
# 1 + (1 + 13) + 1 + 2 * 22 + 3 = 63 bytes for the longest name; keep a wide margin.
PAYLOAD_LIMIT = RPC_REQUEST_LIMIT - 128

# Decoder caps: anything beyond is hostile or broken.
MAX_DECOMPRESSED = 512 * 1024
MAX_KEYS = 512
MAX_ITEMS = 16384
# The encoder stays well inside them, and keeps each chunk's key count small because the
# reply lists refused keys of that chunk: a small request must not cause a big reply.
ENC_MAX_KEYS = 256
ENC_MAX_ITEMS = 8192
ENC_MAX_RAW = 256 * 1024

# Upper bounds of the msgpack cost of each element, used to size chunks before compressing.
_KEY_COST = 1 + 22 + 3 + 3 * 3
_FP_COST = 8

FPS_PER_CHUNK = PAYLOAD_LIMIT // 8


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
    """One URL to crawl. ``hops`` counts how often it was forwarded between peers."""

    url: str
    depth: int
    hops: int = 0


@dataclass(slots=True)
class KeyBatch:
    """Everything about one partition key: its tasks and the fingerprints of finished URLs.

    The key is the unit that moves between peers on join and leave (DESIGN.md, Ownership).
    """

    key: bytes
    tasks: list[TaskItem]
    done: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Reply to STORE_TASK: how many tasks were new, how many the owner already had, and the
    keys it refused (it is not the closest node for them, or they are out of scope)."""

    new: int
    duplicate: int
    refused_keys: list[bytes]


# --- validation --------------------------------------------------------------------------

# Canonical URLs are percent-encoded printable ASCII; refusing whitespace and control
# characters also keeps hostile input out of logs and WARC headers, and makes "\n" a safe
# separator on the wire. The length bound is MAX_URL_LENGTH minus the scheme.
_URL = (
    r"(?:[hH][tT][tT][pP]://(?![/?#])[!-~]{1,2041}|[hH][tT][tT][pP][sS]://(?![/?#])[!-~]{1,2040})"
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


def _check_url_lines(urls: list[str], joined: str) -> None:
    # One C-level regex pass over the whole column instead of a Python call per URL; the
    # separator count catches a URL that smuggles in its own "\n".
    if not _URL_LINES_RE.fullmatch(joined) or joined.count("\n") != len(urls) - 1:
        for u in urls:
            check_url(u)
        raise MessageError("url column does not split back into the same URLs")


def _fingerprint(value: object) -> int:
    if type(value) is not int or not 0 <= value < FP_LIMIT:
        raise MessageError("fingerprint must be an int in [0, 2**64)")
    return value


# --- encoding ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Column:
    """One KeyBatch prepared for slicing: validated, with running msgpack size estimates."""

    batch: KeyBatch
    urls: list[str]
    depths: list[int]
    hops: list[int]
    cum: list[int]  # cum[i] = bytes of tasks[0..i] on the wire (URL + "\n" + u16 + u16)


def _column(batch: KeyBatch) -> _Column:
    check_id(batch.key, "key")
    urls = [t.url for t in batch.tasks]
    if urls:
        if not all(type(u) is str for u in urls):
            raise MessageError("url must be a string")
        _check_url_lines(urls, "\n".join(urls))
    depths = [t.depth for t in batch.tasks]
    hops = [t.hops for t in batch.tasks]
    for v in (*depths, *hops):
        if type(v) is not int or not 0 <= v <= MAX_SMALL_INT:
            raise MessageError(f"depth and hops must be ints in [0, {MAX_SMALL_INT}]")
    for fp in batch.done:
        _fingerprint(fp)
    return _Column(batch, urls, depths, hops, list(accumulate(len(u) + 5 for u in urls)))


@dataclass(slots=True)
class _Piece:
    """A slice of one KeyBatch that goes into one chunk."""

    col: _Column
    t0: int
    t1: int
    d0: int
    d1: int


_Cursor = tuple[int, int, int]  # batch index, next task, next fingerprint


def _collect(
    cols: list[_Column], cur: _Cursor, budget: float
) -> tuple[list[_Piece], _Cursor, int, bool]:
    """Take pieces from ``cur`` until their estimated msgpack size reaches ``budget``.

    Always takes at least one unit, so shrinking the budget always makes progress.
    Returns (pieces, next cursor, estimated raw size, stopped-by-count-cap).
    """
    bi, ti, di = cur
    pieces: list[_Piece] = []
    raw = 16
    items = 0
    full = capped = False
    while bi < len(cols) and not full:
        if len(pieces) == ENC_MAX_KEYS:
            capped = True
            break
        if pieces and raw + _KEY_COST > budget:
            break
        col = cols[bi]
        raw += _KEY_COST
        t0, d0 = ti, di
        ntasks, ndone = len(col.urls), len(col.batch.done)
        if ti < ntasks:
            base = col.cum[ti - 1] if ti else 0
            end = bisect_right(col.cum, budget - raw + base, lo=ti)
            end = min(end, ti + ENC_MAX_ITEMS - items)
            if end == ti and not items:
                end = ti + 1
            raw += col.cum[end - 1] - base if end > ti else 0
            items += end - ti
            full = end < ntasks
            capped = full and items == ENC_MAX_ITEMS
            ti = end
        if not full and di < ndone:
            fit = int((budget - raw) // _FP_COST)
            end = min(ndone, di + max(fit, 0 if items else 1), di + ENC_MAX_ITEMS - items)
            raw += (end - di) * _FP_COST
            items += end - di
            full = end < ndone
            capped = full and items == ENC_MAX_ITEMS
            di = end
        if ti > t0 or di > d0 or not full:
            pieces.append(_Piece(col, t0, ti, d0, di))
        if not full:
            bi, ti, di = bi + 1, 0, 0
    return pieces, (bi, ti, di), raw, capped


def _pack(pieces: list[_Piece]) -> bytes:
    body = []
    for p in pieces:
        c, n = p.col, p.t1 - p.t0
        done = c.batch.done[p.d0 : p.d1]
        body.append(
            [
                c.batch.key,
                "\n".join(c.urls[p.t0 : p.t1]),
                struct.pack(f">{n}H", *c.depths[p.t0 : p.t1]),
                struct.pack(f">{n}H", *c.hops[p.t0 : p.t1]),
                struct.pack(f">{len(done)}Q", *done),
            ]
        )
    return zlib.compress(umsgpack.packb([WIRE_VERSION, body]), 6)


def encode_batches(batches: Sequence[KeyBatch], limit: int = PAYLOAD_LIMIT) -> list[bytes]:
    """Validate ``batches`` and cut them into compressed payloads of at most ``limit`` bytes."""
    return [payload for payload, _keys in encode_chunks(batches, limit)]


def encode_chunks(
    batches: Sequence[KeyBatch], limit: int = PAYLOAD_LIMIT
) -> list[tuple[bytes, frozenset[bytes]]]:
    """``encode_batches``, with the keys each chunk carries (a reply may refuse only those).

    A KeyBatch too big for one chunk is split across chunks (same key in each). Chunk sizes
    are predicted from the compression ratio seen so far and corrected by re-packing, so most
    chunks are compressed once or twice and end up 70-95% full. Raises MessageError on a
    task the receiver would refuse, so the sender learns it before anything is sent.
    """
    if limit < 4096:
        raise ValueError("limit must leave room for one maximal URL")
    cols = [_column(b) for b in batches]
    out: list[tuple[bytes, frozenset[bytes]]] = []
    cur: _Cursor = (0, 0, 0)
    ratio = 0.5  # compressed bytes per estimated raw byte, refined by every attempt
    target = limit * 0.92
    while cur[0] < len(cols):
        budget = min(target / ratio, ENC_MAX_RAW)
        for attempt in range(32):
            pieces, nxt, raw, capped = _collect(cols, cur, budget)
            payload = _pack(pieces)
            ratio = max(len(payload) / raw, 1e-3)
            if len(payload) > limit:
                budget = raw * target / len(payload)
                continue
            grow = min(target / ratio, ENC_MAX_RAW)
            if (
                attempt < 3
                and len(payload) < 0.7 * limit
                and nxt[0] < len(cols)
                and not capped
                and grow > raw * 1.1
            ):
                budget = grow
                continue
            break
        else:  # pragma: no cover - one unit always fits, see MAX_URL_LENGTH
            raise MessageError("could not fit a chunk into the payload limit")
        out.append((payload, frozenset(p.col.batch.key for p in pieces)))
        cur = nxt
    return out


# --- decoding ----------------------------------------------------------------------------


def _inflate(payload: object) -> bytes:
    if type(payload) is not bytes:
        raise MessageError("payload must be bytes")
    if len(payload) > RPC_REQUEST_LIMIT:
        raise MessageError("payload larger than one request")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(payload, MAX_DECOMPRESSED + 1)
    except zlib.error as exc:
        raise MessageError(f"bad compression: {exc}") from None
    if len(raw) > MAX_DECOMPRESSED or inflater.unconsumed_tail:
        raise MessageError("payload inflates beyond the cap (decompression bomb?)")
    if not inflater.eof or inflater.unused_data:
        raise MessageError("truncated or trailing compressed data")
    return raw


def _decode_entry(entry: object) -> KeyBatch:
    if not isinstance(entry, list) or len(entry) != 5:
        raise MessageError("batch must be [key, urls, depths, hops, done]")
    key, joined, depths, hops, done = entry
    if type(joined) is not str:
        raise MessageError("urls must be a string")
    if not all(type(b) is bytes for b in (depths, hops, done)):
        raise MessageError("depths, hops and done must be bytes")
    urls = joined.split("\n") if joined else []
    n = len(urls)
    if len(depths) != 2 * n or len(hops) != 2 * n or len(done) % 8:
        raise MessageError("column lengths do not match")
    if urls:
        _check_url_lines(urls, joined)
    tasks = list(
        map(TaskItem, urls, struct.unpack(f">{n}H", depths), struct.unpack(f">{n}H", hops))
    )
    return KeyBatch(check_id(key, "key"), tasks, list(struct.unpack(f">{len(done) // 8}Q", done)))


def decode_batches(payload: bytes) -> list[KeyBatch]:
    """Inverse of ``encode_batches`` for one chunk; raises only ``MessageError``."""
    raw = _inflate(payload)
    try:
        obj = umsgpack.unpackb(raw)
    except Exception as exc:  # umsgpack raises many types, RecursionError on deep nesting
        raise MessageError(f"undecodable payload: {type(exc).__name__}") from None
    if (
        not isinstance(obj, list)
        or len(obj) != 2
        or type(obj[0]) is not int
        or obj[0] != WIRE_VERSION
        or not isinstance(obj[1], list)
    ):
        raise MessageError("payload must be [1, [batches]]")
    if len(obj[1]) > MAX_KEYS:
        raise MessageError(f"more than {MAX_KEYS} keys in one payload")
    out = [_decode_entry(e) for e in obj[1]]
    if sum(len(b.tasks) + len(b.done) for b in out) > MAX_ITEMS:
        raise MessageError(f"more than {MAX_ITEMS} items in one payload")
    return out


def encode_fps(fps: Sequence[int]) -> list[bytes]:
    """Fingerprints for DELETE_BACKUP as big-endian u64 arrays, ``FPS_PER_CHUNK`` per chunk.

    Fingerprints are random bits, so compressing them would only cost CPU.
    """
    for fp in fps:
        _fingerprint(fp)
    return [
        struct.pack(f">{len(part)}Q", *part)
        for part in (fps[i : i + FPS_PER_CHUNK] for i in range(0, len(fps), FPS_PER_CHUNK))
    ]


def decode_fps(payload: object) -> list[int]:
    if type(payload) is not bytes or len(payload) % 8 or len(payload) > FPS_PER_CHUNK * 8:
        raise MessageError(f"fingerprints must be at most {FPS_PER_CHUNK} u64 values")
    return list(struct.unpack(f">{len(payload) // 8}Q", payload))


# --- replies -----------------------------------------------------------------------------


def store_result_to_wire(result: StoreResult, asked: Collection[bytes]) -> dict[str, Any]:
    """Only keys of this chunk may be refused, deduplicated: the reply stays small."""
    refused = list(dict.fromkeys(k for k in result.refused_keys if k in asked))
    return {"new": int(result.new), "dup": int(result.duplicate), "refused": refused}


def store_result_from_wire(obj: object, asked: Collection[bytes]) -> StoreResult:
    if not isinstance(obj, dict):
        raise MessageError("store_task reply must be a map")
    new, dup, refused = obj.get("new"), obj.get("dup"), obj.get("refused")
    if type(new) is not int or type(dup) is not int or new < 0 or dup < 0:
        raise MessageError("store_task reply counts must be non-negative ints")
    if not isinstance(refused, list) or len(refused) > MAX_KEYS:
        raise MessageError("store_task reply refused must be a short list")
    # A peer can only refuse what we asked it to take; anything else is ignored.
    return StoreResult(new, dup, [k for k in refused if type(k) is bytes and k in asked])


def count_from_wire(obj: object) -> int:
    if not isinstance(obj, dict) or type(obj.get("n")) is not int or obj["n"] < 0:
        raise MessageError("reply must be a map with a non-negative int 'n'")
    n: int = obj["n"]
    return n
