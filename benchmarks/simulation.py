"""Simulation to internet scale: 1,000 and 10,000 peers with churn, no sockets.

What runs is the project's own code: every peer has a ``protocol.routing.ContactTable``
(kademlia's k-buckets with our eviction rules), lookups are ``protocol.lookup.NodeLookup`` (what
``CrawlNode.closest`` runs once a table no longer knows everyone), owners come from
``protocol.balance.IdSpace`` (equal to ``protocol.ownership.closest``, see its tests) and joiners
take their IDs with ``protocol.balance.split_id``. Only the transport is replaced: a FIND_NODE
"RPC" is a call into the other peer's table, answered if that peer is alive and failed if not.

Per network size it reports:

- lookup rounds (iterative FIND_NODE steps, Kademlia §2.3) and RPCs per lookup, against
  log2 N, and whether the lookup found the true owner: in the grown network, and again after
  churn (a share of the peers crash without a word, the same number join through real
  FIND_NODE(self) lookups);
- key-space share, max/mean, for random IDs and for IDs chosen by ``split_id`` (``--probes``
  random lookups per joiner; the largest region among their owners is split);
- keys moved per join and per leave, as a fraction of all keys, against 1/N;
- the owner-resolution cache hit rate: the dispatcher caches each key's owner and forgets them
  all whenever its routing table changes; the simulation measures how often a peer's table
  changes under churn and replays a stream of discovered cross-peer links against the cache;
- messages per discovered URL, from those measurements (see ``messages_per_url``).

Usage: python benchmarks/simulation.py [--quick] [--sizes 1000,10000] [--churn 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.balance import IdSpace, split_id
from protocol.kbucket import Node
from protocol.lookup import NodeLookup
from protocol.ownership import key_for
from protocol.routing import ContactTable

DOCS = Path(__file__).resolve().parent.parent / "docs"
KSIZE, ALPHA = 20, 3  # NodeConfig's defaults


def rand_id(rng: random.Random) -> bytes:
    return rng.getrandbits(160).to_bytes(20, "big")


class Grower:
    """Joiners one at a time, each splitting the largest of ``probes`` regions found by
    looking up random keys (a probe lands in a region with probability equal to its share).
    A split halves only the split node's share, so shares are kept up to date cheaply."""

    def __init__(self, ids: list[bytes], probes: int = 8) -> None:
        self.space = IdSpace(ids)
        self.shares = self.space.shares()
        self.probes = probes

    def join(self, rng: random.Random) -> bytes:
        owners = {self.space.owner(rand_id(rng)) for _ in range(self.probes)}
        target = max(owners, key=lambda o: (self.shares[o], o))
        new = split_id(target, self.space.neighbours(target), rng)
        self.shares[target] /= 2
        self.shares[new] = self.shares[target]
        self.space.add(new)
        return new


def balanced_ids(n: int, rng: random.Random, probes: int) -> list[bytes]:
    grower = Grower([rand_id(rng)], probes)
    while len(grower.space) < n:
        grower.join(rng)
    return grower.space.ids()


@dataclass
class Peer:
    node: Node
    table: ContactTable
    alive: bool = True
    changes: int = 0  # routing-table membership changes: each one empties the owner cache


@dataclass
class Net:
    peers: dict[bytes, Peer] = field(default_factory=dict)
    rpcs: int = 0

    def add_peer(self, node_id: bytes, index: int) -> Peer:
        node = Node(node_id, f"198.18.{index // 250}.{index % 250 + 1}", 4000 + index % 20000)
        holder: list[Peer] = []

        def changed(*_: Any) -> None:
            if holder:
                holder[0].changes += 1

        def on_full(head: Node) -> None:
            # The owner pings the least-recently-seen contact; a dead one is evicted at once
            # here (no timeout to wait for), which promotes the newest replacement.
            other = self.peers.get(head.id)
            if other is None or not other.alive:
                holder[0].table.remove_contact(head)

        table = ContactTable(node, KSIZE, changed, changed, on_full)
        peer = Peer(node, table)
        holder.append(peer)
        self.peers[node_id] = peer
        return peer

    def alive_ids(self) -> list[bytes]:
        return [i for i, p in self.peers.items() if p.alive]


