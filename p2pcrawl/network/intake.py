"""Taking tasks this peer owns: dedup, store, copy to the replicas, then crawl.

Everything this peer comes to own passes here: links routed to it (STORE_TASK), its own
discoveries of its own keys (the dispatcher's local share), a neighbour's handoff with its
done history, seeds. A task is new when it is neither done nor queued (``Ledger.accept``);
only new ones are copied to the replicas, and the copies are held before ``accept`` returns
(docs/membership.md, "Who writes the replicas").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from p2pcrawl.crawl import Ledger, Task
from p2pcrawl.network.known import Advertised

__all__ = ["AcceptTasks", "Copies", "Intake", "IntakeCrawl"]


class AcceptTasks(Protocol):
    """``Intake.accept``."""

    def __call__(
        self,
        tasks: list[Task],
        done: dict[bytes, list[int]] | None = None,
        *,
        routed: bool = False,
        again: bool = False,
    ) -> Awaitable[int]: ...


class Copies(Protocol):
    """The owner's side of replication (``replication.Replication``)."""

    def fresh(self, tasks: Sequence[Task], exclude: Iterable[bytes] = ()) -> set[bytes]: ...

    def arrived(self, keys: Iterable[bytes]) -> None: ...

    async def finished(self, tasks: list[Task], *, hurry: bool = False) -> None: ...

    async def copy_new(
        self,
        tasks: Sequence[Task],
        *,
        fresh: Iterable[bytes] = (),
        late: Callable[[list[Task]], Awaitable[None]] | None = None,
    ) -> list[Task] | None: ...

    async def store_backups(
        self, tasks: Sequence[Task], *, fresh: Iterable[bytes] = (), hurry: bool = False
    ) -> list[Task]: ...


class IntakeCrawl(Protocol):
    """What intake asks of our crawler (``crawl.Engine``)."""

    def exclude_keys(self, keys: Iterable[bytes]) -> list[Task]: ...

    def include_keys(self, keys: Iterable[bytes]) -> None: ...

    def wake(self) -> None: ...


class Intake:
    def __init__(
        self, ledger: Ledger, copies: Copies, crawl: IntakeCrawl, advertised: Advertised
    ) -> None:
        """``advertised``: links routed here that were new, told to the other senders."""
        self.ledger = ledger
        self.copies = copies
        self.crawl = crawl
        self.advertised = advertised
        self.learned_done = 0  # tasks the replicas knew as done: recorded, not fetched here
        # Keys whose first copies were answered late, and how many such answers each awaits:
        # neither fetched nor lent until then.
        self._parked: dict[bytes, int] = {}
        self.parked_late = 0  # keys parked so, in all

    async def accept(
        self,
        tasks: list[Task],
        done: dict[bytes, list[int]] | None = None,
        *,
        routed: bool = False,
        again: bool = False,
    ) -> int:
        """Accept tasks this peer owns: dedup, store, and copy the new ones to the replicas
        before returning; returns how many were new. Tasks ``routed`` here by STORE_TASK
        wait for their copies at most ``Replication.copy_wait_s`` (the handler's caller has
        a deadline); the replica set follower fills any gap in the background.

        A key changes owner only with its history. The tasks of a key this peer holds
        nothing of (no task, no done page: a new host, or a key whose owner died before
        its replicas handed its history on, or that this peer never knew of) are copied to
        the replicas *before* they are queued here, and the replicas' answer names those
        they know as done (a replica records every finished page of the keys it copies):
        those are recorded done, not queued. A new host costs its first copies' round
        trip before it is crawled, which it paid before as well. Not so for tasks queued
        ``again`` (``--recrawl``): this peer forgot them as done on purpose, and the
        replicas' older record of them must not finish them unfetched."""
        ledger = self.ledger
        if done:
            pairs = [(k, fp) for k, fps in done.items() for fp in fps]
            await ledger.done.add(pairs)
            # Tasks queued here before the history arrived (a restart) are finished already.
            if await ledger.drop_done([fp for _, fp in pairs]):
                finished = [Task("", fp, k, 0) for k, fp in pairs]
                await self.copies.finished(finished, hurry=routed)  # a sender waits
        fresh = self.copies.fresh(tasks, exclude=done or ())
        first = [t for t in tasks if t.key in fresh]
        try:
            if first:
                if routed:
                    keys = {t.key for t in first}
                    late = self._answered(keys, again)
                    known = await self.copies.copy_new(first, fresh=fresh, late=late)
                    if known is None:
                        self._park(keys)
                else:
                    known = await self.copies.store_backups(first, fresh=fresh)
                if known and not again:
                    await self._learned(known)
                    gone = {t.fp for t in known}
                    tasks = [t for t in tasks if t.fp not in gone]
            new = await ledger.accept(tasks)
        finally:
            if fresh:
                self.copies.arrived(fresh)
        if new:
            self.crawl.include_keys({t.key for t in new if t.key not in self._parked})
            # Copied already: the tasks of keys new here. A key that came with a done
            # range: the copies do not carry it, the follower does.
            rest = [t for t in new if t.key not in fresh]
            if routed:
                if rest:
                    await self.copies.copy_new(rest)
                # Held as the answer says they are: the other senders may skip them now.
                self.advertised.add(t.fp for t in new)
            elif rest:
                await self.copies.store_backups(rest)
            self.crawl.wake()
        return len(new)

    def _park(self, keys: set[bytes]) -> None:
        """The replicas' answer to these keys' first copies is late, and it may name pages
        done elsewhere (a handoff's sender was slow, and it is one of them): until it comes,
        nothing of them is fetched or lent."""
        self.parked_late += len(keys)
        for key in keys:
            self._parked[key] = self._parked.get(key, 0) + 1
        self.crawl.exclude_keys(keys)

    def _answered(self, keys: set[bytes], again: bool) -> Callable[[list[Task]], Awaitable[None]]:
        async def answered(known: list[Task]) -> None:
            if known and not again:
                await self._learned(known)
            free = []
            for key in keys & self._parked.keys():
                self._parked[key] -= 1
                if not self._parked[key]:
                    del self._parked[key]
                    free.append(key)
            if free:
                # The refill's cursor went past their rows while they were parked: they are
                # queued again, after it.
                tasks = await self.ledger.take_keys(free)
                self.crawl.include_keys(free)
                await self.ledger.accept(tasks)
                self.crawl.wake()

        return answered

    async def _learned(self, known: list[Task]) -> None:
        """The replicas knew these as done: done here too (dropped if queued meanwhile),
        and the other replicas, which were sent copies of them, hear it."""
        await self.ledger.done.add([(t.key, t.fp) for t in known])
        await self.ledger.drop_done([t.fp for t in known])
        self.learned_done += len(known)
        await self.copies.finished(known)

    async def keep_history(self, done: dict[bytes, list[int]]) -> None:
        """Done history of keys this peer owns, with no task."""
        await self.accept([], done)
