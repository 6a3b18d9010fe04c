"""Who writes the replicas: the owner, before it answers STORE_TASK, and only what is new.

An in-process peer owns a key; two bare nodes, both further from the key, are its replicas
(real CrawlNodes with in-memory handlers). One of them routes tasks to the owner as a
discoverer would. What the replicas hold when the sender hears back, and how many
STORE_BACKUPs reach them, show who copies what.
"""

from __future__ import annotations

import asyncio

import pytest

from p2pcrawl.network import Peer
from p2pcrawl.network import follower as follower_module
from p2pcrawl.settings import CrawlSettings, ScopeSettings
from protocol import CrawlNode, Held, KeyBatch, NodeConfig, PeerRef, TaskItem, key_for
from tests.conftest import KEYED, TEST_SECRET, PeerFactory, id_outranked_by
from tests.protocol.conftest import MemoryHandler, eventually

pytestmark = pytest.mark.timeout(60)

HOST = "kept.test"


class Replica(MemoryHandler):
    """Counts STORE_BACKUPs; with ``hang`` set, never answers one (a replica that died
    after the owner last heard from it)."""

    def __init__(self) -> None:
        super().__init__()
        self.backup_calls = 0
        self.hang = False
        self._never = asyncio.Event()

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> Held:
        self.backup_calls += 1
        if self.hang:
            await self._never.wait()
        # The news of finished pages rides in the owner's copy lane (done fingerprints).
        self.done_seen.update((b.key, f) for b in batches for f in b.done)
        return await super().handle_store_backup(sender, owner, batches)


async def _owner(make_peer: PeerFactory) -> tuple[Peer, bytes, bytes]:
    """A paused peer that owns HOST, and two node IDs further from HOST's key than it is:
    ``near`` nearer than ``far``."""
    crawl = CrawlSettings(scope=ScopeSettings(allow_domains=(HOST,)))
    a = await make_peer(crawl=crawl, peer=KEYED)
    assert a.engine is not None and a.node is not None
    a.engine.pause("test")
    near = id_outranked_by(a.node_id, key_for(HOST))
    # Flipping a low bit keeps the bit that makes ``a`` the closer one: ``a`` still owns.
    far = near[:-1] + bytes([near[-1] ^ 1])
    return a, near, far


async def _replica(node_id: bytes, a: Peer) -> tuple[CrawlNode, Replica]:
    """A bare node joined to ``a``, holding what it is sent in memory."""
    handler = Replica()
    node = CrawlNode(node_id, handler, NodeConfig(secret=TEST_SECRET))
    await node.listen_on("127.0.0.1", 0)
    await node.join([a.me.addr])
    return node, handler


async def _owner_and_replicas(
    make_peer: PeerFactory,
) -> tuple[Peer, tuple[CrawlNode, Replica], tuple[CrawlNode, Replica]]:
    a, near, far = await _owner(make_peer)
    nodes = [await _replica(near, a), await _replica(far, a)]
    want = sorted(n.me.id for n, _ in nodes)
    node = a.node
    assert node is not None
    await eventually(lambda: sorted(p.id for p in node.peers()) == want, timeout=5)
    return a, nodes[0], nodes[1]


def _batch(n: int) -> KeyBatch:
    urls = [f"http://{HOST}/p{i}" for i in range(n)]
    return KeyBatch(key_for(HOST), [TaskItem(url=u, depth=1) for u in urls])


async def _store_and_settle(sender: CrawlNode, a: Peer) -> None:
    """Route a new key's 20 tasks to ``a``, then wait out its follower's pass."""
    replication = a.parts.replication
    assert (await sender.store_task(a.me, [_batch(20)])).new == 20
    await asyncio.sleep(0.2 + 0.5)  # the follower's pass starts 0.2 s after a wake
    await eventually(lambda: replication.pending == 0)


