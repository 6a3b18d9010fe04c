"""Coalescing small per-peer messages into one RPC.

Many workers finish pages at once; each needs its replicas told, and each must wait until
they were (so a crash cannot leave a replica holding a copy of a page that is already done
without knowing it is done). Items for the same peer that arrive within a few milliseconds
share one RPC, and every submitter is released by that RPC's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

P = TypeVar("P", bound=Hashable)
T = TypeVar("T")


class Coalescer(Generic[P, T]):
    def __init__(
        self,
        send: Callable[[P, list[T]], Awaitable[object]],
        *,
        window: float = 0.01,
        max_items: int = 2000,
    ) -> None:
        self._send = send
        self._window = window
        self._max = max_items
        self._pending: dict[P, tuple[list[T], asyncio.Future[None]]] = {}
        self._flushers: dict[P, asyncio.Task[None]] = {}
        self.rpcs = 0

    @property
    def pending(self) -> int:
        return sum(len(items) for items, _ in self._pending.values())

    async def submit(self, peer: P, items: list[T]) -> None:
        """Returns when the RPC carrying ``items`` was answered (or failed: see send)."""
        entry = self._pending.get(peer)
        if entry is None:
            entry = self._pending[peer] = ([], asyncio.get_running_loop().create_future())
        entry[0].extend(items)
        fut = entry[1]
        if peer not in self._flushers:
            self._flushers[peer] = asyncio.ensure_future(self._flush(peer))
        elif len(entry[0]) >= self._max:
            self._flushers[peer].cancel()
            self._flushers[peer] = asyncio.ensure_future(self._flush(peer, wait=False))
        await asyncio.shield(fut)

    async def _flush(self, peer: P, *, wait: bool = True) -> None:
        try:
            if wait:
                await asyncio.sleep(self._window)
        except asyncio.CancelledError:
            return
        items, fut = self._pending.pop(peer)
        if self._flushers.get(peer) is asyncio.current_task():
            del self._flushers[peer]
        try:
            self.rpcs += 1
            await self._send(peer, items)
        except BaseException as exc:
            if not fut.done():
                fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not fut.done():
            fut.set_result(None)

    async def aclose(self) -> None:
        tasks = list(self._flushers.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        self._pending.clear()
        with contextlib.suppress(Exception):
            self._flushers.clear()
