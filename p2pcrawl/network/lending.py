"""Lending hosts: idle fetchers crawl part of a busy owner's queue (``protocol.lending``).

With the host (or domain) partition every owner crawls whole hosts (or sites), and hosts
differ in size by orders of magnitude (Zipf), so however evenly the node IDs split the key
space, some owner ends up with more pages than the others and the crawl lasts as long as
that owner needs. Here the work moves instead of the keys: a peer whose fetchers would
otherwise idle asks a peer with a backlog for one host's queued tasks; the owner stops
fetching that host while the lease runs, so a server is still fetched by one peer at a time
(docs/membership.md, "Lending").
The owner's side is ``network.lender``; the borrower's is ``network.borrower`` (asking),
``network.reporting`` (telling the lender what it finished) and ``network.loanbook`` (what
the engine sees of loans: ``crawl.LoanPort``); this module runs them together, one loop and
one status block per peer.

The owner keeps every lent task in its task store and in the loan book's ``lent``: its queue
still counts them, refill skips them, and they are finished (done record, DELETE_BACKUP)
only when the borrower reports them. What can go wrong costs duplicates, never a task:

* the borrower dies: the failure detector's word (or ``LEASE_S`` of silence) ends the lease,
  and the owner crawls the rest itself; the pages fetched since the borrower's last report
  (those it had fetched, waiting for the owner's word, and those under way) are fetched
  again: a borrowed page's tail ends only once its owner has recorded it;
* the owner dies: its replicas hold every lent task, as they hold the rest of its queue; the
  borrower drops what it has not fetched, since the new owner will crawl it, and tells the
  replicas (DELETE_BACKUP) what it fetched and the owner never recorded, at the first report
  that goes unanswered: long before the owner is declared dead and its successor crawls;
* the owner hands the host to a joiner: it revokes the lease without waiting (the borrower's
  pages may be waiting to route links to the very keys that move); the borrower hears
  "unknown lease" at its next report, drops the rest and sends what it finished to the new
  owner as done history;
* the owner leaves: it recalls its leases and waits up to 5 s for them, storing what is
  routed to its keys meanwhile, then hands everything off.
"""

from __future__ import annotations

import asyncio
import time

from p2pcrawl.network.borrower import Borrower
from p2pcrawl.network.lender import Lender
from p2pcrawl.network.loanbook import LoanBook
from p2pcrawl.network.reporting import TICK_S, Reports

__all__ = ["LendingLoop"]


class LendingLoop:
    """A peer's two roles in lending, run together: borrow while hungry or behind, report
    what was finished on loan, and end the leases that lapsed."""

    def __init__(
        self, book: LoanBook, lender: Lender, borrower: Borrower, reports: Reports
    ) -> None:
        self.book = book
        self.lender = lender
        self.borrower = borrower
        self.reports = reports

    def peer_gone(self, peer_id: bytes, reason: str = "") -> None:
        """A peer left the routing table: its leases lapse, its loans are dropped."""
        self.lender.borrower_gone(peer_id)
        self.reports.lender_gone(peer_id)
        self.borrower.lender_gone(peer_id)

    async def run(self) -> None:
        """Owned by the peer: every ``TICK_S``, or at once when a borrowed page settles."""
        borrower, wake = self.borrower, self.book.wake
        while True:
            try:
                async with asyncio.timeout(TICK_S):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            now = time.monotonic()
            borrower.give_back_if_stopped()
            self.lender.lapse_expired(now)
            self.lender.recall_outgrown()
            self.reports.report_due(now)
            if not borrower.enabled:
                continue
            if borrower.hungry():
                borrower.borrow_soon()
            elif (behind := borrower.behind(now)) is not None:
                borrower.borrow_soon(behind)

    async def aclose(self) -> None:
        await self.borrower.aclose()
        await self.reports.aclose()

    def status(self) -> dict[str, int]:
        b = self.borrower
        return {
            **self.lender.status(),
            "tasks_borrowed": self.book.borrowed,
            "loans_in": len(self.book.loans),
            "borrowed_total": b.borrowed_total,
            "borrowed_behind": b.borrowed_behind,
            "robots_adopted": b.robots_adopted,
            "loans_taken": b.loans_taken,
            "reports_sent": self.reports.reports_sent,
        }