class SimProtocol:
    """The one replaced part: FIND_NODE answered from the other peer's table, in process."""

    def __init__(self, net: Net, me: Peer) -> None:
        self.net, self.me = net, me

    async def call_find_node(self, peer: Node, target: Node) -> tuple[bool, Any]:
        self.net.rpcs += 1
        other = self.net.peers.get(peer.id)
        if other is None or not other.alive:
            self.me.table.record_failure(peer)
            return False, None
        # Both sides learn of each other, as with real datagrams (Kademlia §2.2).
        other.table.add_contact(self.me.node)
        self.me.table.add_contact(other.node)
        found = other.table.find_neighbors(target, KSIZE, exclude=self.me.node)
        return True, [tuple(n) for n in found]


class CountingCrawl(NodeLookup):
    rounds = 0

    async def _round(self, call: Any) -> Any:
        self.rounds += 1
        return await super()._round(call)


async def lookup(net: Net, src: Peer, key: bytes) -> tuple[bytes | None, int, int]:
    """(closest ID found, rounds, RPCs) of one iterative FIND_NODE from ``src``."""
    target = Node(key)
    start = src.table.find_neighbors(target, KSIZE)
    rpcs0 = net.rpcs
    crawl = CountingCrawl(SimProtocol(net, src), target, start, KSIZE, ALPHA)
    found = await crawl.find()
    pool = [n.id for n in found] + [src.node.id]
    best = min(pool, key=lambda i: int.from_bytes(i, "big") ^ int.from_bytes(key, "big"))
    return best, crawl.rounds, net.rpcs - rpcs0


def fill_tables(net: Net, rng: random.Random, sample: int) -> None:
    """A converged network without replaying every join: each table hears from its ID-order
    neighbours (the XOR-nearest live there) and from a random sample of everyone."""
    ids = sorted(net.peers, key=lambda i: int.from_bytes(i, "big"))
    nodes = [net.peers[i].node for i in ids]
    for pos, i in enumerate(ids):
        table = net.peers[i].table
        for j in range(max(0, pos - KSIZE), min(len(ids), pos + KSIZE + 1)):
            if j != pos:
                table.add_contact(nodes[j])
        for node in rng.sample(nodes, min(sample, len(nodes))):
            if node.id != i:
                table.add_contact(node)


async def join(net: Net, node_id: bytes, index: int, rng: random.Random) -> None:
    """A real join (Kademlia §2.3): one bootstrap contact, then FIND_NODE(self)."""
    me = net.add_peer(node_id, index)
    alive = net.alive_ids()
    boot = net.peers[rng.choice([i for i in alive if i != node_id])]
    me.table.add_contact(boot.node)
    boot.table.add_contact(me.node)
    crawl = NodeLookup(SimProtocol(net, me), me.node, [boot.node], KSIZE, ALPHA)
    await crawl.find()


def ping_round(net: Net) -> None:
    """One liveness round (``protocol.upkeep.ping_round``): every live peer pings its contacts
    and drops those that do not answer (the failure detector's verdict, without its wait)."""
    for peer in net.peers.values():
        if not peer.alive:
            continue
        for contact in peer.table.members():
            other = net.peers.get(contact.id)
            if other is None or not other.alive:
                peer.table.record_failure(contact)
                peer.table.remove_contact(contact)


async def measure_lookups(net: Net, rng: random.Random, count: int) -> dict[str, float]:
    alive = net.alive_ids()
    space = IdSpace(alive)
    rounds, rpcs, correct = [], [], 0
    for _ in range(count):
        src = net.peers[rng.choice(alive)]
        key = rand_id(rng)
        best, r, c = await lookup(net, src, key)
        rounds.append(r)
        rpcs.append(c)
        correct += best == space.owner(key)
    return {
        "rounds_median": statistics.median(rounds),
        "rounds_mean": statistics.fmean(rounds),
        "rounds_max": max(rounds),
        "rpcs_mean": statistics.fmean(rpcs),
        "owner_found": correct / count,
    }


def keys_moved(ids: list[bytes], new: bytes | None, gone: bytes | None, keys: list[bytes]) -> float:
    before = IdSpace(ids)
    after_ids = [i for i in ids if i != gone] + ([new] if new else [])
    after = IdSpace(after_ids)
    return sum(before.owner(k) != after.owner(k) for k in keys) / len(keys)


