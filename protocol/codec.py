"""Bytes <-> KeyBatches: compressed, columnar chunks that each fit one rpcudp request.

rpcudp refuses a request whose msgpack framing exceeds 8 KiB (``MalformedMessage``) and UDP
drops whatever does not arrive whole, so the one-URL-per-RPC design of "Distributed Crawler Based
on the Improved Kademlia Protocol" (§2.3) is slow and fragile.
Tasks travel as batches per partition key, cut into chunks that fit one datagram. A chunk is
zlib-compressed msgpack (URLs of one host share long prefixes and compress several-fold) laid
out in columns, so msgpack costs a constant per chunk rather than per URL or per key (it was
pure Python when this layout was chosen; ``protocol.wire`` now uses the C one), and
validation is a handful of C-level passes::

    [1, keys (20 B each), tasks per key (u32[]), fps per key (u32[]),
     "url\\nurl\\n...", depths (u16[]), hops (u16[]), fps (u64[])]

Decoding is strict (every count and length cross-checked, inflation capped against zlib bombs)
and raises only ``MessageError``.
"""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
from operator import sub

from protocol import wire
from protocol.errors import MessageError
from protocol.model import (
    FP_LIMIT,
    MAX_SMALL_INT,
    KeyBatch,
    TaskItem,
    check_fingerprint,
    check_id,
    check_url_lines,
)
from protocol.ownership import ID_BYTES

__all__ = [
    "FPS_PER_CHUNK",
    "PAYLOAD_LIMIT",
    "RPC_REQUEST_LIMIT",
    "decode_batches",
    "decode_fps",
    "encode_chunks",
    "encode_fps",
]

WIRE_VERSION = 1
RPC_REQUEST_LIMIT = 8192  # rpcudp: len(packb([name, args])) must not exceed this
# Room for the framing around a payload: [name, [sender_id, owner_id, payload]] costs
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

# Upper bounds of the wire cost of each unit, used to size chunks before compressing.
_KEY_COST = ID_BYTES + 8
_TASK_EXTRA = 5  # "\n" + u16 depth + u16 hops, on top of the URL itself
_FP_COST = 8
_HEADER_COST = 64

FPS_PER_CHUNK = PAYLOAD_LIMIT // 8

# zlib level 3: on crawled URLs about 3x faster than the default 6 for ~15% larger chunks.
# Compression is the biggest CPU cost of sending (benchmarks/dispatch.py).
ZLIB_LEVEL = 3
# An 8 KiB window and memLevel 4, not zlib's 32 KiB and 8: ``zlib.compress`` sets up (and
# zeroes) about 256 KiB of state per call, which cost ~45 us on the 1 KiB chunks most calls
# carry, ten times the compressing itself. A chunk is at most 8 KiB compressed, so the small
# window loses under 1% on the largest; the stream is plain zlib either way.
_ZLIB_WBITS = 13
_ZLIB_MEMLEVEL = 4


def _deflate(raw: bytes) -> bytes:
    c = zlib.compressobj(ZLIB_LEVEL, zlib.DEFLATED, _ZLIB_WBITS, _ZLIB_MEMLEVEL)
    return c.compress(raw) + c.flush()


def _ints(values: list[int], low: int, high: int, what: str) -> None:
    # set(map(type, ...)) runs in C; bool is refused because type(True) is not int.
    if values and (set(map(type, values)) != {int} or min(values) < low or max(values) > high):
        raise MessageError(f"{what} must be ints in [{low}, {high}]")


@dataclass(slots=True)
class _Flat:
    """All batches as global columns. Units are, per batch: its key, its tasks, its fps;
    ``cum[u]`` is the estimated wire size of units ``[0, u)``."""

    keys: list[bytes]
    urls: list[str]
    depths: list[int]
    hops: list[int]
    done: list[int]
    ustart: list[int]  # first unit (the key) of batch b; ustart[-1] = number of units
    tstart: list[int]  # first global task index of batch b
    dstart: list[int]
    cum: list[int]


