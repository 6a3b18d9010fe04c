"""The loan book: lending as the engine sees it (``crawl.LoanPort``), both ways.

* ``lent``: our own tasks another peer fetches (``lender``). They stay in our task store
  and count in our queue, but refill keeps them out of the frontier until the borrower
  reports them.
* ``loans``: what we hold of other owners' queues (``Borrowed``, one per lease; taken by
  ``borrower``, reported by ``reporting``). Their tasks are queued in our frontier, not in
  our ledger; each one ends here, in ``settle``: finished (its tail waits for the lender's
  word) or given back.

A borrowed page's tail ends only once its lender has recorded it, as a page's tail ends only
once its links are durable at their owners, and a loan has at most ``MAX_UNSETTLED`` pages
between their fetch and that word (``may_fetch``; more for a host whose politeness spaces
its requests, ``unsettled_limit``): what a crash of either side can cost.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from p2pcrawl.crawl import Task
from protocol import PeerRef

__all__ = ["MAX_UNSETTLED", "Borrowed", "LoanBook", "loan_page_s", "unsettled_limit"]

# A loan's pages between their fetch and the lender's word, at most. Should the lender die,
# its successor cannot know of them and fetches them again: this bounds what a lender's
# crash costs per loan. The word comes within about a report interval, so in a healthy
# network a loan seldom has this many pages waiting.
MAX_UNSETTLED = 4
# A host whose politeness spaces its requests may have as many pages waiting as that spacing
# lets it fetch in this long, up to POLITE_UNSETTLED: the word takes a report interval and a
# flush of the lender's lane to its replicas, 0.3-0.5 s under load, and at four pages a
# round trip a host with a 50 ms Crawl-delay (18 pages a second at its owner) went at 10 on
# loan (chaos seed 7), so lending it, as a busy owner does, set the crawl's end. In time a
# crash costs the same as a fast loan's four pages: what half a second of the host brings.
UNSETTLED_S = 0.5
POLITE_UNSETTLED = 10


# A host whose gap lets its loan run further ahead of the word goes at about that gap on
# loan; its owner keeps it unless it goes slower than this many times the gap at home, since
# moving it costs a hand-over and the pace measured there is noisy (a 50 ms Crawl-delay host
# went at 18-19 pages a second at an owner with room, at 10 at one busy taking a big host).
POLITE_LOAN_MARGIN = 1.5


def loan_page_s(gap: float, page_s: float) -> float:
    """Seconds a page of a loan whose host's politeness gap is ``gap``, a loan of a host
    fetched without one taking ``page_s``: ``unsettled_limit`` pages a round trip of the
    lender's word, and no faster than the gap (``POLITE_LOAN_MARGIN`` times it where the
    gap sets the pace)."""
    limit = unsettled_limit(gap)
    if limit == MAX_UNSETTLED:
        return page_s
    return max(page_s * MAX_UNSETTLED / limit, POLITE_LOAN_MARGIN * gap)


def unsettled_limit(gap: float) -> int:
    """How many of a loan's pages may wait for the lender's word, its host's politeness gap
    being ``gap`` seconds: at least ``MAX_UNSETTLED``, and what ``gap`` lets the host fetch
    in ``UNSETTLED_S``, up to ``POLITE_UNSETTLED``."""
    if gap <= 0:
        return MAX_UNSETTLED
    return max(MAX_UNSETTLED, min(POLITE_UNSETTLED, math.ceil(UNSETTLED_S / gap)))


@dataclass(slots=True)
class Borrowed:
    """What the borrower holds: ``held`` not yet finished; ``done``/``back`` not yet reported."""

    lease: int
    lender: PeerRef
    host: str
    key: bytes
    held: set[int]
    done: list[int] = field(default_factory=list)
    back: list[int] = field(default_factory=list)
    reported: float = field(default_factory=time.monotonic)
    # Not fetched while the lender does not answer: it may be dead, and then its successor
    # crawls them from the replicas' copies.
    parked: list[Task] = field(default_factory=list)
    # Pages finished here wait (their tails do) until the lender has recorded them, as a
    # page waits until its links are durable at their owners: a crash of either side then
    # costs what was under way, no more.
    acks: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    # One report at a time per loan; the loans' reports run side by side, since an owner
    # whose link is full answers each in a few hundred ms and a loan's pages wait for it.
    reporting: asyncio.Lock = field(default_factory=asyncio.Lock)
    report_task: asyncio.Task[None] | None = None

    def release(self, fps: list[int] | None = None) -> None:
        for fp in list(self.acks) if fps is None else fps:
            fut = self.acks.pop(fp, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    @property
    def final(self) -> bool:
        return not self.held


class LoanBook:
    """``crawl.LoanPort``. ``orphaned(key, fps)``: pages finished here on a loan that ended
    while they were under way; their history goes to the key's owner."""

    def __init__(self, orphaned: Callable[[bytes, list[int]], None]) -> None:
        self.lent: dict[int, Task] = {}  # ours, out on loan: fingerprint -> task
        self.loans: dict[int, Borrowed] = {}  # theirs, held here: lease -> loan
        self.borrowed = 0  # tasks held on loan, not yet finished or given back
        self.wake = asyncio.Event()  # something to report: the lending loop runs now
        self._orphaned = orphaned

    def may_fetch(self, task: Task, under_way: Mapping[int, Task], gap: float = 0.0) -> bool:
        """The loan has fewer than ``unsettled_limit(gap)`` other pages fetched (or being
        fetched) and not yet recorded by its lender."""
        limit = unsettled_limit(gap)
        return sum(1 for t in under_way.values() if t.lease == task.lease) <= limit

    async def settle(self, tasks: list[Task], *, finished: bool) -> None:
        """Borrowed tasks finished (or given back) here; a finished one returns once its
        lender has recorded it (or the loan was dropped)."""
        fut = self.settle_now(tasks, finished=finished)
        if fut is not None:
            await fut

    def settle_now(self, tasks: list[Task], *, finished: bool) -> asyncio.Future[None] | None:
        """``settle`` without the wait: the future of the lender's word on finished ones."""
        fut: asyncio.Future[None] | None = None
        for t in tasks:
            held = self.loans.get(t.lease)
            if held is None or t.fp not in held.held:
                if finished and t.key:  # its loan was dropped while it was under way
                    self._orphaned(t.key, [t.fp])
                continue
            held.held.discard(t.fp)
            (held.done if finished else held.back).append(t.fp)
            if finished:
                fut = fut or asyncio.get_running_loop().create_future()
                held.acks[t.fp] = fut
        self.recount()
        self.wake.set()
        return fut

    def recount(self) -> None:
        self.borrowed = sum(len(b.held) for b in self.loans.values())
