"""What an owner holds, told to the peers that send it links: fewer STORE_TASKs for nothing.

After "Parallel Crawlers" (Cho, Garcia-Molina), §3: crawling processes that exchange
discovered links spend most of that exchange on a few popular URLs, and keeping those known
at every process removes most of it. The cluster benchmark showed the same: at 8 peers, 93%
of STORE_TASKs carried only links their owner already had (hosts' roots, found by every peer
on its own), each a round trip that both peers paid for.

The paper picked the popular URLs from an earlier crawl. Here an owner learns them as they
come: the links other peers route to it (STORE_TASK) are the ones other peers find, so it
keeps the fingerprints of those that were new to it in a ring (``Advertised``), and each
answer to a member's STORE_TASK carries the ones that sender has not been told yet, at most
``MAX_KNOWN``. The sender keeps them per owner (``KnownAtOwners``), and a link whose owner
told it "I hold this" is not sent again: the owner holds it as it holds any link it
answered for (stored, and its copies waited for before that first answer, within the bounded
wait of ``Replication.copy_new``), so nothing is lost by not sending it.

A hostile owner can only say it holds links that it owns: entries are keyed by the owner
that told them, through a hash salted per process that no one else can compute.

A membership change wipes each sender's entries with its owner cache (``forget``), and
each owner tells its ring again from the start (``retell``), so a sender relearns in its
next few answers what every owner held before the change. A sender consults an entry
only for the owner its own view gives the link's key now, so a ring entry whose key has
moved to another owner suppresses nothing. The ring used to be emptied instead, and a
host that changed hands reached a peer no owner would tell of the links it held: its new
owner sent each of them once and waited for the answer, on every one of its first pages
(docs/membership.md, "A new owner's first seconds").
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable

import xxhash

from p2pcrawl.aio import Memo
from p2pcrawl.crawl import SeenCache
from protocol import MAX_KNOWN

__all__ = ["MAX_KNOWN", "Advertised", "KnownAtOwners"]

# An answer carries at most MAX_KNOWN (512, 4 KiB as u64s), and only to members: a
# stranger's reply stays bounded by its request.
RING = 16384  # fingerprints an owner remembers to tell (128 KiB)
MAX_SENDERS = 4096  # senders whose place in the ring is remembered (one per peer in practice)
KNOWN_SLOTS = 1 << 17  # (owner, fingerprint) entries a sender keeps (1 MiB)


class Advertised:
    """The owner's side: fingerprints of links routed here that were new, and how far each
    sender has been told. A sender behind by more than the ring hears the newest ``RING``."""

    def __init__(self, capacity: int = RING, max_senders: int = MAX_SENDERS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._ring = array("Q", bytes(8 * capacity))
        self._next = 0  # sequence number of the next fingerprint added
        # Sender id -> sequence number it has heard up to. Past ``max_senders`` (senders that
        # left, in practice) it starts again empty: the rest hear the ring again.
        self._told: Memo[bytes, int] = Memo(max_senders)
        self.told = 0  # fingerprints sent in answers

    def __len__(self) -> int:
        return min(self._next, self.capacity)

    def add(self, fps: Iterable[int]) -> None:
        ring, cap = self._ring, self.capacity
        n = self._next
        for fp in fps:
            ring[n % cap] = fp
            n += 1
        self._next = n

    def retell(self) -> None:
        """Who owns which key changed: every sender wiped what it had heard (``forget``),
        so each hears the ring again from its oldest entry."""
        self._told.clear()

    def since(self, sender: bytes, most: int = MAX_KNOWN) -> list[int]:
        """What ``sender`` has not been told yet, oldest first, at most ``most``."""
        start = max(self._told.get(sender, 0), self._next - self.capacity)
        end = min(self._next, start + most)
        if end <= start:
            return []
        self._told.remember(sender, end)
        cap, ring = self.capacity, self._ring
        a, b = start % cap, end % cap
        out = ring[a:b].tolist() if a < b else ring[a:].tolist() + ring[:b].tolist()
        self.told += len(out)
        return out


class KnownAtOwners:
    """The sender's side: which owner said it holds which fingerprint. A bounded cache: an
    entry evicted or forgotten costs one link sent again, never a link lost."""

    def __init__(self, slots: int = KNOWN_SLOTS) -> None:
        self._slots = slots
        self._cache = SeenCache(slots)
        # Salted per process, so an owner cannot pick fingerprints that collide with
        # another owner's entries here.
        self._seed = int.from_bytes(os.urandom(8), "big")
        self._empty = True
        self.learned = 0
        self.skipped = 0  # links not sent because their owner holds them

    def _entry(self, owner: bytes, fp: int) -> int:
        return xxhash.xxh3_64_intdigest(owner + fp.to_bytes(8, "big"), seed=self._seed)

    def learn(self, owner: bytes, fps: Iterable[int]) -> None:
        entry, cache = self._entry, self._cache
        self._empty = False
        for fp in fps:
            cache.check_and_add(entry(owner, fp))
            self.learned += 1

    def holds(self, owner: bytes, fp: int) -> bool:
        return self._entry(owner, fp) in self._cache

    def forget(self) -> None:
        """Membership changed: which peer holds what may have changed with it."""
        if not self._empty:
            self._cache, self._empty = SeenCache(self._slots), True
