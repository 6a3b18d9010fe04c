"""A ready host held by one worker for one request: :class:`HostSlot`.

:meth:`p2pcrawl.crawl.frontier.Frontier.slot` hands it out; the attempt (robots.txt, a
sitemap, the page) works through it and the frontier takes the host back when the slot
ends, once, with the time the request took and the gap it set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p2pcrawl.crawl.frontier import Frontier, HostQueue, Task

__all__ = ["HostSlot"]


class HostSlot:
    """A ready host taken from the frontier by :meth:`Frontier.slot`.

    Whatever a request's outcome (a page, a retry, a robots.txt detour, an exception), the
    host goes back exactly once, when the ``async with`` that took it ends, with the
    response time and politeness gap the request set: a branch that forgot to hand it back
    would leave the host busy for good, and one that handed it back twice would let two
    requests reach one server at once.
    """

    __slots__ = ("_frontier", "_released", "gap", "hq", "response_time")

    def __init__(self, frontier: Frontier, hq: HostQueue) -> None:
        self._frontier = frontier
        self.hq = hq
        self.response_time = 0.0
        self.gap = 0.0
        self._released = False

    @property
    def host(self) -> str:
        return self.hq.host

    def pop(self) -> Task | None:
        return self._frontier.pop_task(self.hq)

    def requeue(self, task: Task) -> None:
        """Put ``task`` back on this host's queue (tried again after the gap)."""
        # Not taken after all: a root requeued behind its host's robots.txt leaves the host
        # still never fetched from, which longest-first and the pacer serve first.
        self.hq.taken = max(0, self.hq.taken - 1)
        self._frontier.push(self.hq.host, task)

    def after(self, response_time: float, gap: float) -> None:
        """What this request took, and the gap to keep before the host's next one."""
        self.response_time = response_time
        self.gap = gap

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._frontier.release(self.hq, response_time=self.response_time, gap=self.gap)

    def join_server(self, address: str) -> bool:
        """Put this host under the politeness of the server at ``address`` (``--politeness-by
        ip``). True: the request may go ahead now. False: another host's request to that
        server is under way or its gap runs; the slot is given up (not released: the server's
        state is not this slot's to end) and the host waits for the server."""
        if self._frontier.join_server(self.hq, address):
            return True
        self._released = True
        return False
