"""What the crawl RPCs carry: the public face of ``model`` (the types) and ``codec`` (bytes),
plus the small reply maps.

Replies stay within one datagram: STORE_TASK answers with two counts, the refused keys *of
that chunk* (at most 256) and, to a member, up to ``MAX_KNOWN`` fingerprints of links the
owner holds (4 KiB; ``p2pcrawl.network.known``); the other RPCs with one count.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence
from typing import Any

from protocol.codec import (
    FPS_PER_CHUNK,
    MAX_KEYS,
    PAYLOAD_LIMIT,
    RPC_REQUEST_LIMIT,
    decode_batches,
    decode_fps,
    encode_chunks,
    encode_fps,
)
from protocol.errors import MessageError
from protocol.model import (
    MAX_KNOWN,
    MAX_REFRESH_WAIT_S,
    MAX_URL_LENGTH,
    KeyBatch,
    PeerRef,
    RefreshAnswer,
    StoreResult,
    TaskItem,
    check_id,
    check_url,
)

__all__ = [
    "FPS_PER_CHUNK",
    "MAX_URL_LENGTH",
    "PAYLOAD_LIMIT",
    "RPC_REQUEST_LIMIT",
    "KeyBatch",
    "PeerRef",
    "RefreshAnswer",
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
    "refresh_from_wire",
    "refresh_to_wire",
    "store_result_from_wire",
    "store_result_to_wire",
]


def encode_batches(batches: Sequence[KeyBatch], limit: int = PAYLOAD_LIMIT) -> list[bytes]:
    """Validate ``batches`` and cut them into compressed chunks that each fit one rpcudp
    request (8 KiB after msgpack framing of the whole call); see ``codec``."""
    return [payload for payload, _keys in encode_chunks(batches, limit)]


def store_result_to_wire(result: StoreResult, asked: Collection[bytes]) -> dict[str, Any]:
    """Only keys of this chunk may be refused, deduplicated: the reply stays small."""
    refused = list(dict.fromkeys(k for k in result.refused_keys if k in asked))
    out: dict[str, Any] = {"new": int(result.new), "dup": int(result.duplicate), "refused": refused}
    if result.known:
        known = result.known[:MAX_KNOWN]
        out["known"] = struct.pack(f">{len(known)}Q", *known)
    return out


def store_result_from_wire(obj: object, asked: Collection[bytes]) -> StoreResult:
    if not isinstance(obj, dict):
        raise MessageError("store_task reply must be a map")
    new, dup, refused = obj.get("new"), obj.get("dup"), obj.get("refused")
    if type(new) is not int or type(dup) is not int or new < 0 or dup < 0:
        raise MessageError("store_task reply counts must be non-negative ints")
    if not isinstance(refused, list) or len(refused) > MAX_KEYS:
        raise MessageError("store_task reply refused must be a short list")
    known = obj.get("known", b"")
    if type(known) is not bytes or len(known) % 8 or len(known) > 8 * MAX_KNOWN:
        raise MessageError(f"store_task reply known must be at most {MAX_KNOWN} u64 values")
    # A peer can only refuse what we asked it to take; anything else is ignored.
    return StoreResult(
        new,
        dup,
        [k for k in refused if type(k) is bytes and k in asked],
        list(struct.unpack(f">{len(known) // 8}Q", known)),
    )


def count_from_wire(obj: object) -> int:
    if not isinstance(obj, dict) or type(obj.get("n")) is not int or obj["n"] < 0:
        raise MessageError("reply must be a map with a non-negative int 'n'")
    n: int = obj["n"]
    return n


def refresh_to_wire(answer: RefreshAnswer) -> dict[str, Any]:
    """``{"n": keys}``, plus ``"later_ms"`` when the asker must ask again: a peer that does
    not know the field reads a plain count of 0."""
    out: dict[str, Any] = {"n": answer.keys}
    if answer.retry_after:
        out["later_ms"] = max(1, round(answer.retry_after * 1000))
    return out


def refresh_from_wire(obj: object) -> RefreshAnswer:
    n = count_from_wire(obj)
    assert isinstance(obj, dict)
    later = obj.get("later_ms", 0)
    if type(later) is not int or not 0 <= later <= MAX_REFRESH_WAIT_S * 1000:
        raise MessageError("refresh_task reply 'later_ms' must be a small non-negative int")
    if later and n:
        raise MessageError("refresh_task reply cannot promise keys and say 'later'")
    return RefreshAnswer(n, later / 1000)
