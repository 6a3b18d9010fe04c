"""Async plumbing shared by the crawler and the peer: owned tasks and coalesced batches.

:class:`TaskSet` (from :mod:`protocol`, the lowest layer, which needs it too) owns every
background task; :class:`Coalescer` gathers concurrent small requests into one round trip
and releases each caller with that round trip's answer.
"""

from __future__ import annotations

from p2pcrawl.aio.batching import Coalescer
from p2pcrawl.aio.groupcommit import GroupCommit
from protocol import TaskSet

__all__ = ["Coalescer", "GroupCommit", "TaskSet"]
