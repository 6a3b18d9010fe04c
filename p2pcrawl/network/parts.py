"""A started peer's parts, and the one place that wires them.

Each part is built with the few narrow interfaces it uses (``ports``, and the protocols its
module declares); none holds the peer. ``assemble`` builds them all in the order their
dependencies allow, once the stores are open, and the peer keeps them in one frozen
``Parts``: nothing is filled in later.

Two circles are closed here. The node needs its ``CrawlHandler`` when it is built, and what
serves the crawl RPCs needs the node: the node gets the peer's door (``inbox.Inbox``), opened
once the handler exists. And the engine sends every link through the dispatcher, whose share
for this peer goes back to the engine through the intake, as do a loan's orphaned pages and
the lanes' patience: those few arguments are functions that name parts built after the
engine, and are called only once the peer runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from p2pcrawl.archive import WarcWriter
from p2pcrawl.crawl import Engine, EventLog, Ledger, Pipeline
from p2pcrawl.network.announce import store_guard
from p2pcrawl.network.borrower import Borrower
from p2pcrawl.network.claims import Claims
from p2pcrawl.network.dispatch import Dispatcher
from p2pcrawl.network.follower import Follower, ReplicaBook
from p2pcrawl.network.handlers import PeerHandler
from p2pcrawl.network.handoff import Handoff, History
from p2pcrawl.network.healing import Healing
from p2pcrawl.network.history import STORE_HISTORY, HistoryLane
from p2pcrawl.network.inbox import Inbox
from p2pcrawl.network.intake import Intake
from p2pcrawl.network.join import Join, Welcome
from p2pcrawl.network.known import Advertised
from p2pcrawl.network.leave import HandoffReport, Leave
from p2pcrawl.network.lender import Lender
from p2pcrawl.network.lending import LendingLoop
from p2pcrawl.network.loadinfo import LoadInfo
from p2pcrawl.network.loanbook import LoanBook
from p2pcrawl.network.netkey import is_loopback
from p2pcrawl.network.patience import Patience
from p2pcrawl.network.ports import Spawn
from p2pcrawl.network.quiescence import Quiescence, QuietAnswer
from p2pcrawl.network.rebalance import Rebalance
from p2pcrawl.network.replication import Replication
from p2pcrawl.network.reporting import Reports
from p2pcrawl.network.roster import Roster
from p2pcrawl.network.scopesync import ScopeSync
from p2pcrawl.network.seeding import Seeder
from p2pcrawl.network.stall import StallResync
from p2pcrawl.network.vouching import Vouching, VouchServer
from p2pcrawl.settings import CrawlSettings, PeerSettings
from protocol import (
    GIVE_BACK,
    LEASE_S,
    LEND,
    LOAD,
    QUIET,
    VOUCH,
    CrawlNode,
    NodeKey,
    PeerRef,
    Rate,
    serve_load,
)
from storage import BackupStore

__all__ = ["Parts", "State", "assemble"]

State = Literal["joining", "active", "finished", "leaving", "stopped"]

UDP_FRAMING = 42  # a UDP datagram's framing on Ethernet: 14 + IP 20 + UDP 8


@dataclass(frozen=True, slots=True)
class Parts:
    """Everything a started peer is made of."""

    ledger: Ledger
    backups: BackupStore
    warc: WarcWriter | None
    node: CrawlNode
    roster: Roster
    engine: Engine
    advertised: Advertised
    intake: Intake
    dispatcher: Dispatcher
    replication: Replication
    follower: Follower
    handler: PeerHandler
    scope_sync: ScopeSync
    seeder: Seeder
    patience: Patience
    handoff: Handoff
    history: History
    visit_history: HistoryLane
    join: Join
    welcome: Welcome
    stall: StallResync
    rebalance: Rebalance
    leave: Leave
    loans: LoanBook
    lender: Lender
    reports: Reports
    borrower: Borrower
    lending: LendingLoop
    quiescence: Quiescence
    healing: Healing
    load_info: LoadInfo
    vouching: Vouching
    vouch_server: VouchServer

    def in_transit(self) -> int:
        """URLs and news waiting in our RPC lanes, and done claims waiting for a check."""
        return self.dispatcher.pending + self.replication.pending + self.vouching.pending


def assemble(
    *,
    node_id: bytes,
    data_dir: Path,
    listen_host: str,
    bootstrap: tuple[tuple[str, int], ...],
    saved_contacts: list[tuple[str, int]],
    crawl: CrawlSettings,
    settings: PeerSettings,
    ledger: Ledger,
    backups: BackupStore,
    warc: WarcWriter | None,
    events: EventLog,
    report: HandoffReport,
    state: Callable[[], State],
    on_failure: Callable[[BaseException], None],
    spawn: Spawn,
    key: NodeKey | None = None,
) -> Parts:
    """Build and wire a peer's parts around its open stores; nothing is started here.
    ``key``: the node key of a peer in an open network (no secret)."""
    ps = settings

    def active() -> bool:
        return state() == "active"

    inbox = Inbox()
    node = CrawlNode(node_id, inbox, replace(ps.node_config(), key=key))
    ids = node.identities
    node.storage.guard = store_guard(ps.secret, ids.proven, ids.verify)
    roster = Roster(node, events)
    advertised = Advertised()
    rebalance_due = asyncio.Event()
    keyed = bool(ps.secret)
    # No loans in an open network: checking a report would cost the fetch a loan saves.
    lending_on = ps.lend and ps.partition != "url" and keyed
    # -- the engine, and what it sends through ------------------------------------------
    replica_book = ReplicaBook(
        enroll_new=ledger.queued == 0 and ledger.done_count == 0, gone=roster.gone
    )
    vouching = Vouching(node.call, lambda: engine, ledger.done)
    vouch_server = VouchServer(ledger.done)
    claims = Claims(node, node, keyed=keyed, replicas=ps.replicas, vouching=vouching)
    replication = Replication(
        node,
        replica_book,
        ledger,
        backups,
        store_backup=node.store_backup,
        delete_backup=node.delete_backup,
        replicas=ps.replicas,
        rpc_timeout=node.config.rpc_timeout,
        patient=lambda: patience(),
        believe=lambda rep, done: claims.taken(rep, done, handler.record_done),
        suspect=node.rpc.liveness.is_suspect,
    )
    dispatcher = Dispatcher(
        node,
        node.store_task,
        intake=lambda tasks: intake.accept(tasks),
        batch=ps.dispatch_batch,
        flush_s=ps.dispatch_flush_s,
        patient=lambda: patience(),
        gone=roster.gone,
        rushed=lambda: engine.pipeline.gating,
    )
    loans = LoanBook(orphaned=lambda key, fps: reports.forward(key, fps))
    rpc = node.rpc_stats
    engine = Engine(
        crawl,
        ledger,
        warc=warc,
        partition=ps.partition,
        router=dispatcher,
        on_finished=replication.finished,
        on_failure=on_failure,
        loans=loans,
        data_dir=data_dir,
        link_bytes=lambda: rpc.bytes_in + UDP_FRAMING * rpc.datagrams_in,
        keep_proofs=not keyed,  # only an open network's members are checked (VOUCH)
        pipeline=Pipeline(),
    )
    intake = Intake(ledger, replication, engine, advertised)

    def hurry() -> None:
        """Something waits for our pages' tails (a hand-off, a leave): our lanes send now."""
        dispatcher.hurry()
        replication.hurry()

    patience = Patience(engine, active=active, hurry=hurry)
    follower = Follower(replica_book, ledger, node, replication)
    scope_sync = ScopeSync(node, engine, trusted=bool(ps.secret) or is_loopback(listen_host))
    # -- keys changing hands ----------------------------------------------------------------
    lender = Lender(
        engine,
        loans,
        lambda: ledger.queued,
        is_member=roster.is_member,
        active=active,
        enabled=lending_on,
    )
    visit_history = HistoryLane(
        engine.revisits,
        node,
        node.call,
        replicas=ps.replicas,
        me=lambda: node_id,
        believes=claims.believes,
    )
    handoff = Handoff(
        ledger,
        engine,
        node,
        send=node.store_task,
        copy_for=replication.copy_for,
        revoke=lender.revoke_keys,
        waiting=patience.waiting,
        rebalance_soon=rebalance_due.set,
        timeout=ps.handoff_timeout,
        move_history=visit_history.hand_keys if engine.revisits else None,
    )
    history = History(
        ledger,
        node,
        send=node.store_task,
        keep=intake.keep_history,
        timeout=ps.handoff_timeout,
        done_range=handoff.done_range,
    )
    join = Join(
        node,
        roster.peers,
        events,
        ask=node.refresh_task,
        take_ownership=node.take_ownership,
        owners_changed=roster.owners_changed,
        ksize=ps.ksize,
        give_up_after=ps.min_peer_age + ps.handoff_timeout,
        replicas=ps.replicas,
    )
    welcome = Welcome(
        ledger, node, node, handoff, events, backups.owner_counts, active=active, spawn=spawn
    )
    rebalance = Rebalance(
        ledger,
        backups,
        node,
        handoff,
        history,
        events,
        peers=roster.peers,
        in_table=node.in_table,
        route=dispatcher.route,
        active=active,
        due=rebalance_due,
        replicas=ps.replicas,
        republish_interval=ps.republish_interval,
    )

    # -- lending --------------------------------------------------------------------------
    reports = Reports(
        loans,
        engine.frontier,
        give_back=node.give_back,
        member=roster.member,
        tell_replicas=replication.finished_for,
        forward=lambda key, fps: history.forward(key, fps, within=LEASE_S, base=0.1),
    )
    handler = PeerHandler(
        engine,
        node,
        accept=intake.accept,
        holding=replication,
        claims=claims,
        scope_sync=scope_sync,
        advertised=advertised,
        is_member=roster.is_member,
        expecting=join.expecting,
        serve_refresh=welcome.serve_refresh,
        taking=lambda: taking(),
        sender_rate=Rate(ps.sender_tasks_per_s, ps.sender_tasks_burst),
    )
    borrower = Borrower(
        engine,
        loans,
        reports,
        roster,
        lend=node.lend,
        decode=handler.decode,
        active=active,
        trusted=scope_sync.trusted,
        enabled=lending_on,
        strained=node.strained,
    )
    lending = LendingLoop(loans, lender, borrower, reports)

    # -- membership ---------------------------------------------------------------------------
    stall = StallResync(
        engine,
        events,
        peers=roster.peers,
        ping=node.ping_peer,
        refresh=join.refresh,
        park_loans=reports.on_stall,
        rebalance_soon=rebalance_due.set,
        active=active,
        spawn=spawn,
    )
    leave = Leave(
        ledger,
        backups,
        engine,
        handoff,
        events,
        report,
        leases=lender,
        loans=reports,
        peers=roster.peers,
        contacts=node.neighbours,
        depart=node.depart,
        goodbye=node.goodbye,
        flush_links=dispatcher.flush,
        stored=handler.stored,
        hurry=patience.hurry,
        hand_history=visit_history.hand_all if engine.revisits else None,
    )

    def taking() -> bool:
        """STORE_TASK is taken while joining or active, and while leaving only until the
        pages of our borrowers have settled."""
        now = state()
        return now in ("joining", "active") or (now == "leaving" and leave.taking)

    async def ask_quiet(peer: PeerRef) -> QuietAnswer:
        reply = await node.quiet(peer)
        return reply.quiet, reply.done

    quiescence = Quiescence(
        engine,
        roster,
        events,
        me=node_id,
        done_count=lambda: ledger.done_count,
        in_transit=lambda: dispatcher.pending + replication.pending + vouching.pending,
        backup_owners=backups.owner_counts,
        steady=lambda: active() and node.listening and not stall.resyncing,
        ask=ask_quiet,
        settle=ps.finish_settle,
        hold=ps.partition_hold,
    )
    roster.on_departure(quiescence.lost)
    healing = Healing(
        node,
        events,
        data_dir=data_dir,
        saved=saved_contacts,
        bootstrap=bootstrap,
        active=active,
        rebalance_soon=rebalance_due.set,
        interval=ps.heal_interval,
        max_backoff=ps.heal_max_backoff,
    )
    load_info = LoadInfo(ledger, lambda n: node.neighbours(n) if node.listening else [], spawn)
    seeder = Seeder(
        engine,
        ledger,
        node,
        send=node.store_task,
        route=dispatcher.route,
        accept=intake.accept,
        publish=scope_sync.publish,
    )

    # -- who hears what ---------------------------------------------------------------------
    gone_hooks = (rebalance.owner_gone, welcome.forget, replica_book.forget_peer)
    for gone in (*gone_hooks, lending.peer_gone, join.neighbour_gone):
        roster.on_departure(gone)
    for changed in (
        advertised.retell,
        dispatcher.owners_changed,
        replica_book.membership_changed,
        rebalance_due.set,
    ):
        roster.on_change(changed)
    roster.on_contacts(replica_book.membership_changed)
    inbox.open(handler, roster)
    node.on_stall = stall.on_stall

    node.serve(QUIET, quiescence.serve)
    node.serve(LOAD, serve_load(load_info.report))
    node.serve(LEND, lender.serve_lend)
    node.serve(GIVE_BACK, lender.serve_return)
    node.serve_claims(STORE_HISTORY, visit_history.serve)
    node.serve(VOUCH, vouch_server.serve)  # only an open network's peers ask
    return Parts(
        ledger=ledger,
        backups=backups,
        warc=warc,
        node=node,
        roster=roster,
        engine=engine,
        advertised=advertised,
        intake=intake,
        dispatcher=dispatcher,
        replication=replication,
        follower=follower,
        handler=handler,
        scope_sync=scope_sync,
        seeder=seeder,
        patience=patience,
        handoff=handoff,
        history=history,
        visit_history=visit_history,
        join=join,
        welcome=welcome,
        stall=stall,
        rebalance=rebalance,
        leave=leave,
        loans=loans,
        lender=lender,
        reports=reports,
        borrower=borrower,
        lending=lending,
        quiescence=quiescence,
        healing=healing,
        load_info=load_info,
        vouching=vouching,
        vouch_server=vouch_server,
    )
