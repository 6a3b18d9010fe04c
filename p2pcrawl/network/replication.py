"""Backups on the replicas: copies of every accepted task, dropped once it is finished.

The Kademlia crawler's improved protocol: an owner copies each task it accepts to its r
nearest neighbours (STORE_BACKUP) and, once the page is done, tells them to drop their
copies (DELETE_BACKUP), which also gives them the done fingerprint, so a neighbour that
takes the host over after a crash does not fetch it again. docs/architecture.md states
the invariant this keeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence

from p2pcrawl.aio import Coalescer
from p2pcrawl.crawl import Task
from p2pcrawl.network.dispatch import Dispatcher, to_batches
from protocol import CrawlNode, PeerRef, PeerTimeout, RemoteError

__all__ = ["Replication"]

log = logging.getLogger(__name__)


class Replication:
    def __init__(self, node: CrawlNode, dispatcher: Dispatcher) -> None:
        self.node = node
        self.dispatcher = dispatcher
        self._deletes: Coalescer[PeerRef, int] = Coalescer(self._send_deletes)

    @property
    def pending(self) -> int:
        return self._deletes.pending

    async def aclose(self) -> None:
        await self._deletes.aclose()

    async def store_backups(self, tasks: Sequence[Task]) -> None:
        """Copy newly accepted tasks to the replicas of their keys (best effort: a missing
        copy is made again by the next replication pass; the task is durable here)."""
        by_replica: dict[PeerRef, list[Task]] = defaultdict(list)
        for key in {t.key for t in tasks}:
            for rep in await self.dispatcher.replicas_of(key):
                by_replica[rep].extend(t for t in tasks if t.key == key)
        if by_replica:
            await asyncio.gather(*(self._store(r, ts) for r, ts in by_replica.items()))

    async def _store(self, rep: PeerRef, ts: list[Task]) -> None:
        try:
            await self.node.store_backup(rep, self.node.me.id, to_batches(ts))
        except (PeerTimeout, RemoteError, OSError) as exc:
            log.info("STORE_BACKUP to %s failed: %s", rep, exc)

    async def finished(self, tasks: list[Task]) -> None:
        """Tell the replicas that ``tasks`` are finished, and wait for their answer.

        Waiting keeps a crash from leaving a replica with a copy of a finished page and
        no record that it is finished: it would fetch it again.
        """
        by_rep: dict[PeerRef, list[int]] = defaultdict(list)
        for t in tasks:
            for rep in await self.dispatcher.replicas_of(t.key):
                by_rep[rep].append(t.fp)
        if by_rep:
            await asyncio.gather(*(self._deletes.submit(r, f) for r, f in by_rep.items()))

    async def _send_deletes(self, rep: PeerRef, fps: list[int]) -> None:
        try:
            await self.node.delete_backup(rep, self.node.me.id, fps)
        except (PeerTimeout, RemoteError, OSError) as exc:
            # The copies stay; the republish pass finds the owner healthy and they are
            # dropped when the owner's next DELETE_BACKUP or a takeover dedups them.
            log.info("DELETE_BACKUP to %s failed: %s", rep, exc)
