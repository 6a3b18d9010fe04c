"""Lending hosts: idle fetchers crawl part of a busy owner's queue (``protocol.lending``).

With the host partition every owner crawls whole hosts, and hosts differ in size by orders
of magnitude (Zipf), so however evenly the node IDs split the key space, some owner ends up
with more pages than the others and the crawl lasts as long as that owner needs. Here the
work moves instead of the keys: a peer whose fetchers would otherwise idle asks a peer with a
backlog for one host's queued tasks; the owner stops fetching that host while the lease
runs, so a server is still fetched by one peer at a time (docs/membership.md, "Lending").
The owner's side is ``network.lender``, the borrower's ``network.borrower``; this module
runs them together, one loop and one status block per peer.

The owner keeps every lent task in its task store and in ``Engine.lent``: its queue still
counts them, refill skips them, and they are finished (done record, DELETE_BACKUP) only when
the borrower reports them. What can go wrong costs duplicates, never a task:

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
from typing import TYPE_CHECKING

from p2pcrawl.network.borrower import TICK_S, Borrower
from p2pcrawl.network.lender import Lender
from protocol import GIVE_BACK, LEND

if TYPE_CHECKING:
    from p2pcrawl.network.peer import Peer

__all__ = ["Lending"]


class Lending:
    """A peer's two roles in lending: ``lender`` (owner) and ``borrower``."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self._wake = asyncio.Event()
        self.lender = Lender(peer)
        self.borrower = Borrower(peer, self._wake)

    def serve(self) -> None:
        node = self.peer.node
        assert node is not None
        node.serve(LEND, self.lender.serve_lend)
        node.serve(GIVE_BACK, self.lender.serve_return)

    def peer_removed(self, peer_id: bytes) -> None:
        """A peer left the routing table: its leases lapse, its loans are dropped."""
        self.lender.borrower_removed(peer_id)
        self.borrower.lender_removed(peer_id)

    async def run(self) -> None:
        """Owned by the peer: borrow while hungry, report, and end leases that lapsed."""
        borrower = self.borrower
        while True:
            try:
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            borrower.give_back_if_stopped()
            self.lender.lapse_expired(now)
            borrower.report_due(now)
            if not borrower.enabled:
                continue
            if borrower.hungry():
                borrower.borrow_soon()
            elif (behind := borrower.behind(now)) is not None:
                borrower.borrow_soon(behind)

    async def aclose(self) -> None:
        await self.borrower.aclose()

    def status(self) -> dict[str, int]:
        return {**self.lender.status(), **self.borrower.status()}
