"""A fixed piece of pure-Python work, timed in thread CPU time while a benchmark runs.

The machines are shared: the same single-peer crawl measured 3.0 to 4.8 ms of CPU per page
in runs minutes apart, so a CPU-per-page figure taken from one run and compared with one
from another compares the machine's moods as much as the code. This probe does the same
small job (dict, string and list work of the kind a peer does per page, about 2 ms) every
``--every`` seconds and reports the median CPU time it took: a run's CPU per page divided by
its probe figure is in units of "probe jobs", comparable across runs of one invocation.

It costs about 1% of one core. Prints one JSON line when stdin closes or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import threading
import time


def job(n: int = 2000) -> int:
    table: dict[str, int] = {}
    acc = 0
    for i in range(n):
        key = f"http://198.19.{i & 255}.{i >> 8}/p{i}"
        table[key] = len(key)
        acc += table[key] ^ hash(key[-6:])
    parts = sorted(table, key=len)[:50]
    return acc + len(",".join(parts))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=float, default=0.2)
    args = p.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    samples: list[float] = []
    while not stop.is_set():
        t = time.thread_time()
        job()
        samples.append(time.thread_time() - t)
        stop.wait(args.every)
    med = statistics.median(samples) if samples else 0.0
    print(json.dumps({"probe_us": round(1e6 * med, 1), "samples": len(samples)}), flush=True)


if __name__ == "__main__":
    main()
