"""Handing a host over: it changes hands once, and is never crawled on both sides meanwhile.

An in-process peer owns a host of a real test web; a node whose ID is closer to the host's
key joins, and answers the first handoffs "busy" (a real CrawlHandler that keeps what it
accepts in memory). The web's own request counts show whether the old owner crawled the
host while the handoff kept failing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from p2pcrawl.crawl import Task, urls
from p2pcrawl.network import save_identity
from p2pcrawl.settings import CrawlSettings, ScopeSettings
from protocol import (
    Busy,
    CrawlNode,
    Held,
    KeyBatch,
    NodeConfig,
    PeerRef,
    StoreResult,
    TaskItem,
    key_for,
)
from tests.conftest import (
    KEYED,
    TEST_SECRET,
    PeerFactory,
    WebFactory,
    crawl_settings_for,
    id_next_to,
    id_outranked_by,
)
from tests.protocol.conftest import MemoryHandler, eventually

pytestmark = pytest.mark.timeout(60)


class BusyAtFirst(MemoryHandler):
    """Answers the first ``busy_for`` STORE_TASKs "busy", then takes everything."""

    def __init__(self, busy_for: int) -> None:
        super().__init__()
        self.busy_for = busy_for
        self.calls = 0

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        self.calls += 1
        if self.calls <= self.busy_for:
            raise Busy()
        return await super().handle_store_task(sender, batches)


async def test_a_failed_handoff_is_retried_and_the_host_stays_parked_meanwhile(
    make_web: WebFactory, make_peer: PeerFactory
) -> None:
    web = await make_web(hosts=1, pages_per_host=20)
    host = web.allow_domains[0]
    truth = sorted(u for u in web.ground_truth() if urls.hostname_of(u) == host)
    a = await make_peer(crawl=crawl_settings_for(web), peer=KEYED)
    assert a.engine is not None and a.node is not None
    a.engine.pause("test")
    key = key_for(host)
    assert await a.intake([Task(u, urls.fingerprint(u), key, 1) for u in truth]) == len(truth)
    handler = BusyAtFirst(busy_for=3)
    newcomer = CrawlNode(id_next_to(key), handler, NodeConfig(rpc_timeout=0.5, secret=TEST_SECRET))
    await newcomer.listen_on("127.0.0.1", 0)
    try:
        await newcomer.join([a.me.addr])
        # Until the newcomer is established the host is rightly a's; once the first handoff
        # has failed, a may crawl whatever it still counts as its own.
        await eventually(lambda: handler.calls >= 1, timeout=10)
        a.engine.resume("test")
        await eventually(lambda: len(handler.tasks.get(key, [])) == len(truth), timeout=20)
    finally:
        await newcomer.aclose()
    assert handler.calls > 3  # refused three times, then taken
    assert sorted(t.url for t in handler.tasks[key]) == truth
    # Not one page of the host was fetched by its old owner while the handoff kept failing.
    assert not any(u in web.request_counts for u in truth)
    assert a.ledger is not None and a.ledger.queued == 0


async def test_a_joiner_that_receives_a_large_host_gets_all_of_it_before_crawling(
    make_peer: PeerFactory, tmp_path: Path
) -> None:
    """Thousands of queued tasks and done fingerprints of one host move in one join: the
    joiner's start returns only once they are all here, and the old owner keeps none."""
    crawl = CrawlSettings(scope=ScopeSettings(allow_domains=("big.test",)))
    a = await make_peer(crawl=crawl, peer=KEYED)
    assert a.engine is not None and a.ledger is not None
    a.engine.pause("test")  # the queue stays whole until it moves
    key = key_for("big.test")
    queued = [f"http://big.test/q{i}" for i in range(5000)]
    finished = [urls.fingerprint(f"http://big.test/d{i}") for i in range(5000)]
    await a.ledger.done.add([(key, fp) for fp in finished])
    assert await a.intake([Task(u, urls.fingerprint(u), key, 1) for u in queued]) == len(queued)
    # The joiner's ID is the one next to the host's key: the host is all its.
    (tmp_path / "peer1").mkdir()
    node_id = id_next_to(key)
    save_identity(tmp_path / "peer1", node_id)
    b = await make_peer(crawl=crawl, peer=KEYED, bootstrap=(a.me.addr,))
    assert b.node_id == node_id and b.ledger is not None and b.engine is not None
    refreshed = [e for e in b.events.events if e["kind"] == "refreshed"]
    assert refreshed and refreshed[-1]["keys"] == 1
    assert b.ledger.queued == len(queued) and a.ledger.queued == 0
    assert all(await b.ledger.done.contains([(key, fp) for fp in finished]))


