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
from p2pcrawl.membership import HandoffReport, Membership
from p2pcrawl.settings import CrawlSettings, PeerSettings
from p2pcrawl.stats import EventLog
from p2pcrawl.warc import WarcWriter
from protocol.errors import PeerTimeout, RemoteError
from protocol.messages import KeyBatch, PeerRef, StoreResult
from protocol.node import CrawlNode, NodeConfig
from protocol.ownership import key_for
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
        self._deletes: Coalescer[PeerRef, int] = Coalescer(self._send_deletes)
        self._stopped = asyncio.Event()
        self._leave_requested = asyncio.Event()
        self.membership = Membership(self)

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
                on_failure=self._engine_failed,
            )
            # Until the neighbours have handed over the hosts this peer now owns, with their
            # history, it accepts tasks but crawls nothing: it could not tell what is done.
            self.engine.paused = bool(cfg.bootstrap)
            await self.engine.start()
            if cfg.bootstrap:
                peers = await self.node.join(list(cfg.bootstrap))
                self.events.add("joined", peers=len(peers))
            self.spawn(self.membership.rebalance_loop(), "rebalance")
            self.spawn(self.membership.republish_loop(), "republish")
            if self.engine.scope_from_seeds:
                self.spawn(self._scope_loop(), "scope")
            if cfg.bootstrap:
                await self.membership.refresh_from_neighbours()
            self.state = "active"
            self.engine.paused = False
            # A restart may find tasks whose keys moved while it was down.
            self.membership.kick.set()
            if cfg.seeds:
                await self.add_seeds(cfg.seeds)
        except BaseException:
            await self.aclose()
            raise

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
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

    def _engine_failed(self, exc: BaseException) -> None:
        # A peer that cannot archive what it fetches (disk full, WARC writer gone) must not
        # fetch on; leaving hands its queued URLs to peers that can.
        self.events.add("engine_failed", reason=str(exc))
        self.request_leave()

    async def run(self) -> HandoffReport:
        """Serve until asked to leave, then leave gracefully."""
        await self._leave_requested.wait()
        return await self.membership.leave()

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
        self.membership.note_received(sender, {k for k in by_key if k not in refused})
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
        return await self.membership.on_refresh(sender)

    def peer_added(self, peer: PeerRef) -> None:
        if self.dispatcher is not None:
            self.dispatcher.forget_owners()
        self.events.add("peer_added", peer=peer.id.hex()[:8], addr=f"{peer.host}:{peer.port}")
        self.membership.kick.set()

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        if self.dispatcher is not None:
            self.dispatcher.forget_owners()
        kind = "peer_left" if reason == "goodbye" else "peer_lost"
        self.events.add(kind, peer=peer.id.hex()[:8], reason=reason)
        self.membership.gone_owners.add(peer.id)
        self.membership.kick.set()

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
            "handoff": self.handoff.as_dict(),
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
