"""The node's two background jobs, run by ``CrawlNode`` in owned loops.

kademlia schedules ``refresh_table`` with ``call_later`` and, after the first run, forgets the
interval it was given (it reschedules itself with the default hour), and it never pings anyone
on its own: a dead neighbour is only noticed when a lookup happens to hit it. Here:

* ``ping_round`` (every ``ping_interval``): ping the closest neighbours -- the likely owners and
  replicas of our keys -- that were silent for a whole interval, plus the contacts silent for
  longest. Failures feed the eviction count, so a crashed owner is noticed within about
  ``failures_before_evict * (ping_interval + rpc_timeout)``.
* ``refresh_once`` (every ``refresh_interval``): Kademlia §2.3 bucket refresh -- a lookup of a
  random ID in each bucket idle that long -- plus a lookup of our own ID, which finds new
  close neighbours; then republish stored values older than an hour (§2.5).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kademlia.crawling import NodeSpiderCrawl
from kademlia.node import Node

from protocol.ownership import closest
from protocol.rpc import CrawlProtocol

__all__ = ["every", "ping_round", "refresh_once"]

log = logging.getLogger(__name__)

NEIGHBOUR_PINGS = 8  # closest contacts checked each round
STALE_PINGS = 16  # at most this many long-silent contacts checked per round


async def every(interval: float, job: Callable[[], Awaitable[None]]) -> None:
    """Run ``job`` every ``interval`` seconds until cancelled; a failure is logged, not fatal
    (a dead loop would silently stop liveness checks)."""
    while True:
        await asyncio.sleep(interval)
        try:
            await job()
        except Exception:
            log.exception("background job %s failed", getattr(job, "__name__", job))


async def ping_round(proto: CrawlProtocol, ping_interval: float, stale_after: float) -> None:
    router = proto.router
    now = time.monotonic()

    def silent_for(node: Node) -> float:
        return now - (router.last_seen(node.id) or 0.0)

    members = {n.id: n for n in router.members()}
    near = [members[i] for i in closest(proto.my_id, members, NEIGHBOUR_PINGS)]
    targets = [n for n in near if silent_for(n) >= ping_interval]
    stale = sorted((n for n in members.values() if silent_for(n) > stale_after), key=silent_for)
    targets += [n for n in reversed(stale[-STALE_PINGS:]) if n not in targets]
    await asyncio.gather(*(proto.call_ping(n) for n in targets))


async def refresh_once(
    proto: CrawlProtocol,
    ksize: int,
    alpha: int,
    idle: float,
    republish: Callable[[bytes, Any], Awaitable[bool]],
) -> None:
    targets = [proto.my_id]
    for bucket in proto.router.lonely_buckets(idle):
        low, high = bucket.range
        rid = min(low + secrets.randbelow(high - low + 1), 2**160 - 1)
        targets.append(rid.to_bytes(20, "big"))
    crawls = []
    for target in targets:
        node = Node(target)
        nearest = proto.router.find_neighbors(node, alpha)
        if nearest:
            crawls.append(NodeSpiderCrawl(proto, node, nearest, ksize, alpha).find())
    await asyncio.gather(*crawls)
    for dkey, value in proto.storage.iter_older_than(3600):
        await republish(dkey, value)
