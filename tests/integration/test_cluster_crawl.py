"""Five peer processes crawl the test web together through the full seed-001 flow."""

from __future__ import annotations

from typing import Any

import pytest

from p2pcrawl.testweb import TestWeb
from tests.integration.conftest import crawl_args

pytestmark = pytest.mark.slow


async def test_five_peers_crawl_ground_truth_once(web: TestWeb, make_cluster: Any) -> None:
    cluster = await make_cluster(crawl_args(web, "--delay", "0"))
    founder = await cluster.start_peer("p0")
    for i in range(1, 5):
        await cluster.start_peer(f"p{i}", bootstrap=founder)
    await cluster.wait_until(
        lambda ss: len(ss) == 5 and all(s["peers"] == 4 for s in ss), 20, "a full mesh"
    )
    doc = await cluster.api(founder, "/api/seed", "POST", {"urls": [web.hub_url]})
    assert doc == {"accepted": 1}
    final = await cluster.wait_finished(timeout=90)
    # Idle: every finished task's copies were dropped by DELETE_BACKUP.
    assert [s["backups_held"] for s in final] == [0] * 5
    fetched_by = [s["pages_fetched"] for s in final]
    assert sum(1 for n in fetched_by if n) >= 2, fetched_by
    for p in cluster.peers:
        cluster.terminate(p)
    for p in cluster.peers:
        assert await cluster.wait_exit(p, 30) == 0, cluster.log(p)
    counts = cluster.warc_counts()
    assert set(counts) == web.ground_truth()
    assert max(counts.values()) == 1
    assert max(web.request_counts.values()) == 1
