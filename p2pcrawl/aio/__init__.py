"""Async plumbing shared by the crawler and the peer: owned tasks and coalesced batches.

:class:`TaskSet` (from :mod:`protocol`, the lowest layer, which needs it too) owns every
background task and closes them under a deadline; :class:`Coalescer` gathers concurrent
small requests for one destination into one round trip (the ledger's group commits, the
replicas' DELETE_BACKUPs, the dispatcher's STORE_TASK outboxes) and releases each caller
with that round trip's answer.
"""

from __future__ import annotations

from p2pcrawl.aio.batching import Coalescer
from p2pcrawl.aio.looplag import LagSnapshot, LoopLagMonitor
from p2pcrawl.aio.service import Service
from protocol import TaskSet

__all__ = ["Coalescer", "LagSnapshot", "LoopLagMonitor", "Service", "TaskSet"]
