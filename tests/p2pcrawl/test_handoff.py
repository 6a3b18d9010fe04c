"""Handing a host over: it changes hands once, and is never crawled on both sides meanwhile.

An in-process peer owns a host of a real test web; a node whose ID is closer to the host's
key joins, and answers the first handoffs "busy" (a real CrawlHandler that keeps what it
accepts in memory). The web's own request counts show whether the old owner crawled the
host while the handoff kept failing.
"""

from __future__ import annotations

import pytest

from p2pcrawl.crawl import Task, urls
from p2pcrawl.settings import PeerSettings
from protocol import Busy, CrawlNode, KeyBatch, NodeConfig, PeerRef, StoreResult, key_for
from tests.conftest import TEST_MIN_PEER_AGE, PeerFactory, WebFactory, crawl_settings_for
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
    a = await make_peer(
        crawl=crawl_settings_for(web), peer=PeerSettings(min_peer_age=TEST_MIN_PEER_AGE)
    )
    assert a.engine is not None and a.node is not None
    a.engine.paused = True
    key = key_for(host)
    assert await a.intake([Task(u, urls.fingerprint(u), key, 1) for u in truth]) == len(truth)
    handler = BusyAtFirst(busy_for=3)
    newcomer = CrawlNode(key[:-1] + bytes([key[-1] ^ 1]), handler, NodeConfig(rpc_timeout=0.5))
    await newcomer.listen_on("127.0.0.1", 0)
    try:
        await newcomer.join([a.me.addr])
        # Until the newcomer is established the host is rightly a's; once the first handoff
        # has failed, a may crawl whatever it still counts as its own.
        await eventually(lambda: handler.calls >= 1, timeout=10)
        a.engine.paused = False
        await eventually(lambda: len(handler.tasks.get(key, [])) == len(truth), timeout=20)
    finally:
        await newcomer.aclose()
    assert handler.calls > 3  # refused three times, then taken
    assert sorted(t.url for t in handler.tasks[key]) == truth
    # Not one page of the host was fetched by its old owner while the handoff kept failing.
    assert not any(u in web.request_counts for u in truth)
    assert a.ledger is not None and a.ledger.queued == 0
