"""The receiving side of the crawl RPCs on a peer: what it does with what neighbours send.

The node (:mod:`protocol`) checks a datagram's framing and types; this module checks what
only a crawler can: that each URL is canonical and belongs to the key it came with, that
this peer owns the key, and that the URL is inside *this peer's own* scope and depth limit
(a sender's word is not enough: any peer, or anyone in an open network, could otherwise make
it crawl anything). Bad items are dropped and counted (``rejected`` by reason), never stored.

A sender whose *new* tasks outrun ``sender_tasks_per_s`` (beyond a large burst, so a host
handed over whole passes) is answered "busy" once its budget is spent; its dispatcher keeps
the tasks and tries again later, so a flood is slowed down without losing anything a real
peer sent. Only new tasks are charged, after the fact: a retried batch whose tasks are
already here costs nothing, so a batch larger than the burst cannot be refused forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from p2pcrawl.crawl import Task, hops, urls
from p2pcrawl.network.claims import Claims
from p2pcrawl.network.intake import AcceptTasks
from p2pcrawl.network.known import Advertised
from p2pcrawl.network.ports import Ownership, ScopeView
from protocol import Busy, Held, KeyBatch, PeerRef, Rate, RefreshAnswer, SourceLimits, StoreResult

__all__ = ["HandlerCrawl", "Holding", "PeerHandler", "ScopeRefresh"]

SCOPE_REFRESH_GAP_S = 1.0  # at most one DHT scope lookup per second caused by strangers' tasks


class HandlerCrawl(ScopeView, Protocol):
    """What the checks ask of our crawler (``crawl.Engine``): our own scope and limits."""

    def key_of(self, url: str) -> bytes: ...

    def requisite_allowed(self, url: str) -> bool: ...


class ScopeRefresh(Protocol):
    """The network-wide default scope (``scopesync.ScopeSync``)."""

    @property
    def trusted(self) -> bool: ...

    async def refresh(self) -> None: ...


class Holding(Protocol):
    """The replica's side of replication (``replication.Replication``)."""

    async def hold(self, owner: bytes, tasks: Sequence[Task]) -> Held: ...

    async def record_done(self, owner: bytes, done: dict[bytes, list[int]]) -> int: ...

    def note_keys(self, keys: set[bytes]) -> None: ...