async def test_the_owner_has_copied_new_tasks_to_its_replicas_when_the_sender_hears_back(
    make_peer: PeerFactory,
) -> None:
    a, (sender, sent_side), (other, other_side) = await _owner_and_replicas(make_peer)
    replication = a.parts.replication
    try:
        result = await sender.store_task(a.me, [_batch(20)])
        assert result.new == 20
        # No waiting: the owner's answer came after both copies were held.
        assert len(sent_side.backups.get(a.node_id, {})) == 20
        assert len(other_side.backups.get(a.node_id, {})) == 20
        await eventually(lambda: replication.pending == 0)
        calls = sent_side.backup_calls + other_side.backup_calls
        # The same links again, as a second discoverer would send them: nothing is new to
        # the owner, so nothing more is copied.
        again = await sender.store_task(a.me, [_batch(20)])
        assert (again.new, again.duplicate) == (0, 20)
        await eventually(lambda: replication.pending == 0)
        assert sent_side.backup_calls + other_side.backup_calls == calls
    finally:
        await sender.aclose()
        await other.aclose()


async def test_a_key_new_to_the_owner_is_copied_once_not_again_by_the_follower(
    make_peer: PeerFactory,
) -> None:
    """The copies made as the first tasks of a key were queued are all of that key: the
    replica set follower has nothing to send for it until the replica set changes."""
    a, (sender, sent_side), (other, other_side) = await _owner_and_replicas(make_peer)
    replication = a.parts.replication
    try:
        await _store_and_settle(sender, a)
        assert (sent_side.backup_calls, other_side.backup_calls) == (1, 1)
        follower = a.parts.follower
        assert (follower.book.enrolled_keys, follower.resynced_keys) == (1, 0)
        # The key is followed all the same: a replica set change brings it back to the
        # follower, which finds the same replicas and sends nothing.
        follower.book.membership_changed()
        assert replication.pending == 1
        await eventually(lambda: replication.pending == 0)
        assert (sent_side.backup_calls, other_side.backup_calls) == (1, 1)
    finally:
        await sender.aclose()
        await other.aclose()


