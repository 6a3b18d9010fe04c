"""Read a ``cluster.py --request-log`` file: who fetched what, when, as the test web saw it.

For each run: each peer's page requests per second (the peers' rates and where each ran
dry), each peer's first robots.txt and first page request (the start), and for the largest
hosts who fetched them and the gaps between their requests longer than ``--gap`` (a host
fetched one request at a time is a serial chain: its gaps are the time it waited).

Usage: python benchmarks/request_log.py FILE [--run K] [--hosts 3] [--gap 0.15]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROBOTS = "/robots.txt"


def report(doc: dict[str, Any], hosts: int, gap: float) -> None:
    names = {addr: f"p{i}" for addr, i in doc["clients"].items()}
    reqs = [(t, h, names.get(c, c), path) for t, h, c, path in doc["requests"]]
    pages = [r for r in reqs if r[3] != ROBOTS]
    print(f"{doc['peers']} peers{'' if doc.get('lend', True) else ' (no lending)'}: "
          f"{len(pages)} page requests, {len(reqs) - len(pages)} robots.txt")  # fmt: skip
    if not pages:
        return
    end = int(max(t for t, *_ in pages)) + 1
    per: dict[str, Counter[int]] = defaultdict(Counter)
    first: dict[str, list[float]] = defaultdict(lambda: [float("inf"), float("inf")])
    for t, _, who, path in reqs:
        slot = 0 if path == ROBOTS else 1
        first[who][slot] = min(first[who][slot], t)
        if slot:
            per[who][int(t)] += 1
    print("  page requests per second, from the seed:")
    for who in sorted(per, key=lambda w: int(w[1:]) if w[1:].isdigit() else 1 << 30):
        row = " ".join(f"{per[who][s]:2d}" for s in range(end))
        print(f"  {who:>4} {row}")
    print("  first robots.txt / page request (s): " + ", ".join(
        f"{w} {r:.2f}/{p:.2f}" for w, (r, p) in sorted(first.items())))  # fmt: skip
    by_host: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for t, h, who, _ in pages:
        by_host[h].append((t, who))
    for h in sorted(by_host, key=lambda k: -len(by_host[k]))[:hosts]:
        rs = by_host[h]
        waits = [(a[0], b[0] - a[0]) for a, b in itertools.pairwise(rs) if b[0] - a[0] > gap]
        who = Counter(w for _, w in rs)
        longest = max(waits, key=lambda w: w[1], default=(0.0, 0.0))
        print(f"  host {h}: {len(rs)} pages, {rs[0][0]:.2f}-{rs[-1][0]:.2f} s, fetched by "
              f"{dict(who.most_common())}; {sum(g for _, g in waits):.1f} s in gaps over "
              f"{gap} s, the longest {longest[1]:.2f} s (from {longest[0]:.2f} s)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("file", type=Path)
    p.add_argument("--run", type=int, help="only this run (0 is the first)")
    p.add_argument("--hosts", type=int, default=3, help="largest hosts to trace")
    p.add_argument("--gap", type=float, default=0.15, help="gaps reported, in seconds")
    a = p.parse_args(argv)
    with a.file.open() as fh:
        docs = [json.loads(line) for line in fh if line.strip()]
    for i, doc in enumerate(docs):
        if a.run is None or a.run == i:
            print(f"run {i}: ", end="")
            report(doc, a.hosts, a.gap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
