"""The membership machines through their ports: no socket, real stores, a fake network.

Each machine of ``p2pcrawl.network`` (a join from both sides, a handoff, a takeover, a leave,
the finished state) is built here as the peer builds it, with ``netfakes.Net`` in place of
the node; what a user depends on is asserted on what the fake network was sent and on what
the stores hold afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from p2pcrawl.crawl import CrawlStats, EventLog, Ledger, Task, to_stored, urls
from p2pcrawl.network.handoff import Handoff, History
from p2pcrawl.network.join import (
    ADMISSION_RETRY_S,
    HANDOFF_POLL_S,
    REASK_S,
    SUSPECT_LATER_S,
    SUSPECT_POLL_S,
    Join,
    Welcome,
)
from p2pcrawl.network.leave import HandoffReport, Leave
from p2pcrawl.network.quiescence import Quiescence
from p2pcrawl.network.rebalance import Rebalance
from p2pcrawl.network.roster import Roster
from p2pcrawl.network.stall import StallResync
from protocol import (
    KeyBatch,
    PeerRef,
    PeerTimeout,
    RefreshAnswer,
    RemoteError,
    StoreResult,
    closest,
    key_for,
)
from storage import BackupStore
from tests.conftest import id_next_to, id_outranked_by
from tests.p2pcrawl.netfakes import FakeCrawl, Net, no_patience, open_stores, peer, tasks_of

pytestmark = pytest.mark.timeout(30)

Stores = tuple[Ledger, BackupStore]


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[Stores]:
    ledger, backups = await open_stores(tmp_path)
    yield ledger, backups
    await ledger.aclose()
    await backups.aclose()


HOST = "moving.test"
KEY = key_for(HOST)
OWNER = id_next_to(KEY)  # the key's owner once it is in the table
ME = id_outranked_by(OWNER, KEY)  # the key's owner while OWNER is not


def handoff_for(net: Net, ledger: Ledger, crawl: FakeCrawl, **kwargs: Any) -> Handoff:
    async def copy_for(owner: PeerRef, tasks: Any, done: dict[bytes, list[int]] | None) -> None:
        net.calls.append(("copy_for", owner, (list(tasks), done)))

    defaults: dict[str, Any] = {
        "send": net.store_task,
        "copy_for": copy_for,
        "revoke": lambda keys: None,
        "waiting": no_patience,
        "rebalance_soon": lambda: None,
        "timeout": 10.0,
    }
    return Handoff(ledger, crawl, net, **{**defaults, **kwargs})


async def queue_with_history(ledger: Ledger, pages: int = 5, done: int = 3) -> list[Task]:
    tasks = tasks_of(HOST, pages)
    assert len(await ledger.accept(tasks)) == pages
    finished = tasks_of(HOST, range(100, 100 + done))
    await ledger.done.add([(t.key, t.fp) for t in finished])
    return tasks


# -- handoff ------------------------------------------------------------------------------


async def test_a_handoff_answered_busy_is_retried_and_its_keys_stay_parked(
    stores: Stores,
) -> None:
    ledger = stores[0]
    tasks = await queue_with_history(ledger)
    net, crawl = Net(ME, [OWNER]), FakeCrawl()
    refusals: list[tuple[int, bool]] = []

    async def busy_twice(to: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        if len(refusals) < 2:
            # Each try carries the whole queue (put back after the last one failed),
            # and meanwhile the key is not ours to crawl.
            refusals.append((sum(len(b.tasks) for b in batches), KEY in crawl.excluded))
            raise RemoteError(to, "store_task", "busy")
        return StoreResult(sum(len(b.tasks) for b in batches), 0, [])

    net.store_task_answer = busy_twice
    handoff = handoff_for(net, ledger, crawl)
    sent = await handoff.hand_over(net.members[OWNER], [KEY])
    assert sent == len(tasks)
    assert refusals == [(len(tasks), True), (len(tasks), True)]
    assert KEY not in crawl.ever_included  # never crawled here meanwhile
    to, batches = net.sent("store_task")[-1]
    assert to.id == OWNER and isinstance(batches, list)
    (batch,) = batches
    assert {t.url for t in batch.tasks} == {t.url for t in tasks}
    assert len(batch.done) == 3  # the history went with the queue
    assert [p.id for p, _ in net.sent("copy_for")] == [OWNER] * 3  # and to its replicas
    assert ledger.queued == 0


async def test_an_open_networks_handoff_names_only_the_pages_it_can_vouch_for(
    stores: Stores,
) -> None:
    """In an open network the new owner checks a handed done range with us (VOUCH), and a
    drawn page we did not fetch ourselves left the whole range unrecorded: only the pages
    with a proof go (docs/security.md, "What a handoff names")."""
    ledger = stores[0]
    await queue_with_history(ledger, done=0)
    fetched, told = tasks_of(HOST, range(100, 103)), tasks_of(HOST, range(200, 202))
    await ledger.done.add(
        [(t.key, t.fp) for t in fetched + told], [(t.key, t.fp, t.url, b"") for t in fetched]
    )
    net, crawl = Net(ME, [OWNER]), FakeCrawl()
    crawl.keep_proofs = True
    await handoff_for(net, ledger, crawl).hand_over(net.members[OWNER], [KEY])
    _, batches = net.sent("store_task")[-1]
    assert isinstance(batches, list)
    (batch,) = batches
    assert sorted(batch.done) == sorted(t.fp for t in fetched)
    _, copied = net.sent("copy_for")[-1]
    assert isinstance(copied, tuple)
    assert sorted(copied[1][KEY]) == sorted(t.fp for t in fetched)


async def test_a_handoff_to_a_peer_that_no_longer_owns_the_keys_gives_them_back(
    stores: Stores,
) -> None:
    ledger = stores[0]
    tasks = await queue_with_history(ledger)
    net, crawl = Net(ME, [OWNER]), FakeCrawl()
    rebalances: list[int] = []

    async def gone(to: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        net.members.pop(OWNER, None)  # declared dead while we tried
        raise PeerTimeout(to, to.addr, "store_task")

    net.store_task_answer = gone
    handoff = handoff_for(net, ledger, crawl, rebalance_soon=lambda: rebalances.append(1))
    assert await handoff.hand_over(peer(OWNER, 2), [KEY]) is None
    assert len(net.sent("store_task")) == 1  # not offered again to a non-owner
    assert KEY not in crawl.excluded and rebalances  # ours to crawl, or to pass on
    assert ledger.queued == len(tasks)


# -- a join, both sides ---------------------------------------------------------------------


async def test_a_joiner_owns_nothing_until_each_neighbour_counted_and_waits_for_all() -> None:
    a, b = id_next_to(key_for("a.test")), id_next_to(key_for("b.test"))
    net = Net(ME, [a, b])
    net.owner_ready = False
    asked: list[bytes] = []
    script = {a: [RefreshAnswer(0, 0.02), RefreshAnswer(0, 0.02), RefreshAnswer(2)]}
    owned_after: list[int] = []

    async def answer(to: PeerRef) -> RefreshAnswer:
        asked.append(to.id)
        left = script.get(to.id, [])
        return left.pop(0) if left else RefreshAnswer(0)

    def take_ownership() -> bool:
        owned_after.append(asked.count(a))
        return net.take_ownership()

    net.refresh_answer = answer
    events = EventLog()
    changes: list[int] = []
    join = Join(
        net,
        net.peers,
        events,
        ask=net.refresh_task,
        take_ownership=take_ownership,
        owners_changed=lambda: changes.append(1),
        ksize=20,
        give_up_after=10.0,
    )
    task = asyncio.create_task(join.refresh())
    await asyncio.sleep(0)
    assert join.expecting(a) and join.expecting(b)
    await task
    # "Later" twice, then a count: ownership only then, and the wait went on until "0".
    assert owned_after and owned_after[0] == 3 and asked.count(a) == 4
    assert net.owner_ready and changes == [1]
    assert not join.expecting(a)
    (refreshed,) = [e for e in events.events if e["kind"] == "refreshed"]
    assert refreshed["keys"] == 2 and refreshed["neighbours"] == 2


def quiet_join(net: Net) -> Join:
    """A join over ``net`` whose events and ownership changes nobody watches."""
    return Join(
        net,
        net.peers,
        EventLog(),
        ask=net.refresh_task,
        take_ownership=net.take_ownership,
        owners_changed=lambda: None,
        ksize=20,
        give_up_after=30.0,
    )


async def test_a_neighbour_declared_dead_during_a_join_is_not_waited_for() -> None:
    a = id_next_to(key_for("a.test"))
    net = Net(ME, [a])

    async def silent(to: PeerRef) -> RefreshAnswer:
        net.members.pop(a, None)
        raise PeerTimeout(to, to.addr, "refresh_task")

    net.refresh_answer = silent
    join = quiet_join(net)
    async with asyncio.timeout(2):
        await join.refresh()
    assert len(net.sent("refresh_task")) == 1


async def test_a_join_goes_on_once_a_silent_neighbour_is_declared_dead() -> None:
    """A neighbour that dies mid-join leaves its REFRESH_TASK unanswered; the join drops it
    when it is declared dead (an event, not the next timeout), and asks the dead one's
    nearest neighbours, its replicas, once more for what they took over of ours."""
    dead, b, c, far = (id_next_to(key_for(f"{h}.test")) for h in ("d", "b", "c", "f"))
    net = Net(ME, [dead, b, c, far])
    never = asyncio.Event()

    async def answer(to: PeerRef) -> RefreshAnswer:
        if to.id == dead:
            await never.wait()  # the RPC timeout is far away
        return RefreshAnswer(0)

    net.refresh_answer = answer
    join = quiet_join(net)  # asks the dead one's two replicas
    task = asyncio.create_task(join.refresh())
    await asyncio.sleep(0.2)
    assert not task.done()
    del net.members[dead]
    join.neighbour_gone(dead, "unresponsive")
    async with asyncio.timeout(REASK_S + 1.0):
        await task
    asked = [p.id for p, _ in net.sent("refresh_task")]
    reps = set(closest(dead, [b, c, far], 2))
    assert all(asked.count(r) == 2 for r in reps)  # asked again once the dead one went
    once = {i for i in asked if asked.count(i) == 1}
    assert once == {dead} | {i for i in (b, c, far) if i not in reps}


class Newcomers:
    def __init__(self) -> None:
        self.wait: float | None = None
        self.established = False
        self.silent: dict[bytes, float] = {}  # suspects, and how long each was silent

    def silences(self) -> dict[bytes, float]:
        return self.silent

    def owner_wait(self, peer_id: bytes) -> float | None:
        return self.wait

    def establish_early(self, peer_id: bytes) -> bool:
        return self.established


async def test_a_neighbour_hands_a_joiner_its_keys_only_once_it_may_own_them(
    stores: Stores,
) -> None:
    ledger = stores[0]
    spawned: list[Coroutine[Any, Any, None]] = []
    try:
        tasks = await queue_with_history(ledger)
        net = Net(ME, [OWNER])
        # A key that stays ours.
        stays = next(
            h
            for h in (f"s{i}.test" for i in range(100))
            if net.closest_local(key_for(h), 1)[0].id == ME
        )
        await ledger.accept(tasks_of(stays, 2))
        newcomers = Newcomers()
        handoff = handoff_for(net, ledger, FakeCrawl())
        welcome = Welcome(
            ledger,
            net,
            newcomers,
            handoff,
            EventLog(),
            stores[1].owner_counts,
            active=lambda: True,
            spawn=lambda coro, name: spawned.append(coro),
        )
        joiner = net.members[OWNER]
        assert await welcome.serve_refresh(joiner) == RefreshAnswer(0, ADMISSION_RETRY_S)
        newcomers.wait = 3.0  # admitted, 3 s short of the minimum age
        assert await welcome.serve_refresh(joiner) == RefreshAnswer(0, 3.0)
        assert not net.calls and not spawned and ledger.queued == len(tasks) + 2
        newcomers.wait, newcomers.established = 0.0, True
        assert await welcome.serve_refresh(joiner) == RefreshAnswer(1)
        assert await welcome.serve_refresh(joiner) == RefreshAnswer(0, HANDOFF_POLL_S)  # under way
        await spawned.pop()
        assert ledger.queued == 2 and [p.id for p, _ in net.sent("store_task")] == [OWNER]
        # Asked again, it has nothing more: the key's history went already.
        assert await welcome.serve_refresh(joiner) == RefreshAnswer(0)
    finally:
        for coro in spawned:
            coro.close()


async def test_a_replica_of_a_suspect_nearer_the_joiner_answers_it_later(
    stores: Stores,
) -> None:
    """A joiner's neighbour died; the joiner declared it and asks that neighbour's replicas
    again. A replica that still suspects it answers "later" until it has declared it too
    (then the dead one's keys nearest the joiner go to the joiner from it), rather than
    "nothing for you" while it holds them. A suspicion grown old (a slow peer more likely
    than a dead one), a suspect farther from the joiner than we are, or one of which we
    hold nothing changes no answer."""
    ledger, backups = stores
    net = Net(ME, [OWNER])
    joiner = net.members[OWNER]
    dead = (int.from_bytes(OWNER, "big") ^ 1).to_bytes(len(OWNER), "big")  # next to it
    far = bytes(b ^ 0xFF for b in OWNER)  # as far from the joiner as an ID can be
    newcomers = Newcomers()
    newcomers.wait, newcomers.established = 0.0, True
    silent = newcomers.silent
    welcome = Welcome(
        ledger,
        net,
        newcomers,
        handoff_for(net, ledger, FakeCrawl()),
        EventLog(),
        backups.owner_counts,
        active=lambda: True,
        spawn=lambda coro, name: coro.close(),
    )
    silent[dead] = 1.0
    assert await welcome.serve_refresh(joiner) == RefreshAnswer(0)  # nothing of it held here
    await backups.add(dead, [to_stored(t) for t in tasks_of("dead.test", 2)])
    await backups.add(far, [to_stored(t) for t in tasks_of("far.test", 2)])
    assert await welcome.serve_refresh(joiner) == RefreshAnswer(0, SUSPECT_POLL_S)
    silent[dead] = SUSPECT_LATER_S + 1.0
    assert await welcome.serve_refresh(joiner) == RefreshAnswer(0)
    del silent[dead]  # declared (or heard from again)
    silent[far] = 1.0
    assert await welcome.serve_refresh(joiner) == RefreshAnswer(0)


# -- a takeover ------------------------------------------------------------------------------


async def test_a_takeover_hands_done_history_before_rerouting_the_backups(
    stores: Stores,
) -> None:
    """The successor may not have declared the old owner dead yet (it refuses), and must
    not take the backups without the history: it would fetch finished pages again."""
    ledger, backups = stores
    gone = OWNER
    successor = id_outranked_by(OWNER, KEY)
    me = id_outranked_by(successor, KEY)
    held = tasks_of(HOST, 5)
    await backups.add(gone, [to_stored(t) for t in held])
    await ledger.done.add([(t.key, t.fp) for t in held[:2]])  # told as a replica
    net = Net(me, [successor])
    order: list[str] = []

    async def refuse_once(to: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        order.append("history")
        refused = [KEY] if order.count("history") == 1 else []
        return StoreResult(0, 0, refused)

    routed: list[Task] = []

    async def route(tasks: list[Task]) -> None:
        order.append("route")
        routed.extend(tasks)

    net.store_task_answer = refuse_once
    rebalance = _rebalance(net, ledger, backups, route)
    rebalance.owner_gone(gone, "unresponsive")
    await rebalance.pass_once()
    assert order == ["history", "history", "route"]
    for _, batches in net.sent("store_task"):
        assert all(not b.tasks and len(b.done) == 2 for b in batches)  # type: ignore[attr-defined]
    assert sorted(t.url for t in routed) == sorted(t.url for t in held[2:])
    assert await backups.count() == 0


async def test_a_takeover_keeps_its_own_share_without_waiting_for_the_others_to_declare(
    stores: Stores,
) -> None:
    """The dead owner's keys that are ours now are taken at once: another successor that
    has not declared the death yet (it refuses the history) holds up only the backups that
    go to it. Before, our share waited until the slowest successor had declared too."""
    ledger, backups = stores
    successor = id_outranked_by(OWNER, KEY)
    me = id_outranked_by(successor, KEY)
    mine = next(
        h
        for h in (f"mine{i}.test" for i in range(256))
        if closest(key_for(h), [me, successor], 1)[0] == me
    )
    theirs, ours = tasks_of(HOST, 3), tasks_of(mine, 3)
    await backups.add(OWNER, [to_stored(t) for t in theirs + ours])
    await ledger.done.add([(t.key, t.fp) for t in theirs[:1]])  # told as a replica
    net = Net(me, [successor])
    order: list[str] = []

    async def refuse_twice(to: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        order.append("history")
        return StoreResult(0, 0, [KEY] if order.count("history") <= 2 else [])

    async def route(tasks: list[Task]) -> None:
        order.append("route " + ",".join(sorted({urls.hostname_of(t.url) for t in tasks})))

    net.store_task_answer = refuse_twice
    rebalance = _rebalance(net, ledger, backups, route)
    rebalance.owner_gone(OWNER, "unresponsive")
    await rebalance.pass_once()
    assert order == [f"route {mine}", "history", "history", "history", f"route {HOST}"]
    assert await backups.count() == 0


def _rebalance(net: Net, ledger: Ledger, backups: BackupStore, route: Any) -> Rebalance:
    crawl = FakeCrawl()
    handoff = handoff_for(net, ledger, crawl)

    async def keep(done: dict[bytes, list[int]]) -> None:
        raise AssertionError("no history of ours here")

    history = History(ledger, net, send=net.store_task, keep=keep, timeout=5.0)
    return Rebalance(
        ledger,
        backups,
        net,
        handoff,
        history,
        EventLog(),
        peers=net.peers,
        in_table=net.in_table,
        route=route,
        active=lambda: True,
        due=asyncio.Event(),
        replicas=2,
        republish_interval=60.0,
    )


# -- a graceful leave -----------------------------------------------------------------------


class Parted:
    """The leave's other ports: what it stops, recalls and flushes, in order."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def stop_fetching(self, timeout: float) -> list[Task]:
        self.order.append("stop")
        return []

    async def aclose(self) -> None:
        self.order.append("engine closed")

    def recall(self, keys: set[bytes] | None = None) -> None:
        self.order.append("recall")

    async def wait_leases(self, timeout: float) -> None:
        self.order.append("leases back")

    def end_leases(self) -> None:
        pass

    def give_back_unstarted(self) -> None:
        self.order.append("give back")

    async def flush(self, timeout: float) -> None:
        self.order.append("reported")


def _leave(
    net: Net, ledger: Ledger, backups: BackupStore, order: list[str], **kwargs: Any
) -> Leave:
    parted = Parted(order)

    async def nothing(*args: Any) -> None:
        return None

    ports: dict[str, Any] = {
        "leases": parted,
        "loans": parted,
        "peers": net.peers,
        "contacts": net.neighbours,
        "depart": net.depart,
        "goodbye": net.goodbye,
        "flush_links": nothing,
        "stored": nothing,
        "hurry": lambda: None,
    }
    handoff = handoff_for(net, ledger, FakeCrawl())
    return Leave(
        ledger, backups, parted, handoff, EventLog(), HandoffReport(), **{**ports, **kwargs}
    )


async def test_a_leave_says_goodbye_then_hands_every_task_and_backup_to_its_owner(
    stores: Stores,
) -> None:
    ledger, backups = stores
    other_host = "other.test"
    a, b = OWNER, id_next_to(key_for(other_host))
    await queue_with_history(ledger)
    await ledger.accept(tasks_of(other_host, 3))
    held = tasks_of("held.test", 4)
    await backups.add(b"\x01" * 20, [to_stored(t) for t in held])
    net = Net(ME, [a, b])
    # A joiner in our table, not yet a member here: it counts us a member (we are older),
    # and would route our keys back to us after the handoff had it not heard the goodbye.
    young = id_next_to(ME)
    net.young[young] = peer(young, 9)
    order: list[str] = []

    async def taken(to: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        order.append("store_task")
        return StoreResult(sum(len(x.tasks) for x in batches), 0, [])

    net.store_task_answer = taken
    leave = _leave(net, ledger, backups, order)
    report = await leave.leave()
    assert order[:5] == ["recall", "give back", "stop", "reported", "leases back"]
    goodbyes = [p.id for p, _ in net.sent("goodbye")]
    assert sorted(goodbyes) == sorted([a, b, young])
    first_store = next(i for i, (n, _, _) in enumerate(net.calls) if n == "store_task")
    # It stops probing before its goodbyes, and sends only its handoff after them.
    assert net.calls[0][0] == "depart"
    assert all(n == "goodbye" for n, _, _ in net.calls[1:4]) and first_store == 4
    to_owner = {p.id: batches for p, batches in net.sent("store_task")}
    assert young not in to_owner  # a young ID owns nothing yet
    assert {x.key for x in to_owner[a]} >= {KEY}  # type: ignore[attr-defined]
    assert report.tasks == report.queue_at_leave == 8 and report.failed == 0
    assert report.done == 3 and report.backups == 4
    assert ledger.queued == 0 and await backups.count() == 0


async def test_a_leave_counts_the_store_tasks_taken_before_its_door_closed(
    stores: Stores,
) -> None:
    """A STORE_TASK taken while the door was open may still be storing its task when the
    leave counts its queue: the leave waits for it, and hands it off with the rest."""
    ledger, backups = stores
    await queue_with_history(ledger)
    late = tasks_of(HOST, range(50, 51))

    async def store_late() -> None:
        await asyncio.sleep(0.1)
        await ledger.accept(late)

    storing = asyncio.create_task(store_late())

    async def stored(timeout: float) -> None:
        await asyncio.wait_for(asyncio.shield(storing), timeout)

    net = Net(ME, [OWNER])
    leave = _leave(net, ledger, backups, [], stored=stored)
    report = await leave.leave()
    await storing
    assert report.tasks == report.queue_at_leave == 6
    assert ledger.queued == 0


async def test_a_leave_counts_its_queue_after_a_handoff_under_way_put_tasks_back(
    stores: Stores,
) -> None:
    ledger, backups = stores
    await queue_with_history(ledger)
    net = Net(ME, [OWNER])
    leave = _leave(net, ledger, backups, [])
    lock = leave.handoff.lock
    await lock.acquire()  # a rebalance pass, its send failing: the tasks come back

    async def put_back() -> None:
        await asyncio.sleep(0.1)
        await ledger.accept(tasks_of(HOST, range(60, 62)))
        lock.release()

    back = asyncio.create_task(put_back())
    report = await leave.leave()
    await back
    assert report.tasks == report.queue_at_leave == 7 and ledger.queued == 0


# -- finished -------------------------------------------------------------------------------


class Idle:
    """A crawler with nothing to do (``quiescence.Work``)."""

    tasks_queued = 0
    in_flight: dict[int, Task] = {}
    exhausted = False

    def __init__(self) -> None:
        self.stats = CrawlStats()


def quiescence(
    net: Net, ask: Any, *, held: dict[bytes, int], done: int, **kwargs: Any
) -> Quiescence:
    async def owners() -> dict[bytes, int]:
        return held

    return Quiescence(
        Idle(),
        net,
        EventLog(),
        me=ME,
        done_count=lambda: done,
        in_transit=lambda: 0,
        backup_owners=owners,
        steady=lambda: True,
        ask=ask,
        settle=0.0,
        **kwargs,
    )


async def test_the_network_is_not_finished_while_a_peer_says_it_is_not_quiet() -> None:
    a, b = id_next_to(key_for("a.test")), id_next_to(key_for("b.test"))
    net = Net(ME, [a, b])
    answers: dict[bytes, Any] = {a: (True, 7), b: (False, 0)}

    async def ask(to: PeerRef) -> tuple[bool, int]:
        answer = answers[to.id]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    q = quiescence(net, ask, held={}, done=0)
    await q.tick()  # quiet from now on: nothing changed since
    await q.tick()
    assert q.quiet() and not q.finished.is_set()  # b is not quiet
    answers[b] = PeerTimeout(net.members[b], net.members[b].addr, "quiet")
    q.answer(b)  # b asks us: it may be quiet now, we ask again at once
    await q.tick()
    assert not q.finished.is_set()  # b cannot be asked: a suspect decides first
    answers[b] = (True, 0)
    q.answer(b)
    await q.tick()
    assert q.finished.is_set()  # and some work was done (a's 7 pages)


async def test_a_peer_holding_an_orphaned_backup_is_not_quiet() -> None:
    net = Net(ME, [])

    async def ask(to: PeerRef) -> tuple[bool, int]:
        raise AssertionError("nobody to ask")

    # Backups of an owner not in our table: a takeover is due.
    q = quiescence(net, ask, held={OWNER: 3}, done=5)
    for _ in range(3):
        await q.tick()
    assert q.orphaned == 3 and not q.quiet() and not q.finished.is_set()


async def test_a_peer_declared_dead_holds_the_finish_back_for_the_merge_bound() -> None:
    """A half cut off by a partition looks dead: the network is not finished while a peer
    declared dead may still come back with work (--partition-hold), unless it comes back,
    and a GOODBYE holds nothing back."""
    a, b = id_next_to(key_for("a.test")), id_next_to(key_for("b.test"))
    net = Net(ME, [a, b])
    now = [1000.0]

    async def ask(to: PeerRef) -> tuple[bool, int]:
        return True, 5

    q = quiescence(net, ask, held={}, done=5, hold=36.0, clock=lambda: now[0])
    cut = net.members.pop(b)  # declared dead: the roster says so
    q.lost(b, "unresponsive")
    for step in (0.0, 10.0, 25.0):  # up to 35 s after the declaration
        now[0] += step
        await q.tick()
        await q.tick()
        assert not q.quiet() and not q.finished.is_set(), step
    assert q.holding() == pytest.approx(1.0)
    now[0] += 1.0  # 36 s: a partition this long is taken for a crash
    await q.tick()
    await q.tick()
    assert q.finished.is_set() and q.holding() == 0.0

    net.members[b] = cut  # b was back, and is declared dead again
    await q.tick()
    net.members.pop(b)
    q.lost(b, "unresponsive")
    await q.tick()
    assert not q.quiet() and not q.finished.is_set()
    net.members[b] = cut  # the halves merged: the hold goes at once
    await q.tick()
    await q.tick()
    assert q.finished.is_set()

    net.members.pop(a)
    q.lost(a, "goodbye")  # a said GOODBYE: nothing to wait for
    q.lost(b, "replaced")
    await q.tick()
    await q.tick()
    assert q.holding() == 0.0 and q.finished.is_set()


# -- a stall, and the roster --------------------------------------------------------------


class Pauses:
    def __init__(self) -> None:
        self.held: set[str] = set()
        self.log: list[str] = []

    def pause(self, reason: str) -> None:
        self.held.add(reason)
        self.log.append(f"pause {reason}")

    def resume(self, reason: str) -> None:
        self.held.discard(reason)
        self.log.append(f"resume {reason}")

    def wake(self) -> None:
        self.log.append("wake")


async def test_after_a_stall_nothing_is_fetched_until_the_neighbours_handed_back_ours() -> None:
    a, b = id_next_to(key_for("a.test")), id_next_to(key_for("b.test"))
    net = Net(ME, [a, b])
    pauses = Pauses()
    refreshed = asyncio.Event()
    done_refreshing = asyncio.Event()
    spawned: list[asyncio.Task[None]] = []

    async def ping(to: PeerRef) -> None:
        net.calls.append(("ping", to, None))

    async def refresh() -> None:
        refreshed.set()
        await done_refreshing.wait()

    stall = StallResync(
        pauses,
        EventLog(),
        peers=net.peers,
        ping=ping,
        refresh=refresh,
        park_loans=lambda: pauses.log.append("loans parked"),
        rebalance_soon=lambda: pauses.log.append("rebalance"),
        active=lambda: True,
        spawn=lambda coro, name: spawned.append(asyncio.create_task(coro)),
    )
    stall.on_stall(12.0)
    stall.on_stall(13.0)  # the same stall seen twice: one re-sync
    await refreshed.wait()
    assert pauses.held == {"stall"} and stall.resyncing and len(spawned) == 1
    assert sorted(p.id for p, _ in net.sent("ping")) == sorted([a, b])
    done_refreshing.set()
    await spawned[0]
    assert pauses.log == ["pause stall", "loans parked", "resume stall", "wake", "rebalance"]
    assert not stall.resyncing and stall.resyncs == 1


def test_the_roster_tells_of_a_departure_before_the_change_it_makes() -> None:
    net = Net(ME, [OWNER])
    events = EventLog()
    roster = Roster(net, events)
    heard: list[str] = []
    roster.on_departure(lambda peer_id, why: heard.append(f"gone {why}"))
    roster.on_change(lambda: heard.append("changed"))
    roster.departed(net.members[OWNER], "goodbye")
    roster.arrived(net.members[OWNER])
    assert heard == ["gone goodbye", "changed", "changed"]
    assert [e["kind"] for e in events.events] == ["peer_left", "peer_added"]
