"""``--max-disk``: stop fetching once the data directory holds that much.

The directory is measured by walking it (in a thread) once a second, ten times a second
near the limit. Between two measurements the bytes fetched since count against the limit,
scaled by how much of what was fetched reached the disk last time (WARC files are
compressed: counted one for one, an HTML crawl stopped at a third of its limit), and no
fetch starts while that estimate says full: at 16 fetches with no delay a crawl ran a
whole second, 3.7 MB, past a 3 MB limit. Everything in the directory counts, the stores'
write-ahead logs too (a few MB while they are written; they shrink again at checkpoints).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["DiskBudget", "directory_bytes"]

log = logging.getLogger("p2pcrawl.crawl.engine")

EVERY_S = 1.0
NEAR = 0.8  # of the limit: measured NEAR_EVERY_S apart from there on
NEAR_EVERY_S = 0.1


def directory_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (a blocking walk: call it in a thread)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # removed meanwhile
    return total


class DiskBudget:
    def __init__(self, limit: int, fetched: Callable[[], int]) -> None:
        self.limit = limit  # 0: none
        self._fetched = fetched  # bytes fetched so far, all told
        self.bytes = 0  # as last measured
        self.full = False
        self._fetched_at_measure = 0
        # Bytes on disk per byte fetched, between the last two measurements.
        self._ratio = 1.0

    @property
    def estimate(self) -> int:
        """The directory's size as last measured, plus what was fetched since."""
        return self.bytes + int((self._fetched() - self._fetched_at_measure) * self._ratio)

    @property
    def over(self) -> bool:
        """No fetch may start: full, or full by the estimate until the next measurement."""
        return self.full or (bool(self.limit) and self.estimate >= self.limit)

    async def run(self, data_dir: Path, on_full: Callable[[], None]) -> None:
        """Measure until the directory is full (kept stopped: what is queued stays queued
        for a run with more room)."""
        while not self.full:
            await self.measure(data_dir)
            if self.full:
                on_full()
                return
            near = self.estimate >= NEAR * self.limit
            await asyncio.sleep(NEAR_EVERY_S if near else EVERY_S)

    async def measure(self, data_dir: Path) -> None:
        fetched = self._fetched()
        measured = await asyncio.to_thread(directory_bytes, data_dir)
        grew, got = measured - self.bytes, fetched - self._fetched_at_measure
        if got > 64 * 1024 and self.bytes:
            # Bounded both ways: a page fetched now reaches the disk a moment later.
            self._ratio = min(1.5, max(0.05, grew / got))
        self.bytes, self._fetched_at_measure = measured, fetched
        if self.limit and measured >= self.limit and not self.full:
            self.full = True
            log.warning(
                "stopped fetching: the data directory holds %d bytes, --max-disk is %d",
                measured,
                self.limit,
            )
