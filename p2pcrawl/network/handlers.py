"""The receiving side of the crawl RPCs on a peer: what it does with what neighbours send.

The node (:mod:`protocol`) checks a datagram's framing and types; this module checks what
only a crawler can: that each URL is canonical and belongs to the key it came with, and
that this peer owns the key. Bad items are dropped and counted, never stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2pcrawl.crawl import Task, urls
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
        kept = {k: v for k, v in done.items() if k not in refused}
        # Only stored here: no call to another peer inside a handler, so the sender's
        # deadline measures this peer alone. Replicas are the sender's and the follower's job.
        new = await peer.intake(mine, kept, replicate=False)
        if peer.replication is not None:
            peer.replication.note_keys({t.key for t in mine} | set(kept))
        return StoreResult(new=new, duplicate=len(mine) - new, refused_keys=refused)

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        backups, ledger = self.peer.backups, self.peer.ledger
        assert backups is not None and ledger is not None
        done = {b.key: b.done for b in batches if b.done}
        if done:  # the owner's done range for a key this peer now replicates
            await self._record_done(owner, done)
        tasks = [t for ts in self._decode(batches).values() for t in ts]
        assert self.peer.replication is not None
        return await self.peer.replication.hold(owner, tasks)

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        return await self._record_done(owner, done)

    async def _record_done(self, owner: bytes, done: dict[bytes, list[int]]) -> int:
        """The owner finished these: drop the copies and remember every fingerprint under
        its key, copy or not, so whoever takes the host over does not fetch it again."""
        backups, ledger = self.peer.backups, self.peer.ledger
        assert backups is not None and ledger is not None
        pairs = [(k, fp) for k, fps in done.items() for fp in fps]
        await ledger.done.add(pairs)
        return await backups.remove(owner, [fp for _, fp in pairs])

    async def handle_refresh_task(self, sender: PeerRef) -> int:
        return await self.peer.membership.on_refresh(sender)

    def peer_added(self, peer: PeerRef) -> None:
        me = self.peer
        if me.dispatcher is not None:
            me.dispatcher.forget_owners()
        if me.replication is not None:
            me.replication.membership_changed()
        me.events.add("peer_added", peer=peer.id.hex()[:8], addr=f"{peer.host}:{peer.port}")
        me.membership.kick.set()

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        me = self.peer
        if me.dispatcher is not None:
            me.dispatcher.forget_owners()
        if me.replication is not None:
            me.replication.membership_changed()
        kind = "peer_left" if reason == "goodbye" else "peer_lost"
        me.events.add(kind, peer=peer.id.hex()[:8], reason=reason)
        me.membership.gone_owners.add(peer.id)
        me.membership.kick.set()
