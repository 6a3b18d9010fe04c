"""Keys change hands: a host key's queued tasks and done history go to its new owner, once.

A host must never be crawled by its old owner and its new one at the same time
(docs/membership.md, "Joining"), so a handoff stops crawling the keys, lets their fetches
end, and sends queue and done range to the new owner (STORE_TASK) and its replicas
(STORE_BACKUP). If the send fails, the tasks go back into our store but are *not* crawled
again: the keys stay parked while the handoff is retried, for as long as the receiver is
still their owner. A key's done history alone (``History``) is offered the same way.

Every retry here follows one policy (``Retry``): wait ``RETRY_BASE_S``, doubling up to
``RETRY_CAP_S`` (``HISTORY_RETRY_CAP_S`` for a dead owner's history), until a deadline;
stop early once the receiver no longer owns the keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from p2pcrawl.crawl import Ledger, Task
from p2pcrawl.network.ports import Ownership, StoreTask, owner_id, to_batches
from protocol import Backoff, KeyBatch, PeerRef, PeerTimeout, RemoteError

__all__ = ["RETRY_BASE_S", "RETRY_CAP_S", "Handoff", "HandoffCrawl", "History", "Retry"]

log = logging.getLogger(__name__)

RETRY_BASE_S = 0.25
RETRY_CAP_S = 2.0
# A dead owner's history is offered to its successor at most this far apart while it
# refuses (it has not declared the owner dead yet). It declares within a probe round or two
# of the others (docs/membership.md, "Liveness", rule 6) and takes its own copies over at
# once: if they missed some of the owner's last news (a flood, a late lane), each second the
# history waits can be a second of finished pages fetched again.
HISTORY_RETRY_CAP_S = 0.5

CopyFor = Callable[[PeerRef, Sequence[Task], dict[bytes, list[int]] | None], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Retry:
    """The retry policy: ``base`` seconds, doubling up to ``cap``, while the next wait
    would end within ``within`` seconds of the first try."""

    within: float
    base: float = RETRY_BASE_S
    cap: float = RETRY_CAP_S

    async def until(self, attempt: Callable[[], Awaitable[bool]]) -> bool:
        """Run ``attempt`` until it says it is through (True); False if the deadline came
        first."""
        deadline = time.monotonic() + self.within
        backoff = Backoff(self.base, self.cap)
        while not await attempt():
            delay = backoff.next()
            if time.monotonic() + delay > deadline:
                return False
            await asyncio.sleep(delay)
        return True


class HandoffCrawl(Protocol):
    """What a handoff asks of our crawler (``crawl.Engine``)."""

    keep_proofs: bool  # what we fetched is recorded with a proof (an open network)

    @property
    def in_flight(self) -> Mapping[int, Task]: ...

    def exclude_keys(self, keys: Iterable[bytes]) -> list[Task]: ...

    def include_keys(self, keys: Iterable[bytes]) -> None: ...

    def wake(self) -> None: ...

    async def wait_progress(self, timeout: float) -> None: ...


class Handoff:
    """Handing keys this peer no longer owns to their owner (a join, a rebalance)."""

    def __init__(
        self,
        ledger: Ledger,
        crawl: HandoffCrawl,
        ownership: Ownership,
        *,
        send: StoreTask,
        copy_for: CopyFor,
        revoke: Callable[[set[bytes]], None],
        waiting: Callable[[], AbstractContextManager[None]],
        rebalance_soon: Callable[[], None],
        timeout: float,
        move_history: Callable[[PeerRef, list[bytes]], Awaitable[bool]] | None = None,
    ) -> None:
        """``move_history``: continuous mode's visit history of keys that moved, to their
        new owner (``HistoryLane.hand_keys``);
        ``copy_for``: copies for the new owner's replicas (``Replication.copy_for``);
        ``revoke``: end the leases of keys that move (``Lender.revoke_keys``); ``waiting``:
        held while the handoff waits for our pages (``Patience.waiting``);
        ``rebalance_soon``: keys we could not hand over go to whoever owns them next."""
        self.ledger = ledger
        self.crawl = crawl
        self.ownership = ownership
        self._send = send
        self._copy_for = copy_for
        self._revoke = revoke
        self._waiting = waiting
        self._rebalance_soon = rebalance_soon
        self.timeout = timeout
        self._move_history = move_history
        self.retry = Retry(timeout)
        # One handoff at a time (a join's, a rebalance pass, a leave).
        self.lock = asyncio.Lock()

    async def hand_over(self, owner: PeerRef, keys: list[bytes]) -> int | None:
        """Hand ``keys`` to ``owner`` until it goes through, for as long as ``owner`` is still
        their owner (bounded by the handoff timeout); how many tasks went, or None if it
        never did. Meanwhile the keys stay excluded from our crawl: the owner may already be
        crawling what it was routed, and two crawlers of one host is the duplicate fetch
        this whole dance avoids."""
        sent: int | None = None
        left = list(keys)
        failure: BaseException | None = None

        async def attempt() -> bool:
            nonlocal sent, left, failure
            try:
                sent = await self._hand(owner, left)
                return True
            except (PeerTimeout, RemoteError, OSError) as exc:
                failure = exc
                still = [k for k in left if owner_id(self.ownership, k) == owner.id]
                if not still:
                    self._give_up(owner, left, exc)
                    return True
                log.info("handoff to %s failed (%s); trying again", owner, exc)
                moved_on = set(left) - set(still)
                if moved_on:  # owned by someone else now: ours to crawl or pass on again
                    self._resume(moved_on)
                left = still
                return False

        if not await self.retry.until(attempt):
            self._give_up(owner, left, failure)
        return sent

    def _give_up(self, owner: PeerRef, keys: list[bytes], exc: BaseException | None) -> None:
        log.warning("handoff of %d keys to %s failed: %s", len(keys), owner, exc)
        self._resume(set(keys))

    def _resume(self, keys: set[bytes]) -> None:
        self.crawl.include_keys(keys)
        self.crawl.wake()
        self._rebalance_soon()  # whoever owns them now gets them from the rebalance

    async def _hand(self, owner: PeerRef, keys: list[bytes]) -> int:
        """Stop crawling ``keys``, wait for their fetches, send tasks and done fps to
        ``owner``. On failure the tasks go back into our store, still not crawled."""
        keyset = set(keys)
        crawl = self.crawl
        crawl.exclude_keys(keyset)
        deadline = time.monotonic() + self.timeout
        # Our own fetches only: a borrowed one is its lender's to wait for. Their tails wait
        # on our RPC lanes, which must not be patient now.
        with self._waiting():
            while any(t.key in keyset and not t.lease for t in crawl.in_flight.values()):
                if time.monotonic() > deadline:
                    break
                await crawl.wait_progress(0.2)
        # Not waited for: a borrower's pages may be waiting to route their links to the very
        # keys that move. Their tasks go with the keys; what the borrower finishes of them is
        # forwarded to the new owner as done history (``History.forward``).
        self._revoke(keyset)
        tasks = await self.ledger.take_keys(keys)
        done = await self.done_range(keys)
        try:
            result, _ = await asyncio.gather(
                self._send(owner, to_batches(tasks, done)), self._copy_for(owner, tasks, done)
            )
        except (PeerTimeout, RemoteError, OSError):
            await self.ledger.accept(tasks)  # they stay ours until the owner answers
            raise
        refused = set(result.refused_keys)
        if refused:
            crawl.include_keys(refused)
            await self.ledger.accept([t for t in tasks if t.key in refused])
            crawl.wake()
        if self._move_history is not None:
            await self._move_history(owner, [k for k in keys if k not in refused])
        return len(tasks)

    async def done_range(self, keys: list[bytes]) -> dict[bytes, list[int]]:
        """The done fingerprints of ``keys`` their new owner is handed. In an open network it
        holds them until a sample of them was checked with us (``vouching``), and a drawn
        page we did not fetch ourselves (done on another peer's word: a range handed to us
        before) leaves the whole range unrecorded. So we hand only the pages we fetched;
        the rest is fetched again if its links come back, as the whole range was before.
        Our crawler keeps proofs in an open network only (``keep_proofs``)."""
        return await self.ledger.done.fps_for_keys(keys, proven=self.crawl.keep_proofs)

    async def send_with_copies(
        self, owner: PeerRef, tasks: list[Task], done: dict[bytes, list[int]] | None
    ) -> None:
        """STORE_TASK to ``owner`` and, done range included, to its replicas: the new
        owner's handler copies only the tasks, and if it crashes before its own replication
        pass, its successor still knows what was finished before the key moved."""
        await asyncio.gather(
            self._send(owner, to_batches(tasks, done)), self._copy_for(owner, tasks, done)
        )


class History:
    """A key's done fingerprints to its owner, offered again while it refuses them: it may
    not have declared the key's previous owner dead yet, and a new owner without the
    history fetches finished pages again."""

    def __init__(
        self,
        ledger: Ledger,
        ownership: Ownership,
        *,
        send: StoreTask,
        keep: Callable[[dict[bytes, list[int]]], Awaitable[object]],
        timeout: float,
        done_range: Callable[[list[bytes]], Awaitable[dict[bytes, list[int]]]] | None = None,
    ) -> None:
        """``keep``: record history of keys this peer owns (``Intake.accept``);
        ``done_range``: what of a key's history goes (``Handoff.done_range``; all of it
        without one)."""
        self.ledger = ledger
        self._done_range = done_range or ledger.done.fps_for_keys
        self.ownership = ownership
        self._send = send
        self._keep = keep
        self.retry = Retry(timeout, cap=HISTORY_RETRY_CAP_S)

    async def hand_on(self, owner: PeerRef, keys: list[bytes]) -> None:
        """The done history of ``keys`` to their new ``owner``, while it refuses and still
        owns them (a takeover: the old owner vanished)."""
        left = list(keys)

        async def attempt() -> bool:
            nonlocal left
            done = await self._done_range(left)
            if not any(done.values()):
                return True  # nothing here its owner could take (``Handoff.done_range``)
            try:
                result = await self._send(owner, to_batches([], done))
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.info("history for %d keys to %s failed: %s", len(left), owner, exc)
                return True
            refused = set(result.refused_keys)
            left = [k for k in left if k in refused and owner_id(self.ownership, k) == owner.id]
            return not left

        if not await self.retry.until(attempt):
            log.warning("%s refused the history of %d keys", owner, len(left))

    async def forward(self, key: bytes, fps: list[int], *, within: float, base: float) -> None:
        """Pages of ``key`` finished here on a loan that ended without their report: done
        here, and their history to whoever owns the key now (ourselves, perhaps)."""
        # Fetched and archived here. The key's new owner got these tasks queued with the
        # key, and may lend them to us before this history reaches it (it is offered to the
        # old owner until we count the new one); found in our done record, they are then
        # reported done, not fetched again.
        await self.ledger.done.add([(key, fp) for fp in fps])
        me = self.ownership.me.id

        async def attempt() -> bool:
            found = self.ownership.closest_local(key, 1)
            try:
                if not found or found[0].id == me:
                    await self._keep({key: fps})
                    return True
                result = await self._send(found[0], [KeyBatch(key, [], fps)])
                return not result.refused_keys
            except (PeerTimeout, RemoteError, OSError) as exc:
                to = found[0] if found else "ourselves"
                log.debug("forwarding done history to %s failed: %s", to, exc)
                return False

        await Retry(within, base=base).until(attempt)