def _flatten(batches: Sequence[KeyBatch]) -> _Flat:
    keys = [check_id(b.key, "key") for b in batches]
    tasks = list(chain.from_iterable(b.tasks for b in batches))
    urls = [t.url for t in tasks]
    if urls:
        if set(map(type, urls)) != {str}:
            raise MessageError("url must be a string")
        check_url_lines(urls, "\n".join(urls))
    depths, hops = [t.depth for t in tasks], [t.hops for t in tasks]
    _ints(depths, 0, MAX_SMALL_INT, "depth")
    _ints(hops, 0, MAX_SMALL_INT, "hops")
    done = list(chain.from_iterable(b.done for b in batches))
    _ints(done, 0, FP_LIMIT - 1, "fingerprint")
    tcount = [len(b.tasks) for b in batches]
    dcount = [len(b.done) for b in batches]
    task_costs = [len(u) + _TASK_EXTRA for u in urls]
    costs: list[int] = []
    i = 0
    for t, d in zip(tcount, dcount, strict=True):  # per key, not per URL: C does the rest
        costs.append(_KEY_COST)
        costs += task_costs[i : i + t]
        costs += repeat(_FP_COST, d)
        i += t
    return _Flat(
        keys,
        urls,
        depths,
        hops,
        done,
        list(accumulate((1 + t + d for t, d in zip(tcount, dcount, strict=True)), initial=0)),
        list(accumulate(tcount, initial=0)),
        list(accumulate(dcount, initial=0)),
        list(accumulate(costs, initial=0)),
    )


def _span(f: _Flat, u0: int, budget: float) -> tuple[int, int, bool]:
    """The end ``u1`` of the chunk starting at unit ``u0`` whose estimate fits ``budget``.

    Always takes at least one task or fp, so a shrinking budget still makes progress.
    Returns (u1, estimated raw size, stopped by a count cap).
    """
    total = f.ustart[-1]
    b0 = bisect_right(f.ustart, u0) - 1
    extra = _HEADER_COST + (_KEY_COST if u0 != f.ustart[b0] else 0)  # key repeated mid-batch
    u1 = bisect_right(f.cum, f.cum[u0] + budget - extra) - 1
    first_key_only = u0 == f.ustart[b0] and f.ustart[b0 + 1] - u0 > 1
    u1 = max(u1, u0 + (2 if first_key_only else 1))
    cap = min(u0 + ENC_MAX_ITEMS, f.ustart[min(b0 + ENC_MAX_KEYS, len(f.keys))])
    capped = u1 > cap
    u1 = min(u1, cap, total)
    last = bisect_right(f.ustart, u1 - 1) - 1
    if u1 - 1 == f.ustart[last] > u0 and f.ustart[last + 1] - u1 > 0:
        u1 -= 1  # don't end on a bare key whose items all go to the next chunk
    return u1, f.cum[u1] - f.cum[u0] + extra, capped


def _clamp(x: int, high: int) -> int:
    return 0 if x < 0 else high if x > high else x


def _pack(f: _Flat, u0: int, u1: int) -> tuple[bytes, frozenset[bytes]]:
    """Compress units ``[u0, u1)``. Keys between the first and the last are whole; only the
    first and last can be cut, so counts are slices of the prefix sums, then trimmed."""
    b0 = bisect_right(f.ustart, u0) - 1
    b1 = bisect_right(f.ustart, u1 - 1) - 1
    keys = f.keys[b0 : b1 + 1]
    tcounts = list(map(sub, f.tstart[b0 + 1 : b1 + 2], f.tstart[b0 : b1 + 1]))
    dcounts = list(map(sub, f.dstart[b0 + 1 : b1 + 2], f.dstart[b0 : b1 + 1]))
    # Units past the first key's own unit, and up to the last key's end.
    off0, off1 = u0 - f.ustart[b0] - 1, u1 - f.ustart[b1] - 1
    tc0, dc0, tc1, dc1 = tcounts[0], dcounts[0], tcounts[-1], dcounts[-1]
    t_cut0, d_cut0 = _clamp(off0, tc0), _clamp(off0 - tc0, dc0)
    t_keep1, d_keep1 = _clamp(off1, tc1), _clamp(off1 - tc1, dc1)
    tcounts[0] -= t_cut0
    dcounts[0] -= d_cut0
    tcounts[-1] -= tc1 - t_keep1
    dcounts[-1] -= dc1 - d_keep1
    t_first, d_first = f.tstart[b0] + t_cut0, f.dstart[b0] + d_cut0
    t_end, d_end = f.tstart[b1] + t_keep1, f.dstart[b1] + d_keep1
    n, m, k = t_end - t_first, d_end - d_first, len(keys)
    body = [
        WIRE_VERSION,
        b"".join(keys),
        struct.pack(f">{k}I", *tcounts),
        struct.pack(f">{k}I", *dcounts),
        "\n".join(f.urls[t_first:t_end]),
        struct.pack(f">{n}H", *f.depths[t_first:t_end]),
        struct.pack(f">{n}H", *f.hops[t_first:t_end]),
        struct.pack(f">{m}Q", *f.done[d_first:d_end]),
    ]
    return _deflate(wire.packb(body)), frozenset(keys)


