"""Membership changes: join refresh, handoff, crash takeover, republish and graceful leave.

"Distributed Crawler Based on the Improved Kademlia Protocol" (§2.4) gives the shape
(REFRESH_TASK on join, re-publishing on leave, periodic republish of backups against crashes).
Beyond the paper: a host key's done fingerprints travel with its tasks, a joiner waits for its
neighbours' handoffs before crawling, and only backups whose owner is gone or replaced are
re-sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from p2pcrawl.crawl import Task
from p2pcrawl.network.dispatch import to_batches
from protocol import (
    MessageError,
    PeerRef,
    PeerTimeout,
    RefreshAnswer,
    RemoteError,
    closest,
    distance,
)

if TYPE_CHECKING:
    from p2pcrawl.crawl import Engine, Ledger
    from p2pcrawl.network.dispatch import Dispatcher
    from p2pcrawl.network.peer import Peer
    from protocol import CrawlNode
    from storage import BackupStore

__all__ = ["HandoffReport", "Membership"]

log = logging.getLogger(__name__)

# How soon a joiner asks again when we have not admitted it yet (a challenge is one ping
# round trip), and the least "later" we say (a timer due within milliseconds).
ADMISSION_RETRY_S = 0.1
MIN_RETRY_S = 0.02
HANDOFF_POLL_S = 0.2  # how often a joiner asks whether a handoff to it is complete
HISTORY_REQUESTERS = 64


@dataclass(slots=True)
class HandoffReport:
    tasks: int = 0
    done: int = 0
    backups: int = 0
    failed: int = 0
    queue_at_leave: int = 0

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class Membership:
    """The peer's reactions to others joining, leaving and vanishing, and its own leave."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.kick = asyncio.Event()  # membership changed: take over and rebalance soon
        # Leaving, and our borrowers' pages still settling: their links to our keys are
        # stored here and handed off with the rest (refused, those pages would wait for our
        # goodbye, the leases would time out, and the new owners fetch the pages again).
        self.accepting_while_leaving = False
        self.gone_owners: set[bytes] = set()  # removed peers whose backups may need taking
        self._handoff_lock = asyncio.Lock()
        self.handing_off = 0  # hand-offs waiting for their keys' pages to finish here
        self._asked: set[bytes] = set()  # neighbours we asked for our keys (join, re-sync)
        self._handing_to: Counter[bytes] = Counter()  # requester -> handoffs under way
        # Done-only keys whose history went to a requester: a later REFRESH_TASK of the
        # same requester does not send it again (bounded: one entry per recent requester).
        self._history_sent: OrderedDict[bytes, set[bytes]] = OrderedDict()
        self.resyncing = False
        self.stall_resyncs = 0

    def _started(self) -> tuple[Ledger, Engine, CrawlNode, BackupStore, Dispatcher]:
        p = self.peer
        assert p.ledger and p.engine and p.node and p.backups and p.dispatcher, "not started"
        return p.ledger, p.engine, p.node, p.backups, p.dispatcher

    async def on_refresh(self, sender: PeerRef) -> RefreshAnswer:
        """REFRESH_TASK (Kademlia crawler paper, §2.4.1): send the requester every key now
        closer to it.

        Beyond the paper, a key's done fingerprints go with it, and keys with no queued
        tasks left move too (their history is what keeps the new owner from re-fetching).
        The answer is how many keys will follow; the requester asks again until the answer
        is 0 with no "later": then everything has arrived. "Ask again later" is the answer
        while a handoff to the requester is under way, while the requester is not in our
        routing table yet (its admission challenge is a round trip away: answering from a
        table without it would promise nothing and leave us crawling its hosts beside it),
        and while it is younger than the minimum age before a new ID takes over keys. A
        requester old enough counts as an owner from this answer on, so no key is handed
        to it that we would then still crawl.
        """
        ledger, _, node, _, _ = self._started()
        if self.peer.state != "active":
            return RefreshAnswer(0)
        if self._handing_to[sender.id]:
            return RefreshAnswer(0, retry_after=HANDOFF_POLL_S)
        wait = node.owner_wait(sender.id)
        if wait is None:  # not admitted yet: the request itself set its challenge going
            return RefreshAnswer(0, retry_after=ADMISSION_RETRY_S)
        if not node.establish_early(sender.id):  # too young: as many seconds as it lacks
            return RefreshAnswer(0, retry_after=max(wait, MIN_RETRY_S))
        queued = set(await ledger.tasks.key_counts())
        sent = self._history_sent.get(sender.id, set())
        keys = queued | (set(await ledger.done.keys()) - sent)
        moving = [k for k in keys if _owner_id(node, k) == sender.id]
        if moving:
            self._handing_to[sender.id] += 1
            self.peer.spawn(self._refresh_handoff(sender, moving), "refresh-handoff")
        return RefreshAnswer(len(moving))

    async def _refresh_handoff(self, requester: PeerRef, keys: list[bytes]) -> None:
        try:
            async with self._handoff_lock:
                sent = await self._hand_keys_retrying(requester, keys)
            if sent is not None:
                history = self._history_sent.setdefault(requester.id, set())
                history.update(keys)
                self._history_sent.move_to_end(requester.id)
                while len(self._history_sent) > HISTORY_REQUESTERS:
                    self._history_sent.popitem(last=False)
            self.peer.events.add(
                "handoff", to=requester.id.hex()[:8], keys=len(keys), tasks=sent or 0
            )
        finally:
            self._handing_to[requester.id] -= 1
            if not self._handing_to[requester.id]:
                del self._handing_to[requester.id]

    def peer_removed(self, peer_id: bytes) -> None:
        """A peer left our table (dead, gone, replaced). Its keys may be crawled elsewhere
        now, so if it comes back and asks again, their history goes with them again."""
        self.gone_owners.add(peer_id)
        self._history_sent.pop(peer_id, None)
        if self.peer.replication is not None:
            self.peer.replication.forget_peer(peer_id)
        self.owners_changed()

    def expecting_handoff(self, sender: bytes) -> bool:
        """Whether we asked ``sender`` for our keys (join or re-sync) and wait for them."""
        return sender in self._asked

    async def refresh_from_neighbours(self) -> None:
        """Join step 3 (Kademlia crawler paper, §2.4.1): ask neighbours to send what is now
        closer to us, and wait (bounded) until they have sent it all.

        Each neighbour is asked until it answers 0 with no "later": "later" while it has
        not admitted us yet, while we are younger than the minimum owner age, or while its
        handoff to us is under way; a count when it starts one. Once every neighbour has
        answered with a count, this node takes ownership of its keys (``take_ownership``):
        from then on the others' handoffs and newly routed tasks are ours, though the
        engine stays paused until every neighbour has said it has nothing more -- so
        nothing is fetched before the history that would have deduplicated it.
        """
        _, _, node, _, _ = self._started()
        ps = self.peer.config.peer
        neighbours = [
            p
            for p in node.closest_local(self.peer.node_id, ps.ksize, with_self=False)
            if p.id != self.peer.node_id
        ]
        self._asked = {p.id for p in neighbours}
        asked = time.monotonic()
        give_up = asked + ps.min_peer_age + ps.handoff_timeout
        counted: set[bytes] = set()  # neighbours that answered with a count at least once
        promised = 0
        try:
            due = {p.id: asked for p in neighbours}  # when to ask each neighbour (again)
            by_id = {p.id: p for p in neighbours}
            while due:
                now = time.monotonic()
                ask = [by_id[i] for i, t in due.items() if t <= now]
                answers = await asyncio.gather(*(self._ask_refresh(p) for p in ask))
                for p, answer in zip(ask, answers, strict=True):
                    if answer is None and p.id not in {q.id for q in node.peers()}:
                        del due[p.id]  # declared dead meanwhile: nothing will come from it
                        continue
                    if answer is not None and not answer.retry_after:
                        counted.add(p.id)
                        promised += answer.keys
                        if not answer.keys:
                            del due[p.id]  # all it had for us has arrived
                            continue
                    if answer is None:  # a peer still in our table: after a stall it
                        wait = ADMISSION_RETRY_S  # may be the one that took our hosts
                    elif answer.retry_after:
                        wait = answer.retry_after
                    else:
                        wait = HANDOFF_POLL_S  # a handoff began: ask when it is through
                    due[p.id] = time.monotonic() + wait
                # Every neighbour still sending counts us as an owner: its keys are ours.
                if set(due) <= counted and node.take_ownership():
                    self.owners_changed()
                if due:
                    left = give_up - time.monotonic()
                    if left <= 0:
                        log.warning("join: %d neighbours never handed over all; going on", len(due))
                        break
                    await asyncio.sleep(max(0.0, min(min(due.values()) - time.monotonic(), left)))
            if node.take_ownership():
                self.owners_changed()
        finally:
            self._asked = set()
        self.peer.events.add(
            "refreshed",
            neighbours=len(counted),
            keys=promised,
            waited_s=round(time.monotonic() - asked, 2),
        )

    async def _ask_refresh(self, p: PeerRef) -> RefreshAnswer | None:
        """The neighbour's answer; None if it did not answer. One that answers with an
        error (a stock kademlia node has no REFRESH_TASK) has nothing for us."""
        node = self.peer.node
        assert node is not None
        try:
            return await node.refresh_task(p)
        except RemoteError as exc:
            log.info("REFRESH_TASK to %s failed: %s", p, exc)
            return RefreshAnswer(0)
        except (PeerTimeout, OSError) as exc:
            log.info("REFRESH_TASK to %s unanswered: %s", p, exc)
            return None

    def owners_changed(self) -> None:
        """Who owns which key changed (a contact came or went, or this node started owning
        keys): cached owners and replica sets are stale, and a rebalance pass is due."""
        p = self.peer
        p.advertised.forget()  # links of keys that may be someone else's now
        if p.dispatcher is not None:
            p.dispatcher.forget_owners()
        if p.replication is not None:
            p.replication.membership_changed()
        self.kick.set()

    def on_stall(self, seconds: float) -> None:
        """Our event loop stood still for ``seconds`` (SIGSTOP, a long blocking call): the
        others may have declared us dead and crawled our hosts from their backups meanwhile.
        Fetch nothing new until the neighbours have handed back what is ours, with the done
        fingerprints of what they crawled in our place -- otherwise we would fetch those
        pages a second time."""
        if self.resyncing or self.peer.state != "active" or self.peer.engine is None:
            return
        self.resyncing = True
        self.peer.engine.paused = True
        self.peer.lending.borrower.on_stall()
        self.peer.events.add("stalled", seconds=round(seconds, 1))
        self.peer.spawn(self._resync_after_stall(), "stall-resync")

    async def _resync_after_stall(self) -> None:
        _, engine, node, _, _ = self._started()
        try:
            # Our requests put us back into the others' tables; their answers refute any
            # suspicion we had of them while we could not read.
            await asyncio.gather(*(node.ping_peer(p) for p in node.peers()), return_exceptions=True)
            await self.refresh_from_neighbours()
        except (PeerTimeout, RemoteError, OSError) as exc:
            log.warning("re-sync after a stall failed: %s", exc)
        finally:
            self.resyncing = False
            self.stall_resyncs += 1
            if self.peer.state == "active":
                engine.paused = False
                engine.wake()
                self.kick.set()

    async def rebalance_loop(self) -> None:
        while True:
            await self.kick.wait()
            # Debounce: a join brings several membership events in a burst.
            await asyncio.sleep(0.2)
            self.kick.clear()
            if self.peer.state != "active":
                continue
            try:
                await self._takeover()
                await self._rebalance()
            except (PeerTimeout, RemoteError, OSError, MessageError) as exc:
                log.warning("rebalance pass failed: %s; retrying", exc)
                await asyncio.sleep(1.0)
                self.kick.set()

    async def _takeover(self) -> None:
        """Crash recovery: re-route the backups held for owners that are gone."""
        _, _, node, backups, dispatcher = self._started()
        if not self.gone_owners:
            return
        live = {p.id for p in node.peers()}
        gone = [o for o in self.gone_owners if o not in live]
        self.gone_owners.clear()
        if gone:
            await self._hand_on_history(gone)
        for owner in gone:
            taken = await backups.take_owner(owner)
            if not taken:
                continue
            tasks = await self._unfinished(
                [Task(s.url, s.fp, s.key, s.depth, s.hops) for s in taken]
            )
            self.peer.events.add("takeover", owner=owner.hex()[:8], tasks=len(tasks))
            await dispatcher.route(tasks)

    async def _hand_on_history(self, gone: list[bytes]) -> None:
        """Give the successors of vanished owners the done fingerprints this peer knows for
        their keys (as a replica, or as an earlier owner), before any backup is re-routed.

        A successor that was not yet a replica when the pages were finished -- it joined
        after the key last moved, and the owner died before its replication pass -- would
        otherwise accept every newly discovered link to those pages as new work, and for a
        host that was already fully crawled it would crawl the whole host again.
        """
        ledger, _, node, _, _ = self._started()
        me = self.peer.node_id
        candidates = [*(p.id for p in node.peers()), me, *gone]
        gone_set = set(gone)
        by_owner: dict[PeerRef, list[bytes]] = defaultdict(list)
        for key in await ledger.done.keys():
            if closest(key, candidates, 1)[0] not in gone_set:
                continue  # its owner did not change
            successor = node.closest_local(key, 1)[0]
            if successor.id != me:
                by_owner[successor].append(key)
        await asyncio.gather(*(self._send_history(o, keys) for o, keys in by_owner.items()))

    async def _send_history(self, owner: PeerRef, keys: list[bytes]) -> None:
        """Done fingerprints of ``keys`` to their new owner, again while it refuses them: it
        may not have declared the old owner dead yet. The takeover waits for this, since a
        successor that takes the backups without the history re-fetches finished pages."""
        ledger, _, node, _, _ = self._started()
        deadline = time.monotonic() + self.peer.config.peer.handoff_timeout
        delay = 0.25
        while keys:
            done = await ledger.done.fps_for_keys(keys)
            try:
                result = await node.store_task(owner, to_batches([], done))
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.info("history for %d keys to %s failed: %s", len(keys), owner, exc)
                return
            refused = set(result.refused_keys)
            keys = [k for k in keys if k in refused and _owner_id(node, k) == owner.id]
            if keys:
                if time.monotonic() + delay > deadline:
                    log.warning("%s refused the history of %d keys", owner, len(keys))
                    return
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)

    async def _copy_to_replicas(
        self, owner: PeerRef, tasks: list[Task], done: dict[bytes, list[int]] | None
    ) -> None:
        """A handoff writes the new owner's replicas too, done range included: the new
        owner's STORE_TASK handler copies only the tasks, and if it crashes before its own
        replication pass, its successor still knows what was finished before the key moved."""
        replication = self.peer.replication
        if replication is not None:
            await replication.copy_for(owner, tasks, done)

    async def _unfinished(self, tasks: list[Task]) -> list[Task]:
        """Drop copies this peer knows to be finished (as a replica it records every done
        fingerprint it is told of; as an old owner it keeps its history): republishing them
        would make a new owner that lacks that history fetch them again."""
        ledger = self.peer.ledger
        assert ledger is not None
        if not tasks:
            return tasks
        done = await ledger.is_done(tasks)
        return [t for t, d in zip(tasks, done, strict=True) if not d]

    async def _rebalance(self) -> None:
        """Hand every key this peer no longer owns to its owner, history included."""
        ledger, engine, node, _, _ = self._started()
        assert ledger is not None and engine is not None and node is not None
        async with self._handoff_lock:
            counts = await ledger.tasks.key_counts()
            moved: dict[PeerRef, list[bytes]] = defaultdict(list)
            for key in counts:
                found = node.closest_local(key, 1)
                if found and found[0].id != self.peer.node_id:
                    moved[found[0]].append(key)
            for owner, keys in moved.items():
                sent = await self._hand_keys_retrying(owner, keys)
                self.peer.events.add(
                    "handoff", to=owner.id.hex()[:8], keys=len(keys), tasks=sent or 0
                )

    async def _hand_keys(
        self, owner: PeerRef, keys: list[bytes], *, resume_on_failure: bool = True
    ) -> int:
        """Stop crawling ``keys``, wait for their fetches, send tasks and done fps to
        ``owner``. On failure the tasks go back into our store; ``resume_on_failure``
        says whether we crawl them again meanwhile (a caller that retries says no)."""
        ledger, engine, node, _, _ = self._started()
        assert ledger is not None and engine is not None and node is not None
        keyset = set(keys)
        engine.exclude_keys(keyset)
        deadline = time.monotonic() + self.peer.config.peer.handoff_timeout
        # Our own fetches only: a borrowed one is its lender's to wait for. Their tails wait
        # on our RPC lanes, which must not be patient now (``Peer._backlogged``).
        self.handing_off += 1
        try:
            self.peer.hurry()
            while any(t.key in keyset and not t.lease for t in engine.in_flight.values()):
                if time.monotonic() > deadline:
                    break
                await engine.wait_progress(0.2)
        finally:
            self.handing_off -= 1
        # Not waited for: a borrower's pages may be waiting to route their links to the very
        # keys that move. Their tasks go with the keys; what the borrower finishes of them is
        # forwarded to the new owner as done history (network/borrower.py).
        self.peer.lending.lender.revoke_keys(keyset)
        tasks = await ledger.take_keys(keys)
        done = await ledger.done.fps_for_keys(keys)
        try:
            result, _ = await asyncio.gather(
                node.store_task(owner, to_batches(tasks, done)),
                self._copy_to_replicas(owner, tasks, done),
            )
        except (PeerTimeout, RemoteError, OSError):
            # Put them back: they stay ours until the owner answers.
            await ledger.accept(tasks)
            if resume_on_failure:
                engine.include_keys(keyset)
                engine.wake()
            raise
        if result.refused_keys:
            back = [t for t in tasks if t.key in set(result.refused_keys)]
            engine.include_keys(set(result.refused_keys))
            await ledger.accept(back)
            engine.wake()
        return len(tasks)

    async def _hand_keys_retrying(self, owner: PeerRef, keys: list[bytes]) -> int | None:
        """``_hand_keys`` until it goes through, for as long as ``owner`` is still the
        owner of the keys (bounded by ``handoff_timeout``); None if it never did.
        Meanwhile the keys stay excluded from our crawl: the owner may already be crawling
        what it was routed, and two crawlers of one host is the duplicate fetch this whole
        dance avoids."""
        _, engine, node, _, _ = self._started()
        deadline = time.monotonic() + self.peer.config.peer.handoff_timeout
        delay = 0.25
        while True:
            try:
                return await self._hand_keys(owner, keys, resume_on_failure=False)
            except (PeerTimeout, RemoteError, OSError) as exc:
                still = [k for k in keys if _owner_id(node, k) == owner.id]
                if not still or time.monotonic() + delay > deadline:
                    log.warning("handoff of %d keys to %s failed: %s", len(keys), owner, exc)
                    engine.include_keys(set(keys))
                    engine.wake()
                    self.kick.set()  # whoever owns them now gets them from the rebalance
                    return None
                log.info("handoff to %s failed (%s); trying again in %.1f s", owner, exc, delay)
                moved_on = set(keys) - set(still)
                if moved_on:  # owned by someone else now: ours to crawl or pass on again
                    engine.include_keys(moved_on)
                    engine.wake()
                    self.kick.set()
                keys = still
                await asyncio.sleep(delay)
                delay = min(2 * delay, 4.0)

    async def republish_loop(self) -> None:
        """The periodic republish of backups (Kademlia crawler paper, §2.4.3), limited to the
        ones that need it.

        A backup whose owner is alive and still the closest node to its key is left alone:
        re-sending those would flood a healthy network for nothing.
        """
        interval = self.peer.config.peer.republish_interval
        while True:
            await asyncio.sleep(interval)
            if self.peer.state == "active":
                with contextlib.suppress(PeerTimeout, RemoteError, OSError):
                    await self.republish_pass()

    async def republish_pass(self) -> int:
        _, _, node, backups, dispatcher = self._started()
        live = {p.id for p in node.peers()}
        after = 0
        resent = 0
        while True:
            rows = await backups.page(after, 1000)
            if not rows:
                return resent
            after = rows[-1][0]
            stale: dict[bytes, list[Task]] = defaultdict(list)
            for _, owner, s in rows:
                closest = node.closest_local(s.key, 1 + self.peer.config.peer.replicas)
                ids = [p.id for p in closest]
                healthy = owner in live and ids and ids[0] == owner and self.peer.node_id in ids[1:]
                if not healthy:
                    stale[owner].append(Task(s.url, s.fp, s.key, s.depth, s.hops))
            for owner, tasks in stale.items():
                await dispatcher.route(await self._unfinished(tasks))
                await backups.remove(owner, [t.fp for t in tasks])
                resent += len(tasks)

    # -- graceful leave --------------------------------------------------------------------

    async def leave(self) -> HandoffReport:
        """Graceful leave (Kademlia crawler paper, §2.4.2): hand every task, done range and
        backup to its owner."""
        ledger, engine, node, backups, dispatcher = self._started()
        assert engine is not None and ledger is not None and node is not None
        if self.peer.state != "active":
            return self.peer.handoff
        self.peer.state = "leaving"
        self.peer.hurry()  # what our pages wait for leaves now: the hand-off waits for them
        self.accepting_while_leaving = True
        self.peer.events.add("leaving")
        report = self.peer.handoff
        # Borrowed tasks not yet started go back to their owners at once; those under way
        # finish with ours and are reported before the hand-off. Our own lent hosts are
        # recalled the same way, so none of their pages is fetched twice.
        lending = self.peer.lending
        lending.lender.recall()
        lending.borrower.give_back_unstarted()
        await engine.stop_fetching(timeout=10.0)
        await lending.borrower.flush(timeout=5.0)
        try:
            await lending.lender.wait_leases(timeout=5.0)
        finally:
            # From here on what arrives is refused: the hand-off below takes the keys.
            self.accepting_while_leaving = False
        lending.lender.end_leases()
        await engine.aclose()
        await dispatcher.flush()
        report.queue_at_leave = ledger.queued
        # Goodbye first: once the others have dropped this peer from their tables they
        # route its keys to their new owners, and those accept the handoff below as theirs.
        others = await self.say_goodbye()
        if others:
            async with self._handoff_lock:
                counts = await ledger.tasks.key_counts()
                by_owner: dict[PeerRef, list[bytes]] = defaultdict(list)
                for key in counts:
                    by_owner[_closest_other(key, others)].append(key)
                for owner, keys in by_owner.items():
                    tasks = await ledger.take_keys(keys)
                    done = await ledger.done.fps_for_keys(keys)
                    if await self._send_with_fallback(owner, others, tasks, done):
                        report.tasks += len(tasks)
                        report.done += sum(len(v) for v in done.values())
                    else:
                        report.failed += len(tasks)
                        await ledger.accept(tasks)
                for owner_id, _ in (await backups.owner_counts()).items():
                    taken = await backups.take_owner(owner_id)
                    groups: dict[PeerRef, list[Task]] = defaultdict(list)
                    for s in taken:
                        groups[_closest_other(s.key, others)].append(
                            Task(s.url, s.fp, s.key, s.depth, s.hops)
                        )
                    for owner, tasks in groups.items():
                        if await self._send_with_fallback(owner, others, tasks, None):
                            report.backups += len(tasks)
        self.peer.events.add("left", **report.as_dict())
        log.info(
            "left the network: handed off %d tasks, %d done fingerprints, %d backups (%d failed)",
            report.tasks,
            report.done,
            report.backups,
            report.failed,
        )
        return report

    async def say_goodbye(self) -> list[PeerRef]:
        """GOODBYE to every peer we know, at once (each bounded by the RPC timeout): they
        drop us from their tables now instead of suspecting us for a while. Returns them."""
        node = self.peer.node
        assert node is not None
        others = [p for p in node.peers() if p.id != self.peer.node_id]

        async def one(p: PeerRef) -> None:
            with contextlib.suppress(PeerTimeout, RemoteError, OSError):
                await node.goodbye(p)

        await asyncio.gather(*(one(p) for p in others))
        return others

    async def _send_with_fallback(
        self,
        owner: PeerRef,
        others: list[PeerRef],
        tasks: list[Task],
        done: dict[bytes, list[int]] | None,
    ) -> bool:
        """STORE_TASK to the new owner; if it is gone, to the next closest that answers."""
        _, _, node, _, _ = self._started()
        if not tasks and not done:
            return True
        candidates = [owner] + [p for p in others if p != owner]
        key = tasks[0].key if tasks else next(iter(done or {b"": []}))
        candidates.sort(key=lambda p: distance(p.id, key) if p != owner else -1)
        for cand in candidates[:4]:
            try:
                await asyncio.gather(
                    node.store_task(cand, to_batches(tasks, done)),
                    self._copy_to_replicas(cand, tasks, done),
                )
                return True
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.warning("handoff to %s failed: %s", cand, exc)
        return False


def _owner_id(node: CrawlNode, key: bytes) -> bytes | None:
    found = node.closest_local(key, 1)
    return found[0].id if found else None


def _closest_other(key: bytes, others: list[PeerRef]) -> PeerRef:
    return min(others, key=lambda p: distance(p.id, key))
