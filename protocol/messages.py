"""The crawl RPCs' messages, each declared once (``procedures``), and what they carry: the
types of ``model`` and the task chunks of ``codec``.

    store_task     [sender, payload]         {new, dup, refused, known?}
    store_backup   [sender, owner, payload]  {n, done?}
    delete_backup  [sender, owner, payload]  {n}
    refresh_task   [sender]                  {n, later_ms?}
    quiet          [sender]                  {quiet, done}
    ping_req       [sender, target]          {ok, known}
    goodbye        [sender]                  {ok}
    vouch          [sender, [[key, fp]...]]  {pages: [[key, fp, url, digest]...]}

(LEND and GIVE_BACK are declared in ``loans``, LOAD in ``loadreport``; the server adds its
node ID to every reply as ``"id"``.) Replies stay within one datagram: STORE_TASK answers with
two counts, the refused keys *of that chunk* (at most 256) and, to a member, up to
``MAX_KNOWN`` fingerprints of links the owner holds (4 KiB; ``p2pcrawl.network.known``);
STORE_BACKUP with a count and up to ``MAX_KNOWN`` fingerprints of the copies the replica
knows as done (``Held``); the other RPCs with one count.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence
from typing import Annotated

import msgspec
from msgspec import Meta

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
from protocol.model import (
    MAX_KNOWN,
    MAX_REFRESH_WAIT_S,
    MAX_URL_LENGTH,
    Held,
    KeyBatch,
    PeerRef,
    RefreshAnswer,
    StoreResult,
    TaskItem,
    check_id,
    check_url,
)
from protocol.procedures import U64, Args, Count, Id, NoArgs, Procedure, Reply

__all__ = [
    "DELETE_BACKUP",
    "FPS_PER_CHUNK",
    "GOODBYE",
    "MAX_URL_LENGTH",
    "MAX_VOUCH",
    "PAYLOAD_LIMIT",
    "PING_REQ",
    "QUIET",
    "REFRESH_TASK",
    "RPC_REQUEST_LIMIT",
    "STORE_BACKUP",
    "STORE_TASK",
    "VOUCH",
    "BackupArgs",
    "BackupReply",
    "GoodbyeReply",
    "Held",
    "KeyBatch",
    "PeerRef",
    "PingReqArgs",
    "PingReqReply",
    "QuietReply",
    "RefreshAnswer",
    "RefreshReply",
    "StoreResult",
    "StoreTaskArgs",
    "StoreTaskReply",
    "TaskItem",
    "VouchArgs",
    "VouchReply",
    "Vouched",
    "Wanted",
    "backup_reply",
    "check_id",
    "check_url",
    "decode_batches",
    "decode_fps",
    "encode_batches",
    "encode_chunks",
    "encode_fps",
    "held_of",
    "refresh_answer",
    "refresh_reply",
    "store_reply",
    "store_result",
]


NonNegative = Annotated[int, Meta(ge=0)]
Payload = Annotated[bytes, Meta(max_length=RPC_REQUEST_LIMIT)]


class StoreTaskArgs(Args):
    payload: Payload


class StoreTaskReply(Reply):
    """``known``: u64 fingerprints, big-endian, packed."""

    new: NonNegative
    dup: NonNegative
    refused: Annotated[list[bytes], Meta(max_length=MAX_KEYS)]
    known: Annotated[bytes, Meta(max_length=8 * MAX_KNOWN)] = b""

    def __post_init__(self) -> None:
        if len(self.known) % 8:
            raise ValueError(f"known must be at most {MAX_KNOWN} u64 values")


class BackupReply(Reply):
    """``done``: u64 fingerprints of the chunk's tasks the replica knows as done, packed."""

    n: NonNegative
    done: Annotated[bytes, Meta(max_length=8 * MAX_KNOWN)] = b""

    def __post_init__(self) -> None:
        if len(self.done) % 8:
            raise ValueError(f"done must be at most {MAX_KNOWN} u64 values")


def backup_reply(held: Held) -> BackupReply:
    done = held.done[:MAX_KNOWN]
    return BackupReply(int(held.stored), struct.pack(f">{len(done)}Q", *done))


def held_of(reply: BackupReply) -> Held:
    return Held(reply.n, list(struct.unpack(f">{len(reply.done) // 8}Q", reply.done)))


class BackupArgs(Args):
    """STORE_BACKUP's and DELETE_BACKUP's: whose tasks, and a chunk of them (``codec``)."""

    owner: Id
    payload: Payload