class CountingBackups(MemoryHandler):
    """Counts STORE_BACKUPs; answers the first ``busy_for`` "busy" (a replica on a saturated
    link), then holds."""

    def __init__(self, busy_for: int = 0) -> None:
        super().__init__()
        self.busy_for = busy_for
        self.backup_calls = 0

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> Held:
        self.backup_calls += 1
        if self.backup_calls <= self.busy_for:
            raise Busy()
        return await super().handle_store_backup(sender, owner, batches)


async def test_a_replica_that_missed_its_copy_gets_it_without_a_membership_change(
    make_peer: PeerFactory,
) -> None:
    """A key whose replica missed its copy stays "in transit" until the copy is through; it
    must be tried again by itself, or the network never counts itself finished."""
    crawl = CrawlSettings(scope=ScopeSettings(allow_domains=("kept.test",)))
    a = await make_peer(crawl=crawl, peer=KEYED)
    assert a.engine is not None and a.node is not None
    a.engine.pause("test")
    key = key_for("kept.test")
    handler = CountingBackups(busy_for=1)  # a replica: a, not it, owns the key
    replica = CrawlNode(id_outranked_by(a.node_id, key), handler, NodeConfig(secret=TEST_SECRET))
    await replica.listen_on("127.0.0.1", 0)
    try:
        await replica.join([a.me.addr])
        await eventually(lambda: [p.id for p in a.node.peers()] == [replica.me.id], timeout=5)  # type: ignore[union-attr]
        page = [f"http://kept.test/p{i}" for i in range(20)]
        sent = KeyBatch(key, [TaskItem(url=u, depth=1) for u in page])
        assert (await replica.store_task(a.me, [sent])).new == len(page)
        await eventually(lambda: len(handler.backups.get(a.node_id, {})) == len(page), timeout=10)
        await eventually(lambda: a.parts.replication.pending == 0)
    finally:
        await replica.aclose()
    assert handler.backup_calls >= 2


async def test_copies_of_links_found_by_pages_finishing_together_share_one_store_backup(
    make_peer: PeerFactory,
) -> None:
    """Each page's new links of a host its peer owns are copied to the replicas before the
    page counts as done; pages finishing together must not cost a STORE_BACKUP each."""
    crawl = CrawlSettings(scope=ScopeSettings(allow_domains=("kept.test",)))
    a = await make_peer(crawl=crawl, peer=KEYED)
    assert a.engine is not None and a.node is not None
    a.engine.pause("test")
    key = key_for("kept.test")
    handler = CountingBackups()
    replica = CrawlNode(id_outranked_by(a.node_id, key), handler, NodeConfig(secret=TEST_SECRET))
    await replica.listen_on("127.0.0.1", 0)
    try:
        await replica.join([a.me.addr])
        await eventually(lambda: [p.id for p in a.node.peers()] == [replica.me.id], timeout=5)  # type: ignore[union-attr]
        pages = [[f"http://kept.test/p{i}-{j}" for j in range(3)] for i in range(6)]
        added = await asyncio.gather(
            *(a.intake([Task(u, urls.fingerprint(u), key, 1) for u in links]) for links in pages)
        )
        assert added == [3] * len(pages)
        # Each intake returned only once its copies were held.
        assert len(handler.backups.get(a.node_id, {})) == 3 * len(pages)
        assert handler.backup_calls == 1
    finally:
        await replica.aclose()
