"""One coalescer for every batching need: concurrent small requests share one round trip.

Three places need the same thing. The ledger's ``accept`` and ``finish`` (twenty workers
finishing pages at once should cost one store job, not forty); the replicas' DELETE_BACKUP
(each finished page must be told, and its worker must wait until it was); the dispatcher's
STORE_TASK outboxes (a page's ~50 links cost one message per owner, not one per URL).

Items are submitted under a *lane* key (a peer, or ``None`` for a single lane). The first
item of an idle lane opens a ``window``; everything submitted to that lane until the window
closes (or until ``max_items`` are waiting) goes out in one ``flush(lane, items)``, which
returns one result per item. Flushes of one lane run one at a time, in order; items that
arrive during a flush go out in the next one, straight away (they have waited for the flush
already) unless ``window_each_flush`` asks for a window before every flush. With ``spacing``
instead of a window, flushes of a lane start at least that far apart and an item reaching a
lane that has been quiet that long goes out at once: no wait when traffic is light, and
under load one flush per spacing however fast items come; ``spacing_of(lane)``, when given,
is asked before each wait and may stretch one lane's spacing (a lane whose flushes carry
nothing its receiver needs can wait longer), and items submitted ``within`` a time leave no
later than that after the lane's last flush, however far it is stretched. Each submitter
returns only once the flush carrying its items returned, with its own slice of the results
or that flush's error, so "durable on return" holds per caller. A cancelled submitter leaves
its lane-mates' flush alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from protocol import TaskSet

__all__ = ["Coalescer"]

MAX_IDLE_LANES = 1024

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Lane(Generic[T, R]):
    items: list[T] = field(default_factory=list)
    due: asyncio.Future[list[R]] | None = None
    full: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[Any] | None = None
    last: float = float("-inf")  # loop time the last flush started (``spacing``)
    hurry: asyncio.TimerHandle | None = None  # closes the window for ``within`` items


class Coalescer(Generic[K, T, R]):
    def __init__(
        self,
        flush: Callable[[K, list[T]], Awaitable[Sequence[R]]],
        *,
        window: float = 0.0,
        max_items: int | None = None,
        window_each_flush: bool = False,
        spacing: float = 0.0,
        spacing_of: Callable[[K], float] | None = None,
        name: str = "coalescer",
    ) -> None:
        if window < 0 or spacing < 0:
            raise ValueError("window and spacing must be >= 0")
        if window and spacing:
            raise ValueError("a coalescer has a window or a spacing, not both")
        if spacing_of is not None and not spacing:
            raise ValueError("spacing_of needs a spacing")
        if max_items is not None and max_items < 1:
            raise ValueError("max_items must be >= 1")
        self._flush = flush
        self._window = window
        self._max = max_items
        self._rewindow = window_each_flush or spacing > 0
        self._spacing = spacing
        self._spacing_of = spacing_of
        self._lanes: dict[K, _Lane[T, R]] = {}
        self._runners = TaskSet(name)
        self._closed = False
        self.flushes = 0
        self.in_flush = 0  # items handed to a flush that has not returned yet

    @property
    def pending(self) -> int:
        """Items waiting for their flush, and items in a flush under way."""
        return sum(len(lane.items) for lane in self._lanes.values()) + self.in_flush

    async def submit(
        self, lane: K, items: Sequence[T], *, urgent: bool = False, within: float | None = None
    ) -> list[R]:
        """The results for ``items``, once the flush carrying them returned; its error if not.
        ``urgent`` items close the lane's spacing, or the window of a coalescer with
        ``max_items`` (a window without it is a plain sleep): they go in the next flush.
        Items ``within`` a time go in a flush that starts no later than that after the
        lane's last one (a stretched spacing does not hold them)."""
        if not items:
            return []
        due, start = self._enqueue(lane, items, urgent, within)
        # shield: a cancelled caller leaves its lane-mates' flush alone.
        results = await asyncio.shield(due)
        return results[start : start + len(items)]

    def post(self, lane: K, items: Sequence[T]) -> None:
        """Queue ``items`` for the lane's next flush without waiting for it: for news whose
        sender must not wait on its receiver. A failed flush is counted by nobody here; the
        flush itself handles its errors."""
        if items:
            self._enqueue(lane, items, False, None)

    def _enqueue(
        self, lane: K, items: Sequence[T], urgent: bool, within: float | None
    ) -> tuple[asyncio.Future[list[R]], int]:
        if self._closed:
            raise RuntimeError("Coalescer is closed")
        state = self._lanes.get(lane)
        if state is None:
            state = self._lanes[lane] = _Lane()
        start = len(state.items)
        state.items.extend(items)
        if state.due is None:
            state.due = asyncio.get_running_loop().create_future()
            # Every caller may have been cancelled by the time it fails: nobody else reads it.
            state.due.add_done_callback(_consume)
        due = state.due
        if urgent or (self._max is not None and len(state.items) >= self._max):
            state.full.set()
        elif within is not None:
            self._hurry(state, within)
        if state.runner is None:
            state.runner = self._runners.spawn(self._run(lane, state), "flush")
            if state.runner is None:  # closing: the runners refuse work
                raise RuntimeError("Coalescer is closed")
        return due, start

    @staticmethod
    def _hurry(state: _Lane[T, R], within: float) -> None:
        loop = asyncio.get_running_loop()
        at = state.last + within
        if at <= loop.time():
            state.full.set()
        elif state.hurry is None or state.hurry.when() > at:
            if state.hurry is not None:
                state.hurry.cancel()
            state.hurry = loop.call_at(at, state.full.set)

    async def _wait_window(self, lane: K, state: _Lane[T, R]) -> None:
        if state.full.is_set():
            return
        if self._spacing:
            spacing = self._spacing if self._spacing_of is None else self._spacing_of(lane)
            delay = state.last + spacing - asyncio.get_running_loop().time()
        else:
            delay = self._window
        if delay <= 0:
            return
        if self._max is None and not self._spacing:
            # Only kick() or an urgent item could close it early, and a plain sleep is the
            # cheapest wait on a path taken once per flush of every page (the ledger's).
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await state.full.wait()

    async def _run(self, lane: K, state: _Lane[T, R]) -> None:
        current: asyncio.Future[list[R]] | None = None
        try:
            await self._wait_window(lane, state)
            while state.items:
                items, current = state.items, state.due
                state.items, state.due = [], None
                state.full.clear()
                if state.hurry is not None:
                    state.hurry.cancel()
                    state.hurry = None
                assert current is not None
                state.last = asyncio.get_running_loop().time()
                self.flushes += 1
                self.in_flush += len(items)
                try:
                    results = await self._flush(lane, items)
                except Exception as exc:
                    current.set_exception(exc)
                else:
                    if len(results) == len(items):
                        current.set_result(list(results))
                    else:
                        current.set_exception(RuntimeError("flush returned a wrong result count"))
                finally:
                    self.in_flush -= len(items)
                current = None
                if self._rewindow and state.items:
                    await self._wait_window(lane, state)
        except asyncio.CancelledError:
            # Cancelled mid-flush (shutting down): no caller may hang on it.
            for fut in (current, state.due):
                if fut is not None and not fut.done():
                    fut.cancel()
            state.items, state.due = [], None
            raise
        finally:
            # No await between the loop's test and here, so no item is left unseen.
            state.runner = None
            # Idle lanes are kept for the next burst, up to a bound (one per peer in practice).
            if len(self._lanes) > MAX_IDLE_LANES and not state.items:
                self._lanes.pop(lane, None)

    def kick(self) -> None:
        """Close every open window now (a window of a coalescer without ``max_items`` is a
        plain sleep of a few milliseconds, and runs out by itself)."""
        for state in self._lanes.values():
            state.full.set()

    async def drain(self) -> None:
        """Flush everything queued now and wait for it (the coalescer stays open)."""
        self.kick()
        await self._runners.join()

    async def aclose(self, timeout: float = 5.0) -> None:
        """Refuse new items; give the queued ones up to ``timeout`` to be flushed, then
        cancel (their submitters see ``CancelledError``)."""
        self._closed = True
        self.kick()
        await self._runners.aclose(timeout)


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
