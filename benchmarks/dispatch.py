"""Dispatch throughput: how many URL tasks per second one peer can hand to another.

Seed 001 sends every discovered URL to its owner with its own STORE_TASK RPC. This benchmark
runs two CrawlNodes on loopback UDP -- the receiver in a separate process, so sender and
receiver don't share a core -- and measures, in one run:

  (a) one URL per STORE_TASK, awaited one after another, and with 32 RPCs in flight;
  (b) batched: URLs grouped into KeyBatches per host key, each STORE_TASK carrying thousands
      of URLs that the node cuts into compressed chunks of up to 8 KiB, several calls in flight.

URLs/s counts URLs acknowledged by the receiver (StoreResult.new + duplicate), including the
sender's encoding and the receiver's decoding and validation. URL lists are built before the
clock starts. Usage::

    python benchmarks/dispatch.py            # default sizes, about 20 s
    python benchmarks/dispatch.py --quick    # smaller runs
    python benchmarks/dispatch.py --json     # machine-readable result on the last line
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import statistics
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

from protocol import (
    CrawlNode,
    KeyBatch,
    NodeConfig,
    PeerRef,
    StoreResult,
    TaskItem,
    key_for,
    new_node_id,
)

CONFIG = NodeConfig(rpc_timeout=5.0, ping_interval=3600.0, refresh_interval=3600.0)
WORDS = ["news", "sport", "world", "article", "story", "update", "report", "review", "guide"]


class CountingHandler:
    """Receiver: counts URLs and accepts everything (what an owner does before queueing)."""

    def __init__(self) -> None:
        self.urls = 0

    async def handle_store_task(self, sender: PeerRef, batches: list[KeyBatch]) -> StoreResult:
        n = sum(len(b.tasks) for b in batches)
        self.urls += n
        return StoreResult(n, 0, [])

    async def handle_store_backup(
        self, sender: PeerRef, owner: bytes, batches: list[KeyBatch]
    ) -> int:
        return 0

    async def handle_delete_backup(self, sender: PeerRef, owner: bytes, fps: list[int]) -> int:
        return 0

    async def handle_refresh_task(self, sender: PeerRef) -> int:
        return 0

    def peer_added(self, peer: PeerRef) -> None:
        pass

    def peer_removed(self, peer: PeerRef, reason: str) -> None:
        pass


def receiver_main(conn: Connection) -> None:
    async def serve() -> None:
        handler = CountingHandler()
        node = CrawlNode(new_node_id(), handler, CONFIG)
        me = await node.listen_on("127.0.0.1", 0)
        conn.send((me.id, me.port))
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # "stop"
        conn.send({"urls": handler.urls, "dropped": node.stats()["dropped"]})
        await node.aclose()

    asyncio.run(serve())


def make_urls(n: int, hosts: int, seed: int) -> list[tuple[str, str]]:
    """(host, url) pairs that look like links found on news/blog pages, ~90-130 chars."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        host = f"www.site{rng.randrange(hosts)}.example.org"
        slug = "-".join(rng.choices(WORDS, k=rng.randint(3, 6)))
        url = f"https://{host}/{rng.choice(WORDS)}/{2000 + rng.randrange(25)}/{slug}-{i}.html"
        if rng.random() < 0.3:
            url += f"?ref={rng.choice(WORDS)}&utm_source=feed{rng.randrange(100)}"
        out.append((host, url))
    return out


def group(pairs: Sequence[tuple[str, str]]) -> list[KeyBatch]:
    by_host: dict[str, list[TaskItem]] = {}
    for host, url in pairs:
        by_host.setdefault(host, []).append(TaskItem(url, 2, 1))
    return [KeyBatch(key_for(h), tasks) for h, tasks in by_host.items()]


async def one_per_rpc(
    node: CrawlNode, peer: PeerRef, pairs: Sequence[tuple[str, str]], in_flight: int
) -> tuple[float, int]:
    batches = [KeyBatch(key_for(h), [TaskItem(u, 2, 1)]) for h, u in pairs]
    queue = iter(batches)
    acked = 0

    async def worker() -> None:
        nonlocal acked
        for b in queue:
            r = await node.store_task(peer, [b])
            acked += r.new + r.duplicate

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - started, acked


