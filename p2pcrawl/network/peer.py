"""A peer: the crawl engine wired to the DHT node, the stores and its neighbours.

The Kademlia crawler's flow, per URL: the discoverer routes it to its owner (STORE_TASK,
:mod:`~p2pcrawl.network.dispatch`); the owner dedups it against its done record and queue,
stores it and copies it to its r closest neighbours (STORE_BACKUP,
:mod:`~p2pcrawl.network.replication`); it crawls it, records it done and tells the
neighbours (DELETE_BACKUP). What arrives from neighbours is checked in
:mod:`~p2pcrawl.network.handlers`; joins, stalls, crashes and leaves move host keys between
peers (:mod:`~p2pcrawl.network.join`, ``stall``, ``rebalance``, ``leave``). The parts are
built and wired in :mod:`~p2pcrawl.network.parts`; the peer opens the stores, starts the
parts in order and closes them. docs/architecture.md follows one URL through it all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pcrawl import __version__
from p2pcrawl.archive import WarcWriter
from p2pcrawl.crawl import CrawlStats, Engine, EventLog, Ledger, SeedVerdict, Task
from p2pcrawl.network.dispatch import STATUS_FIELDS
from p2pcrawl.network.healing import read_contacts
from p2pcrawl.network.identity import (
    choose_id,
    create_key,
    join_through,
    load_identity,
    load_key,
    lock_data_dir,
    save_identity,
)
from p2pcrawl.network.leave import HandoffReport
from p2pcrawl.network.parts import Parts, State, assemble
from p2pcrawl.network.seeding import Forward, log_verdicts
from p2pcrawl.settings import CrawlSettings, PeerSettings
from protocol import BootstrapError, CrawlNode, PeerRef, TaskSet, new_node_id
from storage import BackupStore

__all__ = ["Peer", "PeerConfig", "State"]

log = logging.getLogger(__name__)

JOINING = "joining"  # the engine's pause while the neighbours hand over our keys


@dataclass(frozen=True, slots=True)
class PeerConfig:
    data_dir: Path
    listen: tuple[str, int] = ("127.0.0.1", 0)
    bootstrap: tuple[tuple[str, int], ...] = ()
    seeds: tuple[str, ...] = ()
    recrawl: bool = False  # fetch the seeds again even if they are done here
    crawl: CrawlSettings = field(default_factory=CrawlSettings)
    peer: PeerSettings = field(default_factory=PeerSettings)


class Peer:
    def __init__(self, config: PeerConfig) -> None:
        self.config = config
        self.state: State = "joining"
        self.events = EventLog()
        # Before anything reads the directory: its identity and stores are this peer's alone.
        self._dir_lock = lock_data_dir(config.data_dir)
        saved = load_identity(config.data_dir)
        # An open network (no key): the ID is made from a key pair (``identity``); one that
        # does not exist yet is made in ``start`` (its puzzle takes a moment).
        self._open = not config.peer.secret
        self.key = (
            load_key(config.data_dir, saved, config.peer.id_work_bits) if self._open else None
        )
        self.node_id = saved or (self.key.node_id() if self.key else new_node_id())
        # A brand-new joiner chooses its ID in ``start`` and saves it once it has joined; a
        # founder has nothing to learn from, so its ID is kept at once.
        self._choose_id = saved is None and bool(config.bootstrap)
        self._founding = saved is None and not config.bootstrap
        if self._founding and not self._open:
            save_identity(config.data_dir, self.node_id)
        self.started = time.monotonic()
        self.handoff = HandoffReport()
        self._owned = TaskSet("peer")
        # What closes the stores and parts, in the reverse order of their opening.
        self._closing = contextlib.AsyncExitStack()
        self._parts: Parts | None = None
        self._stopped = asyncio.Event()
        self._leave_requested = asyncio.Event()
        self._backup_count = 0

    # -- the parts ---------------------------------------------------------------------------

    @property
    def parts(self) -> Parts:
        """The started peer's parts (``parts.Parts``); RuntimeError before ``start``."""
        if self._parts is None:
            raise RuntimeError("the peer has not started")
        return self._parts

    @property
    def running(self) -> Parts | None:
        """The parts once ``start`` has built them, else None (the status page asks)."""
        return self._parts

    @property
    def engine(self) -> Engine | None:
        return self._parts.engine if self._parts else None

    @property
    def node(self) -> CrawlNode | None:
        return self._parts.node if self._parts else None

    @property
    def ledger(self) -> Ledger | None:
        return self._parts.ledger if self._parts else None

    @property
    def backups(self) -> BackupStore | None:
        return self._parts.backups if self._parts else None

    @property
    def me(self) -> PeerRef:
        return self.parts.node.me

    @property
    def finished(self) -> asyncio.Event:
        """Set while the network is finished (``quiescence``)."""
        return self.parts.quiescence.finished

    # -- start and stop --------------------------------------------------------------------

    async def start(self) -> None:
        cfg, ps = self.config, self.config.peer
        try:
            if self._open and self.key is None:
                self.key = await create_key(cfg.data_dir, ps.id_work_bits)
                self.node_id = self.key.node_id()
            if self._founding and self._open:
                await asyncio.to_thread(save_identity, cfg.data_dir, self.node_id)
            if self._choose_id:
                self.node_id = await choose_id(
                    cfg.bootstrap, cfg.listen, ps, self.node_id, self.events, key=self.key
                )
            stores = cfg.data_dir / "stores"
            ledger = await Ledger.open(stores)
            self._closing.push_async_callback(_guarded, ledger.aclose, "ledger")
            backups = await BackupStore.open(stores / "backups.sqlite3")
            self._closing.push_async_callback(_guarded, backups.aclose, "backups")
            warc: WarcWriter | None = None
            if cfg.crawl.warc:
                warc = WarcWriter(
                    cfg.data_dir / "warc",
                    prefix=self.node_id.hex()[:8],
                    max_bytes=cfg.crawl.warc_max_bytes,
                )
                await warc.start()
                self._closing.push_async_callback(_guarded, warc.aclose, "warc")
            # A restart without --bootstrap rejoins the network it last knew (healing).
            saved = [] if cfg.bootstrap else read_contacts(cfg.data_dir)
            parts = assemble(
                node_id=self.node_id,
                data_dir=cfg.data_dir,
                listen_host=cfg.listen[0],
                bootstrap=cfg.bootstrap,
                saved_contacts=saved,
                crawl=cfg.crawl,
                settings=ps,
                ledger=ledger,
                backups=backups,
                warc=warc,
                events=self.events,
                report=self.handoff,
                state=lambda: self.state,
                on_failure=self._engine_failed,
                spawn=self.spawn,
                key=self.key,
            )
            self._parts = parts
            for name, closer in (
                ("node", parts.node.aclose),
                ("dispatcher", parts.dispatcher.aclose),
                ("replication", parts.replication.aclose),
                ("lending", parts.lending.aclose),
                ("engine", parts.engine.aclose),
                ("vouching", parts.vouching.aclose),  # it fetches through the engine
            ):
                self._closing.push_async_callback(_guarded, closer, name)
            await self._run(parts, joining=bool(cfg.bootstrap or saved), saved=saved)
        except BaseException:
            await self.aclose()
            raise

    async def _run(self, parts: Parts, *, joining: bool, saved: list[tuple[str, int]]) -> None:
        """Listen, join, start the loops, and take ownership of our keys."""
        cfg, node, engine = self.config, parts.node, parts.engine
        await node.listen_on(*cfg.listen)
        if joining:
            # Until the neighbours have handed over the hosts this peer now owns, with their
            # history, it accepts tasks but crawls nothing: it could not tell what is done.
            # And it owns no key meanwhile (``join.Join``).
            engine.pause(JOINING)
            node.hold_ownership()
        await engine.start()
        joined = False
        if cfg.bootstrap:
            peers = await join_through(node, list(cfg.bootstrap), cfg.peer.join_retry, self.events)
            self.events.add("joined", peers=len(peers))
            joined = True
            if self._choose_id:  # only now: a failed join leaves the directory fresh
                await asyncio.to_thread(save_identity, cfg.data_dir, self.node_id)
                self._choose_id = False
        elif saved:
            try:
                peers = await node.join(saved)
                self.events.add("rejoined", peers=len(peers))
                joined = True
            except BootstrapError as exc:
                # Not fatal: this peer runs alone and keeps trying (``healing``).
                log.warning("no saved contact answered (%s); running alone for now", exc)
                node.take_ownership()
        for name, loop in (
            ("rebalance", parts.rebalance.run),
            ("republish", parts.rebalance.republish_loop),
            ("replication", parts.follower.run),
            ("quiescence", parts.quiescence.run),
            ("lending", parts.lending.run),
            ("healing", parts.healing.run),
        ):
            self.spawn(loop(), name)
        if parts.scope_sync.needed:
            self.spawn(parts.scope_sync.run(), "scope")
        if parts.engine.revisits is not None:
            self.spawn(parts.visit_history.run(), "visit-history")
        if joined:
            await parts.join.refresh()
        self.state = "active"
        engine.resume(JOINING)
        # A restart may find tasks whose keys moved while it was down.
        parts.rebalance.due.set()
        if cfg.seeds:
            log_verdicts(await self.seed(cfg.seeds, recrawl=cfg.recrawl))

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._owned.spawn(coro, name)

    async def aclose(self) -> None:
        """Stop everything, each part in its own guard so one failure leaks nothing."""
        if self._stopped.is_set():
            return
        self.state = "stopped"
        await self._owned.aclose()
        await self._closing.aclose()
        self._dir_lock.release()  # last: every store is closed
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
        return await self.leave()

    async def leave(self) -> HandoffReport:
        """Graceful leave (``leave.Leave``): hand every task, done range and backup to its
        owner. Only an active peer leaves; the report says what went where."""
        if self.state != "active":
            return self.handoff
        self.state = "leaving"
        report = await self.parts.leave.leave()
        if not self.config.peer.secret:  # an open network: answer the checks of our claims
            await self.parts.vouch_server.linger()
        return report

    async def say_goodbye(self) -> list[PeerRef]:
        """GOODBYE to every peer we know (a peer that exits once the crawl is finished)."""
        return await self.parts.leave.say_goodbye()

    # -- seeds and intake ------------------------------------------------------------------

    async def seed(
        self, seeds: Iterable[str], *, recrawl: bool = False, forward: Forward | None = None
    ) -> list[SeedVerdict]:
        """Seed, and say per URL what became of it (see :mod:`~p2pcrawl.network.seeding`)."""
        return await self.parts.seeder.seed(seeds, recrawl=recrawl, forward=forward)

    async def add_seeds(self, seeds: Iterable[str]) -> int:
        return await self.parts.seeder.add(seeds)

    async def intake(
        self,
        tasks: list[Task],
        done: dict[bytes, list[int]] | None = None,
        *,
        routed: bool = False,
    ) -> int:
        """Accept tasks this peer owns (``intake.Intake.accept``); how many were new."""
        return await self.parts.intake.accept(tasks, done, routed=routed)

    # -- what the status server and the metrics read ---------------------------------------

    @property
    def crawl_stats(self) -> CrawlStats | None:
        return self._parts.engine.stats if self._parts else None

    def routing(self) -> dict[str, object] | None:
        """The routing table and RPC counters, or None before the node listens."""
        node = self.node
        if node is None or not node.listening:
            return None
        return {
            "peers": [{"id": p.id.hex(), "host": p.host, "port": p.port} for p in node.peers()],
            "buckets": node.buckets(),
            "rpc": node.stats(),
        }

    def frontier_size(self) -> tuple[int, int]:
        """URLs and hosts in the in-memory frontier."""
        if self._parts is None:
            return 0, 0
        frontier = self._parts.engine.frontier
        return len(frontier), len(frontier.hosts)

    async def backup_owners(self) -> dict[bytes, int] | None:
        """Backups held, by owner (a store query), or None while the stores are closed."""
        if self._parts is None or self.state not in ("active", "leaving"):
            return None
        return await self._parts.backups.owner_counts()

    def status(self) -> dict[str, object]:
        p = self._parts
        eng, led = (p.engine, p.ledger) if p else (None, None)
        stats = eng.stats if eng else None
        pages_s, disc_s, bytes_s = stats.rate() if stats else (0.0, 0.0, 0.0)
        peers = p.node.peers() if p else []
        listening = p is not None and p.node.listening and self.state != "joining"
        finished = p is not None and p.quiescence.finished.is_set()
        # Continuous mode: a crawl that is never over is idle until its next page is due.
        rev = eng.revisits if eng else None
        done_state = "finished" if rev is None else "waiting"
        return {
            "node_id": self.node_id.hex(),
            "version": __version__,
            "listen": f"{self.me.host}:{self.me.port}" if listening else "",
            # "finished" is reported, never stored: new seeds make the same peer active again.
            "state": done_state if self.state == "active" and finished else self.state,
            "peers": len(peers),
            "network_size": len(peers) + 1,
            "tasks_queued": eng.tasks_queued if eng else 0,
            "tasks_in_flight": len(eng.in_flight) if eng else 0,
            "backups_held": self._backup_count,
            "backups_orphaned": p.quiescence.orphaned if p else 0,
            # A peer declared dead holds the finish back (--partition-hold): seconds left.
            "finish_held_s": round(p.quiescence.holding(), 1) if p else 0.0,
            "done": led.done_count if led else 0,
            "pages_fetched": stats.pages_fetched if stats else 0,
            "urls_discovered": stats.urls_discovered if stats else 0,
            "errors": stats.error_total if stats else 0,
            "errors_by_kind": dict(stats.errors) if stats else {},
            "bytes_fetched": stats.bytes_fetched if stats else 0,
            "pages_per_s": round(pages_s, 2),
            "discovered_per_s": round(disc_s, 2),
            "bytes_per_s": round(bytes_s, 1),
            "rpc_in_transit": p.in_transit() if p else 0,
            "uptime_s": round(time.monotonic() - self.started, 3),
            "last_task_at": eng.last_task_at if eng else None,
            "handoff": self.handoff.as_dict(),
            "lending": p.lending.status() if p else {},
            "claims": p.vouching.status() if p else {},
            "dispatch": self.dispatch_status(),
            **self._hostile_status(),
            # Continuous mode (docs/freshness.md): the revisits, and when the next is due.
            **({"revisit": rev.status(), "next_due_at": rev.next_due_at} if rev else {}),
        }

    def dispatch_status(self) -> dict[str, int]:
        """The dispatcher's counts, and the links this peer told senders it holds."""
        p = self._parts
        if p is None:
            return {**dict.fromkeys(STATUS_FIELDS, 0), "told_known": 0}
        return {**p.dispatcher.status(), "told_known": p.advertised.told}

    def _hostile_status(self) -> dict[str, object]:
        """Loop lag and what the bounds on hostile input did (status page and /metrics)."""
        p = self._parts
        lag = p.node.lag.snapshot() if p else None
        stats = p.engine.stats if p else None
        return {
            "loop_lag_p99_ms": round(lag.p99 * 1000, 1) if lag else 0.0,
            "loop_lag_max_ms": round(lag.max * 1000, 1) if lag else 0.0,
            "truncated_by": dict(stats.truncated_by) if stats else {},
            "parse_bounded": dict(stats.parse_bounded) if stats else {},
            "budget": dict(stats.budget) if stats else {},
            "signals": stats.signals() if stats else {},
            "disk_full": bool(p and p.engine.disk.full),
        }

    def top_hosts(self, limit: int) -> list[dict[str, object]]:
        """Hosts by queue length in the frontier window, with their politeness state."""
        if self._parts is None:
            return []
        now = time.monotonic()
        hosts = sorted(self._parts.engine.frontier.hosts.values(), key=len, reverse=True)[:limit]
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
        if self._parts is not None and self.state in ("active", "leaving"):
            self._backup_count = await self._parts.backups.count()


async def _guarded(close: Callable[[], Awaitable[None]], name: str) -> None:
    """Close one part; a failure is logged, and the rest still close."""
    try:
        await close()
    except Exception:
        log.exception("closing %s failed", name)
