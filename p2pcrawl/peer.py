"""A peer: the crawl engine wired to the DHT node, the stores and the status server.

Seed 001's flow, per URL: the discoverer routes it to its owner (STORE_TASK); the owner
dedups it against its done record and queue, stores it, and copies it to its r closest
neighbours (STORE_BACKUP) before acknowledging; it crawls it, records it done and tells
the neighbours to drop their copies (DELETE_BACKUP), which also gives them the done
fingerprint so a neighbour that takes the host over does not fetch it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from p2pcrawl import __version__, urls
from p2pcrawl.batching import Coalescer
from p2pcrawl.dispatch import Dispatcher, to_batches
from p2pcrawl.engine import Engine
from p2pcrawl.frontier import Task
from p2pcrawl.identity import load_or_create_identity
from p2pcrawl.ledger import Ledger, to_stored
from p2pcrawl.settings import CrawlSettings, PeerSettings
from p2pcrawl.stats import EventLog
from p2pcrawl.warc import WarcWriter
from protocol.errors import MessageError, PeerTimeout, RemoteError
from protocol.messages import KeyBatch, PeerRef, StoreResult
from protocol.node import CrawlNode, NodeConfig
from protocol.ownership import distance, key_for
from protocol.tasks import TaskSet
from storage.backups import BackupStore

__all__ = ["Peer", "PeerConfig", "State"]

log = logging.getLogger(__name__)

State = Literal["joining", "active", "leaving", "stopped"]

# The DHT value that carries the seeds' hosts, the default scope, to every peer.
SCOPE_KEY = "p2pcrawl/scope/v1"
SCOPE_REFRESH_S = 5.0
MAX_SCOPE_HOSTS = 10_000


@dataclass(frozen=True, slots=True)
class PeerConfig:
    data_dir: Path
    listen: tuple[str, int] = ("127.0.0.1", 0)
    bootstrap: tuple[tuple[str, int], ...] = ()
    seeds: tuple[str, ...] = ()
    crawl: CrawlSettings = field(default_factory=CrawlSettings)
    peer: PeerSettings = field(default_factory=PeerSettings)


@dataclass(slots=True)
class HandoffReport:
    tasks: int = 0
    done: int = 0
    backups: int = 0
    failed: int = 0
    queue_at_leave: int = 0


class Peer:
    def __init__(self, config: PeerConfig) -> None:
        self.config = config
        self.state: State = "joining"
        self.events = EventLog()
        self.node_id = load_or_create_identity(config.data_dir)
        self.started = time.monotonic()
        self.ledger: Ledger | None = None
        self.backups: BackupStore | None = None
        self.warc: WarcWriter | None = None
        self.node: CrawlNode | None = None
        self.engine: Engine | None = None
        self.dispatcher: Dispatcher | None = None
        self.handoff = HandoffReport()
        self.malformed = 0
        self.refused = 0
        self._owned = TaskSet("peer")
        self._rebalance_kick = asyncio.Event()
        self._takeover_owners: set[bytes] = set()
        self._deletes: Coalescer[PeerRef, int] = Coalescer(self._send_deletes)
        self._stopped = asyncio.Event()
        self._leave_requested = asyncio.Event()
        self._handoff_lock = asyncio.Lock()
        self._handoffs_received: dict[bytes, set[bytes]] = {}
        self._handoff_progress = asyncio.Event()

    # -- start and stop --------------------------------------------------------------------

    @property
    def me(self) -> PeerRef:
        assert self.node is not None
        return self.node.me

    async def start(self) -> None:
        cfg = self.config
        try:
            self.ledger = await Ledger.open(cfg.data_dir / "stores")
            self.backups = await BackupStore.open(cfg.data_dir / "stores" / "backups.sqlite3")
            if cfg.crawl.warc:
                self.warc = WarcWriter(
                    cfg.data_dir / "warc",
                    prefix=self.node_id.hex()[:8],
                    max_bytes=cfg.crawl.warc_max_bytes,
                )
                await self.warc.start()
            ps = cfg.peer
            self.node = CrawlNode(
                self.node_id,
                self,
                NodeConfig(
                    ksize=ps.ksize,
                    alpha=ps.alpha,
                    rpc_timeout=ps.rpc_timeout,
                    failures_before_evict=ps.failures_before_evict,
                    secret=ps.secret,
                    ping_interval=ps.ping_interval,
                    refresh_interval=ps.refresh_interval,
                ),
            )
            await self.node.listen_on(*cfg.listen)
            self.dispatcher = Dispatcher(
                self.node,
                replicas=ps.replicas,
                intake=self.intake,
                batch=ps.dispatch_batch,
                flush_s=ps.dispatch_flush_s,
            )
            self.engine = Engine(
                cfg.crawl,
                self.ledger,
                warc=self.warc,
                partition=ps.partition,
                router=self.dispatcher,
                on_finished=self._finished,
            )
            # Until the neighbours have handed over the hosts this peer now owns, with their
            # history, it accepts tasks but crawls nothing: it could not tell what is done.
            self.engine.paused = bool(cfg.bootstrap)
            await self.engine.start()
            if cfg.bootstrap:
                peers = await self.node.join(list(cfg.bootstrap))
                self.events.add("joined", peers=len(peers))
            self._spawn(self._rebalance_loop(), "rebalance")
            self._spawn(self._republish_loop(), "republish")
            if self.engine.scope_from_seeds:
                self._spawn(self._scope_loop(), "scope")
            if cfg.bootstrap:
                await self._refresh_from_neighbours()
            self.state = "active"
            self.engine.paused = False
            # A restart may find tasks whose keys moved while it was down.
            self._rebalance_kick.set()
            if cfg.seeds:
                await self.add_seeds(cfg.seeds)
        except BaseException:
            await self.aclose()
            raise

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._owned.spawn(coro, name)

    async def aclose(self) -> None:
        """Stop everything, each component in its own guard so one failure leaks nothing."""
        if self._stopped.is_set():
            return
        self.state = "stopped"
        await self._owned.aclose()
        for name, closer in (
            ("engine", self.engine.aclose if self.engine else None),
            ("deletes", self._deletes.aclose),
            ("dispatcher", self.dispatcher.aclose if self.dispatcher else None),
            ("node", self.node.aclose if self.node else None),
            ("warc", self.warc.aclose if self.warc else None),
            ("backups", self.backups.aclose if self.backups else None),
            ("ledger", self.ledger.aclose if self.ledger else None),
        ):
            if closer is None:
                continue
            try:
                await closer()
            except Exception:
                log.exception("closing %s failed", name)
        self._stopped.set()

    def request_leave(self) -> None:
        self._leave_requested.set()

    async def run(self) -> HandoffReport:
        """Serve until asked to leave, then leave gracefully."""
        await self._leave_requested.wait()
        return await self.leave()

    # -- seeds -----------------------------------------------------------------------------

    async def add_seeds(self, seeds: Iterable[str]) -> int:
        assert self.engine is not None
        seeds = list(seeds)
        if self.engine.scope_from_seeds:
            tasks = self.engine.seed_tasks(seeds)  # validates; raises ValueError first
            # Published before the seeds travel, so an owner that refreshes its scope on
            # receiving a seed already finds every seed host there.
            await self._publish_scope({urls.hostname_of(t.url) for t in tasks})
        return await self.engine.add_seeds(seeds)

    # -- the cluster-wide default scope ----------------------------------------------------

    async def _publish_scope(self, hosts: set[str]) -> None:
        """Merge ``hosts`` into the scope kept in the DHT's value store (Kademlia STORE)."""
        assert self.node is not None
        merged = sorted(set(await self._fetch_scope()) | hosts)[:MAX_SCOPE_HOSTS]
        value = json.dumps(merged)
        # Kept here too: a lone founder has no neighbour to store it on yet, and kademlia
        # hands stored values to nodes that join later (Kademlia §2.5).
        self.node.storage[key_for(SCOPE_KEY)] = value
        with contextlib.suppress(PeerTimeout, RemoteError, OSError):
            await self.node.set(SCOPE_KEY, value)

    async def _fetch_scope(self) -> list[str]:
        assert self.node is not None
        try:
            raw = await self.node.get(SCOPE_KEY)
        except (PeerTimeout, RemoteError, OSError):
            return []
        return _parse_scope(raw)

    async def refresh_scope(self) -> None:
        if self.engine is not None and self.engine.scope_from_seeds:
            self.engine.adopt_hosts(await self._fetch_scope())

    async def _scope_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.refresh_scope()
            await asyncio.sleep(SCOPE_REFRESH_S)

    # -- intake: what this peer owns -------------------------------------------------------

    async def intake(self, tasks: list[Task], done: dict[bytes, list[int]] | None = None) -> int:
        """Accept tasks this peer owns: dedup, store, back up; returns how many were new."""
        assert self.ledger is not None and self.engine is not None
        if done:
            pairs = [(k, fp) for k, fps in done.items() for fp in fps]
            await self.ledger.done.add(pairs)
            # Tasks queued here before the history arrived (a restart) are finished already.
            if await self.ledger.drop_done([fp for _, fp in pairs]):
                await self._finished([Task("", fp, k, 0) for k, fp in pairs])
        if self.engine.scope_from_seeds and tasks:
            # The sender checked these against its scope; this peer owns their hosts now.
            self.engine.adopt_hosts({urls.hostname_of(t.url) for t in tasks})
        new = await self.ledger.accept(tasks)
        if new:
            self.engine.include_keys({t.key for t in new})
            await self._store_backups(new)
            self.engine.wake()
        return len(new)

    async def _store_backups(self, tasks: Sequence[Task]) -> None:
        assert self.dispatcher is not None and self.node is not None
        by_replica: dict[PeerRef, list[Task]] = defaultdict(list)
        for key in {t.key for t in tasks}:
            for rep in await self.dispatcher.replicas_of(key):
                by_replica[rep].extend(t for t in tasks if t.key == key)
        if not by_replica:
            return

        async def one(rep: PeerRef, ts: list[Task]) -> None:
            assert self.node is not None
            try:
                await self.node.store_backup(rep, self.node_id, to_batches(ts))
            except (PeerTimeout, RemoteError, OSError) as exc:
                # The copy is missing until the next replication pass; the task is safe here.
                log.info("STORE_BACKUP to %s failed: %s", rep, exc)

        await asyncio.gather(*(one(r, ts) for r, ts in by_replica.items()))

    async def _finished(self, tasks: list[Task]) -> None:
        """Tell the replicas before the page counts as done (seed 001: DELETE_BACKUP).

        Waiting for their answer keeps a crash from leaving a replica with a copy of a
        finished page and no record that it is finished: it would fetch it again.
        """
        assert self.dispatcher is not None
        by_rep: dict[PeerRef, list[int]] = defaultdict(list)
        for t in tasks:
            for rep in await self.dispatcher.replicas_of(t.key):
                by_rep[rep].append(t.fp)
        if by_rep:
            await asyncio.gather(*(self._deletes.submit(r, f) for r, f in by_rep.items()))

    async def _send_deletes(self, rep: PeerRef, fps: list[int]) -> None:
        assert self.node is not None
        try:
            await self.node.delete_backup(rep, self.node_id, fps)
        except (PeerTimeout, RemoteError, OSError) as exc:
            # The copies stay; the republish pass finds the owner healthy and they are
            # dropped when the owner's next DELETE_BACKUP or a takeover dedups them.
            log.info("DELETE_BACKUP to %s failed: %s", rep, exc)

    # -- the CrawlHandler the node calls ---------------------------------------------------

    def _decode(self, batches: list[KeyBatch]) -> tuple[dict[bytes, list[Task]], list[bytes]]:
        """Tasks by key, checked: canonical URL, key matching the URL. Bad items counted."""
        assert self.engine is not None
        out: dict[bytes, list[Task]] = {}
        bad_keys: list[bytes] = []
        for b in batches:
            tasks = []
            for item in b.tasks:
                url = urls.canonicalize(item.url)
                if url is None or url != item.url or self.engine.key_of(url) != b.key:
                    self.malformed += 1
                    continue
                tasks.append(Task(url, urls.fingerprint(url), b.key, item.depth, item.hops))
            out[b.key] = tasks
        return out, bad_keys

    def _owns(self, key: bytes) -> bool:
        assert self.node is not None
        found = self.node.closest_local(key, 1)
        return not found or found[0].id == self.node_id

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        if self.state not in ("active", "joining") or self.engine is None:
            return StoreResult(new=0, duplicate=0, refused_keys=[b.key for b in batches])
        by_key, _ = self._decode(batches)
        done = {b.key: b.done for b in batches if b.done}
        refused = [k for k in by_key if not self._owns(k)]
        got = self._handoffs_received.get(sender.id)
        if got is not None:
            got.update(k for k in by_key if k not in refused)
            self._handoff_progress.set()
        mine = [t for k, ts in by_key.items() if k not in refused for t in ts]
        if any(t.depth == 0 for t in mine):
            # A seed: its peer just widened the scope; links from it must not be dropped.
            await self.refresh_scope()
        self.refused += len(refused)
        new = await self.intake(mine, {k: v for k, v in done.items() if k not in refused})
        return StoreResult(new=new, duplicate=len(mine) - new, refused_keys=refused)

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        assert self.backups is not None
        by_key, _ = self._decode(batches)
        stored = [to_stored(t) for ts in by_key.values() for t in ts]
        return await self.backups.add(owner, stored) if stored else 0

    async def handle_delete_backup(self, sender: PeerRef, owner: bytes, fps: list[int]) -> int:
        assert self.backups is not None and self.ledger is not None
        removed = await self.backups.remove_returning(owner, fps)
        if removed:
            # The owner finished these: remember them, so taking its hosts over later
            # does not fetch them again.
            await self.ledger.done.add([(t.key, t.fp) for t in removed])
        return len(removed)

    async def handle_refresh_task(self, sender: PeerRef) -> int:
        """Seed 001's REFRESH_TASK: send the requester every key now closer to it.

        Beyond the paper, a key's done fingerprints go with it, and keys with no queued
        tasks left move too (their history is what keeps the new owner from re-fetching).
        The answer is how many keys will follow, so the requester knows when it has all.
        """
        assert self.ledger is not None and self.node is not None
        if self.state != "active":
            return 0
        keys = set(await self.ledger.tasks.key_counts()) | set(await self.ledger.done.keys())
        moving = []
        for key in keys:
            found = self.node.closest_local(key, 1)
            if found and found[0].id == sender.id:
                moving.append(key)
        if moving:
            self._spawn(self._refresh_handoff(sender, moving), "refresh-handoff")
        return len(moving)

    async def _refresh_handoff(self, requester: PeerRef, keys: list[bytes]) -> None:
        async with self._handoff_lock:
            try:
                sent = await self._hand_keys(requester, keys)
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.warning("handoff to joining %s failed: %s", requester, exc)
                return
        self.events.add("handoff", to=requester.id.hex()[:8], keys=len(keys), tasks=sent)

    def peer_added(self, peer: PeerRef) -> None:
        if self.dispatcher is not None:
            self.dispatcher.forget_owners()
        self.events.add("peer_added", peer=peer.id.hex()[:8], addr=f"{peer.host}:{peer.port}")
        self._rebalance_kick.set()

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        if self.dispatcher is not None:
            self.dispatcher.forget_owners()
        kind = "peer_left" if reason == "goodbye" else "peer_lost"
        self.events.add(kind, peer=peer.id.hex()[:8], reason=reason)
        self._takeover_owners.add(peer.id)
        self._rebalance_kick.set()

    # -- membership changes: hand off, take over, re-replicate -----------------------------

    async def _refresh_from_neighbours(self) -> None:
        """Join step 3 of seed 001: ask neighbours to send what is now closer to us, and
        wait (bounded) until every promised key has arrived."""
        assert self.node is not None
        neighbours = self.node.closest_local(self.node_id, self.config.peer.ksize)
        promised: dict[bytes, int] = {}
        for p in neighbours:
            if p.id == self.node_id:
                continue
            self._handoffs_received.setdefault(p.id, set())
            try:
                promised[p.id] = await self.node.refresh_task(p)
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.info("REFRESH_TASK to %s failed: %s", p, exc)
        deadline = time.monotonic() + self.config.peer.handoff_timeout
        try:
            while any(len(self._handoffs_received[i]) < n for i, n in promised.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("join: not every neighbour handed over its keys in time")
                    break
                self._handoff_progress.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._handoff_progress.wait()
        finally:
            received = sum(len(v) for v in self._handoffs_received.values())
            self._handoffs_received.clear()
        self.events.add("refreshed", neighbours=len(promised), keys=received)

    async def _rebalance_loop(self) -> None:
        while True:
            await self._rebalance_kick.wait()
            # Debounce: a join brings several membership events in a burst.
            await asyncio.sleep(0.2)
            self._rebalance_kick.clear()
            if self.state != "active":
                continue
            try:
                await self._takeover()
                await self._rebalance()
            except (PeerTimeout, RemoteError, OSError, MessageError) as exc:
                log.warning("rebalance pass failed: %s; retrying", exc)
                await asyncio.sleep(1.0)
                self._rebalance_kick.set()

    async def _takeover(self) -> None:
        """Crash recovery: re-route the backups held for owners that are gone."""
        assert self.backups is not None and self.node is not None and self.dispatcher
        if not self._takeover_owners:
            return
        live = {p.id for p in self.node.peers()}
        gone = [o for o in self._takeover_owners if o not in live]
        self._takeover_owners.clear()
        for owner in gone:
            taken = await self.backups.take_owner(owner)
            if not taken:
                continue
            tasks = [Task(s.url, s.fp, s.key, s.depth, s.hops) for s in taken]
            self.events.add("takeover", owner=owner.hex()[:8], tasks=len(tasks))
            await self.dispatcher.route(tasks)

    async def _rebalance(self) -> None:
        """Hand every key this peer no longer owns to its owner, history included."""
        assert self.ledger is not None and self.engine is not None and self.node is not None
        async with self._handoff_lock:
            counts = await self.ledger.tasks.key_counts()
            moved: dict[PeerRef, list[bytes]] = defaultdict(list)
            for key in counts:
                found = self.node.closest_local(key, 1)
                if found and found[0].id != self.node_id:
                    moved[found[0]].append(key)
            for owner, keys in moved.items():
                sent = await self._hand_keys(owner, keys)
                self.events.add("handoff", to=owner.id.hex()[:8], keys=len(keys), tasks=sent)

    async def _hand_keys(self, owner: PeerRef, keys: list[bytes]) -> int:
        """Stop crawling ``keys``, wait for their fetches, send tasks and done fps to ``owner``."""
        assert self.ledger is not None and self.engine is not None and self.node is not None
        keyset = set(keys)
        self.engine.exclude_keys(keyset)
        deadline = time.monotonic() + self.config.peer.handoff_timeout
        while any(t.key in keyset for t in self.engine.in_flight.values()):
            if time.monotonic() > deadline:
                break
            await self.engine.wait_progress(0.2)
        tasks = await self.ledger.take_keys(keys)
        done = await self.ledger.done.fps_for_keys(keys)
        try:
            result = await self.node.store_task(owner, to_batches(tasks, done))
        except (PeerTimeout, RemoteError, OSError):
            # Put them back: they stay ours until the owner answers.
            self.engine.include_keys(keyset)
            await self.ledger.accept(tasks)
            self.engine.wake()
            raise
        if result.refused_keys:
            back = [t for t in tasks if t.key in set(result.refused_keys)]
            self.engine.include_keys(set(result.refused_keys))
            await self.ledger.accept(back)
            self.engine.wake()
        return len(tasks)

    async def _republish_loop(self) -> None:
        """Seed 001's periodic republish of backups, limited to the ones that need it.

        A backup whose owner is alive and still the closest node to its key is left alone:
        re-sending those would flood a healthy network for nothing.
        """
        interval = self.config.peer.republish_interval
        while True:
            await asyncio.sleep(interval)
            if self.state == "active":
                with contextlib.suppress(PeerTimeout, RemoteError, OSError):
                    await self._republish_pass()

    async def _republish_pass(self) -> int:
        assert self.backups is not None and self.node is not None and self.dispatcher
        live = {p.id for p in self.node.peers()}
        after = 0
        resent = 0
        while True:
            rows = await self.backups.page(after, 1000)
            if not rows:
                return resent
            after = rows[-1][0]
            stale: dict[bytes, list[Task]] = defaultdict(list)
            for _, owner, s in rows:
                closest = self.node.closest_local(s.key, 1 + self.config.peer.replicas)
                ids = [p.id for p in closest]
                healthy = owner in live and ids and ids[0] == owner and self.node_id in ids[1:]
                if not healthy:
                    stale[owner].append(Task(s.url, s.fp, s.key, s.depth, s.hops))
            for owner, tasks in stale.items():
                await self.dispatcher.route(tasks)
                await self.backups.remove(owner, [t.fp for t in tasks])
                resent += len(tasks)

    # -- graceful leave --------------------------------------------------------------------

    async def leave(self) -> HandoffReport:
        """Seed 001's graceful leave: hand every task, done range and backup to its owner."""
        assert self.engine is not None and self.ledger is not None and self.node is not None
        assert self.backups is not None and self.dispatcher is not None
        if self.state != "active":
            return self.handoff
        self.state = "leaving"
        self.events.add("leaving")
        report = self.handoff
        await self.engine.stop_fetching(timeout=10.0)
        await self.engine.aclose()
        await self.dispatcher.flush()
        report.queue_at_leave = self.ledger.queued
        others = [p for p in self.node.peers() if p.id != self.node_id]
        # Goodbye first: once the others have dropped this peer from their tables they
        # route its keys to their new owners, and those accept the handoff below as theirs.
        for p in others:
            with contextlib.suppress(PeerTimeout, RemoteError, OSError):
                await self.node.goodbye(p)
        if others:
            async with self._handoff_lock:
                counts = await self.ledger.tasks.key_counts()
                by_owner: dict[PeerRef, list[bytes]] = defaultdict(list)
                for key in counts:
                    by_owner[_closest_other(key, others)].append(key)
                for owner, keys in by_owner.items():
                    tasks = await self.ledger.take_keys(keys)
                    done = await self.ledger.done.fps_for_keys(keys)
                    if await self._send_with_fallback(owner, others, tasks, done):
                        report.tasks += len(tasks)
                        report.done += sum(len(v) for v in done.values())
                    else:
                        report.failed += len(tasks)
                        await self.ledger.accept(tasks)
                for owner_id, _ in (await self.backups.owner_counts()).items():
                    taken = await self.backups.take_owner(owner_id)
                    groups: dict[PeerRef, list[Task]] = defaultdict(list)
                    for s in taken:
                        groups[_closest_other(s.key, others)].append(
                            Task(s.url, s.fp, s.key, s.depth, s.hops)
                        )
                    for owner, tasks in groups.items():
                        if await self._send_with_fallback(owner, others, tasks, None):
                            report.backups += len(tasks)
        self.events.add("left", **_report_dict(report))
        log.info(
            "left the network: handed off %d tasks, %d done fingerprints, %d backups (%d failed)",
            report.tasks,
            report.done,
            report.backups,
            report.failed,
        )
        return report

    async def _send_with_fallback(
        self,
        owner: PeerRef,
        others: list[PeerRef],
        tasks: list[Task],
        done: dict[bytes, list[int]] | None,
    ) -> bool:
        """STORE_TASK to the new owner; if it is gone, to the next closest that answers."""
        assert self.node is not None
        if not tasks and not done:
            return True
        candidates = [owner] + [p for p in others if p != owner]
        key = tasks[0].key if tasks else next(iter(done or {b"": []}))
        candidates.sort(key=lambda p: distance(p.id, key) if p != owner else -1)
        for cand in candidates[:4]:
            try:
                await self.node.store_task(cand, to_batches(tasks, done))
                return True
            except (PeerTimeout, RemoteError, OSError) as exc:
                log.warning("handoff to %s failed: %s", cand, exc)
        return False

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        eng, node, led = self.engine, self.node, self.ledger
        stats = eng.stats if eng else None
        pages_s, disc_s, bytes_s = stats.rate() if stats else (0.0, 0.0, 0.0)
        peers = node.peers() if node else []
        return {
            "node_id": self.node_id.hex(),
            "version": __version__,
            "listen": f"{node.me.host}:{node.me.port}" if node and self.state != "joining" else "",
            "state": self.state,
            "peers": len(peers),
            "network_size": len(peers) + 1,
            "tasks_queued": eng.tasks_queued if eng else 0,
            "tasks_in_flight": len(eng.in_flight) if eng else 0,
            "backups_held": self._backup_count,
            "done": led.done_count if led else 0,
            "pages_fetched": stats.pages_fetched if stats else 0,
            "urls_discovered": stats.urls_discovered if stats else 0,
            "errors": stats.error_total if stats else 0,
            "errors_by_kind": dict(stats.errors) if stats else {},
            "bytes_fetched": stats.bytes_fetched if stats else 0,
            "pages_per_s": round(pages_s, 2),
            "discovered_per_s": round(disc_s, 2),
            "bytes_per_s": round(bytes_s, 1),
            "rpc_in_transit": (self.dispatcher.pending if self.dispatcher else 0)
            + self._deletes.pending,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "handoff": _report_dict(self.handoff),
        }

    _backup_count = 0

    def top_hosts(self, limit: int) -> list[dict[str, object]]:
        """Hosts by queue length in the frontier window, with their politeness state."""
        if self.engine is None:
            return []
        now = time.monotonic()
        hosts = sorted(self.engine.frontier.hosts.values(), key=len, reverse=True)[:limit]
        return [
            {
                "host": hq.host,
                "queued": len(hq),
                "busy": hq.polite.busy,
                "next_allowed_in_s": round(max(0.0, hq.polite.next_allowed - now), 3),
                "robots_delay": hq.polite.robots_delay,
                "last_response_s": round(hq.polite.last_response_time, 4),
            }
            for hq in hosts
        ]

    async def refresh_counts(self) -> None:
        """Counts that need a store query, refreshed by the status server's sampler."""
        if self.backups is not None and self.state in ("active", "leaving"):
            self._backup_count = await self.backups.count()


def _parse_scope(raw: object) -> list[str]:
    """The published scope, checked: it comes from the network."""
    if not isinstance(raw, str | bytes) or len(raw) > 1 << 20:
        return []
    try:
        doc = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(doc, list):
        return []
    return [h for h in doc[:MAX_SCOPE_HOSTS] if isinstance(h, str) and 0 < len(h) <= 253]


def _report_dict(report: HandoffReport) -> dict[str, object]:
    return dataclasses.asdict(report)


def _closest_other(key: bytes, others: list[PeerRef]) -> PeerRef:
    return min(others, key=lambda p: distance(p.id, key))


def partition_key_of(url: str, partition: str) -> bytes:
    return key_for(urls.partition_key(url, partition))
