"""A bounded memo: remembered answers of a pure function, forgotten all at once when full.

The hot paths of a peer ask the same small questions again and again (a host's key, whether
a host is in scope, which nodes are closest to a key). A dict answers them at C speed; what it
needs is a bound. Emptying it when full costs nothing per lookup, unlike an LRU's bookkeeping,
and the working set (the hosts of the moment) is back within a few pages.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["Memo"]

K = TypeVar("K")
V = TypeVar("V")


class Memo(dict[K, V]):
    """A dict of at most ``limit`` entries: read it as a dict (``get``, ``in``; C speed),
    write it through ``remember``, which empties it first when it is full."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a memo holds at least one entry")
        super().__init__()
        self.limit = limit

    def remember(self, key: K, value: V) -> V:
        """Store ``value`` under ``key`` and return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
