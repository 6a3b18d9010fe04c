"""How late the event loop runs: the delay between when a timer should fire and when it does.

Anything that holds the loop (a long parse, a blocking call, SIGSTOP, swapping) shows up here
as lag, and everything a peer does on the loop (answering UDP, the status page, fetching)
waits that long. One sampler per process sleeps ``interval`` seconds at a time and records how
much longer each sleep took. Three readers share it:

* the status page and ``/metrics``: the p99 and max over a sliding window of samples
  (``snapshot``);
* the failure detector's local health (``liveness.LocalHealth``): the worst lag since its last
  probe round (``take``). A loop that was stalled read no replies meanwhile, so the calls it
  timed out are not evidence against anyone;
* the crawler, through ``on_stall``: a stall longer than ``stall_after`` may have got this
  peer declared dead by the others, and what it owns must be checked before it fetches on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LagSnapshot", "LoopLagMonitor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    """Lag over the window, in seconds; ``max_ever`` since the monitor started."""

    p99: float
    max: float
    max_ever: float
    samples: int


class LoopLagMonitor:
    """Samples the running loop's lag every ``interval`` seconds; keeps ``window`` samples."""

    def __init__(
        self,
        interval: float = 0.05,
        window: int = 1200,
        *,
        stall_after: float = 0.0,
        on_stall: Callable[[float], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if window < 1:
            raise ValueError("window must be >= 1")
        self.interval = interval
        self.stall_after = stall_after
        self.on_stall = on_stall
        self._samples: deque[float] = deque(maxlen=window)
        self._max_ever = 0.0
        self._worst = 0.0  # the worst lag since the last ``take()``
        self.stalls = 0
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
        if lag > self._worst:
            self._worst = lag
        if self.stall_after > 0 and lag >= self.stall_after:
            self.stalls += 1
            if self.on_stall is not None:
                try:
                    self.on_stall(lag)
                except Exception:  # the sampler must outlive a reader's bug
                    log.exception("stall callback failed")

    def take(self) -> float:
        """The worst lag since the last call."""
        worst, self._worst = self._worst, 0.0
        return worst

    def snapshot(self) -> LagSnapshot:
        samples = sorted(self._samples)
        if not samples:
            return LagSnapshot(0.0, 0.0, self._max_ever, 0)
        # Nearest-rank percentile: the smallest sample at or above 99% of them.
        rank = max(0, -(-99 * len(samples) // 100) - 1)
        return LagSnapshot(samples[rank], samples[-1], self._max_ever, len(samples))

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        interval = self.interval
        while True:
            before = loop.time()
            await asyncio.sleep(interval)
            self.record(loop.time() - before - interval)