def cache_hit_rate(
    clears_per_s: float, links_per_s: float, hosts: int, rng: random.Random, seconds: float
) -> float:
    """Replay discovered cross-peer links (host popularity Zipf, exponent 1) against an owner
    cache that is emptied at Poisson times, ``clears_per_s`` on average."""
    weights = [1.0 / r for r in range(1, hosts + 1)]
    draws = int(links_per_s * seconds)
    keys = rng.choices(range(hosts), weights=weights, k=draws)
    t_per_link = 1.0 / links_per_s
    next_clear = rng.expovariate(clears_per_s) if clears_per_s > 0 else math.inf
    cache: set[int] = set()
    hits = 0
    for n, k in enumerate(keys):
        now = n * t_per_link
        while now >= next_clear:
            cache.clear()
            next_clear += rng.expovariate(clears_per_s)
        if k in cache:
            hits += 1
        else:
            cache.add(k)
    return hits / draws if draws else 0.0


def messages_per_url(n: int, cross_share: float, hit: float, lookup_rpcs: float) -> float:
    """RPCs per discovered URL under the host partition: a link leaves its peer when its host
    is another host (``cross_share``) owned by another peer (1 - 1/N); each such URL costs a
    STORE_TASK (one per URL at this scale: a 50 ms batch window spreads a peer's few links
    over thousands of owners) and, on an owner-cache miss, an iterative lookup."""
    leaves = cross_share * (1 - 1 / n)
    return leaves * (1 + (1 - hit) * lookup_rpcs)


