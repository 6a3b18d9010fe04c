"""A peer: the crawl engine wired to the DHT node, the stores and its neighbours.

The Kademlia crawler's flow, per URL: the discoverer routes it to its owner (STORE_TASK,
:mod:`~p2pcrawl.network.dispatch`); the owner dedups it against its done record and queue,
stores it and copies it to its r closest neighbours (STORE_BACKUP,
:mod:`~p2pcrawl.network.replication`); it crawls it, records it done and tells the
neighbours (DELETE_BACKUP). What arrives from neighbours is checked in
:mod:`~p2pcrawl.network.handlers`; joins, leaves and crashes are
:mod:`~p2pcrawl.network.membership`'s. docs/architecture.md follows one URL through it all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from p2pcrawl import __version__
from p2pcrawl.aio import LoopLagMonitor
from p2pcrawl.archive import WarcWriter
from p2pcrawl.crawl import CrawlStats, Engine, EventLog, Ledger, SeedVerdict, Task, urls
from p2pcrawl.network.dispatch import STATUS_FIELDS, Dispatcher
from p2pcrawl.network.handlers import PeerHandler
from p2pcrawl.network.healing import Healing
from p2pcrawl.network.identity import load_identity, lock_data_dir, save_identity
from p2pcrawl.network.known import Advertised
from p2pcrawl.network.lending import Lending
from p2pcrawl.network.loadinfo import LoadInfo
from p2pcrawl.network.membership import HandoffReport, Membership
from p2pcrawl.network.netkey import is_loopback
from p2pcrawl.network.quiescence import Quiescence
from p2pcrawl.network.replication import Replication
from p2pcrawl.network.scopesync import ScopeSync
from p2pcrawl.network.seeding import Forward, log_verdicts, seed_with_report
from p2pcrawl.settings import CrawlSettings, PeerSettings
from protocol import BootstrapError, CrawlNode, PeerRef, TaskSet, new_node_id
from protocol.loadreport import LOAD_RPC, serve_load
from protocol.survey import survey
from storage import BackupStore

# A UDP datagram's framing on Ethernet: 14 + IP 20 + UDP 8.
UDP_FRAMING = 42

__all__ = ["Peer", "PeerConfig", "State"]

log = logging.getLogger(__name__)

State = Literal["joining", "active", "finished", "leaving", "stopped"]


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
        # Before anything reads the directory: its identity and stores are this peer's alone.
        self._dir_lock = lock_data_dir(config.data_dir)
        saved = load_identity(config.data_dir)
        self.node_id = saved or new_node_id()
        # A brand-new joiner chooses its ID in ``start`` and saves it once it has joined; a
        # founder has nothing to learn from, so its random ID is kept at once.
        self._choose_id = saved is None and bool(config.bootstrap)
        if saved is None and not config.bootstrap:
            save_identity(config.data_dir, self.node_id)
        self.started = time.monotonic()
        self.ledger: Ledger | None = None
        self.backups: BackupStore | None = None
        self.warc: WarcWriter | None = None
        self.node: CrawlNode | None = None
        self.engine: Engine | None = None
        self.dispatcher: Dispatcher | None = None
        self.replication: Replication | None = None
        self.scope_sync: ScopeSync | None = None
        self.handler = PeerHandler(self)
        # Links other peers routed here, told to the rest in STORE_TASK answers.
        self.advertised = Advertised()
        self.handoff = HandoffReport()
        self._owned = TaskSet("peer")
        self._stopped = asyncio.Event()
        self._leave_requested = asyncio.Event()
        self._backup_count = 0
        self.membership = Membership(self)
        self.lending = Lending(self)
        # How late the event loop runs: every RPC reply and status answer waits that long.
        self.loop_lag = LoopLagMonitor()
        self.quiescence = Quiescence(self, config.peer.finish_settle)
        self.healing = Healing(self, config.peer.heal_interval, config.peer.heal_max_backoff)
        self.load_info = LoadInfo(lambda: self.ledger, lambda: self.node, self.spawn)

    # -- start and stop --------------------------------------------------------------------

    @property
    def me(self) -> PeerRef:
        assert self.node is not None
        return self.node.me

    async def start(self) -> None:
        cfg = self.config
        try:
            if self._choose_id:
                self.node_id = await self._chosen_id()
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
            self.node = CrawlNode(self.node_id, self.handler, ps.node_config())
            await self.node.listen_on(*cfg.listen)
            assert self.node.protocol is not None
            self.node.protocol.serve("quiet", self.quiescence.serve_quiet)
            self.node.protocol.serve(LOAD_RPC, serve_load(self.load_info.report))
            self.dispatcher = Dispatcher(
                self.node,
                replicas=ps.replicas,
                intake=self.intake,
                batch=ps.dispatch_batch,
                flush_s=ps.dispatch_flush_s,
                patient=self._backlogged,
            )
            self.replication = Replication(
                self.node, self.dispatcher, self.ledger, self.backups, patient=self._backlogged
            )
            self.node.on_stall = self.membership.on_stall
            self.engine = Engine(
                cfg.crawl,
                self.ledger,
                warc=self.warc,
                partition=ps.partition,
                router=self.dispatcher,
                on_finished=self.replication.finished,
                on_failure=self._engine_failed,
            )
            self.engine.data_dir = cfg.data_dir  # measured against --max-disk
            if self.engine.pacer.enabled:
                # The RPCs share the link with the pages: --max-rate counts them too.
                rpc = self.node.protocol.stats
                self.engine.pacer.count_also(lambda: rpc.bytes_in + UDP_FRAMING * rpc.datagrams_in)
            self.engine.settle_borrowed = self.lending.borrower.settle_and_wait
            self.engine.may_fetch_borrowed = self.lending.borrower.may_fetch
            self.lending.serve()
            self.scope_sync = ScopeSync(
                self.node, self.engine, trusted=bool(ps.secret) or is_loopback(cfg.listen[0])
            )
            # Until the neighbours have handed over the hosts this peer now owns, with their
            # history, it accepts tasks but crawls nothing: it could not tell what is done.
            # A restart without --bootstrap rejoins the network it last knew (healing).
            saved = [] if cfg.bootstrap else self.healing.saved
            self.engine.paused = bool(cfg.bootstrap or saved)
            await self.engine.start()
            joined = False
            if cfg.bootstrap or saved:
                # A joiner owns no key until its neighbours have handed over what is now its
                # own (``Membership.refresh_from_neighbours``).
                self.node.hold_ownership()
            if cfg.bootstrap:
                peers = await self.node.join(list(cfg.bootstrap))
                self.events.add("joined", peers=len(peers))
                joined = True
                if self._choose_id:  # only now: a failed join leaves the directory fresh
                    await asyncio.to_thread(save_identity, cfg.data_dir, self.node_id)
                    self._choose_id = False
            elif saved:
                try:
                    peers = await self.node.join(saved)
                    self.events.add("rejoined", peers=len(peers))
                    joined = True
                except BootstrapError as exc:
                    # Not fatal: this peer runs alone and keeps trying (``Healing.run``).
                    log.warning("no saved contact answered (%s); running alone for now", exc)
                    self.node.take_ownership()
            self.spawn(self.loop_lag.run(), "loop-lag")
            self.spawn(self.membership.rebalance_loop(), "rebalance")
            self.spawn(self.membership.republish_loop(), "republish")
            self.spawn(self.replication.run(), "replication")
            self.spawn(self.quiescence.run(), "quiescence")
            self.spawn(self.lending.run(), "lending")
            if self.engine.scope_from_seeds:
                self.spawn(self.scope_sync.run(), "scope")
            self.spawn(self.healing.run(), "healing")
            if joined:
                await self.membership.refresh_from_neighbours()
            self.state = "active"
            self.engine.paused = False
            # A restart may find tasks whose keys moved while it was down.
            self.membership.kick.set()
            if cfg.seeds:
                log_verdicts(await self.seed(cfg.seeds))
        except BaseException:
            await self.aclose()
            raise

    async def _chosen_id(self) -> bytes:
        """An ID that halves the most loaded peer's region (``protocol.survey``), learned by
        a probe on our --listen address before our node exists; our random one if the probe
        learns nothing in time."""
        cfg = self.config
        try:
            async with asyncio.timeout(cfg.peer.id_survey_timeout):
                found = await survey(
                    cfg.bootstrap, listen=cfg.listen, config=cfg.peer.node_config()
                )
        except (BootstrapError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {cfg.peer.id_survey_timeout:g} s"
            log.warning("could not survey the network (%s); taking a random node ID", why)
            self.events.add("id_random", reason=why[:200])
            return self.node_id
        if not found.known:
            log.warning("the survey found no peer; taking a random node ID")
            self.events.add("id_random", reason="no peer found")
            return self.node_id
        chosen = found.choose()
        load = sum(r.load for r in found.reports.values())
        log.info(
            "chose node ID %s from %d known peers (%d reported, %d pages)",
            chosen.hex()[:8],
            len(found.known),
            len(found.reports),
            load,
        )
        self.events.add("id_chosen", known=len(found.known), reported=len(found.reports), load=load)
        return chosen

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
            ("lending", self.lending.aclose),
            ("replication", self.replication.aclose if self.replication else None),
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
        return await self.membership.leave()

    # -- seeds and intake ------------------------------------------------------------------

    async def seed(
        self, seeds: Iterable[str], *, recrawl: bool = False, forward: Forward | None = None
    ) -> list[SeedVerdict]:
        """Seed, and say per URL what became of it (see :mod:`~p2pcrawl.network.seeding`)."""
        return await seed_with_report(self, seeds, recrawl=recrawl, forward=forward)

    async def add_seeds(self, seeds: Iterable[str]) -> int:
        assert self.engine is not None and self.scope_sync is not None
        seeds = list(seeds)
        if self.engine.scope_from_seeds:
            tasks = self.engine.seed_tasks(seeds)  # validates; raises ValueError first
            # Published before the seeds travel, so an owner that refreshes its scope on
            # receiving a seed already finds every seed host there.
            await self.scope_sync.publish({urls.hostname_of(t.url) for t in tasks})
        return await self.engine.add_seeds(seeds)

    async def intake(
        self,
        tasks: list[Task],
        done: dict[bytes, list[int]] | None = None,
        *,
        routed: bool = False,
    ) -> int:
        """Accept tasks this peer owns: dedup, store, and copy the new ones to the replicas
        before returning; returns how many were new. Tasks ``routed`` here by STORE_TASK
        wait for their copies at most ``Replication.copy_wait_s`` (the handler's caller has
        a deadline); the replica set follower fills any gap in the background."""
        assert self.ledger is not None and self.engine is not None
        assert self.replication is not None
        if done:
            pairs = [(k, fp) for k, fps in done.items() for fp in fps]
            await self.ledger.done.add(pairs)
            # Tasks queued here before the history arrived (a restart) are finished already.
            if await self.ledger.drop_done([fp for _, fp in pairs]):
                finished = [Task("", fp, k, 0) for k, fp in pairs]
                await self.replication.finished(finished, hurry=routed)  # a sender waits
        new = await self.ledger.accept(tasks)
        if new:
            self.engine.include_keys({t.key for t in new})
            # A key that came with a done range: the copies do not carry it, the follower does.
            if routed:
                await self.replication.copy_new(new, exclude=done or ())
                # Held as the answer says they are: the other senders may skip them now.
                self.advertised.add(t.fp for t in new)
            else:
                await self.replication.store_backups(new, exclude=done or ())
            self.engine.wake()
        return len(new)

    def _backlogged(self) -> bool:
        """Whether links to owners that had them all, and the news of finished pages, may
        wait longer (``dispatch.STALE_AFTER``, ``replication.PATIENT_COPY_SPACING_S``):
        more is queued than two rounds of our fetchers, so the crawl's end waits on nothing
        here; no hand-off or leave waits for our pages; and a quarter of the page tails'
        slots is free. A tail holds its slot while it waits, and the fetchers stop when
        none is free; as they fill, batches leave at their usual spacing again, so a fast
        link is never held to slots-per-wait pages a second."""
        engine = self.engine
        if engine is None or self.state != "active" or self.membership.handing_off:
            return False
        conc = engine.settings.concurrency
        return engine.tasks_queued > 2 * conc and 4 * engine.tails < 3 * engine.tail_slots

    def hurry(self) -> None:
        """Something waits for our pages' tails (a hand-off, a leave): the waits of our RPC
        lanes end now, and ``_backlogged`` says no until it is over."""
        if self.dispatcher is not None:
            self.dispatcher.hurry()
        if self.replication is not None:
            self.replication.hurry()

    # -- what the status server and the metrics read ---------------------------------------

    @property
    def crawl_stats(self) -> CrawlStats | None:
        return self.engine.stats if self.engine is not None else None

    def routing(self) -> dict[str, object] | None:
        """The routing table and RPC counters, or None before the node listens."""
        node = self.node
        if node is None or node.protocol is None:
            return None
        return {
            "peers": [{"id": p.id.hex(), "host": p.host, "port": p.port} for p in node.peers()],
            "buckets": node.buckets(),
            "rpc": node.stats(),
        }

    def frontier_size(self) -> tuple[int, int]:
        """URLs and hosts in the in-memory frontier."""
        if self.engine is None:
            return 0, 0
        return len(self.engine.frontier), len(self.engine.frontier.hosts)

    async def backup_owners(self) -> dict[bytes, int] | None:
        """Backups held, by owner (a store query), or None while the stores are closed."""
        if self.backups is None or self.state not in ("active", "leaving"):
            return None
        return await self.backups.owner_counts()

    def status(self) -> dict[str, object]:
        eng, node, led = self.engine, self.node, self.ledger
        stats = eng.stats if eng else None
        pages_s, disc_s, bytes_s = stats.rate() if stats else (0.0, 0.0, 0.0)
        peers = node.peers() if node else []
        return {
            "node_id": self.node_id.hex(),
            "version": __version__,
            "listen": f"{node.me.host}:{node.me.port}" if node and self.state != "joining" else "",
            # "finished" is reported, never stored: new seeds make the same peer active again.
            "state": "finished"
            if self.state == "active" and self.quiescence.finished.is_set()
            else self.state,
            "peers": len(peers),
            "network_size": len(peers) + 1,
            "tasks_queued": eng.tasks_queued if eng else 0,
            "tasks_in_flight": len(eng.in_flight) if eng else 0,
            "backups_held": self._backup_count,
            "backups_orphaned": self.quiescence.orphaned,
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
            + (self.replication.pending if self.replication else 0),
            "uptime_s": round(time.monotonic() - self.started, 3),
            "last_task_at": eng.last_task_at if eng else None,
            "handoff": self.handoff.as_dict(),
            "lending": self.lending.status(),
            "dispatch": self.dispatch_status(),
            **self._hostile_status(),
        }

    def dispatch_status(self) -> dict[str, int]:
        """The dispatcher's counts, and the links this peer told senders it holds."""
        sent = self.dispatcher.status() if self.dispatcher else dict.fromkeys(STATUS_FIELDS, 0)
        return {**sent, "told_known": self.advertised.told}

    def _hostile_status(self) -> dict[str, object]:
        """Loop lag and what the bounds on hostile input did (status page and /metrics)."""
        lag = self.loop_lag.snapshot()
        stats = self.engine.stats if self.engine else None
        return {
            "loop_lag_p99_ms": round(lag.p99 * 1000, 1),
            "loop_lag_max_ms": round(lag.max * 1000, 1),
            "truncated_by": dict(stats.truncated_by) if stats else {},
            "parse_bounded": dict(stats.parse_bounded) if stats else {},
            "budget": dict(stats.budget) if stats else {},
            "signals": stats.signals() if stats else {},
            "disk_full": bool(self.engine and self.engine.disk_full),
        }

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
