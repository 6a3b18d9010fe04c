"""The two-level frontier: per-host URL queues and a queue of hosts.

After "High-performance crawl scheduling" (Cao, Jiang, Singh), §3.2.

A worker asks for the best-ranked host that is ready (no request in flight and its
politeness gap elapsed), takes that host's best URL, and hands the host back with the
response time, which sets the next allowed time. Hosts whose gap has not elapsed wait in
a timer heap; ready hosts wait in a heap ordered by the scheduling policy. The frontier is
the in-RAM window; the task store behind it holds everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from p2pcrawl.crawl import scheduling
from p2pcrawl.crawl.domains import DomainGate
from p2pcrawl.crawl.hostslot import HostSlot
from p2pcrawl.crawl.politeness import HostPoliteness
from p2pcrawl.crawl.servers import Servers
from p2pcrawl.settings import CrawlSettings

__all__ = ["Frontier", "HostQueue", "HostSlot", "Task"]

REQUESTS_PER_CONNECTION = scheduling.DEFAULT_REQUESTS_PER_CONNECTION
# A host's pace is the lower median of its last this many intervals: one stall of this peer's
# loop (a joiner's hand-over, a flood) must not read as a slow host. A moving average took
# one 0.5 s stall of a 50 ms Crawl-delay host as 5 pages a second, and an owner lends a host
# it finds slow, while a move costs such a host 0.4-0.9 s without a page (the gaps between
# two peers' fetches of it in traces of chaos seed 5).
PACE_SAMPLES = 5


@dataclass(slots=True)
class Task:
    url: str
    fp: int
    key: bytes  # DHT key of the URL's partition unit
    depth: int
    hops: int = 0  # redirects followed to reach this URL (capped by max_redirects)
    tries: int = 0  # retries after network errors or 429/503; not persisted
    lease: int = 0  # borrowed from its owner under this lease (network/lending.py); 0: ours


class HostQueue:
    """One server's URLs and politeness state."""

    __slots__ = (
        "backlog_start",
        "est",
        "host",
        "intervals",
        "pace",
        "polite",
        "queued",
        "removed",
        "reserved",
        "taken",
        "tasks",
        "ticket",
        "unit",
    )

    def __init__(self, host: str) -> None:
        self.host = host
        self.tasks: list[tuple[tuple[float, int], Task]] = []
        self.polite = HostPoliteness()
        self.est = scheduling.ServerEstimate()
        self.queued = False  # sits in the ready or the waiting heap
        self.ticket = -1  # the sequence number of its one entry there that counts
        # Tasks popped and not put back: fetched, or settled without a fetch (scheduling.found)
        self.taken = 0
        self.removed = False  # handed to another peer while a request was in flight
        # Set by Frontier.reserve: the request under way is the host's last here for now
        # (it is about to be lent); the future is set when that request ends.
        self.reserved: asyncio.Future[None] | None = None
        # --politeness-by ip: the server address whose politeness ``polite`` is (shared with
        # the other hosts at that address), once known; None: the host's own.
        self.unit: str | None = None
        # Seconds between the starts of its requests here while more of it was queued (a
        # median of the last few; None until measured): how fast this peer gets through it, which
        # lending compares with a loan's pace. ``backlog_start``: when the last such request
        # started, None if the host had nothing more queued then (it waited for links).
        self.pace: float | None = None
        self.intervals: list[float] = []  # the last PACE_SAMPLES of them
        self.backlog_start: float | None = None

    def __len__(self) -> int:
        return len(self.tasks)

    def started(self, now: float) -> None:
        """A request to it starts (its task still queued): measure the pace."""
        if self.backlog_start is not None:
            self.intervals.append(now - self.backlog_start)
            del self.intervals[:-PACE_SAMPLES]
            self.pace = sorted(self.intervals)[(len(self.intervals) - 1) // 2]
        self.backlog_start = now if len(self.tasks) > 1 else None

    @property
    def startable(self) -> bool:
        """A request to it may start: it has work, none under way, and is still ours."""
        return bool(self.tasks) and not (self.removed or self.polite.busy or self.reserved)

    @property
    def borrowed(self) -> bool:
        """Its queue was lent to this peer by the host's owner (a host is lent whole)."""
        return bool(self.tasks) and self.tasks[0][1].lease != 0

    @property
    def key(self) -> bytes | None:
        """The DHT key of the host's queued tasks; None while none is queued."""
        return self.tasks[0][1].key if self.tasks else None


class Frontier:
    def __init__(
        self, settings: CrawlSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._policy = settings.policy
        self._clock = clock
        self._hosts: dict[str, HostQueue] = {}
        self._ready: list[tuple[tuple[float, int], int, HostQueue]] = []
        self._waiting: list[tuple[float, int, HostQueue]] = []
        self._seq = itertools.count()
        self._arrival = itertools.count()
        self._size = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self.servers = Servers()  # --politeness-by ip
        # The explored host with the most found, kept until another explored host has more
        # or it has nothing left here: its chain goes ahead of the roots being explored
        # (scheduling.request_priority). One host only, so exploring still has the link.
        self.leader: HostQueue | None = None
        # Per-domain concurrency ([domains."…"] tables): which hosts may start a request.
        self.gate: DomainGate[HostQueue] | None = None

    def __len__(self) -> int:
        return self._size

    @property
    def hosts(self) -> dict[str, HostQueue]:
        return self._hosts

    def host(self, host: str) -> HostQueue:
        hq = self._hosts.get(host)
        if hq is None:
            hq = self._hosts[host] = HostQueue(host)
        return hq

    def push(self, host: str, task: Task) -> None:
        hq = self.host(host)
        seq = next(self._seq)
        heapq.heappush(
            hq.tasks, (scheduling.url_key(self._policy, depth=task.depth, seq=seq), task)
        )
        self._size += 1
        if not hq.queued and not hq.polite.busy and hq.reserved is None:
            self._schedule(hq, self._clock())
            self._wake_one()
        elif hq.queued and self._policy == "longest-first" and _power_of_two(len(hq.tasks)):
            # Ranked by its queue when it was scheduled, a host found one link at a time
            # would keep the rank of a one-page host however long its queue grew. Re-ranked
            # as its queue doubles, it has O(log n) entries, all but the last skipped.
            self._schedule(hq, self._clock())

    def pop_task(self, hq: HostQueue) -> Task | None:
        if not hq.tasks:
            return None
        self._size -= 1
        hq.taken += 1
        return heapq.heappop(hq.tasks)[1]

    def _rank(self, hq: HostQueue) -> tuple[float, int]:
        nxt = (
            [
                scheduling.url_quality(t.depth)
                for _, t in heapq.nsmallest(REQUESTS_PER_CONNECTION, hq.tasks)
            ]
            if self._policy == "crawl-capability"
            else []
        )
        return scheduling.host_key(
            self._policy,
            arrival_seq=next(self._arrival),
            est=hq.est,
            queued=len(hq.tasks),
            next_qualities=nxt,
            requests_per_connection=REQUESTS_PER_CONNECTION,
            taken=hq.taken,
            leading=self._leads(hq),
            borrowed=hq.borrowed,
        )

    def _leads(self, hq: HostQueue) -> bool:
        """Whether ``hq`` is (now) the :attr:`leader`: explored, and with more found than
        the leader, or the leader has nothing left here."""
        if not hq.taken:
            return False
        lead = self.leader
        if (
            lead is not None
            and lead is not hq
            and not lead.removed
            and (lead.tasks or lead.polite.busy)
            and scheduling.found(len(lead.tasks), lead.taken)
            >= scheduling.found(len(hq.tasks), hq.taken)
        ):
            return False
        self.leader = hq
        return True

    def _schedule(self, hq: HostQueue, now: float) -> None:
        if not hq.tasks or hq.removed:
            return
        hq.queued = True
        hq.ticket = next(self._seq)
        if hq.polite.next_allowed <= now:
            heapq.heappush(self._ready, (self._rank(hq), hq.ticket, hq))
        else:
            heapq.heappush(self._waiting, (hq.polite.next_allowed, hq.ticket, hq))

    def acquire_nowait(self) -> HostQueue | None:
        """The best ready host, marked busy; None when no host may be contacted now."""
        now = self._clock()
        while self._waiting and self._waiting[0][0] <= now:
            _, ticket, hq = heapq.heappop(self._waiting)
            if ticket == hq.ticket:
                hq.ticket = next(self._seq)
                heapq.heappush(self._ready, (self._rank(hq), hq.ticket, hq))
        while self._ready:
            _, ticket, hq = heapq.heappop(self._ready)
            if ticket != hq.ticket:
                continue  # re-ranked since: its later entry counts
            hq.queued = False
            if not hq.startable:
                continue
            if self.gate is not None and not self.gate.enter(hq):
                continue  # parked until a request to its domain ends
            hq.polite.start(now)
            hq.started(now)
            return hq
        return None

    def next_delay(self) -> float | None:
        if not self._waiting:
            return None
        return max(0.0, self._waiting[0][0] - self._clock())

    async def acquire(self) -> HostQueue:
        """Wait for a ready host. Raises CancelledError on shutdown (the caller's task)."""
        loop = asyncio.get_running_loop()
        while True:
            hq = self.acquire_nowait()
            if hq is not None:
                return hq
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout(self.next_delay()):
                    await fut
            except TimeoutError:
                pass
            finally:
                if not fut.done():
                    fut.cancel()
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[HostSlot]:
        """Wait for a ready host; it is handed back when the block ends (see HostSlot)."""
        slot = HostSlot(self, await self.acquire())
        try:
            yield slot
        finally:
            slot.release()

    def release(self, hq: HostQueue, *, response_time: float, gap: float) -> None:
        """Hand a host back after a request; ``gap`` is the politeness gap to honour."""
        now = self._clock()
        hq.polite.busy = False
        hq.polite.last_response_time = response_time
        hq.polite.next_allowed = now + gap
        if hq.unit is not None:
            # The server is free again: its other hosts with work go back in line.
            for other in self.servers.waiting(hq):
                self._schedule(other, now)
        if self.gate is not None and (parked := self.gate.leave(hq)) is not None:
            self._schedule(parked, now)
            self._wake_one()
        if hq.reserved is not None:
            if not hq.reserved.done():
                hq.reserved.set_result(None)
            return  # out of the queues until lent or unreserved
        if hq.removed:
            return
        if hq.tasks:
            self._schedule(hq, now)
        self._wake_one()

    def join_server(self, hq: HostQueue, address: str) -> bool:
        """See :meth:`HostSlot.join_server`; ``hq`` is held by a slot (its own state busy)."""
        return self.servers.join(hq, address, self._clock())

    def prune(self) -> int:
        """Forget idle hosts whose gap has elapsed, so the host table is bounded by live work.

        A host is kept while its politeness gap runs: forgetting it early would let the
        next URL for it start before the gap is over.
        """
        now = self._clock()
        idle = [
            h
            for h, hq in self._hosts.items()
            if not hq.tasks and not hq.polite.busy and hq.polite.next_allowed <= now
        ]
        for h in idle:
            self.servers.leave(self._hosts.pop(h))
        return len(idle)

    def remove_hosts(self, hosts: Iterable[str]) -> list[Task]:
        """Take whole hosts out (their key moved to another peer); returns their tasks."""
        out: list[Task] = []
        for h in list(hosts):
            hq = self._hosts.pop(h, None)
            if hq is None:
                continue
            self.servers.leave(hq)
            hq.removed = True
            out.extend(t for _, t in hq.tasks)
            self._size -= len(hq.tasks)
            hq.tasks = []
        return out

    def take_tasks(self, host: str, which: Callable[[Task], bool]) -> list[Task]:
        """Take the host's queued tasks for which ``which`` holds; the rest stay queued in
        place, so a request under way to the host still keeps the next one waiting."""
        hq = self._hosts.get(host)
        if hq is None:
            return []
        out = [t for _, t in hq.tasks if which(t)]
        if not out:
            return []
        if len(out) == len(hq.tasks):
            return self.remove_hosts([host])
        hq.tasks = [(k, t) for k, t in hq.tasks if not which(t)]
        heapq.heapify(hq.tasks)
        self._size -= len(out)
        return out

    def lendable(self, hq: HostQueue, least: int) -> bool:
        """Whether another peer could fetch ``hq``'s queue: ``least`` tasks or more queued
        here, still in the frontier, ours (not borrowed) and not the :attr:`leader`."""
        return (
            len(hq.tasks) >= least
            and not hq.removed
            and not hq.borrowed  # lending it on would loop
            and hq is not self.leader
        )

    def largest_lendable(
        self, *, busy: bool, least: int, most: int, skip: Callable[[HostQueue], bool]
    ) -> HostQueue | None:
        """The :meth:`lendable` host with the most queued tasks, at most ``most``, among those
        with a request under way (``busy``) or with none, not reserved and not ``skip``."""
        best: HostQueue | None = None
        for hq in self._hosts.values():
            if (
                hq.polite.busy == busy
                and hq.reserved is None
                and len(hq.tasks) <= most
                and (best is None or len(hq.tasks) > len(best.tasks))
                and self.lendable(hq, least)
                and not skip(hq)
            ):
                best = hq
        return best

    def lend_host(self, hq: HostQueue) -> list[Task]:
        """Take a ready host's queued tasks out and mark it busy, as if a request to it were
        under way, until :meth:`release`: another peer fetches them meanwhile."""
        out = [t for _, t in hq.tasks]
        self._size -= len(out)
        hq.tasks = []
        hq.backlog_start = None  # the lease's span says nothing of the pace here
        hq.polite.busy = True
        hq.reserved = None
        if self.leader is hq:
            self.leader = None  # busy while lent, it would lead with nothing fetched here
        return out

    def reserve(self, hq: HostQueue) -> asyncio.Future[None]:
        """Keep a host with a request under way from its next one: when that request ends,
        the returned future is set and the host stays out of the queues until
        :meth:`lend_host` or :meth:`unreserve`. At the end of a crawl an owner's remaining
        hosts all have a request under way, one request at a time each; lending one of them
        must wait for that request, or two peers would reach one server at once."""
        if hq.reserved is None:
            hq.reserved = asyncio.get_running_loop().create_future()
        return hq.reserved

    def unreserve(self, hq: HostQueue) -> None:
        """Not lent after all: the host goes back to the queues (if its request ended)."""
        fut, hq.reserved = hq.reserved, None
        if fut is not None and not fut.done():
            fut.cancel()
        if not hq.polite.busy and not hq.queued and not hq.removed and hq.tasks:
            self._schedule(hq, self._clock())
            self._wake_one()

    def hosts_with_work(self, at_most: int) -> int:
        """Hosts with queued tasks or a request under way, counted up to ``at_most``."""
        n = 0
        for hq in self._hosts.values():
            n += bool(hq.tasks) or hq.polite.busy
            if n >= at_most:
                break
        return n

    def busy_hosts(self) -> list[str]:
        return [h for h, hq in self._hosts.items() if hq.polite.busy]

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                return

    def wake_all(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()


def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0
