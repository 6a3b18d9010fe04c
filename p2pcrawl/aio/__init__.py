"""Async plumbing and small shared primitives for the crawler and the peer.

:class:`Coalescer` gathers concurrent small requests for one destination into one round trip
(the ledger's group commits, the replicas' DELETE_BACKUPs, the dispatcher's STORE_TASK
outboxes) and releases each caller with that round trip's answer; :class:`Service` is
``async with`` for a component.

The rest is :mod:`protocol`'s, the lowest layer, which needs each of them too, said once
there: :class:`TaskSet` (owned tasks), ``every`` (the periodic loop), ``backoff_delay`` and
:class:`Backoff`, :class:`LoopLagMonitor` (event-loop lag), :class:`Memo` (a bounded memo),
:class:`TokenBucket` and :class:`Rate`, :class:`Throttle` (the log throttle).
"""

from __future__ import annotations

from p2pcrawl.aio.batching import Coalescer
from p2pcrawl.aio.service import Service
from protocol import (
    Backoff,
    LagSnapshot,
    LoopLagMonitor,
    Memo,
    Rate,
    TaskSet,
    Throttle,
    TokenBucket,
    backoff_delay,
    every,
)

__all__ = [
    "Backoff",
    "Coalescer",
    "LagSnapshot",
    "LoopLagMonitor",
    "Memo",
    "Rate",
    "Service",
    "TaskSet",
    "Throttle",
    "TokenBucket",
    "backoff_delay",
    "every",
]
