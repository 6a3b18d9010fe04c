"""Failure detection: suspicion by time, indirect probes, local health (SWIM + Lifeguard)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from protocol import CrawlNode
from protocol.kbucket import Node
from protocol.liveness import Detector, LivenessConfig, LocalHealth, socket_drops, socket_inode
from protocol.probes import Answer
from protocol.upkeep import NEIGHBOUR_PINGS, ProbeRound, probe_suspects
from tests.protocol.conftest import NodeFactory, eventually, handler_of
from tests.protocol.test_node import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the pure core ---------------------------------------------------------------------------


def test_a_suspect_dies_only_after_the_timeout_and_enough_rounds() -> None:
    clock = Clock()
    d = Detector(LivenessConfig(suspicion_timeout=10.0, min_failed_rounds=3), clock)
    peer = b"p" * 20
    d.failed(peer)
    for _ in range(5):  # a burst: many failed calls and rounds within a second
        d.failed(peer)
        d.probe_failed(peer)
        clock.now += 0.1
    assert not d.dead(peer), "a burst of failures is not time"
    clock.now += 9.6
    assert d.dead(peer)


def test_rounds_are_needed_even_after_the_timeout() -> None:
    clock = Clock()
    d = Detector(LivenessConfig(suspicion_timeout=1.0, min_failed_rounds=3), clock)
    peer = b"p" * 20
    d.failed(peer)
    clock.now += 60
    d.probe_failed(peer)
    d.probe_failed(peer)
    assert not d.dead(peer)
    d.probe_failed(peer)
    assert d.dead(peer)


def test_anything_heard_refutes_and_the_clock_restarts() -> None:
    clock = Clock()
    d = Detector(LivenessConfig(suspicion_timeout=10.0, min_failed_rounds=1), clock)
    peer = b"p" * 20
    d.failed(peer)
    d.probe_failed(peer)
    clock.now += 9
    d.heard(peer)
    assert not d.is_suspect(peer) and d.refuted == 1
    d.failed(peer)
    d.probe_failed(peer)
    clock.now += 9
    assert not d.dead(peer), "suspicion counts from the new failure, not the old one"
    clock.now += 1
    assert d.dead(peer)


def test_poor_local_health_stretches_the_timeout() -> None:
    clock = Clock()
    d = Detector(LivenessConfig(suspicion_timeout=10.0, min_failed_rounds=1), clock)
    peer = b"p" * 20
    d.failed(peer)
    d.probe_failed(peer)
    for _ in range(2):
        d.health.round(
            loop_lag=0.0, socket_drops=50, junk=0, missed_nacks=0, probes_ok=0, probes_failed=1
        )
    assert d.health.multiplier == 3
    clock.now += 20
    assert not d.dead(peer), "while we drop datagrams ourselves, silence is weak evidence"
    clock.now += 10
    assert d.dead(peer)


def test_local_health_rises_on_each_sign_and_recovers_on_clean_rounds() -> None:
    h = LocalHealth(cap=8)
    clean: dict[str, Any] = {"loop_lag": 0.0, "socket_drops": 0, "junk": 0, "missed_nacks": 0}
    h.round(loop_lag=2.0, socket_drops=0, junk=0, missed_nacks=0, probes_ok=3, probes_failed=0)
    h.round(**{**clean, "junk": 10_000}, probes_ok=0, probes_failed=0)
    h.round(**{**clean, "missed_nacks": 2}, probes_ok=0, probes_failed=0)
    h.round(**clean, probes_ok=0, probes_failed=3)  # every probe failed: likely us
    assert h.score == 4
    assert set(h.signals) == {"loop_lag", "junk", "missed_nacks", "all_probes_failed"}
    h.round(**clean, probes_ok=0, probes_failed=1)  # one failure alone proves nothing
    assert h.score == 4
    for _ in range(10):
        h.round(**clean, probes_ok=1, probes_failed=0)
    assert h.score == 0
    for _ in range(20):
        h.worse("x")
    assert h.score == 8 and h.multiplier == 9


def test_a_busy_network_s_talk_is_a_clean_round() -> None:
    # While the peers crawl they talk all the time, so a round pings nobody (only the
    # members silent for half an interval are pinged): hearing them is what shows that our
    # socket and loop work again, and the score must fall on it, not wait for a quiet member.
    h = LocalHealth(cap=8)
    for _ in range(8):
        h.worse("junk")
    clean: dict[str, Any] = {"loop_lag": 0.0, "socket_drops": 0, "junk": 0, "missed_nacks": 0}
    h.round(**clean, probes_ok=0, probes_failed=1, nacks=2)  # only the dead suspect probed
    assert h.score == 8, "a round that heard nobody proves nothing"
    for _ in range(8):
        h.round(**clean, probes_ok=0, probes_failed=1, nacks=2, heard=3)
    assert h.score == 0
    h.worse("junk")
    h.round(**{**clean, "junk": 10_000}, probes_ok=0, probes_failed=0, heard=3)
    assert h.score == 2, "still flooded: hearing the others does not make a round clean"


def test_helpers_that_declared_the_suspect_dead_end_the_health_stretch() -> None:
    clock = Clock()
    cfg = LivenessConfig(suspicion_timeout=3.0, confirmations=2)
    d = Detector(cfg, clock, network_size=lambda: 4)
    peer = b"p" * 20
    for _ in range(8):
        d.health.worse("junk")  # a flood just ended here
    d.failed(peer)
    d.probe_failed(peer, confirmations=2)
    assert d.timeout(peer) == 27.0, "confirmed by nacks, stretched by our own poor health"
    d.probe_failed(peer, confirmations=2, gone=1)
    assert d.timeout(peer) == 27.0, "one verdict of two needed"
    d.probe_failed(peer, confirmations=2, gone=2)
    assert d.timeout(peer) == 3.0, "both helpers declared it: our health is beside the point"
    clock.now += 3.0
    assert d.dead(peer)
    d.declare(peer)
    assert d.declared_lately(peer) and d.declared_as_others_did == 1
    d.heard(peer)
    assert not d.declared_lately(peer), "heard from since: no longer a verdict to pass on"
    d.declare(peer)
    clock.now += 61.0
    assert not d.declared_lately(peer)


def test_half_a_network_silent_with_helpers_nacking_is_not_our_fault() -> None:
    # Two of four peers stop: every probe of this live half fails, but the live helper
    # answers each PING-REQ with a nack. Blaming ourselves would stretch every timeout up
    # to ninefold, and the stopped half would not be declared dead within the test's 30 s.
    h = LocalHealth(cap=8)
    clean: dict[str, Any] = {"loop_lag": 0.0, "socket_drops": 0, "junk": 0, "missed_nacks": 0}
    for _ in range(20):
        h.round(**clean, probes_ok=0, probes_failed=2, nacks=2)
    assert h.score == 0 and h.multiplier == 1
    h.round(**clean, probes_ok=0, probes_failed=2, nacks=0)  # nobody answered at all
    assert h.score == 1


def test_silence_counts_from_the_unanswered_call_or_the_last_message() -> None:
    # A peer that died while we waited on it has been silent since our call left, not
    # since the call's timer ran out; if it spoke after the call left, from then.
    clock = Clock()
    cfg = LivenessConfig(suspicion_timeout=3.0, call_timeout=2.0)
    d = Detector(cfg, clock)
    peer, other = b"p" * 20, b"o" * 20
    d.failed(peer)
    d.probe_failed(peer)
    clock.now += 0.9
    assert not d.dead(peer)
    clock.now += 0.2  # 3 s after the call left at 98
    assert d.dead(peer)
    d.heard(other)
    clock.now += 1.5
    d.failed(other)  # the call left at now - 2, before we last heard it
    d.probe_failed(other)
    clock.now += 1.4
    assert not d.dead(other)
    clock.now += 0.2
    assert d.dead(other)
    third = b"t" * 20
    d.failed(third, waited=0.5)  # a probe with a short timeout: it left 0.5 s ago
    d.probe_failed(third)
    clock.now += 2.4
    assert not d.dead(third)
    clock.now += 0.2
    assert d.dead(third)


def test_the_timeout_grows_with_log_n_and_shrinks_with_confirmations() -> None:
    clock = Clock()
    size = [4]
    cfg = LivenessConfig(suspicion_timeout=3.0, max_timeout_mult=6.0, confirmations=2)
    d = Detector(cfg, clock, network_size=lambda: size[0])
    peer = b"p" * 20
    d.failed(peer)
    d.probe_failed(peer, confirmations=0)
    assert d.timeout(peer) == 18.0, "nobody else confirms: the longest suspicion"
    d.probe_failed(peer, confirmations=1)
    one = d.timeout(peer)
    assert one is not None and 3.0 < one < 18.0
    d.probe_failed(peer, confirmations=2)
    assert d.timeout(peer) == 3.0, "enough independent suspicions: the shortest"
    size[0] = 100
    assert d.timeout(peer) == 6.0, "log10(100) x the shortest"
    size[0] = 3  # one helper at most: no confirmation to wait for
    d.forget(peer)
    d.failed(peer)
    d.probe_failed(peer, confirmations=0)
    assert d.timeout(peer) == 3.0


def test_without_a_count_every_helper_the_round_could_ask_confirms() -> None:
    # The size is the contacts heard from, plus us; helpers are the others.
    clock = Clock()
    d = Detector(LivenessConfig(suspicion_timeout=3.0), clock)
    peer = b"p" * 20
    for i in range(5):
        d.heard(bytes([i]) * 20)
    d.failed(peer)
    d.probe_failed(peer)
    assert d.size() == 6 and d.timeout(peer) == 3.0
    assert d.snapshot()["network_size"] == 6
    d.forget(bytes(20))
    assert d.size() == 5


# --- on the wire -----------------------------------------------------------------------------

LIVE: dict[str, Any] = {
    "ping_interval": 0.1,
    "rpc_timeout": 0.2,
    "failures_before_evict": 2,
    "suspicion_timeout": 0.6,
}


async def trio(
    make_node: NodeFactory, quiet_b: bool = False, **config: object
) -> tuple[CrawlNode, ...]:
    a = await make_node(**config)
    b = await make_node(**{**config, **({"ping_interval": 60.0} if quiet_b else {})})
    c = await make_node(**config)
    await b.join([a.me.addr])
    await c.join([a.me.addr])
    await eventually(lambda: all(len(n.peers()) == 2 for n in (a, b, c)))
    return a, b, c


async def test_a_peer_others_can_reach_is_not_declared_dead(make_node: NodeFactory) -> None:
    # Asymmetric reachability: a cannot reach b (it knows b at a dead port), c can. SWIM's
    # indirect probe through c keeps b alive in a's view. (b pings nobody on its own here:
    # a request from b would refute the suspicion directly and correct the address.)
    a, b, c = await trio(make_node, quiet_b=True, **LIVE)
    a.rpc.router.add_contact(Node(b.me.id, "127.0.0.1", free_port()))
    await asyncio.sleep(3.0)  # many rounds, five times the suspicion timeout
    assert b.me.id in {p.id for p in a.peers()}
    assert handler_of(a).removed == []
    assert a.stats()["rpc_sent"]["ping_req"] > 0  # type: ignore[index]
    assert c.stats()["rpc_received"]["ping_req"] > 0  # type: ignore[index]


async def test_a_dead_peer_is_probed_indirectly_then_declared(make_node: NodeFactory) -> None:
    a, b, c = await trio(make_node, **LIVE)
    await b.aclose()
    started = time.monotonic()
    await eventually(lambda: b.me not in a.peers() and b.me not in c.peers(), timeout=8.0)
    assert time.monotonic() - started >= LIVE["suspicion_timeout"]
    assert (b.me, "unresponsive") in handler_of(a).removed
    assert a.stats()["rpc_sent"]["ping_req"] > 0  # type: ignore[index]
    assert a.rpc.liveness.declared == 1
    # c declared it too: asked to probe it, c says so, which a late suspector takes as the
    # network's verdict (not merely "I do not know it").
    dead = Node(b.me.id, *b.me.addr)
    assert await a.rpc.ping_req(Node(c.me.id, *c.me.addr), dead) is Answer.GONE
    stranger = Node(bytes(20), "127.0.0.1", free_port())
    assert await a.rpc.ping_req(Node(c.me.id, *c.me.addr), stranger) is Answer.NACK


async def test_helpers_verdicts_count_on_a_keyed_network_only(make_node: NodeFactory) -> None:
    """Two helpers that declared a contact dead lift the asker's health stretch (rule 6 of
    docs/membership.md, "Liveness"). In an open network two members an attacker runs could
    lift it for a flooded peer, so there their word is a plain nack."""
    for secret, counted in (("cluster-key", 2), (None, 0)):
        keyed = {"secret": secret} if secret else {}
        a = await make_node(ping_interval=60.0, **keyed)  # probes only when told to
        helpers = [await make_node(**LIVE, **keyed) for _ in range(2)]
        b = await make_node(**LIVE, **keyed)
        for n in (*helpers, b):
            await n.join([a.me.addr])
        nodes = (a, *helpers, b)
        await eventually(lambda: all(len(n.peers()) == 3 for n in nodes), timeout=8.0)  # noqa: B023
        await b.aclose()
        await eventually(lambda: all(b.me not in h.peers() for h in helpers), timeout=8.0)  # noqa: B023
        assert b.me in a.peers(), "the asker has not judged it yet"
        a.rpc.liveness.failed(b.me.id)
        await probe_suspects(a.rpc, 3, ProbeRound(), lambda node: None)
        suspicion = a.rpc.liveness.snapshot()["suspects"][b.me.id.hex()[:8]]  # type: ignore[index]
        assert suspicion["gone"] == counted, (secret, suspicion)
        assert suspicion["confirmed"] == 2


async def test_ping_req_refuses_targets_it_does_not_know(make_node: NodeFactory) -> None:
    # No reflection: a helper pings only contacts in its own table, at their known address.
    a, b = await make_node(), await make_node()
    await b.join([a.me.addr])
    stranger = Node(bytes(20), "127.0.0.1", free_port())
    pings = b.stats()["rpc_sent"].get("ping", 0)  # type: ignore[attr-defined]
    assert await a.rpc.ping_req(Node(b.me.id, *b.me.addr), stranger) is Answer.NACK
    assert b.stats()["rpc_sent"].get("ping", 0) == pings  # type: ignore[attr-defined]
    target = Node(b.me.id, *b.me.addr)
    c = await make_node()
    await c.join([b.me.addr])
    assert await c.rpc.ping_req(Node(a.me.id, *a.me.addr), target) is Answer.ACK


async def test_socket_drops_and_a_stalled_loop_lower_local_health(
    make_node: NodeFactory,
) -> None:
    a = await make_node(ping_interval=0.2, rpc_timeout=0.2)
    assert a.rpc.endpoint.transport is not None
    sock = a.rpc.endpoint.transport.get_extra_info("socket")
    before = socket_drops(socket_inode(sock.fileno()))
    await asyncio.sleep(0.2)  # the lag monitor's first tick
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        junk = b"x" * 1400
        # Our loop is the node's loop: while it is blocked here nothing reads the socket,
        # so the kernel must drop what does not fit its receive buffer.
        deadline = time.monotonic() + 1.0
        sent = 0
        while time.monotonic() < deadline and sent < 20_000:
            sender.sendto(junk, a.me.addr)
            sent += 1
    finally:
        sender.close()
    time.sleep(0.6)  # noqa: ASYNC251 -- the stall under test
    if before is not None:
        after = socket_drops(socket_inode(sock.fileno()))
        assert after is not None and after > before
    health = a.rpc.liveness.health
    await eventually(lambda: "loop_lag" in health.signals, timeout=3.0)
    await eventually(lambda: "junk" in health.signals, timeout=3.0)
    if before is not None:
        await eventually(lambda: "socket_drops" in health.signals, timeout=3.0)
    assert health.score > 0


async def test_a_long_stall_is_reported(make_node: NodeFactory) -> None:
    a = await make_node(suspicion_timeout=0.4)
    stalls: list[float] = []
    a.on_stall = stalls.append
    await asyncio.sleep(0.2)  # the lag monitor's first tick
    time.sleep(0.5)  # noqa: ASYNC251 -- the stall under test
    await eventually(lambda: bool(stalls), timeout=2.0)
    assert stalls[0] >= 0.2


async def test_every_member_is_checked_each_round_not_only_the_nearest(
    make_node: NodeFactory,
) -> None:
    """A peer with no reason to call a member still notices its death by itself: each round
    pings every member not heard from for half an interval (up to ``PINGS_PER_ROUND``), not
    only the ``NEIGHBOUR_PINGS`` nearest."""
    a = await make_node(ping_interval=60.0)
    others = [await make_node(ping_interval=60.0) for _ in range(NEIGHBOUR_PINGS + 3)]
    for n in others:
        await n.join([a.me.addr])
    await eventually(lambda: len(a.peers()) == len(others), timeout=5.0)
    await asyncio.sleep(0.1)

    def pings() -> int:
        return int(a.stats()["rpc_sent"].get("ping", 0))  # type: ignore[attr-defined]

    sent = pings()
    await a.upkeep.ping_round()  # the interval is 60 s: call the round itself
    assert pings() == sent  # all heard from just now
    a.upkeep._ping_interval = 0.1  # now nobody has been heard from for half of that
    await asyncio.sleep(0.1)
    await a.upkeep.ping_round()
    assert pings() - sent == len(others)
    assert len(a.upkeep.last_round.ok) == len(others)


async def test_a_reply_after_the_probe_timeout_refutes_the_suspicion(
    make_node: NodeFactory,
) -> None:
    """A slow peer is not a dead one: a ping reply that comes after the probe gave up still
    clears the suspicion it left (Lifeguard treats a late ack as an ack for liveness)."""
    a, b = await make_node(), await make_node()
    await b.join([a.me.addr])
    node = Node(b.me.id, *b.me.addr)
    transport: Any = b.rpc.endpoint.transport
    real = transport.sendto
    held: list[tuple[bytes, Any]] = []

    def slow(data: bytes, addr: Any = None) -> None:
        held.append((bytes(data), addr))  # b answers, but only after a's probe gave up

    transport.sendto = slow
    assert not await a.rpc.probe_ping(node, 0.2)
    assert a.rpc.liveness.is_suspect(b.me.id)
    transport.sendto = real
    for data, addr in held:
        real(data, addr)
    await eventually(lambda: not a.rpc.liveness.is_suspect(b.me.id), timeout=2.0)
    assert a.stats()["late_replies"] >= 1  # type: ignore[operator]
