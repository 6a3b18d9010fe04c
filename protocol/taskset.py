"""Ownership of background tasks (aiohttp style): every task we start is kept, and closed.

kademlia fires ``asyncio.ensure_future(...)`` and forgets it (``welcome_if_new``'s stores, the
routing table's pings, the refresh loop). An unreferenced task can be garbage-collected while
pending, its exception is never seen, and shutdown cannot wait for it. Every background task
of the project lives in a :class:`TaskSet`, whose :meth:`TaskSet.aclose` is bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["TaskSet"]

log = logging.getLogger(__name__)

# How long cancelled tasks get to unwind before aclose() gives up on them. A task that
# swallows cancellation must not hang shutdown.
CANCEL_GRACE_S = 5.0


class TaskSet:
    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

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

    async def join(self) -> None:
        """Wait until every task (including ones they start meanwhile) has finished."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def cancel(self) -> None:
        """Synchronous part of shutdown (for ``Server.stop``): refuse new tasks, cancel all."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()

    async def aclose(self, timeout: float = 0.0, *, grace: float = CANCEL_GRACE_S) -> None:
        """Refuse new tasks, let the running ones finish for up to ``timeout`` seconds, then
        cancel what is left and wait up to ``grace`` seconds for it to unwind.

        If the caller is cancelled meanwhile, the tasks are cancelled too and the caller's
        ``CancelledError`` propagates: the caller's cancellation wins over the wait.
        """
        self._closed = True
        try:
            if timeout > 0 and self._tasks:
                await asyncio.wait(set(self._tasks), timeout=timeout)
        finally:
            self.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in stuck:
                log.warning("task %s ignored cancellation for %.1f s", task.get_name(), grace)
