"""The borrower's reports (``network.lending``): what it finished of each loan, to its lender.

Every ``REPORT_S`` a loan with finished pages sends GIVE_BACK with their fingerprints (and
those it gives back unfetched), at once when it has nothing left. The lender records them
and answers; only then do the pages' tails end (``loanbook``). The answer also says whether
the lender still knows the lease (it may have revoked it: the key moved, or it lapsed) and
whether it recalls the rest (it is leaving).

A lender that does not answer may be dead: what of its loan is not started waits (parked),
and its replicas hear at once which of its pages were finished here, so that its successor
does not fetch them again from their copies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from p2pcrawl.aio import Coalescer
from p2pcrawl.crawl import Frontier, Task
from p2pcrawl.network.loanbook import Borrowed, LoanBook
from protocol import KEEPALIVE_S, MAX_REPORTS, GiveBack, PeerRef, PeerTimeout, RemoteError, TaskSet

__all__ = ["REPORT_S", "TICK_S", "Reports"]

log = logging.getLogger(__name__)

TICK_S = 0.1
# A borrower reports finished tasks this often: what a crash of it can cost to fetch again.
REPORT_S = 0.1
# Reports to one lender due within this share a GIVE_BACK; a borrowed page waits this much
# longer for its lender's word, which a peer with idle fetchers can spare.
REPORT_WINDOW_S = 0.05

GiveBackCall = Callable[[PeerRef, Sequence[GiveBack]], Awaitable[list[tuple[bool, bool]]]]
# Pages of ``owner``'s key finished here that ``owner`` did not answer for: its replicas
# record them (``Replication.finished_for``).
TellReplicas = Callable[[bytes, bytes, list[int]], Coroutine[Any, Any, None]]


class Reports:
    def __init__(
        self,
        book: LoanBook,
        frontier: Frontier,
        *,
        give_back: GiveBackCall,
        member: Callable[[bytes], PeerRef | None],
        tell_replicas: TellReplicas,
        forward: Callable[[bytes, list[int]], Coroutine[Any, Any, None]],
    ) -> None:
        """``member``: a lender as the routing table knows it now; ``forward``: pages of a
        loan that ended without their report, as done history to the key's owner now
        (``history.History.forward``)."""
        self.book = book
        self.loans = book.loans
        self.frontier = frontier
        self._give_back = give_back
        self._member = member
        self._tell_replicas = tell_replicas
        self._forward_done = forward
        self._tasks = TaskSet("reports")
        self.reports_sent = 0  # GIVE_BACK flushes (each reports on one or more loans)
        # Lanes of reports by (lender, lease), lease 0 for the last reports of loans: those
        # to one lender that fall due within REPORT_WINDOW_S of each other share a GIVE_BACK
        # (a loan of one page is reported as soon as it is fetched, and the loans of one
        # answer are fetched at about the same time).
        self._lanes: Coalescer[tuple[PeerRef, int], GiveBack, tuple[bool, bool]] = Coalescer(
            self._send, window=REPORT_WINDOW_S, max_items=MAX_REPORTS, name="give-back"
        )

    async def _send(
        self, lane: tuple[PeerRef, int], reports: list[GiveBack]
    ) -> list[tuple[bool, bool]]:
        """One flush of a lane: reports to one lender due together, in one GIVE_BACK."""
        self.reports_sent += 1
        return await self._give_back(lane[0], reports)

    async def _report(self, held: Borrowed) -> None:
        # The lender's address as our routing table knows it now: a lender restarted with
        # its data directory keeps its ID on a new port, is never declared dead, and would
        # never answer at the old one (it answers "unknown lease" at the new).
        held.lender = self._member(held.lender.id) or held.lender
        done, back, final = list(held.done), list(held.back), held.final
        # A loan still under way reports in a lane of its own, at once, side by side with
        # the others: its next pages wait for the answer every MAX_UNSETTLED pages, and a
        # lender whose link is full answers in a few hundred ms. The last reports of loans
        # share their lender's lane, and wait for each other unless there is no other.
        lane = (held.lender, 0 if final else held.lease)
        alone = final and all(
            b is held or b.lender.id != held.lender.id for b in self.loans.values()
        )
        ((known, recall),) = await self._lanes.submit(
            lane, [GiveBack(held.lease, done, back, final)], urgent=not final or alone
        )
        held.reported = time.monotonic()
        del held.done[: len(done)]
        del held.back[: len(back)]
        held.release(done)
        if not known:
            # Revoked (the key moved) or lapsed: what we finished goes to whoever owns the
            # key now, as done history; the rest is dropped.
            self.forward(held.key, done)
            self.drop(held)
        elif final:
            self.drop(held)
        elif recall:
            self.give_back(held)
        elif held.parked:  # the lender answers again
            parked, held.parked = held.parked, []
            for t in parked:
                self.frontier.push(held.host, t)

    async def report(self, held: Borrowed) -> None:
        """One report. A silent lender may be dead: what of its loan is not started waits
        (parked) until it answers again or is declared dead; an odd one is asked again."""
        try:
            async with held.reporting:
                await self._report(held)
        except PeerTimeout as exc:
            log.debug("report to %s failed: %s", held.lender, exc)
            held.parked += self._unqueue(held)
            if held.done:
                # Its successor would crawl these again from the replicas' copies, before
                # our forward of them (after we too declare the lender dead) could arrive.
                done = list(held.done)
                self._tasks.spawn(self._tell_replicas(held.lender.id, held.key, done), "tell")
        except (RemoteError, OSError) as exc:
            log.debug("report to %s failed: %s", held.lender, exc)

    def _unqueue(self, held: Borrowed) -> list[Task]:
        """Take the loan's tasks that are not under way out of the frontier."""
        return self.frontier.take_tasks(held.host, lambda t: t.lease == held.lease)

    def drop(self, held: Borrowed) -> None:
        """Forget a loan; what of it is still queued here is not fetched."""
        self.loans.pop(held.lease, None)
        if held.held and held.host:
            self._unqueue(held)
        held.held.clear()
        held.parked.clear()
        held.release()
        self.book.recount()

    def on_stall(self) -> None:
        """Our loop stood still: the lenders may have declared us dead and crawled our
        loans themselves. Nothing borrowed is fetched until each lender has answered a
        report (``known`` again, or not: then what we finished goes to the key's owner)."""
        for held in self.loans.values():
            held.parked += self._unqueue(held)
            held.reported = 0.0  # report at the next tick
        self.book.wake.set()

    def lender_gone(self, peer_id: bytes) -> None:
        """A peer left the routing table: its loans are dropped."""
        for held in [b for b in self.loans.values() if b.lender.id == peer_id]:
            # Its replicas hold these tasks and its successor crawls them; what we finished
            # and could not report goes to that successor as done history.
            self.forward(held.key, list(held.done))
            self.drop(held)

    def report_due(self, now: float) -> None:
        """Start the reports that are due, each loan's in a task of its own."""
        for held in list(self.loans.values()):
            if held.report_task is not None and not held.report_task.done():
                continue
            # Finished tasks gather for REPORT_S; a silent loan is kept alive well
            # before it lapses; a loan with nothing left is reported at once.
            wait = REPORT_S if held.done or held.back else KEEPALIVE_S
            if held.final or now - held.reported >= wait:
                held.report_task = self._tasks.spawn(self.report(held), "report")

    def forward(self, key: bytes, fps: list[int]) -> None:
        """Pages finished here of a loan that ended without their report: their history
        goes to the key's owner now."""
        if fps:
            self._tasks.spawn(self._forward_done(key, fps), "forward")

    def give_back_unstarted(self) -> None:
        """Return every borrowed task not yet started (those under way finish)."""
        for held in list(self.loans.values()):
            self.give_back(held)

    def give_back(self, held: Borrowed) -> None:
        parked, held.parked = held.parked, []
        back = parked + self._unqueue(held)
        if back:
            self.book.settle_now(back, finished=False)

    async def flush(self, timeout: float) -> None:
        """Leaving: report everything, for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.loans and time.monotonic() < deadline:
            for held in list(self.loans.values()):
                if held.held:
                    # Under way still (the engine stopped): the owner crawls them again.
                    placeholders = [Task("", fp, b"", 0, lease=held.lease) for fp in held.held]
                    self.book.settle_now(placeholders, finished=False)
            # Side by side: the reports to one lender share its GIVE_BACKs.
            await asyncio.gather(*(self.report(h) for h in list(self.loans.values())))
            if self.loans:
                await asyncio.sleep(TICK_S)
        for held in list(self.loans.values()):
            self.drop(held)

    async def aclose(self) -> None:
        await self._tasks.aclose(timeout=1.0)
        await self._lanes.aclose(timeout=1.0)
