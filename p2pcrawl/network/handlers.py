"""The receiving side of the crawl RPCs on a peer: what it does with what neighbours send.

The node (:mod:`protocol`) checks a datagram's framing and types; this module checks what
only a crawler can: that each URL is canonical and belongs to the key it came with, that
this peer owns the key, and that the URL is inside *this peer's own* scope and depth limit
(a sender's word is not enough: any peer, or anyone in an open network, could otherwise make
it crawl anything). Bad items are dropped and counted (``rejected`` by reason), never stored.

A sender whose *new* tasks outrun ``sender_tasks_per_s`` (beyond a large burst, so a host
handed over whole passes) is answered "busy" once its budget is spent; its dispatcher keeps
the tasks and tries again later, so a flood is slowed down without losing anything a real
peer sent. Only new tasks are charged, after the fact: a retried batch whose tasks are
already here costs nothing, so a batch larger than the burst cannot be refused forever.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from p2pcrawl.crawl import Task, hops, urls
from protocol import Busy, KeyBatch, PeerRef, Rate, RefreshAnswer, SourceLimits, StoreResult

if TYPE_CHECKING:
    from p2pcrawl.network.peer import Peer

__all__ = ["PeerHandler"]

SCOPE_REFRESH_GAP_S = 1.0  # at most one DHT scope lookup per second caused by strangers' tasks


class PeerHandler:
    """The :class:`protocol.CrawlHandler` of a peer."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.malformed = 0  # task items that failed the checks
        self.refused = 0  # keys refused because another peer owns them
        self.rejected: Counter[str] = Counter()  # tasks dropped: "scope", "depth"
        self.busy = 0  # STORE_TASK requests answered "busy"
        ps = peer.config.peer
        self._senders = SourceLimits(
            Rate(ps.sender_tasks_per_s, ps.sender_tasks_burst), max_sources=1024
        )
        self._scope_refreshed = 0.0

    def decode(self, batches: list[KeyBatch]) -> dict[bytes, list[Task]]:
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

    async def _within_scope(self, tasks: list[Task]) -> list[Task]:
        """The tasks this peer's own scope and depth limit allow; the rest counted."""
        engine = self.peer.engine
        assert engine is not None
        scope = engine.scope

        def allowed(ts: list[Task]) -> list[Task]:
            # A page requisite has its own scope rule (--requisites) and no depth limit.
            return [
                t
                for t in ts
                if scope.allows_host(urls.hostname_of(t.url))
                or (hops.embeds(t.hops) and engine.links.requisite_allowed(t.url))
            ]

        ok = allowed(tasks)
        sync = self.peer.scope_sync
        now = time.monotonic()
        if (
            len(ok) < len(tasks)
            and engine.scope_from_seeds
            and sync is not None
            and sync.trusted
            and now - self._scope_refreshed >= SCOPE_REFRESH_GAP_S
        ):
            # A seed host this peer has not heard of yet: ask the DHT (trusted) once.
            self._scope_refreshed = now
            await sync.refresh()
            ok = allowed(tasks)
        self.rejected["scope"] += len(tasks) - len(ok)
        max_depth = engine.settings.scope.max_depth
        shallow = [t for t in ok if t.depth <= max_depth or hops.embeds(t.hops)]
        self.rejected["depth"] += len(ok) - len(shallow)
        return shallow

    def _owns(self, key: bytes, *, handed: bool = False) -> bool:
        """Whether this peer is the key's closest node. ``handed``: the sender is a neighbour
        we asked for our keys; while joining we count ourselves the owner of what it hands
        us, and of nothing else (``CrawlNode.hold_ownership``)."""
        node = self.peer.node
        assert node is not None
        found = node.closest_local(key, 1, with_self=True if handed else None)
        return not found or found[0].id == self.peer.node_id

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        peer = self.peer
        open_ = peer.state in ("active", "joining") or (
            peer.state == "leaving" and peer.membership.accepting_while_leaving
        )
        if not open_ or peer.engine is None:
            return StoreResult(new=0, duplicate=0, refused_keys=[b.key for b in batches])
        by_key = self.decode(batches)
        done = {b.key: b.done for b in batches if b.done}
        handed = peer.membership.expecting_handoff(sender.id)
        refused = [k for k in by_key if not self._owns(k, handed=handed)]
        offered = [t for k, ts in by_key.items() if k not in refused for t in ts]
        if offered and not self._senders.allow(sender.id, 0.5):  # some budget left?
            self.busy += 1
            raise Busy()
        if any(t.depth == 0 for t in offered) and peer.scope_sync is not None:
            # A seed: its peer just widened the scope; links from it must not be dropped.
            await peer.scope_sync.refresh()
        mine = await self._within_scope(offered)
        self.refused += len(refused)
        kept = {k: v for k, v in done.items() if k not in refused}
        # Stored, and what is new copied to the replicas, before the answer: the sender's
        # ack means the copies are held too. The wait for them is bounded well inside the
        # sender's deadline (``Replication.copy_new``).
        new = await peer.intake(mine, kept, routed=True)
        if peer.replication is not None:
            peer.replication.note_keys({t.key for t in mine} | set(kept))
        self._senders.charge(sender.id, new)
        node = peer.node
        # What other peers routed here, for a member to not send again (``network.known``).
        known = peer.advertised.since(sender.id) if node and node.is_member(sender.id) else []
        # Rejected tasks count as duplicates: the sender must not re-route them elsewhere.
        return StoreResult(new, len(offered) - new, refused, known)

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        replication = self.peer.replication
        assert replication is not None
        done = {b.key: b.done for b in batches if b.done}
        if done:  # the owner's done range for a key this peer now replicates
            await replication.record_done(owner, done)
        decoded = [t for ts in self.decode(batches).values() for t in ts]
        tasks = await self._within_scope(decoded)
        return await replication.hold(owner, tasks)

    async def handle_delete_backup(
        self, sender: PeerRef, owner: bytes, done: dict[bytes, list[int]]
    ) -> int:
        assert self.peer.replication is not None
        return await self.peer.replication.record_done(owner, done)

    async def handle_refresh_task(self, sender: PeerRef) -> RefreshAnswer:
        return await self.peer.membership.on_refresh(sender)

    def peer_added(self, peer: PeerRef) -> None:
        me = self.peer
        me.events.add("peer_added", peer=peer.id.hex()[:8], addr=f"{peer.host}:{peer.port}")
        me.membership.owners_changed()

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        me = self.peer
        kind = "peer_left" if reason == "goodbye" else "peer_lost"
        me.events.add(kind, peer=peer.id.hex()[:8], reason=reason)
        me.membership.peer_removed(peer.id)
        me.lending.peer_removed(peer.id)