async def test_past_its_bound_of_keys_the_follower_sends_new_keys_again(
    make_peer: PeerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys seen this run are remembered up to ``KNOWN_MAX``; past it a key's first
    copies no longer count, and the follower brings its replicas up to date as it did."""
    monkeypatch.setattr(follower_module, "KNOWN_MAX", 0)
    a, (sender, sent_side), (other, other_side) = await _owner_and_replicas(make_peer)
    try:
        await _store_and_settle(sender, a)
        assert (sent_side.backup_calls, other_side.backup_calls) == (2, 2)
        follower = a.parts.follower
        assert (follower.book.enrolled_keys, follower.resynced_keys) == (0, 1)
        assert len(other_side.backups.get(a.node_id, {})) == 20
    finally:
        await sender.aclose()
        await other.aclose()


async def test_a_key_the_owner_found_itself_is_copied_to_a_replica_that_joins_later(
    make_peer: PeerFactory,
) -> None:
    """Links to the owner's own keys never come by STORE_TASK. Their key is followed all
    the same: a peer that joins nearer the key than anyone but the owner gets its copies."""
    a, near, far = await _owner(make_peer)
    assert a.engine is not None and a.node is not None
    node = a.node
    nodes: list[tuple[CrawlNode, Replica]] = []
    try:
        nodes.append(await _replica(far, a))
        first = nodes[0][1]
        await eventually(lambda: len(node.peers()) == 1, timeout=5)
        tasks = a.engine.seed_tasks([f"http://{HOST}/p{i}" for i in range(20)])
        assert await a.intake(tasks) == 20  # as the dispatcher queues a peer's own finds
        assert len(first.backups.get(a.node_id, {})) == 20
        nodes.append(await _replica(near, a))
        later = nodes[1][1]
        await eventually(lambda: len(later.backups.get(a.node_id, {})) == 20, timeout=10)
    finally:
        for n, _ in nodes:
            await n.aclose()


async def test_a_replica_that_does_not_answer_cannot_make_a_live_owner_look_dead(
    make_peer: PeerFactory,
) -> None:
    """The owner's handler waits for its copies only a share of the RPC timeout: one replica
    gone silent costs the sender a late answer, not a timeout (which would re-route its
    links and count the owner as failing). The copy the silent replica missed is sent
    again by the replica set follower."""
    a, (sender, sent_side), (silent, silent_side) = await _owner_and_replicas(make_peer)
    replication = a.parts.replication
    try:
        silent_side.hang = True
        result = await sender.store_task(a.me, [_batch(20)])
        assert result.new == 20
        assert len(sent_side.backups.get(a.node_id, {})) == 20
        assert replication.late_copies >= 1
        # The copy to the silent replica times out at the owner, which sends it again.
        await eventually(lambda: replication.missed_copies >= 1, timeout=15)
        silent_side.hang = False
        await eventually(
            lambda: len(silent_side.backups.get(a.node_id, {})) == 20,
            timeout=20,
        )
    finally:
        await sender.aclose()
        await silent.aclose()


async def test_a_backlogged_owner_still_copies_routed_tasks_before_it_answers(
    make_peer: PeerFactory,
) -> None:
    """With a backlog the owner's lanes to its replicas flush less often (the news of
    finished pages can wait), but copies a STORE_TASK handler waits for leave at once: the
    sender's ack still means the replicas hold them."""
    a, (sender, sent_side), (other, other_side) = await _owner_and_replicas(make_peer)
    replication, engine = a.parts.replication, a.engine
    assert engine is not None
    try:
        backlog = 2 * engine.settings.concurrency + 1
        urls = [f"http://{HOST}/q{i}" for i in range(backlog)]
        assert await a.intake(engine.seed_tasks(urls)) == backlog  # copied: the lanes flushed
        assert a.parts.patience()
        result = await sender.store_task(a.me, [_batch(20)])
        assert result.new == 20
        assert len(sent_side.backups.get(a.node_id, {})) == backlog + 20
        assert len(other_side.backups.get(a.node_id, {})) == backlog + 20
        assert replication.late_copies == 0
    finally:
        await sender.aclose()
        await other.aclose()


async def test_a_dead_replica_holds_a_page_tail_until_it_is_suspected_not_until_declared(
    make_peer: PeerFactory,
) -> None:
    """A page's tail waits for its replicas to hear that it is finished
    (``Replication.finished``). A replica that crashed is waited for only until the failure
    detector suspects it, once the other replica has the news: not until it is declared
    dead, which stood every owner it replicated still for the detection time. With both
    replicas dead, the tail waits for them: no page is done on the owner's word alone."""
    a, (live, live_side), (dead, _) = await _owner_and_replicas(make_peer)
    assert a.engine is not None and a.node is not None
    replication, liveness, roster = a.parts.replication, a.node.rpc.liveness, a.parts.roster
    key = key_for(HOST)
    tasks = a.engine.seed_tasks([f"http://{HOST}/t{i}" for i in range(4)])
    try:
        assert await a.intake(tasks) == 4  # copied to both replicas
        await dead.aclose()  # a crash: no goodbye
        await replication.finished(tasks[:2])
        # It went on past a suspect that no one had declared dead yet.
        assert liveness.is_suspect(dead.me.id) and not roster.gone(dead.me.id)
        assert {(key, t.fp) for t in tasks[:2]} <= live_side.done_seen
        assert replication.suspects_passed >= 1

        await live.aclose()
        finishing = asyncio.ensure_future(replication.finished(tasks[2:]))
        await eventually(lambda: liveness.is_suspect(live.me.id), timeout=15)
        await asyncio.sleep(0.3)  # several of the wait's looks at the suspects
        assert not finishing.done(), "a page counted as done with every replica suspected"
        assert not (roster.gone(dead.me.id) and roster.gone(live.me.id))
        await asyncio.wait_for(finishing, timeout=45)
    finally:
        await live.aclose()
        await dead.aclose()
