"""Cost growth of one peer as its queue and its done record grow (issue 14, item 4).

    python benchmarks/cost_growth.py           # queue and done record up to 10^7
    python benchmarks/cost_growth.py --quick   # queue 10^4 and 10^5, done record 10^5 (~15 s)

A size whose fill would take the run past ``--budget`` seconds (600) is skipped and named
in the output and the JSON (``queue_skipped``, ``done_skipped``): on a 2-core machine the
10^7 queue took about 15 minutes to fill (guessed n^1.4 from the 10^6 fill), so the
default run stopped at 10^6 there;
``--budget 3000`` measures it.

For each queue size the task store (``p2pcrawl.crawl.Ledger`` over ``storage.TaskStore``) is
filled with synthetic canonical URLs across many hosts, in batches, as intake would. Then,
in interleaved rounds (each round visits every size once, so drift on a shared 2-core machine
hits all sizes alike), the queue operations the engine performs for each page are run
through the real ``Ledger`` with that queue behind it: refill loads in store order through
the cursor (``refill.LOAD_BATCH`` at a time), ``accept`` of the page's links (some new, some
already queued, so the UNIQUE index on the fingerprint is probed both ways) from concurrent
workers (group commit), and ``finish`` (done record first, then the delete). It measures
the process CPU per page (the stores' SQLite worker threads included) and RSS
(/proc/self/status VmRSS). It does not fetch: the fetch, parse and WARC cost of a page does
not depend on the queue size (benchmarks/single_peer.py measures it), and a crawl from a
loopback test web cannot reach 10^7 queued URLs on synthetic hosts without fetching them.

The done record's cost per check reuses benchmarks/done_record.py (its synthetic URLs,
fingerprints and concurrent insert), at 10^5, 10^6 and 10^7 fingerprints.

Prints ratios against the smallest size measured in this run, the median and range of the
rounds, and one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from done_record import UNSEEN_BASE, host_keys, insert, rss_bytes, url_fp

from p2pcrawl.crawl import Ledger, Task
from p2pcrawl.crawl.links import make_task
from p2pcrawl.crawl.refill import LOAD_BATCH
from storage import DoneRecord

URLS_PER_HOST = 200  # as done_record.py: 10^7 URLs are 50,000 hosts
FILL_BATCH = 5_000
NEW_LINKS = 4  # links per page that are new to the queue
OLD_LINKS = 4  # links per page already queued (the store's UNIQUE fingerprint drops them)
WORKERS = 16  # concurrent pages, as the engine's default concurrency order of magnitude


def files_bytes(directory: Path, pattern: str, remove: bool = False) -> int:
    """Bytes of the files matching ``pattern`` (a store and its WAL), removed if asked."""
    total = 0
    for p in directory.glob(pattern):
        total += p.stat().st_size
        if remove:
            p.unlink()
    return total


def queue_url(i: int, hosts: int) -> str:
    return f"http://host{i % hosts}.example/q/{i}"


def queue_task(i: int, hosts: int) -> Task:
    return make_task(queue_url(i, hosts), 1, "host")


def in_ram_bytes_per_task(sample: int = 20_000) -> float:
    """What holding the queue as Python Task objects would cost per URL (measured, not
    guessed): RSS growth of a list of that many tasks."""
    gc.collect()
    before = rss_bytes()
    held = [queue_task(10**12 + i, 50_000) for i in range(sample)]
    gc.collect()
    grown = rss_bytes() - before
    del held
    return max(grown, 1) / sample


async def fill(ledger: Ledger, n: int, hosts: int) -> float:
    t0 = time.process_time()
    for start in range(0, n, FILL_BATCH):
        batch = [queue_task(i, hosts) for i in range(start, min(start + FILL_BATCH, n))]
        added = await ledger.accept(batch)
        assert len(added) == len(batch)
    return time.process_time() - t0


class Size:
    def __init__(self, n: int, work: Path) -> None:
        self.n = n
        self.hosts = max(1, n // URLS_PER_HOST)
        self.dir = work / f"q{n}"
        self.next_new = n  # URL numbers past the filled range are new links
        self.cpu_per_page: list[float] = []
        self.rss: list[int] = []
        self.ledger: Ledger | None = None
        self.rss_before = 0
        self.rss_after_fill = 0
        self.fill_cpu_s = 0.0
        self.fill_wall_s = 0.0
        self.disk_bytes = 0
        self.task_disk_bytes = 0

    async def open_and_fill(self) -> None:
        gc.collect()
        self.rss_before = rss_bytes()
        self.ledger = await Ledger.open(self.dir)
        self.fill_cpu_s = await fill(self.ledger, self.n, self.hosts)
        gc.collect()
        self.rss_after_fill = rss_bytes()

    async def round(self, pages: int) -> None:
        """The engine's queue work for ``pages`` pages: load, accept links, finish."""
        ledger = self.ledger
        assert ledger is not None
        gc.collect()
        t0 = time.process_time()
        loaded: list[Task] = []
        while len(loaded) < pages:
            rows = await ledger.load(min(LOAD_BATCH, pages - len(loaded)))
            assert rows, "queue ran dry"
            loaded += [t for _, t in rows]
        queue = iter(loaded)
        # Queued but not yet loaded: URL numbers from the cursor to the end of the fill.
        ahead = ledger.cursor
        left = max(1, self.n - ahead)

        async def worker() -> None:
            for task in queue:
                first = self.next_new
                self.next_new += NEW_LINKS
                links = [queue_task(i, self.hosts) for i in range(first, first + NEW_LINKS)]
                # Already-queued links: spread over the whole store, as links to other hosts'
                # pages would be.
                links += [
                    queue_task(ahead + (first * 7919 + k * 104729) % left, self.hosts)
                    for k in range(OLD_LINKS)
                ]
                await ledger.accept(links)
                await ledger.finish([task])

        await asyncio.gather(*(worker() for _ in range(WORKERS)))
        self.cpu_per_page.append((time.process_time() - t0) / pages)
        self.rss.append(rss_bytes())

    async def close(self) -> None:
        if self.ledger is not None:
            await self.ledger.aclose()
        self.disk_bytes = await asyncio.to_thread(files_bytes, self.dir, "*")
        self.task_disk_bytes = await asyncio.to_thread(files_bytes, self.dir, "tasks.sqlite3*")


