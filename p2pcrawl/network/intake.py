"""Taking tasks this peer owns: dedup, store, copy to the replicas, then crawl.

Everything this peer comes to own passes here: links routed to it (STORE_TASK), its own
discoveries of its own keys (the dispatcher's local share), a neighbour's handoff with its
done history, seeds. A task is new when it is neither done nor queued (``Ledger.accept``);
only new ones are copied to the replicas, and the copies are held before ``accept`` returns
(docs/membership.md, "Who writes the replicas").
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from typing import Protocol

from p2pcrawl.crawl import Ledger, Task
from p2pcrawl.network.known import Advertised

__all__ = ["AcceptTasks", "Copies", "Intake", "IntakeCrawl"]


class AcceptTasks(Protocol):
    """``Intake.accept``."""

    def __call__(
        self, tasks: list[Task], done: dict[bytes, list[int]] | None = None, *, routed: bool = False
    ) -> Awaitable[int]: ...


class Copies(Protocol):
    """The owner's side of replication (``replication.Replication``)."""

    async def finished(self, tasks: list[Task], *, hurry: bool = False) -> None: ...

    async def copy_new(self, tasks: Sequence[Task], *, exclude: Iterable[bytes] = ()) -> None: ...

    async def store_backups(
        self, tasks: Sequence[Task], *, exclude: Iterable[bytes] = (), hurry: bool = False
    ) -> None: ...


class IntakeCrawl(Protocol):
    """What intake asks of our crawler (``crawl.Engine``)."""

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

    async def accept(
        self,
        tasks: list[Task],
        done: dict[bytes, list[int]] | None = None,
        *,
        routed: bool = False,
    ) -> int:
        """Accept tasks this peer owns: dedup, store, and copy the new ones to the replicas
        before returning; returns how many were new. Tasks ``routed`` here by STORE_TASK
        wait for their copies at most ``Replication.copy_wait_s`` (the handler's caller has
        a deadline); the replica set follower fills any gap in the background."""
        ledger = self.ledger
        if done:
            pairs = [(k, fp) for k, fps in done.items() for fp in fps]
            await ledger.done.add(pairs)
            # Tasks queued here before the history arrived (a restart) are finished already.
            if await ledger.drop_done([fp for _, fp in pairs]):
                finished = [Task("", fp, k, 0) for k, fp in pairs]
                await self.copies.finished(finished, hurry=routed)  # a sender waits
        new = await ledger.accept(tasks)
        if new:
            self.crawl.include_keys({t.key for t in new})
            # A key that came with a done range: the copies do not carry it, the follower does.
            if routed:
                await self.copies.copy_new(new, exclude=done or ())
                # Held as the answer says they are: the other senders may skip them now.
                self.advertised.add(t.fp for t in new)
            else:
                await self.copies.store_backups(new, exclude=done or ())
            self.crawl.wake()
        return len(new)

    async def keep_history(self, done: dict[bytes, list[int]]) -> None:
        """Done history of keys this peer owns, with no task."""
        await self.accept([], done)