async def simulate(n: int, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    t0 = time.perf_counter()
    out: dict[str, Any] = {"peers": n, "log2_n": round(math.log2(n), 2)}
    # Key-space balance: random IDs against chosen ones.
    rnd = IdSpace([rand_id(rng) for _ in range(n)]).shares()
    ids = balanced_ids(n, rng, args.probes)
    bal = IdSpace(ids).shares()
    out["share_max_mean"] = {
        "random": round(max(rnd.values()) * n, 2),
        "split": round(max(bal.values()) * n, 2),
    }
    # Keys moved per join and per leave (host keys of a large web).
    keys = [key_for(f"host{i}.example") for i in range(args.keys)]
    joins, leaves = [], []
    for _ in range(args.moves):
        joins.append(keys_moved(ids, Grower(ids, args.probes).join(rng), None, keys))
        leaves.append(keys_moved(ids, None, rng.choice(ids), keys))
    out["keys_moved_join"] = round(statistics.fmean(joins), 6)
    out["keys_moved_leave"] = round(statistics.fmean(leaves), 6)
    out["one_over_n"] = round(1 / n, 6)
    # Routing: a converged network, lookups, then churn with real joins, then lookups again.
    net = Net()
    for index, i in enumerate(ids):
        net.add_peer(i, index)
    fill_tables(net, rng, args.sample)
    out["table_size_mean"] = round(
        statistics.fmean(len(p.table.members()) for p in net.peers.values()), 1
    )
    out["lookup"] = await measure_lookups(net, rng, args.lookups)
    for p in net.peers.values():
        p.changes = 0
    churned = max(1, int(n * args.churn))
    victims = rng.sample(list(net.peers), churned)
    for v in victims:
        net.peers[v].alive = False
    joiners = balanced_more(net, churned, rng, args.probes)
    for index, j in enumerate(joiners):
        await join(net, j, n + index, rng)
    out["lookup_after_churn"] = await measure_lookups(net, rng, args.lookups)
    ping_round(net)
    out["lookup_after_ping_round"] = await measure_lookups(net, rng, args.lookups)
    # How often an old peer's table changed per churn event (join or crash).
    olds = [p for i, p in net.peers.items() if p.alive and i not in set(joiners)]
    per_event = statistics.fmean(p.changes for p in olds) / (2 * churned)
    out["table_changes_per_churn_event"] = round(per_event, 4)
    # Churn rate: every peer's session lasts --session-s on average, so N / session events/s.
    clears = per_event * 2 * n / args.session_s
    out["owner_cache"] = {"clears_per_s": round(clears, 3)}
    hit = cache_hit_rate(clears, args.links_per_s, args.hosts, rng, args.cache_seconds)
    out["owner_cache"]["hit_rate"] = round(hit, 3)
    # The same stream with no churn at all: the misses that are first sightings of a host.
    still = cache_hit_rate(0.0, args.links_per_s, args.hosts, rng, args.cache_seconds)
    out["owner_cache"]["hit_rate_without_churn"] = round(still, 3)
    out["messages_per_discovered_url"] = round(
        messages_per_url(n, args.cross_share, hit, out["lookup"]["rpcs_mean"]), 3
    )
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def balanced_more(net: Net, count: int, rng: random.Random, probes: int) -> list[bytes]:
    grower = Grower(net.alive_ids(), probes)
    return [grower.join(rng) for _ in range(count)]


def plot(results: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["peers"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(ns, [r["lookup"]["rounds_mean"] for r in results], "o-", label="rounds, converged")
    a.plot(
        ns,
        [r["lookup_after_churn"]["rounds_mean"] for r in results],
        "s-",
        label="rounds, after churn",
    )
    a.plot(ns, [math.log2(n) for n in ns], "--", color="grey", label="log2 N")
    a.set_xscale("log")
    a.set_xlabel("peers")
    a.set_ylabel("lookup rounds (mean)")
    a.legend()
    b.plot(ns, [r["share_max_mean"]["random"] for r in results], "o-", label="random IDs")
    b.plot(ns, [r["share_max_mean"]["split"] for r in results], "s-", label="split IDs")
    b.set_xscale("log")
    b.set_xlabel("peers")
    b.set_ylabel("max / mean key-space share")
    b.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100,300,1000,3000,10000")
    p.add_argument("--churn", type=float, default=0.1, help="share of peers that crash and join")
    p.add_argument("--lookups", type=int, default=300)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--moves", type=int, default=20)
    p.add_argument("--sample", type=int, default=160, help="random contacts per table")
    p.add_argument("--session-s", type=float, default=3600.0, help="mean peer session")
    p.add_argument("--links-per-s", type=float, default=200.0, help="cross-peer links per peer")
    p.add_argument("--hosts", type=int, default=100_000, help="hosts the links point to")
    p.add_argument("--cross-share", type=float, default=0.25, help="links to another host")
    p.add_argument("--cache-seconds", type=float, default=300.0)
    p.add_argument("--probes", type=int, default=8, help="random lookups a joiner makes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="100, 300 and 1,000 peers")
    p.add_argument("--plot", type=Path, default=DOCS / "simulation.png")
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.sizes, a.lookups, a.moves, a.keys, a.cache_seconds = "100,300,1000", 100, 10, 5000, 60.0
    a.sizes = [int(s) for s in a.sizes.split(",")]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    results = []
    for n in args.sizes:
        r = asyncio.run(simulate(n, args, rng))
        results.append(r)
        lk, lc = r["lookup"], r["lookup_after_churn"]
        print(
            f"N={n:>6}  log2N={r['log2_n']:>5}  rounds {lk['rounds_mean']:.2f} (max "
            f"{lk['rounds_max']}), {lk['rpcs_mean']:.1f} RPCs, owner found {lk['owner_found']:.0%}"
            f" | after {args.churn:.0%} churn: rounds {lc['rounds_mean']:.2f}, "
            f"{lc['rpcs_mean']:.1f} RPCs, owner found {lc['owner_found']:.0%}; after a ping "
            f"round: owner found {r['lookup_after_ping_round']['owner_found']:.0%}",
            flush=True,
        )
        print(
            f"          share max/mean random {r['share_max_mean']['random']} split "
            f"{r['share_max_mean']['split']} | keys moved join {r['keys_moved_join']:.5f} leave "
            f"{r['keys_moved_leave']:.5f} (1/N {r['one_over_n']:.5f}) | owner cache hit "
            f"{r['owner_cache']['hit_rate']:.1%} ({r['owner_cache']['clears_per_s']}/s clears; "
            f"{r['owner_cache']['hit_rate_without_churn']:.1%} without churn) | "
            f"{r['messages_per_discovered_url']} RPCs/discovered URL | {r['seconds']} s",
            flush=True,
        )
    if not args.no_plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
