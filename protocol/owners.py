"""Who owns a key: the one answer, and the one cache of it.

The owner of a key is the member XOR-closest to it, this node included (Kademlia §2.1;
``members.Members`` says who counts, and whether this node owns anything yet); its replicas
are the next closest. Two ways to ask:

* ``closest_local``: among the members this node knows. Asked per key for every page
  finished and every batch stored or copied, so its answers are remembered;
* ``closest``: the same while the table may know everyone (fewer than ``ksize`` members);
  beyond that an iterative FIND_NODE (§2.3) is merged in first. ``owner`` is its first
  answer, remembered per key: a link's owner is asked for every link found.

The contract of the cache: an answer is kept while the members' ``version`` stays the same
(no contact came, went, moved or was established, and this node's ownership hold did not
change) and this node's address is the same; then every answer is forgotten at once. A
caller that learns an answer is wrong (the owner refused the key) forgets that key with
``forget``; ``fresh=True`` asks again. Bounded at ``CACHE_ENTRIES`` answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from protocol.contacts import peer_of
from protocol.kbucket import Node
from protocol.members import Members
from protocol.memo import Memo
from protocol.model import PeerRef
from protocol.ownership import closest as closest_ids

__all__ = ["CACHE_ENTRIES", "Owners"]

CACHE_ENTRIES = 200_000

# (key, n, this node counted, looked up in the network) -> the answer
_Key = tuple[bytes, int, bool, bool]


class Owners:
    def __init__(
        self,
        members: Members,
        me: Callable[[], PeerRef],
        lookup: Callable[[bytes], Awaitable[list[Node]]],
        ksize: int,
    ) -> None:
        """``me``: this node (once it listens); ``lookup``: the nodes an iterative FIND_NODE
        finds nearest to a key."""
        self._members = members
        self._me = me
        self._lookup = lookup
        self._ksize = ksize
        self._tag: tuple[int, PeerRef | None] = (-1, None)
        self._cache: Memo[_Key, tuple[PeerRef, ...]] = Memo(CACHE_ENTRIES)

    def _valid(self) -> Memo[_Key, tuple[PeerRef, ...]]:
        tag = (self._members.version, self._me())
        if tag != self._tag:
            self._tag = tag
            self._cache.clear()
        return self._cache

    def closest_local(self, key: bytes, n: int, *, with_self: bool | None = None) -> list[PeerRef]:
        """The ``n`` members XOR-closest to ``key``, this node included unless it is joining
        (``Members.hold_ownership``); ``with_self`` overrides that."""
        mine = self._members.owner_ready if with_self is None else with_self
        cache = self._valid()
        hit = cache.get((key, n, mine, False))
        if hit is None:
            members = self._members.nodes()
            me = self._me()
            ids = closest_ids(key, [*members, me.id] if mine else list(members), n)
            hit = tuple(me if i == me.id else peer_of(members[i]) for i in ids)
            cache.remember((key, n, mine, False), hit)
        return list(hit)

    async def closest(self, key: bytes, n: int, *, fresh: bool = False) -> list[PeerRef]:
        """Like ``closest_local``; once the table may not know everyone (``ksize`` members or
        more) the nodes an iterative FIND_NODE finds are merged in first."""
        members = self._members.nodes()
        if len(members) < self._ksize:
            return self.closest_local(key, n)  # exact, and valid while the members stay
        mine = self._members.owner_ready
        cache = self._valid()
        hit = None if fresh else cache.get((key, n, mine, True))
        if hit is None:
            found = await self._lookup(key)
            me = self._me()
            pool = {node.id: peer_of(node) for node in found}
            pool.update({i: peer_of(node) for i, node in self._members.nodes().items()})
            if mine:
                pool[me.id] = me
            else:
                pool.pop(me.id, None)
            hit = tuple(pool[i] for i in closest_ids(key, pool, n))
            self._valid().remember((key, n, mine, True), hit)
        return list(hit)

    async def owner(self, key: bytes, *, fresh: bool = False) -> PeerRef:
        """The key's owner (``closest(key, 1)``; this node when it knows nobody)."""
        found = await self.closest(key, 1, fresh=fresh)
        return found[0] if found else self._me()

    def forget(self, key: bytes) -> None:
        """Forget who owns ``key`` (its owner refused it): the next ``owner`` asks again."""
        for mine in (False, True):
            for looked_up in (False, True):
                self._cache.pop((key, 1, mine, looked_up), None)
