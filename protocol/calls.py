"""The sending side of the crawl RPCs (``serving`` is the receiving side).

``CrawlNode`` owns one ``CrawlCalls``, over its ``rpc.Rpc``. Each method encodes its arguments
into chunks that fit one request (rpcudp's 8 KiB), sends them ``CHUNK_WINDOW`` at a time,
waits for every reply, and sums the results. All raise ``PeerTimeout`` when the peer stays
silent and ``RemoteError`` when it answers with an error; none returns rpcudp's
``(False, None)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from protocol.errors import MessageError, PeerTimeout, RemoteError
from protocol.kbucket import Node
from protocol.loadreport import LOAD, PAD_BYTES, LoadArgs, LoadReport, report_of
from protocol.loans import (
    GIVE_BACK,
    LEND,
    MAX_FPS,
    MAX_REPORTS,
    GiveBack,
    LendArgs,
    Loan,
    answers_of,
    loan_of,
    report_args,
)
from protocol.messages import (
    DELETE_BACKUP,
    GOODBYE,
    QUIET,
    REFRESH_TASK,
    STORE_BACKUP,
    STORE_TASK,
    BackupArgs,
    Held,
    KeyBatch,
    PeerRef,
    QuietReply,
    RefreshAnswer,
    StoreResult,
    StoreTaskArgs,
    check_id,
    encode_chunks,
    held_of,
    refresh_answer,
    store_result,
)
from protocol.procedures import Args, NoArgs, Procedure, Reply
from protocol.rpc import Rpc

__all__ = ["CHUNK_WINDOW", "CrawlCalls"]

# Chunks of one call in flight: a burst must fit the receiver's socket buffer (UDP drops the
# overflow), yet keep the pipe full while the receiver decodes.
CHUNK_WINDOW = 8

A = TypeVar("A", bound=Args)
R = TypeVar("R", bound=Reply)
T = TypeVar("T")


class CrawlCalls:
    def __init__(self, rpc: Rpc) -> None:
        self._rpc = rpc

    async def call(self, peer: PeerRef, proc: Procedure[A, R], args: A) -> R:
        """One request of ``proc``: its reply, checked; PeerTimeout or RemoteError."""
        return await self._rpc.request(peer, proc, args)

    async def store_task(self, peer: PeerRef, batches: Sequence[KeyBatch]) -> StoreResult:
        """STORE_TASK: hand tasks (and done fingerprints) to their owner; results summed.

        Re-sending after a PeerTimeout is safe: the owner deduplicates (reported as
        ``duplicate``), so the caller need not know which chunks arrived.
        """
        chunks = encode_chunks(batches)
        replies = await self._chunked(peer, STORE_TASK, [StoreTaskArgs(p) for p, _ in chunks])
        new = dup = 0
        refused: dict[bytes, None] = {}
        known: list[int] = []
        for reply, (_, keys) in zip(replies, chunks, strict=True):
            result = store_result(reply, keys)
            new += result.new
            dup += result.duplicate
            refused.update(dict.fromkeys(result.refused_keys))
            known += result.known
        return StoreResult(new, dup, list(refused), known)

    async def store_backup(self, peer: PeerRef, owner: bytes, batches: Sequence[KeyBatch]) -> Held:
        """STORE_BACKUP: ``peer`` holds copies of ``owner``'s tasks; returns how many it
        stored, and which of them it knows as done already."""
        check_id(owner, "owner")
        chunks = encode_chunks(batches)
        replies = await self._chunked(peer, STORE_BACKUP, [BackupArgs(owner, p) for p, _ in chunks])
        helds = [held_of(r) for r in replies]
        return Held(sum(h.stored for h in helds), [fp for h in helds for fp in h.done])

    async def delete_backup(
        self, peer: PeerRef, owner: bytes, done: Mapping[bytes, Sequence[int]]
    ) -> int:
        """DELETE_BACKUP: ``owner`` finished these URLs (fingerprints by host key); returns
        how many copies were dropped. The keys travel so that a replica holding no copy can
        still record the fingerprints as done under their key (and hand them on with it)."""
        check_id(owner, "owner")
        batches = [KeyBatch(key, [], list(fps)) for key, fps in done.items() if fps]
        if not batches:
            return 0
        chunks = encode_chunks(batches)
        replies = await self._chunked(
            peer, DELETE_BACKUP, [BackupArgs(owner, c) for c, _ in chunks]
        )
        return sum(r.n for r in replies)

    async def refresh_task(self, peer: PeerRef) -> RefreshAnswer:
        """REFRESH_TASK: ask ``peer`` to re-send what is now closer to us (after a join):
        how many keys will follow, or when to ask again."""
        return refresh_answer(await self.call(peer, REFRESH_TASK, NoArgs()))

    async def quiet(self, peer: PeerRef) -> QuietReply:
        """QUIET: is ``peer`` quiet, and how many pages has it finished (the network is
        finished when every peer is quiet: docs/architecture.md, "Finished")."""
        return await self.call(peer, QUIET, NoArgs())

    async def load_report(self, peer: PeerRef, *, pad: bool = True) -> LoadReport:
        """LOAD: how much work ``peer`` owns, and how it falls on each bit (``loadreport``).
        ``pad`` makes the request big enough for the full reply to a caller ``peer`` does not
        know (the anti-amplification bound); a member of its table may leave it off."""
        reply = await self.call(peer, LOAD, LoadArgs(bytes(PAD_BYTES) if pad else b""))
        return _checked(peer, LOAD.name, report_of, reply)

    async def lend(self, peer: PeerRef, want: int, have: int | None = None, hosts: int = 1) -> Loan:
        """LEND: ask ``peer`` for up to ``want`` of its queued tasks, to crawl on its behalf
        (``protocol.loans``); lease 0 when it has nothing to spare. ``have``: our own
        backlog, when we ask because we are behind rather than idle; ``hosts``: loans an
        idle asker takes at once (the first loan's ``more`` holds the others)."""
        reply = await self.call(peer, LEND, LendArgs(want, have or 0, hosts))
        return _checked(peer, LEND.name, loan_of, reply)

    async def give_back(
        self, peer: PeerRef, reports: Sequence[GiveBack]
    ) -> list[tuple[bool, bool]]:
        """GIVE_BACK: for leases of ``peer``, which tasks were finished (``done``) or are
        returned unfetched (``back``); ``final`` ends a lease. Answers (known, recall) per
        report: known False if ``peer`` no longer knows the lease (it lapsed or was taken
        back); recall True if it wants the rest back (it is leaving). Reports share
        requests up to ``MAX_REPORTS`` leases and ``MAX_FPS`` fingerprints; a longer one
        is cut into parts, sent in order, only the last of them final."""
        answers = [(True, False)] * len(reports)
        call: list[tuple[int, GiveBack]] = []
        room = MAX_FPS

        async def send() -> None:
            reply = await self.call(peer, GIVE_BACK, report_args([part for _, part in call]))
            got = _checked(peer, GIVE_BACK.name, answers_of, reply, len(call))
            for (i, _), (known, recall) in zip(call, got, strict=True):
                answers[i] = (answers[i][0] and known, answers[i][1] or recall)
            call.clear()

        for i, report in enumerate(reports):
            done, back = list(report.done), list(report.back)
            while True:
                if room == 0 or len(call) == MAX_REPORTS or (call and call[-1][0] == i):
                    await send()
                    room = MAX_FPS
                d = done[:room]
                b = back[: room - len(d)]
                done, back = done[len(d) :], back[len(b) :]
                last = not done and not back
                call.append((i, GiveBack(report.lease, d, b, report.final and last)))
                room -= len(d) + len(b)
                if last:
                    break
        if call:
            await send()
        return answers

    async def goodbye(self, peer: PeerRef) -> None:
        """GOODBYE (graceful leave): ``peer`` drops us from its routing table at once, or
        once a ping finds us gone (``rpc``): from now on we answer pings with an error."""
        self._rpc.departing = True
        await self._rpc.request(peer, GOODBYE, NoArgs())

    async def ping_peer(self, peer: PeerRef) -> bytes:
        """The ID that answers at ``peer.addr``. If it differs from ``peer.id``, the routing
        table has already replaced the old contact (a restart with a new ID)."""
        ok, node_id = await self._rpc.call_ping(Node(peer.id, peer.host, peer.port))
        if not ok:
            raise PeerTimeout(peer, peer.addr, "ping")
        answered: bytes = node_id
        return answered

    async def _chunked(self, peer: PeerRef, proc: Procedure[A, R], arglists: list[A]) -> list[R]:
        """One request per chunk, ``CHUNK_WINDOW`` in flight; waits for all of them.

        Liveness counts once per operation: a burst that loses some datagrams to a full socket
        buffer is not several strikes against a live peer.
        """
        proto = self._rpc
        if len(arglists) == 1:  # the common small call: no window, no extra tasks
            return [await self.call(peer, proc, arglists[0])]
        window = asyncio.Semaphore(CHUNK_WINDOW)

        async def one(args: A) -> R:
            async with window:
                return await proto.request(peer, proc, args, record=False)

        results = await asyncio.gather(*(one(a) for a in arglists), return_exceptions=True)
        node = Node(peer.id, peer.host, peer.port)
        if results and all(isinstance(r, PeerTimeout) for r in results):
            proto.contacts.contact_failed(node)
        elif results:
            proto.contacts.welcome_if_new(node)
        for kind in (PeerTimeout, RemoteError, BaseException):
            for r in results:
                if isinstance(r, kind):
                    raise r
        return [r for r in results if not isinstance(r, BaseException)]


def _checked(peer: PeerRef, rpc: str, convert: Callable[..., T], reply: Any, *extra: Any) -> T:
    """What ``convert`` makes of a checked reply; a rule it breaks is a RemoteError too."""
    try:
        return convert(reply, *extra)
    except MessageError as exc:
        raise RemoteError(peer, rpc, f"malformed reply: {exc}") from None