def encode_chunks(
    batches: Sequence[KeyBatch], limit: int = PAYLOAD_LIMIT
) -> list[tuple[bytes, frozenset[bytes]]]:
    """Validate ``batches`` and cut them into payloads of at most ``limit`` bytes, each with
    the keys it carries (a reply may refuse only those).

    A KeyBatch too big for one chunk is split across chunks (same key in each). Chunk sizes
    are predicted from the compression ratio seen so far and corrected by re-packing, so most
    chunks are compressed once or twice and end up 70-95% full. Raises MessageError on a
    task the receiver would refuse, so the sender learns it before anything is sent.
    """
    if limit < 4096:
        raise ValueError("limit must leave room for one maximal URL")
    f = _flatten(batches)
    out: list[tuple[bytes, frozenset[bytes]]] = []
    u0, total = 0, f.ustart[-1]
    ratio = 0.5  # compressed bytes per estimated raw byte, refined by every attempt
    target = limit * 0.92
    while u0 < total:
        budget = min(target / ratio, ENC_MAX_RAW)
        for attempt in range(32):
            u1, raw, capped = _span(f, u0, budget)
            payload, keys = _pack(f, u0, u1)
            ratio = max(len(payload) / raw, 1e-3)
            if len(payload) > limit:
                budget = raw * target / len(payload)
                continue
            grow = min(target / ratio, ENC_MAX_RAW)
            small = len(payload) < 0.7 * limit
            if attempt < 3 and small and u1 < total and not capped and grow > raw * 1.1:
                budget = grow
                continue
            break
        else:  # pragma: no cover - one unit always fits, see MAX_URL_LENGTH
            raise MessageError("could not fit a chunk into the payload limit")
        out.append((payload, keys))
        u0 = u1
    return out


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


def decode_batches(payload: bytes) -> list[KeyBatch]:
    """Inverse of the encoder for one chunk; raises only ``MessageError``."""
    raw = _inflate(payload)
    try:
        obj = wire.unpackb(raw)
    except Exception as exc:  # msgpack raises many types: ExtraData, StackError, ValueError...
        raise MessageError(f"undecodable payload: {type(exc).__name__}") from None
    if not isinstance(obj, list) or len(obj) != 8 or type(obj[0]) is not int:
        raise MessageError("payload must be an 8-column list")
    version, keys, tcounts, dcounts, joined, depths, hops, done = obj
    if version != WIRE_VERSION:
        raise MessageError(f"unknown payload version {version}")
    if type(joined) is not str or {
        type(c) for c in (keys, tcounts, dcounts, depths, hops, done)
    } != {bytes}:
        raise MessageError("payload columns have the wrong types")
    k = len(keys) // ID_BYTES
    if len(keys) % ID_BYTES or k > MAX_KEYS or len(tcounts) != 4 * k or len(dcounts) != 4 * k:
        raise MessageError(f"bad key columns (at most {MAX_KEYS} keys)")
    tc, dc = struct.unpack(f">{k}I", tcounts), struct.unpack(f">{k}I", dcounts)
    urls = joined.split("\n") if joined else []
    n, m = len(urls), len(done) // 8
    if sum(tc) != n or sum(dc) != m or len(done) % 8 or len(depths) != 2 * n or len(hops) != 2 * n:
        raise MessageError("column lengths do not match")
    if n + m > MAX_ITEMS:
        raise MessageError(f"more than {MAX_ITEMS} items in one payload")
    if urls:
        check_url_lines(urls, joined)
    tasks = list(
        map(TaskItem, urls, struct.unpack(f">{n}H", depths), struct.unpack(f">{n}H", hops))
    )
    fps = list(struct.unpack(f">{m}Q", done))
    out = []
    t = d = 0
    for i in range(k):
        out.append(
            KeyBatch(
                keys[i * ID_BYTES : (i + 1) * ID_BYTES], tasks[t : t + tc[i]], fps[d : d + dc[i]]
            )
        )
        t += tc[i]
        d += dc[i]
    return out


def encode_fps(fps: Sequence[int]) -> list[bytes]:
    """Fingerprints for DELETE_BACKUP as big-endian u64 arrays, ``FPS_PER_CHUNK`` per chunk.

    Fingerprints are random bits, so compressing them would only cost CPU.
    """
    for fp in fps:
        check_fingerprint(fp)
    return [
        struct.pack(f">{len(part)}Q", *part)
        for part in (fps[i : i + FPS_PER_CHUNK] for i in range(0, len(fps), FPS_PER_CHUNK))
    ]


def decode_fps(payload: object) -> list[int]:
    if type(payload) is not bytes or len(payload) % 8 or len(payload) > FPS_PER_CHUNK * 8:
        raise MessageError(f"fingerprints must be at most {FPS_PER_CHUNK} u64 values")
    return list(struct.unpack(f">{len(payload) // 8}Q", payload))
