"""A graceful leave: every task, done range and backup goes to its owner, then GOODBYE.

"Distributed Crawler Based on the Improved Kademlia Protocol" (§2.4.2). The order matters:

1. stop fetching, and give back what we hold on loan unstarted; what is under way finishes
   and is reported. Our own lent hosts are recalled, and while their pages settle, links
   routed to our keys are still taken (refused, those pages would wait for our goodbye and
   their new owners fetch them again);
2. close the door (STORE_TASK refused from here on) and let the ones already taken be
   stored, so that what is counted as our queue is all of it;
3. GOODBYE to every peer: they drop us now instead of suspecting us for a while, route our
   keys to their new owners, and those accept the handoff below as theirs;
4. hand each key's queue and done range to its new owner and its replicas (the next
   closest that answers, if the owner does not), and every backup to its owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from p2pcrawl.crawl import EventLog, Ledger, Task
from p2pcrawl.network.handoff import Handoff
from protocol import PeerRef, PeerTimeout, RemoteError, distance
from storage import BackupStore

__all__ = ["HandoffReport", "Leave"]

log = logging.getLogger(__name__)

STOP_FETCHING_S = 10.0  # fetches under way may end within this
LOANS_S = 5.0  # borrowed pages under way, and our own out on loan, may settle within this
DOOR_S = 2.0  # STORE_TASKs taken before the door closed may be stored within this
FALLBACKS = 4  # peers a key's handoff is offered to, its owner first
# Contacts told GOODBYE, nearest first: every one of a routing table at the default k (k per
# bucket, a bucket per bit of a 160-bit ID).
TABLE_MAX = 20 * 160


@dataclass(slots=True)
class HandoffReport:
    tasks: int = 0
    done: int = 0
    backups: int = 0
    failed: int = 0
    queue_at_leave: int = 0

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class Stopping(Protocol):
    """The crawler's end (``crawl.Engine``)."""

    async def stop_fetching(self, timeout: float) -> list[Task]: ...

    async def aclose(self) -> None: ...


class Leases(Protocol):
    """Our hosts out on loan (``lender.Lender``)."""

    def recall(self, keys: set[bytes] | None = None) -> None: ...

    async def wait_leases(self, timeout: float) -> None: ...

    def end_leases(self) -> None: ...


class Loans(Protocol):
    """What we hold on loan (``reporting.Reports``)."""

    def give_back_unstarted(self) -> None: ...

    async def flush(self, timeout: float) -> None: ...


