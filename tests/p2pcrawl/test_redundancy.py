"""No window without redundancy, and nothing sent to a peer once it is forgotten.

The owner's replication (``Replication``, ``ReplicaBook``, ``Follower``) is built as the
peer builds it, on real stores, with ``netfakes.Net`` in place of the node. A join is
played step by step -- a contact enters the table too young to own keys, more come, one
becomes a member, one dies -- and after every step each queued task must be held by the r
contacts nearest its key after the owner, young or not (docs/membership.md, "No window
without redundancy"). Then the race that kept a dead replica told of every finished page:
a re-sync to a replica under way when the replica is declared dead. And a key that reaches
an owner with none of its history (its previous owner died, or the owner never knew it):
what its replicas know as done is not queued again, even when their answer is late.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest

from p2pcrawl.crawl import Ledger, Task, urls
from p2pcrawl.network.follower import Follower, ReplicaBook
from p2pcrawl.network.intake import Intake
from p2pcrawl.network.known import Advertised
from p2pcrawl.network.replication import Replication
from protocol import Held, KeyBatch, PeerRef, PeerTimeout, key_for
from storage import BackupStore
from tests.p2pcrawl.netfakes import FakeCrawl, Net, open_stores, tasks_of

pytestmark = pytest.mark.timeout(30)

HOST = "kept.test"
KEY = key_for(HOST)
R = 2


def near(bit: int) -> bytes:
    """An ID at XOR distance 2**bit from KEY: the smaller ``bit``, the nearer."""
    return (int.from_bytes(KEY, "big") ^ (1 << bit)).to_bytes(20, "big")


OWNER, Y1, Y3, Y2, FAR = near(10), near(20), near(25), near(30), near(40)


class Copies:
    """What every peer was sent: fingerprints held (STORE_BACKUP) minus those told done."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.held: dict[bytes, set[int]] = defaultdict(set)
        self.after_gone: list[tuple[str, bytes]] = []
        self.gone: set[bytes] = set()
        self.hold_back: dict[bytes, asyncio.Event] = {}
        self.held_back = asyncio.Event()  # a held-back call is under way
        self.known_done: set[int] = set()  # what every replica knows as done
        self.slow: dict[bytes, asyncio.Event] = {}  # replicas that answer once it is set
        self.slow_delete: dict[bytes, asyncio.Event] = {}  # DELETE_BACKUP answered once set

    async def store_backup(self, to: PeerRef, owner: bytes, batches: Sequence[KeyBatch]) -> Held:
        self.net.calls.append(("store_backup", to, (owner, list(batches))))
        if to.id in self.gone:
            self.after_gone.append(("store_backup", to.id))
        wait = self.hold_back.get(to.id)
        if wait is not None:  # a replica that died while the call was under way
            self.held_back.set()
            await wait.wait()
            raise PeerTimeout(to, to.addr, "store_backup")
        slow = self.slow.get(to.id)
        if slow is not None:
            await slow.wait()
        done = []
        for b in batches:
            fps = {urls.fingerprint(t.url) for t in b.tasks}
            done += sorted(fps & self.known_done)
            held = self.held[to.id]
            held.update(fps - self.known_done)
            held.difference_update(b.done)
        return Held(sum(len(b.tasks) for b in batches) - len(done), done)

    async def delete_backup(
        self, to: PeerRef, owner: bytes, done: Mapping[bytes, Sequence[int]]
    ) -> int:
        self.net.calls.append(("delete_backup", to, (owner, dict(done))))
        if to.id in self.gone:
            self.after_gone.append(("delete_backup", to.id))
        slow = self.slow_delete.get(to.id)
        if slow is not None:
            await slow.wait()
        for fps in done.values():
            self.held[to.id].difference_update(fps)
        return 0


ALL = tasks_of(HOST, 40)


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[Ledger, BackupStore]]:
    ledger, backups = await open_stores(tmp_path)
    yield ledger, backups
    await ledger.aclose()
    await backups.aclose()


def build(
    net: Net, copies: Copies, ledger: Ledger, backups: BackupStore, rpc_timeout: float = 2.0
) -> tuple[Replication, Follower]:
    book = ReplicaBook(enroll_new=True, gone=lambda peer_id: peer_id in copies.gone)
    replication = Replication(
        net,
        book,
        ledger,
        backups,
        store_backup=copies.store_backup,
        delete_backup=copies.delete_backup,
        replicas=R,
        rpc_timeout=rpc_timeout,
    )
    return replication, Follower(book, ledger, net, replication)


def owner_of_y1_y2(
    ledger: Ledger, backups: BackupStore
) -> tuple[Net, Copies, Replication, Follower]:
    """The owner, with Y1 and Y2 its replicas."""
    net = Net(OWNER, [Y1, Y2])
    copies = Copies(net)
    replication, follower = build(net, copies, ledger, backups)
    return net, copies, replication, follower