async def batched(
    node: CrawlNode,
    peer: PeerRef,
    pairs: Sequence[tuple[str, str]],
    per_call: int,
    in_flight: int,
) -> tuple[float, int, int]:
    # Like (a), the KeyBatches exist before the clock starts: the crawler builds them as it
    # discovers links; what is measured is moving them.
    calls = [group(pairs[i : i + per_call]) for i in range(0, len(pairs), per_call)]
    queue = iter(calls)
    started = time.perf_counter()
    acked = 0

    async def worker() -> None:
        nonlocal acked
        for batch_list in queue:
            r = await node.store_task(peer, batch_list)
            acked += r.new + r.duplicate

    sent_before = node.stats()["rpc_sent"].get("store_task", 0)  # type: ignore[attr-defined]
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - started
    chunks = node.stats()["rpc_sent"]["store_task"] - sent_before  # type: ignore[index]
    return elapsed, acked, chunks


def line(label: str, urls: int, seconds: float) -> str:
    return f"  {label:<44} {urls:>8} URLs in {seconds:6.2f} s = {urls / seconds:>10,.0f} URLs/s"


async def run(args: argparse.Namespace, peer_id: bytes, port: int) -> dict[str, float]:
    node = CrawlNode(new_node_id(), CountingHandler(), CONFIG)
    await node.listen_on("127.0.0.1", 0)
    peer = PeerRef(peer_id, "127.0.0.1", port)
    try:
        await one_per_rpc(node, peer, make_urls(200, 50, 0), 4)  # warm up both sides

        seq_t, seq_n = await one_per_rpc(node, peer, make_urls(args.single, 500, 1), 1)
        par_t, par_n = await one_per_rpc(node, peer, make_urls(args.single * 4, 500, 2), 32)
        bat_pairs = make_urls(args.batched, args.hosts, 3)
        bat_t, bat_n, chunks = await batched(node, peer, bat_pairs, args.per_call, args.calls)
        latency = node.stats()["latency_ms"]["store_task"]  # type: ignore[index]
    finally:
        await node.aclose()

    seq, par, bat = seq_n / seq_t, par_n / par_t, bat_n / bat_t
    avg_url = statistics.fmean(len(u) for _, u in bat_pairs)
    print("dispatch benchmark: two CrawlNodes on 127.0.0.1, receiver in its own process")
    print(line("(a1) one URL per STORE_TASK, sequential", seq_n, seq_t))
    print(line("(a2) one URL per STORE_TASK, 32 in flight", par_n, par_t))
    print(
        line(f"(b)  batched, {args.per_call} URLs/call, {args.calls} calls in flight", bat_n, bat_t)
    )
    print(
        f"  batched detail: {chunks} chunks, {bat_n / chunks:.0f} URLs/chunk, "
        f"mean URL {avg_url:.0f} chars, {args.hosts} hosts, mean chunk RTT {latency:.2f} ms"
    )
    print(f"  ratio batched / sequential one-per-RPC:    {bat / seq:8.1f}x")
    print(f"  ratio batched / 32-in-flight one-per-RPC:  {bat / par:8.1f}x")
    print(
        f"  target batched >= 50x sequential one-per-RPC: {'met' if bat >= 50 * seq else 'MISSED'}"
    )
    print(f"  target batched >= 50,000 URLs/s:              {'met' if bat >= 50_000 else 'MISSED'}")
    return {
        "one_per_rpc_sequential_urls_s": round(seq),
        "one_per_rpc_32_in_flight_urls_s": round(par),
        "batched_urls_s": round(bat),
        "ratio_vs_sequential": round(bat / seq, 1),
        "ratio_vs_32_in_flight": round(bat / par, 1),
        "urls_per_chunk": round(bat_n / chunks),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=3000, help="URLs for (a1); (a2) sends 4x")
    parser.add_argument("--batched", type=int, default=500_000, help="URLs for (b)")
    parser.add_argument("--hosts", type=int, default=2000, help="distinct hosts in (b)")
    parser.add_argument("--per-call", type=int, default=10_000, help="URLs per batched call")
    parser.add_argument("--calls", type=int, default=4, help="batched calls in flight")
    parser.add_argument("--quick", action="store_true", help="small sizes (a few seconds)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = parser.parse_args(argv)
    if args.quick:
        args.single, args.batched = 1000, 100_000

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    receiver = ctx.Process(target=receiver_main, args=(there,), daemon=True)
    receiver.start()
    try:
        peer_id, port = here.recv()
        result = asyncio.run(run(args, peer_id, port))
        here.send("stop")
        report = here.recv()
        print(f"  receiver counted {report['urls']} URLs, dropped datagrams: {report['dropped']}")
    finally:
        receiver.join(timeout=10)
        if receiver.is_alive():
            receiver.terminate()
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