async def done_checks(n: int, work: Path, probes: int, exact: int, rounds: int) -> dict[str, Any]:
    """Per-check cost of the done record holding n fingerprints (done_record.py's data)."""
    hosts = max(1, n // URLS_PER_HOST)
    keys = host_keys(hosts)
    path = work / f"done{n}.sqlite3"
    record = await DoneRecord.open(path, expected=n)
    try:
        await insert(record, n, hosts, 2_000, 4)
        probes = min(probes, n)
        step = max(1, n // probes)
        seen = [url_fp(i, hosts) for i in range(0, n, step)][:probes]
        unseen = [url_fp(UNSEEN_BASE + i, hosts) for i in range(probes)]
        maybe = record.maybe_contains
        exact = min(exact, probes)
        unseen_ns: list[float] = []
        seen_us: list[float] = []
        # Repeated rounds on the same record (sizes cannot interleave here: a 10^7 record
        # is built, measured and removed before the next).
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _, fp in unseen:
                maybe(fp)
            unseen_ns.append((time.perf_counter() - t0) / probes * 1e9)
            t0 = time.perf_counter()
            for s in range(0, exact, 1_000):
                batch = [(keys[h], fp) for h, fp in seen[s : s + 1_000]]
                flags = await record.contains(batch)
                assert all(flags)
            seen_us.append((time.perf_counter() - t0) / exact * 1e6)
    finally:
        await record.aclose()
    disk = await asyncio.to_thread(files_bytes, work, f"done{n}.sqlite3*", True)
    return {
        "fingerprints": n,
        "unseen_check_ns": round(statistics.median(unseen_ns), 1),
        "unseen_check_ns_range": [round(min(unseen_ns), 1), round(max(unseen_ns), 1)],
        "seen_check_us": round(statistics.median(seen_us), 2),
        "seen_check_us_range": [round(min(seen_us), 2), round(max(seen_us), 2)],
        "disk_bytes_per_fp": round(disk / n, 2),
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    per_task_ram = in_ram_bytes_per_task()
    sizes = [Size(n, work) for n in args.queue]
    measured: list[Size] = []
    skipped: list[int] = []
    started = time.monotonic()
    for s in sizes:
        if measured:
            # Filling grows faster than n once the fingerprint index outgrows the page cache
            # (random inserts): guess n^1.4 from the last fill's wall time, and skip a size
            # whose fill alone would take the run past its budget, saying so.
            prev = measured[-1]
            guess = prev.fill_wall_s * (s.n / prev.n) ** 1.4
            if time.monotonic() - started + guess > args.budget:
                skipped.append(s.n)
                print(f"queue {s.n:>12,}  skipped: its fill would take about {guess:.0f} s")
                continue
        t0 = time.monotonic()
        await s.open_and_fill()
        s.fill_wall_s = time.monotonic() - t0
        print(
            f"queue {s.n:>12,}  filled in {s.fill_wall_s:6.1f} s ({s.fill_cpu_s:.1f} s CPU);"
            f" RSS +{(s.rss_after_fill - s.rss_before) / 2**20:7.1f} MiB",
            flush=True,
        )
        measured.append(s)
    try:
        for _ in range(args.rounds):
            for s in measured:
                await s.round(args.pages)
    finally:
        for s in measured:
            await s.close()

    base = measured[0]
    base_cpu = statistics.median(base.cpu_per_page)
    queue_rows: list[dict[str, Any]] = []
    print(f"\nqueue operations per page ({args.rounds} interleaved rounds of {args.pages} pages)")
    for s in measured:
        cpu = spread([c * 1e6 for c in s.cpu_per_page])
        fill_growth = s.rss_after_fill - s.rss_before
        in_ram = per_task_ram * s.n
        row = {
            "queue": s.n,
            "hosts": s.hosts,
            "cpu_us_per_page": {k: round(v, 1) for k, v in cpu.items()},
            "cpu_ratio": round(statistics.median(s.cpu_per_page) / base_cpu, 2),
            "rss_mib": round(max(s.rss) / 2**20, 1),
            "rss_growth_fill_mib": round(fill_growth / 2**20, 1),
            "queue_in_ram_mib": round(in_ram / 2**20, 1),
            "rss_growth_share_of_in_ram": round(fill_growth / in_ram, 4),
            "disk_bytes_per_url": round(s.disk_bytes / s.n, 1),
            "task_store_bytes_per_url": round(s.task_disk_bytes / s.n, 1),
        }
        queue_rows.append(row)
        print(
            f"queue {s.n:>12,}  CPU {cpu['median']:7.1f} us/page"
            f" [{cpu['min']:.1f}-{cpu['max']:.1f}]  x{row['cpu_ratio']:.2f}"
            f"  RSS {row['rss_mib']:7.1f} MiB (fill +{row['rss_growth_fill_mib']:.1f};"
            f" in RAM it would be {row['queue_in_ram_mib']:.0f})"
            f"  disk {row['disk_bytes_per_url']:.0f} B/URL"
            f" (task store {row['task_store_bytes_per_url']:.0f})"
        )
    for n in skipped:
        print(f"queue {n:>12,}  not measured: its fill would pass the {args.budget:.0f} s budget")

    done_rows: list[dict[str, Any]] = []
    skipped_done: list[int] = []
    last_insert = 0.0
    print("\ndone record cost per check")
    done_started = time.monotonic()
    for n in args.done:
        if done_rows and time.monotonic() - done_started + last_insert * 10 > args.budget:
            # Inserting is about linear in n (done_record.py): a tenfold size, tenfold time.
            print(f"done  {n:>12,}  skipped: its insert would pass the {args.budget:.0f} s budget")
            skipped_done.append(n)
            continue
        t0 = time.monotonic()
        checks = await done_checks(n, work, args.probes, args.exact, args.rounds)
        last_insert = time.monotonic() - t0
        done_rows.append(checks)
        b = done_rows[0]
        print(
            f"done  {n:>12,}  unseen (Bloom) {checks['unseen_check_ns']:6.0f} ns"
            f" {checks['unseen_check_ns_range']}"
            f" x{checks['unseen_check_ns'] / b['unseen_check_ns']:.2f}"
            f"   seen (disk) {checks['seen_check_us']:6.2f} us {checks['seen_check_us_range']}"
            f" x{checks['seen_check_us'] / b['seen_check_us']:.2f}"
            f"   disk {checks['disk_bytes_per_fp']:.1f} B/fp",
            flush=True,
        )
    return {
        "benchmark": "cost_growth",
        "rounds": args.rounds,
        "pages_per_round": args.pages,
        "in_ram_bytes_per_task": round(per_task_ram, 1),
        "queue": queue_rows,
        "queue_skipped": skipped,
        "done": done_rows,
        "done_skipped": skipped_done,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="queue 10^4, 10^5; done record 10^5")
    p.add_argument("--queue", type=int, nargs="+", help="queue sizes")
    p.add_argument("--max-queue", type=int, default=10**7, help="largest default size")
    p.add_argument("--done", type=int, nargs="*", help="done-record sizes")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--pages", type=int, default=2_000, help="pages per round")
    p.add_argument("--probes", type=int, default=200_000, help="Bloom checks per size")
    p.add_argument("--exact", type=int, default=20_000, help="disk checks per size")
    p.add_argument(
        "--budget",
        type=float,
        default=600.0,
        help="seconds for the fills, and for the done records",
    )
    p.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = p.parse_args(argv)
    if args.queue is None:
        top = 100_000 if args.quick else args.max_queue
        args.queue = [10**e for e in range(4, 8) if 10**e <= top]
    if args.done is None:
        args.done = [100_000] if args.quick else [100_000, 1_000_000, 10_000_000]
    if args.quick:
        args.rounds = min(args.rounds, 3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cost-growth-", dir=args.dir))
    try:
        result = asyncio.run(run(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