async def queue(ledger: Ledger, replication: Replication, tasks: list[Task]) -> None:
    """As the intake does: store, then copy what is new."""
    new = await ledger.accept(tasks)
    await replication.store_backups(new, fresh=replication.fresh(new))


async def settle(replication: Replication, follower: Follower) -> None:
    """A membership change, then the follower's pass, as the peer runs it."""
    follower.book.membership_changed()
    while follower.book.dirty:
        await follower.follow()
    await replication._copies.drain()


async def assert_redundant(net: Net, ledger: Ledger, copies: Copies) -> None:
    """Every queued task is held by the r contacts nearest its key after the owner."""
    queued = [t for _, t in await ledger.load_key(KEY, 0, 1000)]
    assert queued
    reps = [p for p in net.closest_contacts(KEY, R + 1) if p.id != OWNER][:R]
    assert len(reps) == min(R, len(net.members) + len(net.young))
    for rep in reps:
        missing = {t.fp for t in queued} - copies.held[rep.id]
        assert not missing, f"{len(missing)} queued tasks not held by {rep.id.hex()[:8]}"


async def test_every_step_of_a_join_keeps_every_queued_task_on_r_live_contacts(
    stores: tuple[Ledger, BackupStore],
) -> None:
    ledger, backups = stores
    net = Net(OWNER)
    copies = Copies(net)
    replication, follower = build(net, copies, ledger, backups)
    try:
        # A founder alone: nobody to copy to yet.
        await queue(ledger, replication, ALL[:10])
        # A joiner enters the table, too young to own anything: it holds copies at once.
        net.young[FAR] = net.add(FAR)
        del net.members[FAR]
        await settle(replication, follower)
        await assert_redundant(net, ledger, copies)
        # A second, nearer the key: the r nearest are both young.
        net.young[Y1] = net.add(Y1)
        del net.members[Y1]
        await settle(replication, follower)
        await assert_redundant(net, ledger, copies)
        # New tasks while both are young go to both.
        await queue(ledger, replication, ALL[10:20])
        await replication._copies.drain()
        await assert_redundant(net, ledger, copies)
        # One becomes a member: still a replica, nothing to send again.
        sent = len(net.sent("store_backup"))
        net.members[Y1] = net.young.pop(Y1)
        await settle(replication, follower)
        await assert_redundant(net, ledger, copies)
        assert len(net.sent("store_backup")) == sent
        # A third, nearer than the first: it takes the first's place as a replica.
        net.young[Y3] = net.add(Y3)
        del net.members[Y3]
        await settle(replication, follower)
        await assert_redundant(net, ledger, copies)
        # The nearest dies: the next nearest gets its place, and hears nothing more.
        del net.members[Y1]
        copies.gone.add(Y1)
        follower.book.forget_peer(Y1)
        await settle(replication, follower)
        await assert_redundant(net, ledger, copies)
        await ledger.finish(ALL[:5])
        await replication.finished(ALL[:5])
        await replication._copies.drain()
        await replication._deletes.drain()
        await assert_redundant(net, ledger, copies)
        assert copies.after_gone == []
    finally:
        await replication.aclose()


async def test_a_replica_declared_dead_during_its_resync_is_not_told_of_finished_pages(
    stores: tuple[Ledger, BackupStore],
) -> None:
    """The re-sync awaited its copy to the replica, the replica was forgotten meanwhile, and
    the re-sync put it back among the key's holders: from then on every finished page of the
    key waited on a DELETE_BACKUP to a dead peer."""
    ledger, backups = stores
    net, copies, replication, follower = owner_of_y1_y2(ledger, backups)
    try:
        await queue(ledger, replication, ALL[:10])
        await replication._copies.drain()
        # Y3 joins nearer than Y2: a re-sync to it starts, and hangs (it has just died).
        copies.hold_back[Y3] = asyncio.Event()
        net.add(Y3)
        follower.book.membership_changed()
        resync = asyncio.ensure_future(follower.follow())
        await copies.held_back.wait()
        # Declared dead while the call waits: forgotten, then the call fails.
        del net.members[Y3]
        copies.gone.add(Y3)
        follower.book.forget_peer(Y3)
        copies.hold_back[Y3].set()
        await resync
        assert not any(r.id == Y3 for held in follower.book.holders.values() for r in held)
        await settle(replication, follower)
        await ledger.finish(ALL[:5])
        await replication.finished(ALL[:5])
        await replication._copies.drain()
        await replication._deletes.drain()
        assert copies.after_gone == []
        await assert_redundant(net, ledger, copies)
    finally:
        await replication.aclose()


