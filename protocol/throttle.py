"""The log throttle: at most so many lines of one kind per window, and a count of the rest.

A failure that repeats (a peer with the wrong ``--secret`` on every datagram, a descriptor
limit hit on every accept) would otherwise flood the log and bury everything else. A line's
kind is a key (its message template, say); each window lets ``burst`` lines of a kind
through, holds back the rest, and the first line of the next window says how many were held
back, so no count is lost silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

__all__ = ["Throttle"]


class Throttle:
    """``admit(key)`` is None for a line to hold back; otherwise the number of lines of that
    kind held back since the last one let through (say it on this line)."""

    def __init__(
        self,
        burst: int = 1,
        window: float = 10.0,
        max_keys: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or window <= 0 or max_keys < 1:
            raise ValueError("a throttle needs burst >= 1, window > 0 and max_keys >= 1")
        self.burst = burst
        self.window = window
        self.max_keys = max_keys
        self._clock = clock
        self.held_total = 0
        # key -> [window start, lines let through in it, lines held back since]
        self._kinds: dict[Hashable, list[float]] = {}

    def admit(self, key: Hashable = None) -> int | None:
        now = self._clock()
        entry = self._kinds.get(key)
        if entry is None:
            if len(self._kinds) >= self.max_keys:
                self._kinds.clear()  # bounded: a kind forgotten starts a fresh window
            self._kinds[key] = [now, 1, 0]
            return 0
        if now - entry[0] >= self.window:
            held = int(entry[2])
            entry[:] = [now, 1, 0]
            return held
        if entry[1] < self.burst:
            entry[1] += 1
            return 0
        entry[2] += 1
        self.held_total += 1
        return None