class RefreshReply(Reply):
    """``later_ms``: ask again in that many milliseconds (then no keys follow). A peer that
    does not know the field reads a plain count of 0."""

    n: NonNegative
    later_ms: Annotated[int, Meta(ge=0, le=int(MAX_REFRESH_WAIT_S * 1000))] = 0

    def __post_init__(self) -> None:
        if self.later_ms and self.n:
            raise ValueError("a refresh_task reply cannot promise keys and say 'later'")


class QuietReply(Reply):
    """QUIET: whether the peer is quiet (docs/architecture.md, "Finished"), and how many
    pages it has finished."""

    quiet: bool
    done: NonNegative


class PingReqArgs(Args):
    target: Id


class PingReqReply(Reply):
    """SWIM's PING-REQ answer: the target acked (``ok``); ``known``: the helper knows it;
    ``gone``: it does not, because it declared the target dead lately."""

    ok: bool
    known: bool
    gone: bool = False


class GoodbyeReply(Reply):
    ok: bool


# Pages one VOUCH asks about: two URLs of MAX_URL_LENGTH fit a reply in one datagram.
MAX_VOUCH = 2
DIGEST_BYTES = 8


class Wanted(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    key: Id
    fp: U64


class VouchArgs(Args):
    """VOUCH: pages the sender says are done, which the asker samples to check that word
    (docs/security.md, "Forged work claims")."""

    wanted: Annotated[list[Wanted], Meta(min_length=1, max_length=MAX_VOUCH)]


class Vouched(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A page the answering peer fetched: its URL and its body's digest (``b""``: finished
    without a page, a robots.txt exclusion or a final error)."""

    key: Id
    fp: U64
    url: Annotated[str, Meta(max_length=MAX_URL_LENGTH)]
    digest: Annotated[bytes, Meta(max_length=DIGEST_BYTES)]


class VouchReply(Reply):
    """The asked pages this peer fetched; one it did not (done on another's word, or not
    done) is left out."""

    pages: Annotated[list[Vouched], Meta(max_length=MAX_VOUCH)]


STORE_TASK = Procedure("store_task", StoreTaskArgs, StoreTaskReply)
STORE_BACKUP = Procedure("store_backup", BackupArgs, BackupReply)
DELETE_BACKUP = Procedure("delete_backup", BackupArgs, Count)
REFRESH_TASK = Procedure("refresh_task", NoArgs, RefreshReply)
QUIET = Procedure("quiet", NoArgs, QuietReply)
PING_REQ = Procedure("ping_req", PingReqArgs, PingReqReply)
# Served inline with the Kademlia RPCs (``rpc.Rpc.rpc_goodbye``); its one argument is the
# sender's ID, as for every crawl RPC.
GOODBYE = Procedure("goodbye", NoArgs, GoodbyeReply)
VOUCH = Procedure("vouch", VouchArgs, VouchReply)


def encode_batches(batches: Sequence[KeyBatch], limit: int = PAYLOAD_LIMIT) -> list[bytes]:
    """Validate ``batches`` and cut them into compressed chunks that each fit one request
    (8 KiB after msgpack framing of the whole call); see ``codec``."""
    return [payload for payload, _keys in encode_chunks(batches, limit)]


def store_reply(result: StoreResult, asked: Collection[bytes]) -> StoreTaskReply:
    """Only keys of this chunk may be refused, deduplicated: the reply stays small."""
    refused = list(dict.fromkeys(k for k in result.refused_keys if k in asked))
    known = result.known[:MAX_KNOWN]
    return StoreTaskReply(
        int(result.new), int(result.duplicate), refused, struct.pack(f">{len(known)}Q", *known)
    )


def store_result(reply: StoreTaskReply, asked: Collection[bytes]) -> StoreResult:
    # A peer can only refuse what we asked it to take; anything else is ignored.
    known = reply.known
    return StoreResult(
        reply.new,
        reply.dup,
        [k for k in reply.refused if k in asked],
        list(struct.unpack(f">{len(known) // 8}Q", known)),
    )


def refresh_reply(answer: RefreshAnswer) -> RefreshReply:
    later = max(1, round(answer.retry_after * 1000)) if answer.retry_after else 0
    return RefreshReply(answer.keys, later)


def refresh_answer(reply: RefreshReply) -> RefreshAnswer:
    return RefreshAnswer(reply.n, reply.later_ms / 1000)