async def test_a_finished_page_does_not_wait_for_a_holder_that_is_no_longer_a_replica(
    stores: tuple[Ledger, BackupStore],
) -> None:
    """A joiner nearer the key displaces a replica, which keeps its copies and is told of
    finished pages by DELETE_BACKUP. Each page's tail waited for that answer too, and so the
    owner crawled at one delete-lane spacing per pipeline while the joiner was young. The
    news still reaches it, and once it is a replica again the follower sends it the done
    range."""
    ledger, backups = stores
    net, copies, replication, follower = owner_of_y1_y2(ledger, backups)
    try:
        await queue(ledger, replication, ALL[:10])
        await replication._copies.drain()
        net.add(Y3)  # nearer than Y2: Y2 is an earlier holder from now on
        await settle(replication, follower)
        copies.slow_delete[Y2] = asyncio.Event()
        await ledger.finish(ALL[:5])
        fin = asyncio.ensure_future(replication.finished(ALL[:5]))
        done, _ = await asyncio.wait([fin], timeout=10.0)
        assert fin in done, "the page's finish waited for the earlier holder"
        assert {t.fp for t in ALL[:5]} <= copies.held[Y2]  # not told yet
        copies.slow_delete[Y2].set()
        await replication._deletes.drain()
        assert not {t.fp for t in ALL[:5]} & copies.held[Y2]
        # Y3 dies before it owns anything: Y2 is a replica again, and in step.
        del net.members[Y3]
        copies.gone.add(Y3)
        follower.book.forget_peer(Y3)
        await settle(replication, follower)
        await assert_redundant(net, ledger, copies)
    finally:
        await replication.aclose()


@pytest.mark.parametrize("routed", [True, False])
async def test_a_key_new_here_is_queued_without_what_its_replicas_know_as_done(
    stores: tuple[Ledger, BackupStore], routed: bool
) -> None:
    """Its previous owner finished half of it and died before its replicas handed the
    history on (or this peer never knew that owner): the replicas answer the key's first
    copies with what they know as done, and only the rest is queued here."""
    ledger, backups = stores
    net = Net(OWNER, [Y1, Y2])
    copies = Copies(net)
    copies.known_done = {t.fp for t in ALL[:5]}
    replication, _ = build(net, copies, ledger, backups)
    intake = Intake(ledger, replication, FakeCrawl(), Advertised())
    try:
        assert await intake.accept(ALL[:10], routed=routed) == 5
        assert ledger.queued == 5 and intake.learned_done == 5
        assert all(await ledger.is_done(ALL[:5]))
        assert {t.fp for _, t in await ledger.load_key(KEY, 0, 100)} == {t.fp for t in ALL[5:10]}
        # Known here now: later tasks of the key are queued first and copied after.
        calls = len(net.sent("store_backup"))
        assert await intake.accept(ALL[10:12], routed=routed) == 2
        await replication._copies.drain()
        assert len(net.sent("store_backup")) > calls
    finally:
        await replication.aclose()


async def test_a_key_whose_first_copies_are_answered_late_waits_for_the_answer(
    stores: tuple[Ledger, BackupStore],
) -> None:
    """A handoff's tasks reach a new owner while one replica (the slow old owner) holds
    the key's done history and answers after the STORE_TASK handler stopped waiting: the
    key is neither fetched nor lent until that answer, and then only what it did not name
    as done is queued, loadable again although the refill's cursor passed it meanwhile."""
    ledger, backups = stores
    net = Net(OWNER, [Y1, Y2])
    copies = Copies(net)
    copies.known_done = {t.fp for t in ALL[:5]}
    copies.slow[Y2] = asyncio.Event()
    # The handler's wait is a quarter of this: nothing here depends on its length.
    replication, _ = build(net, copies, ledger, backups, rpc_timeout=0.2)
    crawl = FakeCrawl()
    intake = Intake(ledger, replication, crawl, Advertised())
    try:
        assert await intake.accept(ALL[:10], routed=True) == 10  # the handler's wait ran out
        assert replication.late_copies == 1
        assert KEY in crawl.excluded and intake.parked_late == 1
        # More of the key while it waits: queued, still parked.
        assert await intake.accept(ALL[10:12], routed=True) == 2
        assert KEY in crawl.excluded
        assert len(await ledger.load(100)) == 12  # the refill passes the rows by
        copies.slow[Y2].set()
        await replication._late.join()
        assert KEY not in crawl.excluded
        assert intake.learned_done == 5 and all(await ledger.is_done(ALL[:5]))
        loaded = {t.fp for _, t in await ledger.load(100)}
        assert loaded == {t.fp for t in ALL[5:12]}
    finally:
        await replication.aclose()
