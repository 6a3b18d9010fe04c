"""The receiving side of the crawl RPCs on a peer: what it does with what neighbours send.

The node (:mod:`protocol`) checks a datagram's framing and types; this module checks what
only a crawler can: that each URL is canonical and belongs to the key it came with, and
that this peer owns the key. Bad items are dropped and counted, never stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2pcrawl.crawl import Task, to_stored, urls
from protocol import KeyBatch, PeerRef, StoreResult

if TYPE_CHECKING:
    from p2pcrawl.network.peer import Peer

__all__ = ["PeerHandler"]


class PeerHandler:
    """The :class:`protocol.CrawlHandler` of a peer."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.malformed = 0  # task items that failed the checks
        self.refused = 0  # keys refused because another peer owns them

    def _decode(self, batches: list[KeyBatch]) -> dict[bytes, list[Task]]:
        """Tasks by key, checked: canonical URL, key matching the URL. Bad items counted."""
        engine = self.peer.engine
        assert engine is not None
        out: dict[bytes, list[Task]] = {}
        for b in batches:
            tasks = []
            for item in b.tasks:
                url = urls.canonicalize(item.url)
                if url is None or url != item.url or engine.key_of(url) != b.key:
                    self.malformed += 1
                    continue
                tasks.append(Task(url, urls.fingerprint(url), b.key, item.depth, item.hops))
            out[b.key] = tasks
        return out

    def _owns(self, key: bytes) -> bool:
        node = self.peer.node
        assert node is not None
        found = node.closest_local(key, 1)
        return not found or found[0].id == self.peer.node_id

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        peer = self.peer
        if peer.state not in ("active", "joining") or peer.engine is None:
            return StoreResult(new=0, duplicate=0, refused_keys=[b.key for b in batches])
        by_key = self._decode(batches)
        done = {b.key: b.done for b in batches if b.done}
        refused = [k for k in by_key if not self._owns(k)]
        peer.membership.note_received(sender, {k for k in by_key if k not in refused})
        mine = [t for k, ts in by_key.items() if k not in refused for t in ts]
        if any(t.depth == 0 for t in mine) and peer.scope_sync is not None:
            # A seed: its peer just widened the scope; links from it must not be dropped.
            await peer.scope_sync.refresh()
        self.refused += len(refused)
        new = await peer.intake(mine, {k: v for k, v in done.items() if k not in refused})
        return StoreResult(new=new, duplicate=len(mine) - new, refused_keys=refused)

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        backups = self.peer.backups
        assert backups is not None
        stored = [to_stored(t) for ts in self._decode(batches).values() for t in ts]
        return await backups.add(owner, stored) if stored else 0

    async def handle_delete_backup(self, sender: PeerRef, owner: bytes, fps: list[int]) -> int:
        backups, ledger = self.peer.backups, self.peer.ledger
        assert backups is not None and ledger is not None
        removed = await backups.remove_returning(owner, fps)
        if removed:
            # The owner finished these: remember them, so taking its hosts over later
            # does not fetch them again.
            await ledger.done.add([(t.key, t.fp) for t in removed])
        return len(removed)

    async def handle_refresh_task(self, sender: PeerRef) -> int:
        return await self.peer.membership.on_refresh(sender)

    def peer_added(self, peer: PeerRef) -> None:
        me = self.peer
        if me.dispatcher is not None:
            me.dispatcher.forget_owners()
        me.events.add("peer_added", peer=peer.id.hex()[:8], addr=f"{peer.host}:{peer.port}")
        me.membership.kick.set()

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        me = self.peer
        if me.dispatcher is not None:
            me.dispatcher.forget_owners()
        kind = "peer_left" if reason == "goodbye" else "peer_lost"
        me.events.add(kind, peer=peer.id.hex()[:8], reason=reason)
        me.membership.gone_owners.add(peer.id)
        me.membership.kick.set()
