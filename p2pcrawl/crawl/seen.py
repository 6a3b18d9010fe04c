"""The host-splitter cache of seed 002: recently routed URL fingerprints.

Mercator found that a cache of about 2^18 recently seen URLs in front of the duplicate
eliminator and the host splitter removes most repeated links before they cost a disk probe
or a network message; LRU came close to the offline optimum. OrderedDict gives an LRU whose
operations run in C, which matters at ~50 links a page.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["SeenCache"]


class SeenCache:
    def __init__(self, capacity: int = 1 << 18) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._od: OrderedDict[int, None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._od)

    def __contains__(self, fp: int) -> bool:
        return fp in self._od

    def check_and_add(self, fp: int) -> bool:
        """True when ``fp`` was already cached (a repeat); records it either way."""
        od = self._od
        if fp in od:
            od.move_to_end(fp)
            self.hits += 1
            return True
        od[fp] = None
        if len(od) > self.capacity:
            od.popitem(last=False)
        self.misses += 1
        return False

    def discard(self, fp: int) -> None:
        self._od.pop(fp, None)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