class Leave:
    def __init__(
        self,
        ledger: Ledger,
        backups: BackupStore,
        crawl: Stopping,
        handoff: Handoff,
        events: EventLog,
        report: HandoffReport,
        *,
        leases: Leases,
        loans: Loans,
        peers: Callable[[], list[PeerRef]],
        contacts: Callable[[int], list[PeerRef]],
        depart: Callable[[], None],
        goodbye: Callable[[PeerRef], Awaitable[None]],
        flush_links: Callable[[], Awaitable[None]],
        stored: Callable[[float], Awaitable[None]],
        hurry: Callable[[], None],
        hand_history: Callable[[list[PeerRef]], Awaitable[int]] | None = None,
    ) -> None:
        """``peers``: the members, to hand off to; ``contacts``: the n contacts of our table
        nearest us, young ones too (``CrawlNode.neighbours``), to say GOODBYE to;
        ``depart``: send nothing but the handoff from now on (``CrawlNode.depart``);
        ``goodbye``: GOODBYE (``CrawlNode.goodbye``); ``flush_links``: send what waits
        in the dispatcher; ``stored``: wait (bounded) for the STORE_TASKs taken to be
        stored (``PeerHandler.stored``); ``hurry``: our RPC lanes send now;
        ``hand_history``: continuous mode's visit history to the remaining peers
        (``HistoryLane.hand_all``), after the tasks."""
        self.ledger = ledger
        self.backups = backups
        self.crawl = crawl
        self.handoff = handoff
        self.events = events
        self.report = report
        self.leases = leases
        self.loans = loans
        self._peers = peers
        self._contacts = contacts
        self._depart = depart
        self._goodbye = goodbye
        self._flush_links = flush_links
        self._stored = stored
        self._hurry = hurry
        self._hand_history = hand_history
        # Leaving, and our borrowers' pages still settling: their links to our keys are
        # stored here and handed off with the rest.
        self.taking = False

    async def leave(self) -> HandoffReport:
        """Leave (the peer is "leaving" already): hand everything off; returns the report."""
        self._hurry()  # what our pages wait for leaves now: the hand-off waits for them
        self.taking = True
        self.events.add("leaving")
        report = self.report
        # Borrowed tasks not yet started go back to their owners at once; those under way
        # finish with ours and are reported before the hand-off. Our own lent hosts are
        # recalled the same way, so none of their pages is fetched twice.
        self.leases.recall()
        self.loans.give_back_unstarted()
        await self.crawl.stop_fetching(timeout=STOP_FETCHING_S)
        await self.loans.flush(timeout=LOANS_S)
        try:
            await self.leases.wait_leases(timeout=LOANS_S)
        finally:
            self.taking = False  # from here on what arrives is refused
        await self._stored(DOOR_S)
        self.leases.end_leases()
        await self.crawl.aclose()
        await self._flush_links()
        # Goodbye first: once the others have dropped this peer from their tables they
        # route its keys to their new owners, and those accept the handoff below as theirs.
        others = await self.say_goodbye()
        # Counted under the handoff lock: a join's handoff or a rebalance under way may
        # still take tasks out or put them back.
        async with self.handoff.lock:
            report.queue_at_leave = self.ledger.queued
            if others:
                await self._hand_off(others, report)
            if others and self._hand_history is not None:
                log.info(
                    "handed off the visit history of %d pages", await self._hand_history(others)
                )
        self.events.add("left", **report.as_dict())
        log.info(
            "left the network: handed off %d tasks, %d done fingerprints, %d backups (%d failed)",
            report.tasks,
            report.done,
            report.backups,
            report.failed,
        )
        return report

    async def _hand_off(self, others: list[PeerRef], report: HandoffReport) -> None:
        ledger = self.ledger
        counts = await ledger.tasks.key_counts()
        by_owner: dict[PeerRef, list[bytes]] = defaultdict(list)
        for key in counts:
            by_owner[_closest(key, others)].append(key)
        for owner, keys in by_owner.items():
            tasks = await ledger.take_keys(keys)
            done = await self.handoff.done_range(keys)
            if await self._send(owner, others, tasks, done):
                report.tasks += len(tasks)
                report.done += sum(len(v) for v in done.values())
            else:
                report.failed += len(tasks)
                await ledger.accept(tasks)
        for owner_id in await self.backups.owner_counts():
            taken = await self.backups.take_owner(owner_id)
            groups: dict[PeerRef, list[Task]] = defaultdict(list)
            for s in taken:
                groups[_closest(s.key, others)].append(Task(s.url, s.fp, s.key, s.depth, s.hops))
            for owner, tasks in groups.items():
                if await self._send(owner, others, tasks, None):
                    report.backups += len(tasks)

    async def say_goodbye(self) -> list[PeerRef]:
        """GOODBYE to every peer we know, at once (each bounded by the RPC timeout): they
        drop us from their tables now instead of suspecting us for a while. Returns the
        members, to hand off to.

        Young contacts (joining, not yet members here) hear it too: one that still counted
        us a member routed our handed-off keys back to us, each attempt a timeout, until it
        declared us dead (chaos seed 9: the big host stood still 8 s beyond a detection).
        From here on this peer sends only its handoff: a liveness ping or a lookup from it
        would tell the others it is still around, and they would make it an owner and a
        replica again while it exits (docs/membership.md, "A dead or departed peer is
        forgotten everywhere")."""
        self._depart()
        others = self._peers()
        told = {p.id: p for p in [*others, *self._contacts(TABLE_MAX)]}

        async def one(p: PeerRef) -> None:
            with contextlib.suppress(PeerTimeout, RemoteError, OSError):
                await self._goodbye(p)

        await asyncio.gather(*(one(p) for p in told.values()))
        return others

    async def _send(
        self,
        owner: PeerRef,
        others: list[PeerRef],
        tasks: list[Task],
        done: dict[bytes, list[int]] | None,
    ) -> bool:
        """STORE_TASK to the new owner; if it is gone, to the next closest that answers."""
        if not tasks and not done:
            return True
        candidates = [owner] + [p for p in others if p != owner]
        key = tasks[0].key if tasks else next(iter(done or {b"": []}))
        candidates.sort(key=lambda p: distance(p.id, key) if p != owner else -1)
        for cand in candidates[:FALLBACKS]:
            try:
                await self.handoff.send_with_copies(cand, tasks, done)
                return True
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.warning("handoff to %s failed: %s", cand, exc)
        return False


def _closest(key: bytes, others: list[PeerRef]) -> PeerRef:
    return min(others, key=lambda p: distance(p.id, key))
