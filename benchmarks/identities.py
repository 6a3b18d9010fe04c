"""Issue 35: what node IDs made from keys cost an open network, and what they cost an attacker.

An open network's peers hold Ed25519 keys, sign their crawl RPCs, and take node IDs derived
from their key through a crypto puzzle, of which they choose only the leading bits that put
them into a region (``protocol.nodekey``, docs/security.md). Three figures, each against a
baseline run in the same process:

1. **CPU per datagram.** One crawl RPC (a STORE_TASK of 40 links, and QUIET) called over
   loopback between two nodes in this process, many times: CPU seconds of the process per
   call, on an open wire with keys (signed requests, checked signatures), against a keyed
   wire (HMAC) and an open wire without keys (what open networks ran before).
2. **Join time.** A peer joins a one-peer network (``Peer.start`` with a bootstrap: survey,
   ID, admission and the ID's proof), open with keys against keyed, rounds interleaved; the
   puzzle of a fresh key (made once per data directory) is timed apart.
3. **Placing an ID.** An ID may choose ``ceil(log2 N) + 4`` leading bits in a network of
   about N nodes; every bit beyond costs the attacker twice the puzzles, since each solution
   of the puzzle is one draw of the bits it does not choose. Measured: puzzles solved per
   second here, and the bits matched by drawing at a low work setting (checking the
   ``2**b`` law); printed: the attacker's expected time to sit within a distance of a target
   key (sharing ``d`` leading bits with it) in networks of 8 to 10,000 peers.

Usage: python benchmarks/identities.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

WORK_BITS = 16  # protocol.nodekey.DEFAULT_WORK_BITS
SECRET = "benchmark-network-key"


# --- 1. CPU per datagram ----------------------------------------------------------------------


async def _rpc_cpu(kind: str, calls: int) -> dict[str, float]:
    """CPU seconds per call of STORE_TASK and QUIET between two nodes of this process."""
    from protocol import (
        QUIET,
        CrawlNode,
        KeyBatch,
        NoArgs,
        NodeConfig,
        NodeKey,
        PeerRef,
        QuietReply,
        TaskItem,
        key_for,
        new_node_id,
    )
    from protocol.serving import NoWork

    async def quiet(sender: PeerRef, args: NoArgs) -> QuietReply:
        return QuietReply(quiet=True, done=0)

    def config() -> NodeConfig:
        if kind == "keyed":
            return NodeConfig(secret=SECRET, min_owner_age=0.0)
        key = NodeKey.generate(WORK_BITS) if kind == "open+keys" else None
        return NodeConfig(key=key, min_owner_age=0.0)

    nodes = []
    for _ in range(2):
        cfg = config()
        node_id = cfg.key.node_id() if cfg.key is not None else new_node_id()
        node = CrawlNode(node_id, NoWork(), cfg)  # refuses the tasks, once it has read them
        node.serve(QUIET, quiet)
        await node.listen_on("127.0.0.1", 0)
        nodes.append(node)
    a, b = nodes
    try:
        await b.join([a.me.addr])
        for _ in range(100):
            if a.peers() and b.peers():
                break
            await asyncio.sleep(0.05)
        assert a.peers() and b.peers(), "the two nodes never counted each other"
        key = key_for("bench.example")
        out: dict[str, float] = {}
        for name in ("store_task", "quiet"):
            start = time.process_time()
            for i in range(calls):
                if name == "store_task":
                    batch = KeyBatch(
                        key, [TaskItem(f"http://bench.example/{i}/{j}.html", 2) for j in range(40)]
                    )
                    await b.store_task(a.me, [batch])
                else:
                    await b.calls.quiet(a.me)
            out[name] = (time.process_time() - start) / calls
        return out
    finally:
        for node in nodes:
            await node.aclose()


def cpu_per_datagram(rounds: int, calls: int) -> None:
    kinds = ("open", "keyed", "open+keys")
    got: dict[str, dict[str, list[float]]] = {k: {"store_task": [], "quiet": []} for k in kinds}
    for _ in range(rounds):  # interleaved: a noisy machine slows all three alike
        for kind in kinds:
            for name, s in asyncio.run(_rpc_cpu(kind, calls)).items():
                got[kind][name].append(s)
    print(f"\n1. CPU per call (both ends, one process; median of {rounds} rounds of {calls}):")
    print(f"   {'wire':<10} {'STORE_TASK':>12} {'QUIET':>10}")
    med = {k: {n: statistics.median(v) for n, v in got[k].items()} for k in kinds}
    for kind in kinds:
        row = med[kind]
        print(f"   {kind:<10} {row['store_task'] * 1e6:>9.0f} us {row['quiet'] * 1e6:>7.0f} us")
    for base in ("open", "keyed"):
        ratios = [med["open+keys"][n] / med[base][n] for n in ("store_task", "quiet")]
        print(f"   open+keys / {base}: STORE_TASK {ratios[0]:.2f}x, QUIET {ratios[1]:.2f}x")


# --- 2. join time -----------------------------------------------------------------------------


async def _join_time(root: Path, keyed: bool) -> float:
    from p2pcrawl.network import Peer, PeerConfig
    from p2pcrawl.settings import PeerSettings

    ps = PeerSettings(secret=SECRET if keyed else "", min_peer_age=0.5)
    founder = Peer(PeerConfig(data_dir=root / "a", peer=ps))
    await founder.start()
    try:
        joiner = Peer(PeerConfig(data_dir=root / "b", bootstrap=(founder.me.addr,), peer=ps))
        start = time.perf_counter()
        await joiner.start()
        took = time.perf_counter() - start
        await joiner.aclose()
        return took
    finally:
        await founder.aclose()


def join_time(rounds: int) -> None:
    from protocol import NodeKey

    times: dict[str, list[float]] = {"keyed": [], "open+keys": []}
    for _ in range(rounds):
        for kind in times:
            with tempfile.TemporaryDirectory() as tmp:
                times[kind].append(asyncio.run(_join_time(Path(tmp), kind == "keyed")))
    puzzle = []
    for _ in range(max(5, rounds * 2)):
        start = time.perf_counter()
        NodeKey.generate(WORK_BITS)
        puzzle.append(time.perf_counter() - start)
    keyed, opened = (statistics.median(times[k]) for k in ("keyed", "open+keys"))
    print(f"\n2. Join time (Peer.start with a bootstrap, median of {rounds}):")
    print(f"   keyed {keyed:.2f} s, open with keys {opened:.2f} s: {opened / keyed:.2f}x")
    print(
        f"   a fresh key's puzzle ({WORK_BITS} bits, once per data directory, included above): "
        f"median {statistics.median(puzzle):.3f} s, max {max(puzzle):.3f} s"
    )


# --- 3. placing an ID -------------------------------------------------------------------------


def _draws_to_match(bits: int, extra: int, trials: int) -> float:
    """Puzzles solved on average before the unchosen bits match a target in ``extra``
    further leading bits (work ``bits``), over ``trials`` targets."""
    import secrets

    from protocol.nodekey import NodeKey, material, place, solve

    key = NodeKey.generate(bits)
    free = 8
    draws: list[int] = []
    for _ in range(trials):
        target = secrets.token_bytes(20)
        nonce, n = 0, 0
        while True:
            nonce = solve(key.public, bits, nonce)
            n += 1
            node_id = place(material(key.public, nonce), target, free)
            shared = (
                160 - (int.from_bytes(node_id, "big") ^ int.from_bytes(target, "big")).bit_length()
            )
            if shared >= free + extra:
                break
            nonce += 1
        draws.append(n)
    return statistics.mean(draws)


def placing(quick: bool) -> None:
    from protocol.nodekey import NodeKey, max_free_bits, solve

    key = NodeKey.generate(0)
    count, start, nonce = 0, time.perf_counter(), 0
    budget = 2.0 if quick else 6.0
    while time.perf_counter() - start < budget:
        nonce = solve(key.public, WORK_BITS, nonce) + 1
        count += 1
    per_s = count / (time.perf_counter() - start)
    print(f"\n3. Placing an ID: {per_s:.1f} puzzle solutions/s here ({WORK_BITS} bits, one core)")
    trials = 20 if quick else 60
    print(f"   drawing at 6 work bits, mean puzzles to match b more bits ({trials} targets each):")
    for extra in (2, 4, 6):
        mean = _draws_to_match(6, extra, trials)
        print(f"     b={extra}: {mean:.1f} (2**b = {2**extra})")
    print("   expected time to share d leading bits with a chosen key (hours unless marked):")
    ds = (16, 24, 32, 40, 64)
    print(f"   {'peers':>7} {'free':>5} " + " ".join(f"{'d=' + str(d):>10}" for d in ds))
    for n in (8, 100, 1000, 10_000):
        free = max_free_bits(n)
        cells = []
        for d in ds:
            seconds = 2 ** max(0, d - free) / per_s
            cells.append(f"{seconds:>9.1f}s" if seconds < 3600 else f"{seconds / 3600:>9.3g}h")
        print(f"   {n:>7} {free:>5} " + " ".join(cells))
    print(
        "   owning a chosen host takes about log2(N) + 1 shared bits, within the free ones:"
        " one puzzle (docs/security.md)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    print(f"issue 35: node IDs from keys (work bits {WORK_BITS})")
    cpu_per_datagram(rounds, 100 if args.quick else 300)
    join_time(rounds)
    placing(args.quick)


if __name__ == "__main__":
    main()
