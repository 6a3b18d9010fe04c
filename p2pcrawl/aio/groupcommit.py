"""Group commit: one store round trip for every caller that arrives while one is due.

Each fetched page used to finish on its own: a done-record job and a task-store job, each a
hand-off to an SQLite thread, a commit and a wake-up of the event loop, per page. Callers
arriving within ``window`` of the first one, or while the previous flush runs, now share
the next flush, and each still returns only after the flush that carries its items has
returned, so "durable on return" holds for every caller. The window costs a caller at most
``window`` of latency; it never costs CPU, so a CPU-bound crawl loses nothing by waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["GroupCommit"]

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    """Runs ``flush(items)`` over the items of concurrent :meth:`submit` calls.

    ``flush`` must return one result per item, in order. Flushes run one at a time, so a
    flush never overlaps the previous one (what a caller that holds a lock across both halves
    of a store update expects).
    """

    def __init__(
        self, flush: Callable[[list[T]], Awaitable[list[R]]], *, window: float = 0.0
    ) -> None:
        if window < 0:
            raise ValueError("window must be >= 0")
        self._flush = flush
        self._window = window
        self._items: list[T] = []
        self._due: asyncio.Future[list[R]] | None = None
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self.flushes = 0

    async def submit(self, items: Sequence[T]) -> list[R]:
        """The results for ``items``, once the flush carrying them returned; its error if not."""
        if self._closed:
            raise RuntimeError("GroupCommit is closed")
        if not items:
            return []
        start = len(self._items)
        self._items.extend(items)
        if self._due is None:
            self._due = asyncio.get_running_loop().create_future()
            # Every caller may have been cancelled by the time it fails: nobody else reads it.
            self._due.add_done_callback(_consume)
        due = self._due
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())
        # shield: a cancelled caller leaves its batch-mates' flush alone.
        results = await asyncio.shield(due)
        return results[start : start + len(items)]

    async def _run(self) -> None:
        current: asyncio.Future[list[R]] | None = None
        try:
            if self._window:
                await asyncio.sleep(self._window)
            # Items that arrived during a flush have waited for it already: no second window.
            while self._items:
                items, current = self._items, self._due
                self._items, self._due = [], None
                assert current is not None
                self.flushes += 1
                try:
                    results = await self._flush(items)
                except Exception as exc:
                    current.set_exception(exc)
                else:
                    if len(results) == len(items):
                        current.set_result(results)
                    else:
                        current.set_exception(RuntimeError("flush returned a wrong result count"))
                current = None
        except asyncio.CancelledError:
            # Cancelled mid-flush (the loop is going away): no caller may hang on it.
            for fut in (current, self._due):
                if fut is not None and not fut.done():
                    fut.cancel()
            self._items, self._due = [], None
            raise
        finally:
            self._runner = None

    async def aclose(self) -> None:
        """Refuse new items and wait for the queued ones to be flushed."""
        self._closed = True
        runner = self._runner
        if runner is not None:
            # shield: if our caller is cancelled, the flush still finishes for its callers.
            await asyncio.shield(runner)


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
