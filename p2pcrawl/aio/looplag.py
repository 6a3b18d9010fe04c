"""How late the event loop runs: the delay between when a timer should fire and when it does.

Anything that holds the loop (a long parse, a blocking call) shows up here as lag, and
everything a peer does on the loop (answering UDP, the status page, fetching) waits that
long. A sampler sleeps ``interval`` seconds at a time and records how much longer than that
each sleep took; the p99 and max over a sliding window of recent samples are what
``/metrics`` and the status page report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass

__all__ = ["LagSnapshot", "LoopLagMonitor"]


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    """Lag over the window, in seconds; ``max_ever`` since the monitor started."""

    p99: float
    max: float
    max_ever: float
    samples: int


class LoopLagMonitor:
    """Samples the running loop's lag every ``interval`` seconds; keeps ``window`` samples."""

    def __init__(self, interval: float = 0.05, window: int = 1200) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if window < 1:
            raise ValueError("window must be >= 1")
        self.interval = interval
        self._samples: deque[float] = deque(maxlen=window)
        self._max_ever = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sample in a task of its own (for owners without a task set; :meth:`aclose` ends it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="loop-lag")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def record(self, lag: float) -> None:
        """Add one sample (the sampler's; tests feed it directly)."""
        lag = max(0.0, lag)
        self._samples.append(lag)
        if lag > self._max_ever:
            self._max_ever = lag

    def snapshot(self) -> LagSnapshot:
        samples = sorted(self._samples)
        if not samples:
            return LagSnapshot(0.0, 0.0, self._max_ever, 0)
        # Nearest-rank percentile: the smallest sample at or above 99% of them.
        rank = max(0, -(-99 * len(samples) // 100) - 1)
        return LagSnapshot(samples[rank], samples[-1], self._max_ever, len(samples))

    async def run(self) -> None:
        """Sample until cancelled."""
        interval = self.interval
        clock = time.monotonic
        while True:
            before = clock()
            await asyncio.sleep(interval)
            self.record(clock() - before - interval)
