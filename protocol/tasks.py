"""Ownership of background tasks (aiohttp style): every task we start is kept, and closed.

kademlia fires ``asyncio.ensure_future(...)`` and forgets it (``welcome_if_new``'s stores, the
routing table's pings, the refresh loop). An unreferenced task can be garbage-collected while
pending, its exception is never seen, and shutdown cannot wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["TaskSet"]

log = logging.getLogger(__name__)


class TaskSet:
    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any] | None:
        """Start ``coro`` as an owned task; after ``aclose`` it is closed instead of run."""
        if self._closed:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(coro, name=f"{self._name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    async def idle(self) -> None:
        """Wait until every task has finished, including tasks those tasks start."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def cancel(self) -> None:
        """Synchronous part of shutdown (for ``Server.stop``): refuse new tasks, cancel all."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()

    async def aclose(self) -> None:
        """Cancel every task and wait until all have finished."""
        self.cancel()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
