"""The Kademlia value store (§2.3 STORE), bounded in count and bytes, in total and per source.

kademlia's ``ForgetfulStorage`` keeps every value anyone sends for a week: 60,000 STOREs of
7 KB took a peer from 47 MB to 478 MB in ten seconds. Here a value is charged to the address
that stored it, and a STORE is refused (the reply is ``False``) when it would take that source
past ``per_source_items``/``per_source_bytes`` or the store past ``max_items``/``max_bytes``.
New values are refused rather than old ones evicted: a flood cannot push out what the network
stored before it. Values expire after ``ttl`` seconds unless stored again (§2.5 republishing
keeps the live ones fresh).

The node that embeds this store may add a rule of its own (``guard``), asked before a value
from the network is stored: the crawler's status announcements use it so that a value naming
one node is taken only from that node (``p2pcrawl.network.announce``).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["BoundedStorage", "StoreGuard", "StoreLimits", "value_size"]

Source = tuple[str, int]
# (key, value, the sender's node ID, its address, the value stored now or None) -> store it?
StoreGuard = Callable[[bytes, Any, bytes, Source, Any], bool]
_LOCAL: Source = ("", 0)  # values this node stores itself


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_items: int = 4096
    max_bytes: int = 8 << 20
    per_source_items: int = 256
    per_source_bytes: int = 1 << 20
    ttl: float = 24 * 3600.0


def value_size(key: bytes, value: Any) -> int:
    """What a value costs: its bytes (text as UTF-8 length bound), key and bookkeeping."""
    if isinstance(value, bytes | str):
        size = len(value) * (4 if isinstance(value, str) else 1)
    else:
        size = 16
    return len(key) + size + 64


class BoundedStorage:
    def __init__(
        self, limits: StoreLimits | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or StoreLimits()
        self._clock = clock
        # key -> (stored at, value, source, size), oldest first
        self.data: OrderedDict[bytes, tuple[float, Any, Source, int]] = OrderedDict()
        self.bytes = 0
        self._items_by: Counter[Source] = Counter()
        self._bytes_by: Counter[Source] = Counter()
        self.refused = 0
        self.guard: StoreGuard | None = None
        self.guarded = 0  # STOREs the guard refused (counted in ``refused`` too)

    def __len__(self) -> int:
        return len(self.data)

    def put(
        self, key: bytes, value: Any, source: Source = _LOCAL, sender: bytes | None = None
    ) -> bool:
        """Store unless a limit or the guard forbids it; False (and ``refused`` counts it)
        if refused. ``sender``: the node ID a STORE from the network named."""
        self.cull()
        lim = self.limits
        size = value_size(key, value)
        old = self.data.get(key)
        guard = self.guard
        if (
            guard is not None
            and source != _LOCAL
            and not guard(key, value, sender or b"", source, None if old is None else old[1])
        ):
            self.refused += 1
            self.guarded += 1
            return False
        # Replacing a value frees what it used (for its own source).
        freed_items, freed_bytes = (1, old[3]) if old is not None else (0, 0)
        same = old is not None and old[2] == source
        items_src = self._items_by[source] - (freed_items if same else 0)
        bytes_src = self._bytes_by[source] - (freed_bytes if same else 0)
        # This node's own values are bounded by its own code; a flood must not crowd them out.
        if source != _LOCAL and (
            len(self.data) - freed_items >= lim.max_items
            or self.bytes - freed_bytes + size > lim.max_bytes
            or items_src >= lim.per_source_items
            or bytes_src + size > lim.per_source_bytes
        ):
            self.refused += 1
            return False
        if old is not None:
            self._forget(key)
        self.data[key] = (self._clock(), value, source, size)
        self.bytes += size
        self._items_by[source] += 1
        self._bytes_by[source] += size
        return True

    def _forget(self, key: bytes) -> None:
        _, _, source, size = self.data.pop(key)
        self.bytes -= size
        self._items_by[source] -= 1
        self._bytes_by[source] -= size
        if self._items_by[source] <= 0:
            del self._items_by[source]
            del self._bytes_by[source]

    def cull(self) -> None:
        cutoff = self._clock() - self.limits.ttl
        while self.data:
            key, entry = next(iter(self.data.items()))
            if entry[0] >= cutoff:
                break
            self._forget(key)

    # --- the mapping kademlia's IStorage named ---------------------------------------------

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.put(key, value)

    def __getitem__(self, key: bytes) -> Any:
        self.cull()
        return self.data[key][1]

    def get(self, key: bytes, default: Any = None) -> Any:
        self.cull()
        entry = self.data.get(key)
        return default if entry is None else entry[1]

    def iter_older_than(self, seconds_old: float) -> Iterator[tuple[bytes, Any]]:
        cutoff = self._clock() - seconds_old
        return iter([(k, e[1]) for k, e in self.data.items() if e[0] < cutoff])

    def __iter__(self) -> Iterator[tuple[bytes, Any]]:
        self.cull()
        return iter([(k, e[1]) for k, e in self.data.items()])
