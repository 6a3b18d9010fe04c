"""Why no fetch may start now, by name, and a wait that ends the moment the last goes.

Each reason is held and released by its owner (a join, a stall, a leave, a failure), so one
cannot end another's pause. A paused worker used to sleep a tenth of a second between looks:
a joiner's fetches began up to that long after its join was through, while the hosts it had
just been handed stood still (traced: 127 ms from the join's end to the first request of
the Crawl-delay host it took over).
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Pauses"]


class Pauses:
    def __init__(self) -> None:
        self._reasons: set[str] = set()
        self._resumed = asyncio.Event()

    def __bool__(self) -> bool:
        return bool(self._reasons)

    def add(self, reason: str) -> None:
        self._reasons.add(reason)
        self._resumed.clear()

    def discard(self, reason: str) -> None:
        self._reasons.discard(reason)
        if not self._reasons:
            self._resumed.set()

    async def wait(self, timeout: float) -> None:
        """Until no reason is held, or ``timeout`` seconds (a caller looks again then at
        what else may hold it)."""
        if self._reasons:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._resumed.wait()
        else:
            await asyncio.sleep(timeout)
