"""Routing discovered URLs to their owners (seed 001: key -> FIND_NODE -> STORE_TASK).

Links for the same owner are gathered for a few milliseconds and sent as one batched
STORE_TASK, so a page's ~50 links cost one message per owner, not one per URL. A caller's
``route`` returns only when every task is durably accepted somewhere: by its owner, or,
when the owner cannot be reached after several tries, by this peer, because crawling a
URL in the wrong place is better than losing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from p2pcrawl.crawl import Task
from protocol import CrawlNode, KeyBatch, PeerRef, PeerTimeout, RemoteError, StoreResult, TaskItem

__all__ = ["Dispatcher", "to_batches"]

log = logging.getLogger(__name__)

# How long to keep re-routing a URL whose owner does not answer before crawling it here.
# It must outlast failure detection (failures x (ping interval + RPC timeout)): until the
# dead owner is evicted every lookup names it again, and crawling its hosts here meanwhile
# would fetch pages that its successor fetches too.
GIVE_UP_AFTER_S = 120.0
MAX_RETRY_DELAY_S = 2.0


def to_batches(tasks: Sequence[Task], done: dict[bytes, list[int]] | None = None) -> list[KeyBatch]:
    by_key: dict[bytes, KeyBatch] = {}
    for t in tasks:
        b = by_key.get(t.key)
        if b is None:
            b = by_key[t.key] = KeyBatch(key=t.key, tasks=[])
        b.tasks.append(TaskItem(url=t.url, depth=t.depth, hops=t.hops))
    for key, fps in (done or {}).items():
        b = by_key.get(key)
        if b is None:
            b = by_key[key] = KeyBatch(key=key, tasks=[])
        b.done.extend(fps)
    return list(by_key.values())


@dataclass(slots=True)
class _Pending:
    tasks: list[Task]
    future: asyncio.Future[None]
    attempt: int = 0
    first_try: float = 0.0


@dataclass(slots=True)
class _Outbox:
    items: list[_Pending] = field(default_factory=list)
    size: int = 0


class Dispatcher:
    def __init__(
        self,
        node: CrawlNode,
        *,
        replicas: int,
        intake: Callable[[list[Task]], Awaitable[object]],
        backup: Callable[[PeerRef, list[Task]], Awaitable[object]] | None = None,
        batch: int = 256,
        flush_s: float = 0.05,
    ) -> None:
        self.node = node
        self.replicas = replicas
        self.intake = intake
        # Copies to the owner's replicas, sent by us alongside STORE_TASK (see _send).
        self.backup = backup
        self.batch = batch
        self.flush_s = flush_s
        self._owners: dict[bytes, PeerRef] = {}
        self._outboxes: dict[PeerRef, _Outbox] = {}
        self._flushers: dict[PeerRef, asyncio.Task[None]] = {}
        self._kick: dict[PeerRef, asyncio.Event] = {}
        self.sent_rpcs = 0
        self.sent_urls = 0
        self.rerouted = 0
        self.fallback_local = 0
        self.in_transit = 0
        self._retries: set[asyncio.Task[None]] = set()

    # -- owner resolution ------------------------------------------------------------------

    def forget_owners(self) -> None:
        """Membership changed: every cached owner may be stale."""
        self._owners.clear()

    async def owner_of(self, key: bytes, *, fresh: bool = False) -> PeerRef:
        """The key's owner: cached per key until membership changes or ``fresh``.

        ``closest`` answers from the routing table while it knows the whole network (fewer
        than k contacts) and runs an iterative FIND_NODE otherwise (Kademlia §2.3); either
        way the local node is compared too, which the library's lookups never do.
        """
        if not fresh:
            hit = self._owners.get(key)
            if hit is not None:
                return hit
        found = await self.node.closest(key, 1)
        owner = found[0] if found else self.node.me
        if len(self._owners) > 200_000:
            self._owners.clear()
        self._owners[key] = owner
        return owner

    async def replicas_of(self, key: bytes) -> list[PeerRef]:
        """The r nodes after the owner (the owner is this peer when it asks)."""
        found = self.node.closest_local(key, self.replicas + 1)
        return [p for p in found if p.id != self.node.me.id][: self.replicas]

    # -- routing ---------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return sum(o.size for o in self._outboxes.values()) + self.in_transit

    async def route(
        self, tasks: list[Task], *, attempt: int = 0, first_try: float | None = None
    ) -> None:
        if not tasks:
            return
        groups: dict[PeerRef, list[Task]] = defaultdict(list)
        me = self.node.me
        for t in tasks:
            owner = await self.owner_of(t.key, fresh=attempt > 0)
            groups[owner].append(t)
        waits: list[Awaitable[object]] = []
        local = groups.pop(me, None)
        if local:
            waits.append(self.intake(local))
        loop = asyncio.get_running_loop()
        for owner, ts in groups.items():
            fut: asyncio.Future[None] = loop.create_future()
            started = time.monotonic() if first_try is None else first_try
            self._enqueue(owner, _Pending(ts, fut, attempt, started))
            waits.append(fut)
        await asyncio.gather(*waits)

    def _enqueue(self, owner: PeerRef, item: _Pending) -> None:
        box = self._outboxes.setdefault(owner, _Outbox())
        box.items.append(item)
        box.size += len(item.tasks)
        kick = self._kick.setdefault(owner, asyncio.Event())
        if box.size >= self.batch:
            kick.set()
        if owner not in self._flushers:
            task = asyncio.ensure_future(self._flush_loop(owner))
            task.set_name(f"dispatch-{owner.short}")
            self._flushers[owner] = task

    async def _flush_loop(self, owner: PeerRef) -> None:
        kick = self._kick[owner]
        try:
            while owner in self._outboxes:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush_s):
                        await kick.wait()
                kick.clear()
                box = self._outboxes.pop(owner)
                await self._send(owner, box.items)
        finally:
            # No await between the loop test and here, so nothing can be queued unseen.
            self._flushers.pop(owner, None)
            self._kick.pop(owner, None)

    async def _send(self, owner: PeerRef, items: list[_Pending]) -> None:
        tasks = [t for it in items for t in it.tasks]
        self.in_transit += len(tasks)
        result: StoreResult | None = None
        try:
            # The discoverer writes the owner and its replicas at once, each with its own
            # deadline: the owner's handler only stores (it never waits on a replica), so a
            # dead replica cannot make a live owner look dead, and once this returns a copy
            # is on the replicas too -- nothing is lost if the owner dies right after its ack.
            store = self.node.store_task(owner, to_batches(tasks))
            if self.backup is not None:
                result, _ = await asyncio.gather(store, self.backup(owner, tasks))
            else:
                result = await store
            self.sent_rpcs += 1
            self.sent_urls += len(tasks)
        except (PeerTimeout, RemoteError, OSError) as exc:
            log.info("STORE_TASK to %s failed (%s); re-routing %d URLs", owner, exc, len(tasks))
        finally:
            self.in_transit -= len(tasks)
        if result is not None and not result.refused_keys:
            for it in items:
                if not it.future.done():
                    it.future.set_result(None)
            return
        refused = set(result.refused_keys) if result is not None else None
        for key in {t.key for t in tasks} if refused is None else refused:
            self._owners.pop(key, None)
        for it in items:
            again = it.tasks if refused is None else [t for t in it.tasks if t.key in refused]
            if not again:
                if not it.future.done():
                    it.future.set_result(None)
                continue
            self.rerouted += len(again)
            self._retry(it, again)

    def _retry(self, it: _Pending, tasks: list[Task]) -> None:
        async def run() -> None:
            try:
                if time.monotonic() - it.first_try > GIVE_UP_AFTER_S:
                    self.fallback_local += len(tasks)
                    await self.intake(tasks)
                else:
                    await asyncio.sleep(min(0.1 * (2 ** min(it.attempt, 8)), MAX_RETRY_DELAY_S))
                    await self.route(tasks, attempt=it.attempt + 1, first_try=it.first_try)
            except BaseException as exc:
                if not it.future.done():
                    it.future.set_exception(exc)
                raise
            if not it.future.done():
                it.future.set_result(None)

        task = asyncio.ensure_future(run())
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def flush(self) -> None:
        """Send everything queued now (used before leaving)."""
        for k in list(self._kick.values()):
            k.set()
        while self._flushers or self._retries:
            await asyncio.gather(*self._flushers.values(), *self._retries, return_exceptions=True)

    async def aclose(self) -> None:
        tasks = [*self._flushers.values(), *self._retries]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for box in self._outboxes.values():
            for it in box.items:
                if not it.future.done():
                    it.future.cancel()
        self._outboxes.clear()