class PeerHandler:
    """The crawl RPCs as this peer serves them (``inbox.Inbox`` passes them on)."""

    def __init__(
        self,
        crawl: HandlerCrawl,
        ownership: Ownership,
        *,
        accept: AcceptTasks,
        holding: Holding,
        claims: Claims,
        scope_sync: ScopeRefresh,
        advertised: Advertised,
        is_member: Callable[[bytes], bool],
        expecting: Callable[[bytes], bool],
        serve_refresh: Callable[[PeerRef], Awaitable[RefreshAnswer]],
        taking: Callable[[], bool],
        sender_rate: Rate,
    ) -> None:
        """``accept``: ``Intake.accept``; ``expecting``: whether we asked this sender for our
        keys and wait for them (``Join.expecting``); ``serve_refresh``: REFRESH_TASK
        (``Join.serve_refresh``); ``taking``: whether tasks are taken now (joining or
        active, or leaving while borrowers' pages still settle)."""
        self.crawl = crawl
        self.ownership = ownership
        self._accept = accept
        self.holding = holding
        self.claims = claims
        self.scope_sync = scope_sync
        self.advertised = advertised
        self._is_member = is_member
        self._expecting = expecting
        self._serve_refresh = serve_refresh
        self._taking = taking
        self.malformed = 0  # task items that failed the checks
        self.refused = 0  # keys refused because another peer owns them
        self.rejected: Counter[str] = Counter()  # tasks dropped: "scope", "depth"
        self.busy = 0  # STORE_TASK requests answered "busy"
        self._senders = SourceLimits(sender_rate, max_sources=1024)
        self._scope_refreshed = 0.0
        self._storing = 0  # STORE_TASKs taken and not yet answered
        self._none_storing = asyncio.Event()
        self._none_storing.set()

    def decode(self, batches: list[KeyBatch]) -> dict[bytes, list[Task]]:
        """Tasks by key, checked: canonical URL, key matching the URL. Bad items counted."""
        key_of = self.crawl.key_of
        out: dict[bytes, list[Task]] = {}
        for b in batches:
            tasks = []
            for item in b.tasks:
                url = urls.canonicalize(item.url)
                if url is None or url != item.url or key_of(url) != b.key:
                    self.malformed += 1
                    continue
                tasks.append(Task(url, urls.fingerprint(url), b.key, item.depth, item.hops))
            out[b.key] = tasks
        return out

    async def _within_scope(self, tasks: list[Task]) -> list[Task]:
        """The tasks this peer's own scope and depth limit allow; the rest counted."""
        crawl = self.crawl
        scope = crawl.scope

        def allowed(ts: list[Task]) -> list[Task]:
            # A page requisite has its own scope rule (--requisites) and no depth limit.
            return [
                t
                for t in ts
                if scope.allows_host(urls.hostname_of(t.url))
                or (hops.embeds(t.hops) and crawl.requisite_allowed(t.url))
            ]

        ok = allowed(tasks)
        now = time.monotonic()
        if (
            len(ok) < len(tasks)
            and crawl.scope_from_seeds
            and self.scope_sync.trusted
            and now - self._scope_refreshed >= SCOPE_REFRESH_GAP_S
        ):
            # A seed host this peer has not heard of yet: ask the DHT (trusted) once.
            self._scope_refreshed = now
            await self.scope_sync.refresh()
            ok = allowed(tasks)
        self.rejected["scope"] += len(tasks) - len(ok)
        max_depth = crawl.settings.scope.max_depth
        shallow = [t for t in ok if t.depth <= max_depth or hops.embeds(t.hops)]
        self.rejected["depth"] += len(ok) - len(shallow)
        return shallow

    def _owns(self, key: bytes, *, handed: bool = False) -> bool:
        """Whether this peer is the key's closest node. ``handed``: the sender is a neighbour
        we asked for our keys; while joining we count ourselves the owner of what it hands
        us, and of nothing else (``CrawlNode.hold_ownership``)."""
        found = self.ownership.closest_local(key, 1, with_self=True if handed else None)
        return not found or found[0].id == self.ownership.me.id

    async def stored(self, timeout: float) -> None:
        """Until every STORE_TASK taken so far is stored (at most ``timeout`` seconds): a
        leave that closed the door counts its queue only then."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._none_storing.wait()

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        if not self._taking():
            return StoreResult(new=0, duplicate=0, refused_keys=[b.key for b in batches])
        self._storing += 1
        self._none_storing.clear()
        try:
            return await self._store_task(sender, batches)
        finally:
            self._storing -= 1
            if not self._storing:
                self._none_storing.set()

    async def _store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        by_key = self.decode(batches)
        done = {b.key: b.done for b in batches if b.done}
        handed = self._expecting(sender.id)
        refused = [k for k in by_key if not self._owns(k, handed=handed)]
        offered = [t for k, ts in by_key.items() if k not in refused for t in ts]
        if offered and not self._senders.allow(sender.id, 0.5):  # some budget left?
            self.busy += 1
            raise Busy()
        if any(t.depth == 0 for t in offered):
            # A seed: its peer just widened the scope; links from it must not be dropped.
            await self.scope_sync.refresh()
        mine = await self._within_scope(offered)
        self.refused += len(refused)
        kept = self.claims.taken(
            sender, {k: v for k, v in done.items() if k not in refused}, self.record_done
        )
        # Stored, and what is new copied to the replicas, before the answer: the sender's
        # ack means the copies are held too. The wait for them is bounded well inside the
        # sender's deadline (``Replication.copy_new``).
        new = await self._accept(mine, kept, routed=True)
        self.holding.note_keys({t.key for t in mine} | set(kept))
        self._senders.charge(sender.id, new)
        # What other peers routed here, for a member to not send again (``network.known``).
        known = self.advertised.since(sender.id) if self._is_member(sender.id) else []
        # Rejected tasks count as duplicates: the sender must not re-route them elsewhere.
        return StoreResult(new, len(offered) - new, refused, known)

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> Held:
        done = self._news(sender, owner, {b.key: b.done for b in batches if b.done})
        if done:  # the owner's done range for a key this peer now replicates
            await self.holding.record_done(owner, done)
        decoded = [t for ts in self.decode(batches).values() for t in ts]
        tasks = await self._within_scope(decoded)
        return await self.holding.hold(owner, tasks)

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        taken = self._news(sender, owner, done)
        return await self.holding.record_done(owner, taken) if taken else 0

    def _news(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> dict[bytes, list[int]]:
        """An owner's news to its replica: what of it to record now. News about its own
        tasks, from the owner of their keys as this peer sees it, is not checked: an owner
        could sit on those tasks anyway (docs/security.md, "Own the key"), and news held
        for a check when the owner dies would be fetched again by its successor."""

        async def record(d: dict[bytes, list[int]]) -> int:
            return await self.holding.record_done(owner, d)

        def owns(key: bytes) -> bool:
            found = self.ownership.closest_local(key, 1, with_self=True)
            return bool(found) and found[0].id == sender.id

        own = owner == sender.id and all(owns(k) for k in done)
        return self.claims.taken(sender, done, record, urgent=False, checked=not own)

    async def record_done(self, done: dict[bytes, list[int]]) -> int:
        """A done range handed over, or known on a replica, that passed its check
        (``vouching``): recorded, and the tasks it names dropped from the queue."""
        return await self._accept([], done)

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer:
        return await self._serve_refresh(sender)
