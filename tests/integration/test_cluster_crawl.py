"""Five peer processes crawl the test web together through the full seed-001 flow."""

from __future__ import annotations

from typing import Any

import pytest

from p2pcrawl.testing import TestWeb
from tests.integration.conftest import crawl_args, leave_all, start_mesh

pytestmark = pytest.mark.slow


async def test_five_peers_crawl_ground_truth_once(web: TestWeb, make_cluster: Any) -> None:
    cluster = await make_cluster(crawl_args(web, "--delay", "0"))
    founder = (await start_mesh(cluster, 5))[0]
    doc = await cluster.api(founder, "/api/seed", "POST", {"urls": [web.hub_url]})
    assert doc["accepted"] == 1 and [v["result"] for v in doc["seeds"]] == ["accepted"]
    final = await cluster.wait_finished(timeout=90)
    # Idle: every finished task's copies were dropped by DELETE_BACKUP.
    assert [s["backups_held"] for s in final] == [0] * 5
    fetched_by = [s["pages_fetched"] for s in final]
    assert sum(1 for n in fetched_by if n) >= 2, fetched_by
    # An open network (loopback, no key) fetches a few pages again to check its members'
    # claims that pages are done (docs/security.md); the web sees no other second request.
    refetched = sum(s["claims"]["refetches"] for s in final)
    twice = sum(n - 1 for n in web.request_counts.values())
    assert twice <= refetched, (twice, refetched)
    counts = await leave_all(cluster)
    assert set(counts) == web.ground_truth()
    assert max(counts.values()) == 1


async def test_default_scope_reaches_every_peer(web: TestWeb, make_cluster: Any) -> None:
    """No --allow-domain anywhere: the seeds' hosts are the scope on every peer."""
    cluster = await make_cluster(
        ["--allow-private", "--politeness-factor", "0", "--delay", "0", "--concurrency", "8"]
    )
    founder = (await start_mesh(cluster, 3))[0]
    roots = [f"http://{h}/" for h in web.hosts]
    doc = await cluster.api(founder, "/api/seed", "POST", {"urls": roots})
    # Seeds are offered one by one while the first is crawled: a front page another seed
    # already linked to is "already known" at its owner, not lost.
    results = [v["result"] for v in doc["seeds"]]
    assert set(results) <= {"accepted", "already_known"} and len(results) == len(roots), doc
    final = await cluster.wait_finished(timeout=90)
    assert sum(1 for s in final if s["pages_fetched"]) >= 2
    counts = await leave_all(cluster)
    # Every test-web host is a seed host, so the scope is the test web: its ground truth.
    assert set(counts) == web.ground_truth()
    assert max(counts.values()) == 1
