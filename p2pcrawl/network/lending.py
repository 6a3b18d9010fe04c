"""Lending hosts: idle fetchers crawl part of a busy owner's queue (``protocol.lending``).

With the host partition every owner crawls whole hosts, and hosts differ in size by orders
of magnitude (Zipf), so however evenly the node IDs split the key space, some owner ends up
with more pages than the others and the crawl lasts as long as that owner needs. Here the
work moves instead of the keys: a peer whose fetchers would otherwise idle asks a peer with a
backlog for one host's queued tasks; the owner stops fetching that host while the lease
runs, so a server is still fetched by one peer at a time (docs/membership.md, "Lending").

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
* the owner hands the host to a joiner or leaves: it waits for the lease as for a fetch
  under way, up to its hand-off timeout, then revokes it; the borrower hears "unknown lease"
  at its next report and drops the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from p2pcrawl.crawl import Task, urls
from p2pcrawl.crawl.frontier import HostQueue
from protocol import KeyBatch, PeerRef, PeerTimeout, RemoteError, TaskItem, TaskSet
from protocol.lending import (
    KEEPALIVE_S,
    LEASE_S,
    LEND_RPC,
    MAX_WANT,
    RETURN_RPC,
    check_lend_request,
    check_return_request,
    loan_to_wire,
    one_chunk,
)

if TYPE_CHECKING:
    from p2pcrawl.crawl import Engine
    from p2pcrawl.network.peer import Peer

__all__ = ["Lending"]

log = logging.getLogger(__name__)

TICK_S = 0.1
# A borrower reports finished tasks this often: what a crash of it can cost to fetch again.
REPORT_S = 0.1
# How long a peer that had nothing to lend is not asked again: an idle network of N peers
# costs each idle peer at most (N - 1) / ASK_AGAIN_S small requests a second.
ASK_AGAIN_S = 5.0
ASK_BUSY_AGAIN_S = 0.5  # the shortest wait before asking a peer again
# A known backlog older than this is a guess, not a reason to ask first.
BACKLOG_FRESH_S = 5.0
# A host with fewer queued tasks is not worth a lease (and a robots.txt fetch by the
# borrower): the owner is about to finish it anyway.
MIN_LEND = 4
# A loan's pages between their fetch and the lender's word, at most. Should the lender die,
# its successor cannot know of them and fetches them again: this bounds what a lender's
# crash costs per loan. The word comes within about a report interval, so in a healthy
# network a loan seldom has this many pages waiting.
MAX_UNSETTLED = 4


@dataclass(slots=True)
class Lease:
    """What the owner lent: ``tasks`` not yet reported, by fingerprint."""

    lease: int
    borrower: PeerRef
    hq: HostQueue
    key: bytes
    tasks: dict[int, Task]
    deadline: float
    recalled: bool = False  # we are leaving: the borrower is asked to give the rest back


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

    def release(self, fps: list[int] | None = None) -> None:
        for fp in list(self.acks) if fps is None else fps:
            fut = self.acks.pop(fp, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    @property
    def final(self) -> bool:
        return not self.held


class Lending:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.leases: dict[int, Lease] = {}
        self.loans: dict[int, Borrowed] = {}
        self._backlog: dict[bytes, tuple[int, float]] = {}  # peer id -> (backlog, when heard)
        self._asked: dict[bytes, float] = {}  # peer id -> when it last had nothing to lend
        self._misses: dict[bytes, int] = {}  # peer id -> answers in a row with no backlog
        self._wake = asyncio.Event()
        self._tasks = TaskSet("lending")
        self._no_leases = asyncio.Event()
        self.lent_total = 0  # tasks lent, ever (status)
        self.borrowed_total = 0
        self.lapsed = 0  # leases ended without their borrower (it died or went silent)

    @property
    def enabled(self) -> bool:
        ps = self.peer.config.peer
        return ps.lend and ps.partition == "host"

    def serve(self) -> None:
        node = self.peer.node
        assert node is not None and node.protocol is not None
        node.protocol.serve(LEND_RPC, self.serve_lend)
        node.protocol.serve(RETURN_RPC, self.serve_return)

    # -- the owner's side ------------------------------------------------------------------

    async def serve_lend(self, sender: PeerRef, args: list[Any]) -> dict[str, Any]:
        want = check_lend_request(args)
        peer, engine, node = self.peer, self.peer.engine, self.peer.node
        if engine is None or node is None:
            return loan_to_wire(0, None, 0)
        # Our own queue only: borrowed tasks are not ours to lend on.
        backlog = max(0, engine.ledger.queued - len(engine.lent) - len(engine.in_flight))
        if (
            not self.enabled
            or peer.state != "active"
            or engine.paused
            or not self._member(sender)  # only members borrow
        ):
            return loan_to_wire(0, None, backlog)
        hq = self._host_to_lend(backlog)
        if hq is None:
            return loan_to_wire(0, None, backlog)
        tasks = engine.frontier.lend_host(hq)
        key = tasks[0].key
        payload, held = one_chunk(
            KeyBatch(key, [TaskItem(t.url, t.depth, t.hops) for t in tasks[: min(want, MAX_WANT)]])
        )
        lent_urls = {item.url for item in held.tasks}
        lease = Lease(
            lease=secrets.randbits(62) + 1,
            borrower=sender,
            hq=hq,
            key=key,
            tasks={t.fp: t for t in tasks if t.url in lent_urls},
            deadline=time.monotonic() + LEASE_S,
        )
        for t in tasks:
            if t.fp in lease.tasks:
                engine.lent[t.fp] = t
            else:
                engine.frontier.push(hq.host, t)  # waits for the lease: the host is busy
        self.leases[lease.lease] = lease
        self.lent_total += len(lease.tasks)
        return loan_to_wire(lease.lease, payload, backlog - len(lease.tasks))

    def _host_to_lend(self, backlog: int) -> HostQueue | None:
        """The ready host with most queued tasks, if lending it leaves this peer enough of
        its own to keep its fetchers busy. A host with a request under way is not lent: the
        borrower's first request could overlap ours."""
        engine = self.peer.engine
        assert engine is not None
        excluded = engine.refill.excluded_keys
        best: HostQueue | None = None
        for hq in engine.frontier.hosts.values():
            if (
                len(hq.tasks) >= MIN_LEND
                and not hq.polite.busy
                and not hq.removed
                and (best is None or len(hq.tasks) > len(best.tasks))
                and not hq.tasks[0][1].lease  # borrowed: lending it on would loop
                and hq.tasks[0][1].key not in excluded
            ):
                best = hq
        # Keep enough to fill our own fetchers, and at least as much as we lend: a borrower
        # that finishes first asks again.
        keep = max(engine.settings.concurrency, len(best.tasks)) if best is not None else 0
        if best is None or backlog - len(best.tasks) < keep:
            return None
        return best

    async def serve_return(self, sender: PeerRef, args: list[Any]) -> dict[str, Any]:
        report = check_return_request(args)
        lease = self.leases.get(report.lease)
        engine = self.peer.engine
        if lease is None or lease.borrower.id != sender.id or engine is None:
            return {"known": False}
        lease.deadline = time.monotonic() + LEASE_S
        finished = [t for fp in report.done if (t := lease.tasks.pop(fp, None)) is not None]
        back = [t for fp in report.back if (t := lease.tasks.pop(fp, None)) is not None]
        for t in finished + back:
            engine.lent.pop(t.fp, None)
        self._requeue(lease, back)
        if report.final or not lease.tasks:
            self._end(lease, requeue=True)
        if finished:
            await engine.finish(finished)
            engine.after_lent(lease.key)
        return {"known": True, "recall": lease.recalled}

    def _requeue(self, lease: Lease, tasks: list[Task]) -> None:
        engine = self.peer.engine
        assert engine is not None
        if not tasks or lease.hq.removed or lease.key in engine.refill.excluded_keys:
            return  # no longer ours to crawl: the store's rows went (or go) with the key
        for t in tasks:
            engine.frontier.push(lease.hq.host, t)

    def _end(self, lease: Lease, *, requeue: bool) -> None:
        """The lease is over: what was not reported is crawled here again (``requeue``) or
        left to the key's new owner; the host may be fetched again."""
        engine = self.peer.engine
        assert engine is not None
        self.leases.pop(lease.lease, None)
        if not self.leases:
            self._no_leases.set()
        rest = list(lease.tasks.values())
        lease.tasks.clear()
        for t in rest:
            engine.lent.pop(t.fp, None)
        if requeue:
            self._requeue(lease, rest)
        engine.frontier.release(lease.hq, response_time=0.0, gap=0.0)
        engine.after_lent(lease.key)

    def recall(self, keys: set[bytes] | None = None) -> None:
        """Leaving (or handing ``keys`` over): each borrower is asked, at its next report,
        to give back what it has not started; what it finishes meanwhile is reported as
        usual, so the hand-off need not wait for whole leases."""
        for lease in self.leases.values():
            if keys is None or lease.key in keys:
                lease.recalled = True

    async def wait_leases(self, timeout: float) -> None:
        """Until every lease has come back, for up to ``timeout`` seconds."""
        if not self.leases:
            return
        self._no_leases.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._no_leases.wait()

    def revoke_keys(self, keys: set[bytes]) -> None:
        """These keys left this peer (a hand-off): their leases end, and the borrower's next
        report hears that it should drop the rest."""
        for lease in [le for le in self.leases.values() if le.key in keys]:
            self._end(lease, requeue=False)

    def _lapse(self, lease: Lease, why: str) -> None:
        self.lapsed += 1
        log.info(
            "took back a lease of %d tasks of %s from %s (%s)",
            len(lease.tasks),
            lease.hq.host,
            lease.borrower,
            why,
        )
        self._end(lease, requeue=True)

    # -- the borrower's side ---------------------------------------------------------------

    def _hungry(self) -> bool:
        peer, engine = self.peer, self.peer.engine
        if engine is None or peer.state != "active" or engine.paused or engine.exhausted:
            return False
        most = max(2, engine.settings.concurrency // 4)
        if engine.failure is not None or len(self.loans) >= most:
            return False
        # Idle fetchers, and too few hosts to keep them busy: one server is fetched one
        # request at a time, so tasks queued on a few hosts do not fill the fetchers.
        conc = engine.settings.concurrency
        if len(engine.in_flight) >= conc or engine.tasks_queued >= 8 * conc:
            return False
        hosts = 0
        for hq in engine.frontier.hosts.values():
            hosts += bool(hq.tasks) or hq.polite.busy
            if hosts >= conc:
                return False
        return True

    def _lender(self) -> PeerRef | None:
        """The peer most worth asking: the largest recent backlog first, then one not asked
        lately, so an idle network costs one small request per peer every ASK_AGAIN_S."""
        node = self.peer.node
        assert node is not None
        now = time.monotonic()
        best: tuple[float, PeerRef] | None = None
        for p in node.peers():
            backlog, heard = self._backlog.get(p.id, (0, -1e9))
            # A peer with a backlog may have a host free to lend soon; one without is asked
            # again after a wait that doubles up to ASK_AGAIN_S while it stays without.
            misses = self._misses.get(p.id, 0) if backlog < MIN_LEND else 0
            again = min(ASK_AGAIN_S, ASK_BUSY_AGAIN_S * 2**misses)
            if now - self._asked.get(p.id, -1e9) < again:
                continue
            score = backlog if now - heard < BACKLOG_FRESH_S else 0.5
            if best is None or score > best[0]:
                best = (score, p)
        return best[1] if best is not None else None

    async def _borrow(self) -> None:
        peer, engine, node = self.peer, self.peer.engine, self.peer.node
        assert engine is not None and node is not None
        lender = self._lender()
        if lender is None:
            return
        want = min(MAX_WANT, 4 * engine.settings.concurrency)
        try:
            loan = await node.lend(lender, want)
        except (PeerTimeout, RemoteError, OSError):
            self._asked[lender.id] = time.monotonic()
            return
        self._backlog[lender.id] = (loan.backlog, time.monotonic())
        if loan.backlog < MIN_LEND:
            self._misses[lender.id] = min(16, self._misses.get(lender.id, 0) + 1)
        else:
            self._misses.pop(lender.id, None)
        if loan.batch is None:
            self._asked[lender.id] = time.monotonic()
            return
        tasks = peer.handler.decode([loan.batch]).get(loan.batch.key, [])
        if not tasks or peer.state != "active" or not self._member(lender):
            # Too late (or nothing usable): straight back, so the owner need not wait for
            # the lease to lapse.
            await self._report_safely(Borrowed(loan.lease, lender, "", loan.batch.key, set()))
            return
        host = urls.host_of(tasks[0].url)
        engine.adopt_hosts([urls.hostname_of(tasks[0].url)])  # links within it are in scope
        held = Borrowed(loan.lease, lender, host, loan.batch.key, {t.fp for t in tasks})
        self.loans[loan.lease] = held
        for t in tasks:
            t.lease = loan.lease
            engine.frontier.push(host, t)
        self.borrowed_total += len(tasks)
        self._count_held()

    def may_fetch(self, task: Task) -> bool:
        """``Engine.may_fetch_borrowed``: the loan has fewer than ``MAX_UNSETTLED`` other
        pages fetched (or being fetched) and not yet recorded by its lender."""
        in_flight = self._engine().in_flight
        return sum(1 for t in in_flight.values() if t.lease == task.lease) <= MAX_UNSETTLED

    def _member(self, peer: PeerRef) -> bool:
        """In our routing table: admitted, and not declared dead."""
        node = self.peer.node
        return node is not None and any(p.id == peer.id for p in node.peers())

    async def settle_and_wait(self, tasks: list[Task], finished: bool) -> None:
        """``Engine.settle_borrowed``: borrowed tasks finished (or given back) here; a
        finished one returns once its lender has recorded it (or the loan was dropped)."""
        fut = self.settle(tasks, finished)
        if fut is not None:
            await fut

    def settle(self, tasks: list[Task], finished: bool) -> asyncio.Future[None] | None:
        fut: asyncio.Future[None] | None = None
        for t in tasks:
            held = self.loans.get(t.lease)
            if held is None or t.fp not in held.held:
                if finished and t.key:  # its loan was dropped while it was under way
                    self._forward(t.key, [t.fp])
                continue
            held.held.discard(t.fp)
            (held.done if finished else held.back).append(t.fp)
            if finished:
                fut = fut or asyncio.get_running_loop().create_future()
                held.acks[t.fp] = fut
        self._count_held()
        self._wake.set()
        return fut

    def _count_held(self) -> None:
        engine = self.peer.engine
        if engine is not None:
            engine.borrowed = sum(len(b.held) for b in self.loans.values())

    async def _report(self, held: Borrowed) -> None:
        node = self.peer.node
        assert node is not None
        done, back, final = list(held.done), list(held.back), held.final
        known, recall = await node.give_back(held.lender, held.lease, done, back, final)
        held.reported = time.monotonic()
        del held.done[: len(done)]
        del held.back[: len(back)]
        held.release(done)
        if not known:
            # Revoked (the key moved) or lapsed: what we finished goes to whoever owns the
            # key now, as done history; the rest is dropped.
            self._forward(held.key, done)
            self._drop(held)
        elif final:
            self._drop(held)
        elif recall:
            parked, held.parked = held.parked, []
            self.settle(parked + self._unqueue(held), finished=False)
        elif held.parked:  # the lender answers again
            parked, held.parked = held.parked, []
            for t in parked:
                self._engine().frontier.push(held.host, t)

    async def _report_safely(self, held: Borrowed) -> None:
        """One report. A silent lender may be dead: what of its loan is not started waits
        (parked) until it answers again or is declared dead; an odd one is asked again."""
        try:
            await self._report(held)
        except PeerTimeout as exc:
            log.debug("report to %s failed: %s", held.lender, exc)
            held.parked += self._unqueue(held)
            replication = self.peer.replication
            if held.done and replication is not None:
                # Its successor would crawl these again from the replicas' copies, before
                # our forward of them (after we too declare the lender dead) could arrive.
                done = list(held.done)
                self._tasks.spawn(replication.finished_for(held.lender.id, held.key, done), "tell")
        except (RemoteError, OSError) as exc:
            log.debug("report to %s failed: %s", held.lender, exc)

    def _engine(self) -> Engine:
        engine = self.peer.engine
        assert engine is not None
        return engine

    def _unqueue(self, held: Borrowed) -> list[Task]:
        """Take the loan's tasks that are not under way out of the frontier."""
        return self._engine().frontier.take_tasks(held.host, lambda t: t.lease == held.lease)

    def _drop(self, held: Borrowed) -> None:
        """Forget a loan; what of it is still queued here is not fetched."""
        self.loans.pop(held.lease, None)
        if held.held and held.host:
            self._unqueue(held)
        held.held.clear()
        held.parked.clear()
        held.release()
        self._count_held()

    def on_stall(self) -> None:
        """Our loop stood still: the lenders may have declared us dead and crawled our
        loans themselves. Nothing borrowed is fetched until each lender has answered a
        report (``known`` again, or not: then what we finished goes to the key's owner)."""
        for held in self.loans.values():
            held.parked += self._unqueue(held)
            held.reported = 0.0  # report at the next tick
        self._wake.set()

    def peer_removed(self, peer_id: bytes) -> None:
        """A peer left the routing table: its leases lapse, its loans are dropped."""
        for lease in [le for le in self.leases.values() if le.borrower.id == peer_id]:
            self._lapse(lease, "it left the network")
        for held in [b for b in self.loans.values() if b.lender.id == peer_id]:
            # Its replicas hold these tasks and its successor crawls them; what we finished
            # and could not report goes to that successor as done history.
            self._forward(held.key, list(held.done))
            self._drop(held)
        self._backlog.pop(peer_id, None)
        self._asked.pop(peer_id, None)
        self._misses.pop(peer_id, None)

    # -- the loop, and leaving ------------------------------------------------------------

    async def run(self) -> None:
        """Owned by the peer: borrow while hungry, report, and end leases that lapsed."""
        while True:
            try:
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            engine = self.peer.engine
            if self.loans and engine is not None and (engine.exhausted or engine.failure):
                # We fetch no more (a page limit, a full disk, a dead WARC writer): what we
                # hold on loan and have not started goes back, or its owner would keep
                # waiting for a lease we keep alive.
                self._give_back_unstarted()
            for lease in [le for le in self.leases.values() if le.deadline < now]:
                self._lapse(lease, f"no report for {LEASE_S:g} s")
            for held in list(self.loans.values()):
                # Finished tasks gather for REPORT_S; a silent loan is kept alive well
                # before it lapses; a loan with nothing left is reported at once.
                wait = REPORT_S if held.done or held.back else KEEPALIVE_S
                if held.final or now - held.reported >= wait:
                    await self._report_safely(held)
            if self.enabled and self._hungry():
                await self._borrow()

    def _forward(self, key: bytes, fps: list[int]) -> None:
        if fps:
            self._tasks.spawn(self._forward_done(key, fps), "forward")

    async def _forward_done(self, key: bytes, fps: list[int]) -> None:
        """Finished tasks of a dead lender's loan, as done history to the key's new owner,
        offered again while it refuses (it may not have declared the lender dead yet)."""
        peer, node = self.peer, self.peer.node
        assert node is not None
        delay, deadline = TICK_S, time.monotonic() + LEASE_S
        while time.monotonic() < deadline:
            owner = node.closest_local(key, 1)
            try:
                if not owner or owner[0].id == node.me.id:
                    await peer.intake([], {key: fps})
                    return
                result = await node.store_task(owner[0], [KeyBatch(key, [], fps)])
                if not result.refused_keys:
                    return
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.debug("forwarding done history to %s failed: %s", owner[0], exc)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)

    async def give_back_queued(self) -> None:
        """Leaving: return every borrowed task not yet started (those under way finish)."""
        self._give_back_unstarted()

    def _give_back_unstarted(self) -> None:
        for held in list(self.loans.values()):
            parked, held.parked = held.parked, []
            back = parked + self._unqueue(held)
            if back:
                self.settle(back, finished=False)

    async def flush(self, timeout: float) -> None:
        """Leaving: report everything, for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.loans and time.monotonic() < deadline:
            for held in list(self.loans.values()):
                if held.held:
                    # Under way still (the engine stopped): the owner crawls them again.
                    self.settle([self._placeholder(held, fp) for fp in held.held], False)
                await self._report_safely(held)
            if self.loans:
                await asyncio.sleep(TICK_S)
        for held in list(self.loans.values()):
            self._drop(held)

    def end_leases(self) -> None:
        """Leaving, after ``wait_leases``: what did not come back is handed off with our
        keys; a borrower that still holds some hears "unknown lease" and drops it."""
        for lease in list(self.leases.values()):
            self._end(lease, requeue=False)

    async def aclose(self) -> None:
        await self._tasks.aclose(timeout=1.0)

    @staticmethod
    def _placeholder(held: Borrowed, fp: int) -> Task:
        return Task("", fp, b"", 0, lease=held.lease)

    def status(self) -> dict[str, int]:
        return {
            "tasks_lent": sum(len(le.tasks) for le in self.leases.values()),
            "tasks_borrowed": sum(len(b.held) for b in self.loans.values()),
            "leases_out": len(self.leases),
            "loans_in": len(self.loans),
            "lent_total": self.lent_total,
            "borrowed_total": self.borrowed_total,
            "leases_lapsed": self.lapsed,
        }
