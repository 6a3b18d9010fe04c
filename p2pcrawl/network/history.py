"""Continuous mode's visit history travels with its key (docs/freshness.md, "When keys move").

A page's row in the visit history (its validators, its change estimate, when it is due) lives
with the key's owner, who alone revisits it. Three ways a key changes hands, and how its rows
follow:

* a join or a rebalance: once the key's tasks and done range reached the new owner
  (``Handoff``), its rows go too (STORE_HISTORY) and leave this peer, unless it stays a
  replica of the key; the new owner sends its replicas the rows it took as those it writes;
* a graceful leave: after the tasks, every row goes to the key's closest remaining peer;
* a crash: nobody sends anything then, so the owner keeps its replicas (the r peers next to
  the key) supplied as it goes: the rows written since the last round go to them every
  ``SYNC_S`` (or the shortest revisit interval, if shorter). A replica keeps the copies in
  its own visit history, where its scheduler passes over rows of keys it does not own; the
  day it owns the key they are its schedule.

Rows are a claim that pages were visited, and a forged one could stop a page's revisits (a
due time years ahead, a later visit that wins every merge), so a peer takes a key's rows only
from a sender whose done claims for that key it would take (``Claims.believes``; in an open
network: a proven, established member among the key's ``replicas + 2`` nearest, in a signed
request). Other rows are dropped and counted (``refused_rows``, and in ``/metrics``): this
peer keeps the row it had, so a refused row can make no page due later. A row taken is first
made one this peer's own schedule could have written (``bounded``), and never makes a page
due later than it was here (``VisitStore.merge``): a member that lies, however often, holds
off no revisit.

What may be lost is bounded and errs early: a replica's copy is at most one round old, and a
page whose newer row it never heard of is revisited at the older row's due time (a revisit
answered 304, most likely). A row costs about 94 bytes on the wire, compressed, for URLs of
40-90 characters (benchmarks/revisit.py measures it).

STORE_HISTORY ``[sender, payload]`` -> ``{n}``: ``payload`` is a zlib-compressed
``storage.pack_visits`` batch that fits one datagram; ``n`` the rows new to the receiver. A
peer not in continuous mode takes none (``n`` = 0). The receiver keeps, of two rows of one
URL, the one of the later visit (``VisitStore.merge``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

from msgspec import Meta

from p2pcrawl.aio import every
from p2pcrawl.crawl import Revisits
from p2pcrawl.network.ports import Ownership
from protocol import (
    Args,
    MessageError,
    PeerRef,
    PeerTimeout,
    Procedure,
    RemoteError,
    Reply,
    distance,
)
from storage import Visit, pack_visits, unpack_visits

__all__ = ["STORE_HISTORY", "HistoryLane", "history_chunks", "read_history_chunk"]

log = logging.getLogger(__name__)

# A payload and its request's framing fit one rpcudp request (8 KiB).
PAYLOAD_LIMIT = 7 * 1024
SYNC_S = 5.0  # how often the rows written since go to the replicas
MAX_INFLATED = 1 << 20  # a chunk inflates to at most this many bytes
_ROW_GUESS = 64  # bytes a row costs besides its URL and ETag, packed, before compression


class HistoryArgs(Args):
    payload: Annotated[bytes, Meta(max_length=PAYLOAD_LIMIT)]


class HistoryReply(Reply):
    n: Annotated[int, Meta(ge=0)]


STORE_HISTORY = Procedure("store_history", HistoryArgs, HistoryReply)

Call = Callable[
    [PeerRef, Procedure[HistoryArgs, HistoryReply], HistoryArgs], Awaitable[HistoryReply]
]


def history_chunks(rows: Sequence[Visit], limit: int = PAYLOAD_LIMIT) -> list[bytes]:
    """``rows`` as compressed batches of at most ``limit`` bytes each. A batch that comes out
    too big is halved until it fits (URLs compress several-fold, so the guess starts at
    three times the limit of packed bytes)."""
    out: list[bytes] = []
    batch: list[Visit] = []
    size = 0
    for row in rows:
        batch.append(row)
        size += len(row.url) + len(row.etag) + _ROW_GUESS
        if size >= 3 * limit:
            out += _fit(batch, limit)
            batch, size = [], 0
    if batch:
        out += _fit(batch, limit)
    return out


def _fit(rows: list[Visit], limit: int) -> list[bytes]:
    data = zlib.compress(pack_visits(rows), 6)
    if len(data) <= limit:
        return [data]
    if len(rows) == 1:
        log.warning("a visit history row too large to send: %s", rows[0].url[:200])
        return []
    half = len(rows) // 2
    return _fit(rows[:half], limit) + _fit(rows[half:], limit)


def read_history_chunk(payload: bytes) -> list[Visit]:
    """The rows of one STORE_HISTORY payload; MessageError for anything else."""
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(payload, MAX_INFLATED)
        if inflate.unconsumed_tail or inflate.unused_data or not inflate.eof:
            raise ValueError("not one whole zlib stream within the bound")
        return unpack_visits(data)
    except (zlib.error, ValueError) as exc:
        raise MessageError(f"store_history: {exc}") from exc


def bounded(rows: Sequence[Visit], now: int, high: int) -> list[Visit]:
    """``rows`` from another peer as this peer's schedule could have written them (``now``
    Unix ms, ``high`` its longest revisit interval): visited no later than now, with an
    interval of at most ``high``, due at most ``high`` from now. An honest row passes as it
    is, up to the clocks' difference; a forged one cannot hold a page off for years, nor win
    every later merge with a visit in the future (``VisitStore.merge``)."""
    out: list[Visit] = []
    for v in rows:
        if v.fetched > now or v.interval > high or v.due > now + high:
            v = dataclasses.replace(
                v,
                fetched=min(v.fetched, now),
                interval=min(v.interval, high),
                due=min(v.due, now + high),
            )
        out.append(v)
    return out


class HistoryLane:
    """Sends and takes visit history rows (STORE_HISTORY) for one peer."""

    def __init__(
        self,
        revisits: Revisits | None,
        ownership: Ownership,
        call: Call,
        *,
        replicas: int,
        me: Callable[[], bytes],
        believes: Callable[[bytes, bytes], bool] = lambda sender, key: True,
    ) -> None:
        """``revisits``: the engine's revisit side (None: not in continuous mode, and this
        lane only refuses); ``call``: the crawl RPC (``CrawlNode.call``); ``replicas``: r;
        ``believes``: whether a sender's rows of a key are taken (``Claims.believes``)."""
        self.revisits = revisits
        self._believes = believes
        self.ownership = ownership
        self._call = call
        self.replicas = replicas
        self._me = me
        self.sent_rows = 0
        self.sent_bytes = 0
        self.received_rows = 0
        self.refused_rows = 0  # rows from a sender whose word about their key is not taken
        # A round per shortest revisit interval, at most SYNC_S apart.
        self.sync_s = SYNC_S
        if revisits is not None:
            revisits.owns = self.owns
            revisits.dirty = {}
            self.sync_s = min(SYNC_S, revisits.bounds.low / 1000)

    def owns(self, key: bytes) -> bool:
        found = self.ownership.closest_local(key, 1)
        return not found or found[0].id == self._me()

    # -- receiving -------------------------------------------------------------------------

    async def serve(self, sender: PeerRef, args: HistoryArgs, attested: bool) -> HistoryReply:
        """``attested``: the request speaks for ``sender`` (``CrawlNode.serve_claims``)."""
        rows = read_history_chunk(args.payload)
        if self.revisits is None or self.revisits.store is None:
            return HistoryReply(n=0)
        self.received_rows += len(rows)
        believed: dict[bytes, bool] = {}
        taken = [
            v
            for v in rows
            if attested and believed.setdefault(v.key, self._believes(sender.id, v.key))
        ]
        self.refused_rows += len(rows) - len(taken)
        if not taken:
            return HistoryReply(n=0)
        now, high = int(time.time() * 1000), self.revisits.bounds.high
        taken = bounded(taken, now, high)
        new = await self.revisits.merge(taken)
        if new:
            # A key handed to us (joining, we are its owner-to-be): our replicas hear of its
            # rows in the next round, as of those we write. Copies of others' keys are not
            # sent on; nor is a batch with nothing new, so two peers that both think they
            # own a key for a moment do not send it back and forth.
            me, closest = self._me(), self.ownership.closest_local
            self.revisits.note_dirty(
                [v for v in taken if closest(v.key, 1, with_self=True)[0].id == me]
            )
        return HistoryReply(n=new)

    # -- sending ---------------------------------------------------------------------------

    async def send(self, peer: PeerRef, rows: Sequence[Visit]) -> None:
        """``rows`` to ``peer``; PeerTimeout, RemoteError or OSError if a chunk failed."""
        for chunk in history_chunks(rows):
            await self._call(peer, STORE_HISTORY, HistoryArgs(chunk))
            self.sent_bytes += len(chunk)
        self.sent_rows += len(rows)

    async def hand_keys(
        self, owner: PeerRef, keys: Sequence[bytes], *, leaving: bool = False
    ) -> bool:
        """The rows of ``keys`` to their new ``owner``. Once it has them they leave this
        peer, unless it stays one of the keys' replicas (a join next to it): then they are
        its copies from the start, since the new owner's rounds send only the rows it
        writes or takes, and a crash before its first round would leave the host with no
        history anywhere. False if the send failed (the rows stay here, out of the
        scheduler's way)."""
        store = self.revisits.store if self.revisits is not None else None
        if store is None or not keys:
            return True
        rows = await store.visits_for_keys(keys)
        if not rows:
            return True
        try:
            await self.send(owner, rows)
        except (PeerTimeout, RemoteError, OSError) as exc:
            log.warning("visit history of %d keys to %s failed: %s", len(keys), owner, exc)
            return False
        me = self._me()
        await store.take_keys(
            [
                k
                for k in keys
                if leaving
                or all(p.id != me for p in self.ownership.closest_local(k, self.replicas + 1))
            ]
        )
        return True

    async def hand_all(self, others: Sequence[PeerRef]) -> int:
        """A graceful leave: every row to its key's closest peer among ``others``; returns
        the rows that went."""
        store = self.revisits.store if self.revisits is not None else None
        if store is None or not others:
            return 0
        by_owner: dict[PeerRef, list[bytes]] = defaultdict(list)
        for key in await store.keys():
            by_owner[min(others, key=lambda p: distance(p.id, key))].append(key)
        before = self.sent_rows
        for owner, keys in by_owner.items():
            await self.hand_keys(owner, keys, leaving=True)
        return self.sent_rows - before

    async def run(self) -> None:
        """Owned by the peer: the rows written since the last round to their replicas."""
        await every(self.sync_s, self.sync)

    async def sync(self) -> None:
        if self.revisits is None:
            return
        rows = self.revisits.take_dirty()
        me = self._me()
        by_peer: dict[PeerRef, list[Visit]] = defaultdict(list)
        for row in rows:
            for peer in self.ownership.closest_local(row.key, self.replicas + 1):
                if peer.id != me:
                    by_peer[peer].append(row)
        for peer, batch in by_peer.items():
            try:
                await self.send(peer, batch)
            except (PeerTimeout, RemoteError, OSError) as exc:
                # Its copy stays older: the page is revisited early if that peer takes over.
                log.debug("visit history to replica %s failed: %s", peer, exc)

    def status(self) -> dict[str, int]:
        return {
            "sent_rows": self.sent_rows,
            "sent_bytes": self.sent_bytes,
            "received_rows": self.received_rows,
            "refused_rows": self.refused_rows,
        }
