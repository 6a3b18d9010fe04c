"""Benchmark the done record: SQLite on disk behind the in-RAM DSBF (docs/references.md).

    python benchmarks/done_record.py              # 10 M URLs (a few minutes)
    python benchmarks/done_record.py --n 1000000  # quick run

Prints insert throughput and group-commit ratio, Bloom check rates for seen and unseen URLs
(``maybe_contains`` one at a time and ``contains_many``), exact ``contains`` rates (unseen:
answered by the filter; seen: one disk probe each), RAM bytes per URL (filter bits, plus the
real RSS growth of a fresh process that rebuilds the filter), disk bytes per URL, the
measured false-positive rate against the target f_max, and the DSBF's shape.

Targets: >= 500,000 unseen checks/s, <= 2 bytes/URL of filter RAM and <= 24 bytes/URL on
disk at 10 M URLs. URLs are synthetic (``https://host{h}.example/page/{i}``, 200 per host)
and fingerprinted with xxh64 as the crawler does; host keys are SHA-1 of the host name.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import xxhash

from storage import DoneRecord, SplittableBloom

URLS_PER_HOST = 200
UNSEEN_BASE = 1 << 40  # URL numbers from here on are never inserted


def url_fp(i: int, hosts: int) -> tuple[int, int]:
    """(host number, fingerprint) of synthetic URL number i."""
    h = i % hosts
    return h, xxhash.xxh64_intdigest(f"https://host{h}.example/page/{i}".encode())


def host_keys(hosts: int) -> list[bytes]:
    return [hashlib.sha1(f"host{h}.example".encode()).digest() for h in range(hosts)]


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM).

    Not ``resource.getrusage().ru_maxrss``: Linux carries that peak over from the parent
    across fork and exec, so a child would report the benchmark parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rss_bytes() -> int:
    return status_bytes("VmRSS")


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f}/s"


async def insert(record: DoneRecord, n: int, hosts: int, batch: int, writers: int) -> float:
    keys = host_keys(hosts)

    async def writer(w: int) -> None:
        for start in range(w * batch, n, writers * batch):
            items = []
            for i in range(start, min(start + batch, n)):
                h, fp = url_fp(i, hosts)
                items.append((keys[h], fp))
            await record.add(items)

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    return time.perf_counter() - t0


async def measure(args: argparse.Namespace, path: Path) -> None:
    n, hosts = args.n, max(1, args.n // URLS_PER_HOST)
    keys = host_keys(hosts)
    # --expected below --n makes the filter grow by DSBF splits while the record fills.
    record = await DoneRecord.open(path, expected=args.expected or n, fp_rate=args.fp_rate)
    try:
        calls_before = record.commits
        seconds = await insert(record, n, hosts, args.batch, args.writers)
        batches = -(-n // args.batch)
        print(f"insert {n:,} URLs    {rate(n, seconds)}  ({seconds:.1f} s)")
        print(
            f"group commit         {batches:,} add calls -> {record.commits - calls_before:,}"
            f" commits ({args.writers} concurrent writers, {args.batch} URLs per call)"
        )
        for _ in range(100_000):  # a split finishing in the background, if one started
            if not record.splitting:
                break
            await asyncio.sleep(0.1)
        assert await record.count() == n, "duplicate fingerprints in the synthetic set?"

        probes = min(args.probes, n)
        step = max(1, n // probes)
        seen = [url_fp(i, hosts) for i in range(0, n, step)][:probes]
        unseen = [url_fp(UNSEEN_BASE + i, hosts) for i in range(probes)]
        seen_fps = [fp for _, fp in seen]
        unseen_fps = [fp for _, fp in unseen]
        maybe = record.maybe_contains
        bloom = record.bloom

        t0 = time.perf_counter()
        hits = sum(1 for fp in seen_fps if maybe(fp))
        t_seen = time.perf_counter() - t0
        assert hits == len(seen_fps), "false negative"
        t0 = time.perf_counter()
        bloom.contains_many(seen_fps)
        t_seen_many = time.perf_counter() - t0
        t0 = time.perf_counter()
        false_hits = sum(1 for fp in unseen_fps if maybe(fp))
        t_unseen = time.perf_counter() - t0
        t0 = time.perf_counter()
        bloom.contains_many(unseen_fps)
        t_unseen_many = time.perf_counter() - t0
        print(
            f"seen   maybe_contains {rate(probes, t_seen)}   "
            f"contains_many {rate(probes, t_seen_many)}"
        )
        print(
            f"unseen maybe_contains {rate(probes, t_unseen)}   contains_many "
            f"{rate(probes, t_unseen_many)}   (target >= 500,000/s)"
        )

        exact = min(probes, args.exact)
        t0 = time.perf_counter()
        for s in range(0, exact, 1_000):
            await record.contains([(keys[h], fp) for h, fp in unseen[s : s + 1_000]])
        t_exact_unseen = time.perf_counter() - t0
        t0 = time.perf_counter()
        for s in range(0, exact, 1_000):
            flags = await record.contains([(keys[h], fp) for h, fp in seen[s : s + 1_000]])
            assert all(flags)
        t_exact_seen = time.perf_counter() - t0
        print(
            f"exact contains       unseen {rate(exact, t_exact_unseen)}   seen (disk) "
            f"{rate(exact, t_exact_seen)}   (batches of 1,000)"
        )

        fp_measured = false_hits / probes
        print(
            f"false positives      {fp_measured:.5%} measured over {probes:,} unseen URLs"
            f"   (target f_max {args.fp_rate:.3%})"
        )
        print(f"DSBF                 height {bloom.height}, {bloom.leaves} leaves")
        print(
            f"filter RAM           {bloom.nbytes / n:.2f} bytes/URL"
            f" ({bloom.nbytes:,} bytes of filter bits)"
        )
    finally:
        await record.aclose()


def rss_child(path: Path, n: int, fp_rate: float) -> None:
    """Run in a fresh process: RSS growth of (a) a bare DSBF holding the n fingerprints,
    (b) reopening the done record, which rebuilds its filter from disk."""
    hosts = max(1, n // URLS_PER_HOST)
    # Warm the interpreter's free lists for the per-URL temporaries first, and feed the
    # filter from a generator, so the growth measured is the filter and not our scaffolding.
    sum(url_fp(i, hosts)[1] & 1 for i in range(10_000))
    gc.collect()
    base = rss_bytes()
    capacity = min(1 << 20, n)
    # Sized exactly as DoneRecord.open(expected=n) sizes its filter.
    bloom = SplittableBloom(capacity, fp_rate, 3, root_fanout=-(-n // capacity))
    bloom.add_many(url_fp(i, hosts)[1] for i in range(n))
    gc.collect()
    bare = rss_bytes() - base
    del bloom
    gc.collect()

    async def reopen() -> tuple[int, float]:
        before = rss_bytes()
        t0 = time.perf_counter()
        record = await DoneRecord.open(path, expected=n, fp_rate=fp_rate)
        seconds = time.perf_counter() - t0
        gc.collect()
        grown = rss_bytes() - before
        await record.aclose()
        return grown, seconds

    grown, seconds = asyncio.run(reopen())
    print(
        json.dumps(
            {"bare": bare, "reopen": grown, "reopen_s": seconds, "peak": status_bytes("VmHWM")}
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000_000, help="URLs to record")
    parser.add_argument(
        "--expected", type=int, help="DoneRecord.open(expected=...) (default: --n, no splits)"
    )
    parser.add_argument("--fp-rate", type=float, default=0.001, help="f_max of the filter")
    parser.add_argument("--batch", type=int, default=2_000, help="URLs per add() call")
    parser.add_argument("--writers", type=int, default=4, help="concurrent add() callers")
    parser.add_argument("--probes", type=int, default=1_000_000, help="lookups per check")
    parser.add_argument("--exact", type=int, default=100_000, help="exact contains() probes")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--rss-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child is not None:
        rss_child(args.rss_child, args.n, args.fp_rate)
        return

    work = Path(tempfile.mkdtemp(prefix="done-bench-", dir=args.dir))
    path = work / "done.sqlite3"
    try:
        print(f"done record benchmark: n={args.n:,}, f_max={args.fp_rate}, file {path}")
        asyncio.run(measure(args, path))
        disk = sum(p.stat().st_size for p in work.iterdir())
        print(f"disk                 {disk / args.n:.2f} bytes/URL ({disk:,} bytes; target <= 24)")
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--rss-child",
                str(path),
                "--n",
                str(args.n),
                "--fp-rate",
                str(args.fp_rate),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        rss = json.loads(child.stdout.strip().splitlines()[-1])
        print(
            f"RAM (RSS growth)     bare DSBF {rss['bare'] / args.n:.2f} bytes/URL (target <= 2);"
            f" reopened record {rss['reopen'] / args.n:.2f} bytes/URL incl. SQLite cache"
        )
        print(f"reopen               {rss['reopen_s']:.1f} s (quick_check + filter rebuild)")
        print(f"peak RSS             {rss['peak'] / 2**20:.0f} MiB (the RSS-measuring process)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
