"""The host-splitter cache: recently routed URL fingerprints.

After "Efficient URL Caching for World Wide Web Crawling" (Broder, Najork, Wiener), §5.

Mercator found that a cache of about 2^18 recently seen URLs in front of the duplicate
eliminator and the host splitter removes most repeated links before they cost a disk probe
or a network message, and that policies cheaper than LRU (CLOCK, even random eviction) come
close to it.

The cache is a two-way set-associative table of fingerprints in one flat ``array('Q')``,
allocated whole when the engine starts: 8 bytes a slot, so the default 2^19 slots are 4 MiB,
and the memory never changes after that. It replaced an ``OrderedDict`` LRU of 2^18 entries
that cost 38 MiB when full and then kept growing under eviction churn (its hash table
resized to 2^20 slots): 56-64 MiB, in steps, which the soak benchmark saw as RSS growth long
after its warm-up. A fingerprint maps to one set of two slots by its low bits (xxh3 bits are
uniform); the set keeps its most recent fingerprint first, so a miss evicts the older of
the two. On a link trace shaped like a crawl (nav links on every page, local and popular
links), two ways over 2^19 slots hit as often as the 2^18-entry LRU did, and a check is
cheaper (two array reads against an ordered-dict move).

A fingerprint of 0 marks an empty slot, so the one URL whose fingerprint is 0 is never
cached: it costs a duplicate check downstream, never a lost URL.
"""

from __future__ import annotations

from array import array

__all__ = ["SeenCache"]

WAYS = 2


class SeenCache:
    def __init__(self, capacity: int = 1 << 19) -> None:
        """A cache of about ``capacity`` fingerprints (rounded up to a power of two sets)."""
        if capacity < 0:
            raise ValueError("capacity must not be negative")
        sets = 1
        while sets * WAYS < capacity:
            sets <<= 1
        self.capacity = sets * WAYS
        self._mask = sets - 1
        self._slots = array("Q", bytes(8 * self.capacity))
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """Fingerprints held (a scan: for stats and tests, not the hot path)."""
        return len(self._slots) - self._slots.count(0)

    def __contains__(self, fp: int) -> bool:
        i = (fp & self._mask) * WAYS
        return fp != 0 and (self._slots[i] == fp or self._slots[i + 1] == fp)

    def check_and_add(self, fp: int) -> bool:
        """True when ``fp`` was already cached (a repeat); records it either way."""
        a = self._slots
        i = (fp & self._mask) << 1  # * WAYS
        first = a[i]
        if first == fp and fp:
            self.hits += 1
            return True
        if a[i + 1] == fp and fp:
            a[i + 1] = first  # the hit becomes the set's most recent
            a[i] = fp
            self.hits += 1
            return True
        a[i + 1] = first  # evicts the older one
        a[i] = fp
        self.misses += 1
        return False

    def discard(self, fp: int) -> None:
        if not fp:
            return
        a = self._slots
        i = (fp & self._mask) * WAYS
        if a[i] == fp:
            a[i] = a[i + 1]
            a[i + 1] = 0
        elif a[i + 1] == fp:
            a[i + 1] = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
