"""What the crawler asks of the world around it: the engine's three doors.

The engine crawls what it was given and knows nothing of the network. Three things it does
reach beyond itself, each through one small interface, implemented on a lone peer here and
on a networked one by ``p2pcrawl.network``:

* :class:`Router`: every link it discovers leaves through ``route`` (to its own ledger, or
  to the URL's owner);
* :class:`FinishedHook`: a finished page is announced to whoever keeps copies of it (the
  replicas);
* :class:`LoanPort`: lending (docs/membership.md, "Lending"). Tasks of ours another peer
  fetches stay queued in our ledger but are not ours to fetch (``lent``); tasks of other
  owners we fetch are queued here but not in our ledger (``borrowed``), may be held back
  while their loan is too far ahead of its owner's word (``may_fetch``), and end by being
  reported to their owner (``settle``). A task's ``lease`` says which kind it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Protocol

from p2pcrawl.crawl.frontier import Task

if TYPE_CHECKING:
    from p2pcrawl.crawl.ledger import Ledger

__all__ = ["NO_LOANS", "FinishedHook", "LoanPort", "LocalRouter", "Router"]


class Router(Protocol):
    async def route(
        self, tasks: list[Task], *, urgent: bytes | None = None, found: bool = False
    ) -> None:
        """Hand newly discovered tasks to their owners (durably accepted on return).
        Tasks of the key ``urgent`` should not wait for company: a host fetched here on
        loan waits for its own links to reach its owner. ``found``: links found on a page,
        which need not be sent to an owner that said it holds them."""


class LocalRouter:
    """A lone peer owns everything: discovered tasks go straight into its own ledger."""

    def __init__(self, ledger: Ledger, wake: Callable[[], None]) -> None:
        self.ledger = ledger
        self.wake = wake

    async def route(
        self, tasks: list[Task], *, urgent: bytes | None = None, found: bool = False
    ) -> None:
        if await self.ledger.accept(tasks):
            self.wake()


class FinishedHook(Protocol):
    def __call__(self, tasks: list[Task], *, hurry: bool = False) -> Awaitable[None]:
        """Tell whoever keeps copies that ``tasks`` are finished; ``hurry`` when a remote
        caller waits for it."""


class LoanPort(Protocol):
    """Lending as the engine sees it: the one door between the crawler and the loans."""

    @property
    def lent(self) -> Collection[int]:
        """Fingerprints of our own tasks out on loan: still queued, not for our fetchers."""

    @property
    def borrowed(self) -> int:
        """Tasks of other owners held here on loan (queued or under way)."""

    def may_fetch(self, task: Task, under_way: Mapping[int, Task], gap: float = 0.0) -> bool:
        """Whether a borrowed ``task`` may be fetched now; ``under_way`` are the engine's
        tasks being fetched or in their tail, ``task`` included; ``gap``: its host's
        politeness gap here, seconds."""

    async def settle(self, tasks: list[Task], *, finished: bool) -> None:
        """Borrowed tasks end here: finished (returns once their owner has recorded them,
        or their loan was dropped) or given back unfetched."""


class _NoLoans:
    """A peer that neither lends nor borrows (a lone crawl)."""

    lent: Collection[int] = frozenset()
    borrowed = 0

    def may_fetch(self, task: Task, under_way: Mapping[int, Task], gap: float = 0.0) -> bool:
        return True

    async def settle(self, tasks: list[Task], *, finished: bool) -> None:
        raise RuntimeError("a borrowed task on a peer that does not borrow")


NO_LOANS: LoanPort = _NoLoans()
