"""Routing discovered URLs to their owners: key -> FIND_NODE -> STORE_TASK.

The flow of "Distributed Crawler Based on the Improved Kademlia Protocol", §2.3.

Links for the same owner are gathered for a few milliseconds and sent as one batched
STORE_TASK, so a page's ~50 links cost one message per owner, not one per URL. A caller's
``route`` returns only when every task is durably accepted somewhere: by its owner, or,
when the owner cannot be reached after several tries, by this peer, because crawling a
URL in the wrong place is better than losing it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from p2pcrawl.aio import Coalescer, Memo, backoff_delay
from p2pcrawl.crawl import Task
from p2pcrawl.network.known import KnownAtOwners
from p2pcrawl.network.ports import StoreTask, to_batches
from protocol import PeerRef, PeerTimeout, RemoteError, StoreResult, TaskSet

__all__ = ["STATUS_FIELDS", "Dispatcher", "Owners"]

log = logging.getLogger(__name__)

# How long to keep re-routing a URL whose owner does not answer before crawling it here.
# It must outlast failure detection (failures x (ping interval + RPC timeout)): until the
# dead owner is evicted every lookup names it again, and crawling its hosts here meanwhile
# would fetch pages that its successor fetches too.
GIVE_UP_AFTER_S = 120.0
RETRY_DELAY_S = 0.1  # the first re-route waits this, each next one twice the last
MAX_RETRY_DELAY_S = 2.0
# An owner whose last STALE_AFTER batches from us were all links it had already is sent to
# less often while this peer has a backlog: the spacing doubles per such batch up to
# PATIENT_FLUSH_S. Past a crawl's first seconds most cross-host links are to hosts every
# peer keeps finding (roots, navigation), and each batch of them cost both peers an RPC for
# nothing: 0.78 STORE_TASKs per page at 8 peers, at about one URL each (cluster benchmark).
# A batch the owner finds anything new in brings the spacing straight back, and so does an
# empty backlog, when a page's links decide how soon the crawl ends, and so do page tails
# filling their slots (a page waits for its links' owners, and a fast link must not be held
# to slots-per-wait pages a second): ``patience.Patience`` says when links may wait.
STALE_AFTER = 2
PATIENT_FLUSH_S = 0.8
# While the page tails gate the crawl (every pipeline ticket held: ``crawl.pipeline``), a
# batch leaves as soon as the one before it to that owner is answered, not after
# ``flush_s``: each tail waits for its links' owners, so the spacing would set the pages a
# second. A new owner of a big host sends each cross-host link once before its seen-cache
# knows it, and its tails waited 100-150 ms on the spacing: 24 tickets gave 150-200 pages
# a second for seconds after every change of hands (4,638 pages at 450-600 a second at an
# owner that had the host from the start). One batch in flight per owner still batches:
# what arrives during a round trip leaves in the next.
MAX_STALE_OWNERS = 4096  # owners whose streak is remembered (one per peer in practice)
# The status API's "dispatch" section (``Dispatcher.status``).
STATUS_FIELDS = ("store_tasks", "urls_sent", "skipped_known", "learned_known")


class Owners(Protocol):
    """Who owns a key, the network's one answer and its cache (``CrawlNode.owner``)."""

    @property
    def me(self) -> PeerRef: ...

    async def owner(self, key: bytes, *, fresh: bool = False) -> PeerRef: ...

    def forget_owner(self, key: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class _Item:
    """One task in an owner's outbox, with the routing history of the call that sent it."""

    task: Task
    attempt: int
    first_try: float


class Dispatcher:
    def __init__(
        self,
        owners: Owners,
        send: StoreTask,
        *,
        intake: Callable[[list[Task]], Awaitable[object]],
        batch: int = 256,
        flush_s: float = 0.2,
        patient: Callable[[], bool] = lambda: False,
        gone: Callable[[bytes], bool] = lambda peer_id: False,
        rushed: Callable[[], bool] = lambda: False,
    ) -> None:
        """``send``: STORE_TASK (``CrawlNode.store_task``); ``intake``: tasks this peer owns
        (``Intake.accept``); ``patient``: whether links may wait longer now; ``gone``:
        whether a peer left the table since (``Roster.gone``); ``rushed``: whether the page
        tails gate the crawl now (``Pipeline.gating``), when no batch waits out a spacing."""
        self.owners = owners
        self._send_to = send
        self.intake = intake
        self.batch = batch
        self.flush_s = flush_s
        # Whether links may wait longer than ``flush_s`` now (this peer has a backlog).
        self._patient = patient
        self._gone = gone
        self._rushed = rushed
        # Per owner: how many batches in a row it already had every link of.
        self._stale: Memo[PeerRef, int] = Memo(MAX_STALE_OWNERS)
        # Links each owner told us it holds (its STORE_TASK answers): not sent again.
        self.known = KnownAtOwners()
        # One outbox per owner: a link for an owner not written to for ``flush_s`` leaves at
        # once; otherwise links gather until then (or until ``batch`` wait) and leave as one
        # STORE_TASK. Each flush answers, per task, the retry that carries it on if the
        # owner refused or did not answer.
        self._outboxes: Coalescer[PeerRef, _Item, asyncio.Task[None] | None] = Coalescer(
            self._send,
            spacing=flush_s,
            spacing_of=self.spacing,
            max_items=batch,
            name="dispatch",
        )
        # Re-routes outlive the call that started them, as the outbox's flushes do.
        self._retries = TaskSet("dispatch-retry")
        self.sent_rpcs = 0
        self.sent_urls = 0
        self.rerouted = 0
        self.fallback_local = 0

    def status(self) -> dict[str, int]:
        """Links sent to their owners, and those not sent because the owner holds them."""
        counts = (self.sent_rpcs, self.sent_urls, self.known.skipped, self.known.learned)
        return dict(zip(STATUS_FIELDS, counts, strict=True))

    def owners_changed(self) -> None:
        """Membership changed: what owners told us they hold, and how stale our batches to
        them were, may no longer hold (the node forgets its cached owners itself)."""
        self._stale.clear()
        self.known.forget()

    # -- routing ---------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """URLs waiting in an outbox or in a STORE_TASK under way."""
        return self._outboxes.pending

    @property
    def in_transit(self) -> int:
        return self._outboxes.in_flush

    async def route(
        self,
        tasks: list[Task],
        *,
        attempt: int = 0,
        first_try: float | None = None,
        urgent: bytes | None = None,
        found: bool = False,
    ) -> None:
        """Returns once every task is durably accepted by its owner (or, in the end, here).
        A batch holding a task of the key ``urgent`` leaves without waiting for its spacing.
        ``found``: links found on a page; one whose owner told us it holds it is not sent
        (``network.known``). Seeds (``--recrawl``), take-overs and re-sends always are."""
        if not tasks:
            return
        groups: dict[PeerRef, list[Task]] = defaultdict(list)
        me = self.owners.me
        known = self.known
        fresh = attempt > 0
        # Asked once per key of the call: a page's links are mostly to a few hosts.
        owners: dict[bytes, PeerRef] = {}
        for t in tasks:
            owner = owners.get(t.key)
            if owner is None:
                # From the routing table while it knows the whole network, with an iterative
                # FIND_NODE otherwise (Kademlia §2.3), this node compared too.
                owner = owners[t.key] = await self.owners.owner(t.key, fresh=fresh)
            if found and owner != me and known.holds(owner.id, t.fp):
                known.skipped += 1
                continue
            groups[owner].append(t)
        waits: list[Awaitable[object]] = []
        local = groups.pop(me, None)
        if local:
            waits.append(self.intake(local))
        started = time.monotonic() if first_try is None else first_try
        for owner, ts in groups.items():
            items = [_Item(t, attempt, started) for t in ts]
            hurry = urgent is not None and any(t.key == urgent for t in ts)
            waits.append(self._to_owner(owner, items, hurry))
        await asyncio.gather(*waits)

    def hurry(self) -> None:
        """Every outbox waiting out its spacing sends now."""
        self._outboxes.kick()

    def spacing(self, owner: PeerRef) -> float:
        """How far apart batches to ``owner`` leave now (``STALE_AFTER``; none while
        ``rushed``: one batch in flight, the next as soon as it is answered)."""
        if self._rushed():
            return 0.0
        stale = self._stale.get(owner, 0)
        if stale < STALE_AFTER or not self._patient():
            return self.flush_s
        stretched = self.flush_s * 2.0 ** (stale - STALE_AFTER + 1)
        return max(self.flush_s, min(stretched, PATIENT_FLUSH_S))

    def _heard(self, owner: PeerRef, result: StoreResult | None) -> None:
        if result is not None and result.new == 0 and not result.refused_keys:
            self._stale.remember(owner, min(self._stale.get(owner, 0) + 1, 64))
        else:
            self._stale.pop(owner, None)

    async def _to_owner(self, owner: PeerRef, items: list[_Item], urgent: bool = False) -> None:
        retries = {
            r for r in await self._outboxes.submit(owner, items, urgent=urgent) if r is not None
        }
        if retries:
            # shield: like the outbox's flush, a re-route goes on if this caller is cancelled.
            await asyncio.gather(*(asyncio.shield(r) for r in retries))

    async def _send(self, owner: PeerRef, items: list[_Item]) -> list[asyncio.Task[None] | None]:
        tasks = [it.task for it in items]
        result: StoreResult | None = None
        if self._gone(owner.id):
            # Dead or gone since these were queued: re-routed now, not after a timeout.
            result = StoreResult(0, 0, list({t.key for t in tasks}))
        else:
            try:
                # The owner copies what is new to it to its replicas before it answers
                # (``Replication.copy_new``), so once this returns the copies are there too.
                result = await self._send_to(owner, to_batches(tasks))
                self.sent_rpcs += 1
                self.sent_urls += len(tasks)
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.info("STORE_TASK to %s failed (%s); re-routing %d URLs", owner, exc, len(tasks))
        self._heard(owner, result)
        if result is not None and result.known:
            self.known.learn(owner.id, result.known)
        if result is not None and not result.refused_keys:
            return [None] * len(items)
        refused = set(result.refused_keys) if result is not None else None
        for key in {t.key for t in tasks} if refused is None else refused:
            self.owners.forget_owner(key)
        # One re-route per routing history, as each ``route`` call keeps its own back-off.
        again: dict[tuple[int, float], list[Task]] = defaultdict(list)
        for it in items:
            if refused is None or it.task.key in refused:
                again[(it.attempt, it.first_try)].append(it.task)
        if again and self._retries.closed:
            # Shutting down: nothing will carry these on, so no caller may take them as sent.
            raise RuntimeError("dispatcher closed with URLs left to re-route")
        retry: dict[tuple[int, float], asyncio.Task[None] | None] = {}
        for (attempt, first_try), ts in again.items():
            self.rerouted += len(ts)
            retry[(attempt, first_try)] = self._retries.spawn(
                self._reroute(ts, attempt, first_try), "reroute"
            )
        return [
            retry.get((it.attempt, it.first_try))
            if refused is None or it.task.key in refused
            else None
            for it in items
        ]

    async def _reroute(self, tasks: list[Task], attempt: int, first_try: float) -> None:
        if time.monotonic() - first_try > GIVE_UP_AFTER_S:
            self.fallback_local += len(tasks)
            await self.intake(tasks)
        else:
            await asyncio.sleep(backoff_delay(attempt + 1, RETRY_DELAY_S, MAX_RETRY_DELAY_S))
            await self.route(tasks, attempt=attempt + 1, first_try=first_try)

    async def flush(self) -> None:
        """Send everything queued now, re-routes included (used before leaving)."""
        while self._outboxes.pending or len(self._retries):
            await self._outboxes.drain()
            await self._retries.join()

    async def aclose(self) -> None:
        await self._retries.aclose()
        await self._outboxes.aclose(timeout=0.0)
