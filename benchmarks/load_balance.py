"""Load balance: how evenly N peers share the pages of a many-host web, before and after.

No sockets: the peers are node IDs, and who owns what comes from the project's own ownership
code (``protocol.balance.IdSpace.owner``, which the tests hold equal to
``protocol.ownership.closest``). The web is ``_zipfweb.ZipfWeb``: thousands of hosts whose page
counts follow Zipf's law. Each page's key is that of ``--partition host`` (the host) or
``--partition url`` (the URL), as the crawler computes it.

Three ways of giving N peers their IDs, each grown one join at a time up to the largest N:

random      every peer draws a random ID (what a new peer did before)
split       each joiner halves the largest region it knows of (``choose_join_id``): the key
            space alone, which is all a peer knows when it joins before the crawl starts
split+load  each joiner halves the most loaded peer, on the bit that divides that peer's pages
            most evenly (``choose_join_id`` with loads and ``bit_loads``): joining a crawl under
            way, when the owners know their hosts' page counts
plan        a reference, not something a joiner can do: all N IDs chosen at once, knowing
            every host's pages, as the best of a search over ID tries whose regions split in
            any ratio of peers (k1 : k - k1), not only in halves one join at a time
            (``plan_ids``; N <= 8 only: the search grows fast with N)

Reported per N, over ``--seeds`` webs and ID draws: WebGather's load-balance metric (the
variance of the peers' normalised shares of pages, shares summing to 1) and max/mean share,
as median and range. Target: max/mean <= 1.25 at 8 peers with the host partition.

Usage: python benchmarks/load_balance.py [--quick] [--hosts N] [--exponent S] [--seeds K]
       [--plot docs/load_balance.png]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _zipfweb import ZipfWeb

from protocol.balance import IdSpace, bit_loads, choose_join_id
from protocol.ownership import key_for

SCHEMES = ("random", "split", "split+load", "plan")
PLAN_MAX_N = 8
PLAN_BITS = 2  # split bits tried per ratio and side in the plan search
PARTITIONS = ("host", "url")
TARGET_N, TARGET = 8, 1.25
DOCS = Path(__file__).resolve().parent.parent / "docs"

Keyed = list[tuple[bytes, float]]


def keyed_pages(web: ZipfWeb, partition: str) -> Keyed:
    """(key, pages) for every ownership unit of the web."""
    if partition == "host":
        return [(key_for(web.host_name(h)), float(n)) for h, n in enumerate(web.pages)]
    return [(key_for(web.url(h, p)), 1.0) for h, n in enumerate(web.pages) for p in range(n)]


def loads_of(ids: Sequence[bytes], keyed: Keyed) -> dict[bytes, float]:
    space = IdSpace(ids)
    out = dict.fromkeys(ids, 0.0)
    for key, load in keyed:
        out[space.owner(key)] += load
    return out


def balance(loads: dict[bytes, float]) -> tuple[float, float]:
    """(variance of normalised shares, max/mean share)."""
    total = sum(loads.values())
    shares = [v / total for v in loads.values()]
    return statistics.pvariance(shares), max(shares) * len(shares)


def plan_ids(keyed: Keyed, n: int, rng: random.Random) -> list[bytes]:
    """N IDs whose trie best balances the pages, found by a search (see ``plan``).

    A region that is to hold k peers splits at some bit c, below the bits its ancestors split
    at, into the keys with a 0 there and those with a 1, holding k1 and k - k1 peers. For each
    k1 and side the search tries the PLAN_BITS bits whose split comes closest to the ratio
    k1 : k - k1, recursively, and keeps the tree with the smallest largest leaf. The IDs are
    built from the tree: the peers of a subtree share every bit above its split bit, so the
    owners ``loads_of`` finds are the leaves' (the benchmark scores them with the ownership
    code, not with the search's own sums).
    """
    import numpy as np

    weights = np.array([load for _, load in keyed])
    depth = 160 - 32
    ints = [int.from_bytes(k, "big") for k, _ in keyed]
    bits = np.array([[(i >> (159 - d)) & 1 for d in range(depth)] for i in ints], dtype=bool)
    memo: dict[tuple[bytes, int, int], tuple[float, Any]] = {}

    def best(idx: Any, k: int, low: int) -> tuple[float, Any]:
        """(largest leaf load, tree) for keys ``idx`` shared by k peers, splitting at >= low.
        A tree is None (a leaf) or (bit, side of the k1 subtree, k1, its tree, the other)."""
        key = (idx.tobytes(), k, low)
        if key in memo:
            return memo[key]
        total = float(weights[idx].sum())
        out: tuple[float, Any] = (total if k == 1 else float("inf"), None)
        if k > 1 and low < depth - k:  # room below for the subtrees' own splits
            ones = (bits[idx, low : depth - k] * weights[idx][:, None]).sum(0)
            for k1 in range(1, k // 2 + 1):
                for side in (0, 1):
                    part = ones if side else total - ones
                    for j in np.argsort(np.abs(part - total * k1 / k))[:PLAN_BITS]:
                        c = low + int(j)
                        mine = bits[idx, c] == bool(side)
                        a = best(idx[mine], k1, c + 1)
                        b = best(idx[~mine], k - k1, c + 1)
                        if max(a[0], b[0]) < out[0]:  # an empty region still takes peers
                            out = (max(a[0], b[0]), (c, side, k1, a[1], b[1]))
        if k > 1 and out[1] is None:
            raise ValueError("no split found")
        memo[key] = out
        return out

    def build(tree: Any, k: int, base: int) -> list[int]:
        if tree is None:
            return [base]
        c, side, k1, t1, t2 = tree
        shift = 159 - c
        above = (base >> (shift + 1)) << (shift + 1)
        first = above | (side << shift) | rng.getrandbits(shift)
        second = above | ((1 - side) << shift) | rng.getrandbits(shift)
        return build(t1, k1, first) + build(t2, k - k1, second)

    _, tree = best(np.arange(len(keyed)), n, 0)
    return [i.to_bytes(20, "big") for i in build(tree, n, rng.getrandbits(160))]


def grow(
    scheme: str, keyed: Keyed, sizes: Sequence[int], rng: random.Random
) -> dict[int, tuple[float, float]]:
    """Join peers one at a time up to max(sizes); the balance at each size in ``sizes``."""
    ids: list[bytes] = []
    out: dict[int, tuple[float, float]] = {}
    if scheme == "plan":
        for n in sizes:
            if n <= PLAN_MAX_N:
                out[n] = balance(loads_of(plan_ids(keyed, n, rng), keyed))
        return out
    while len(ids) < max(sizes):
        if scheme == "random" or not ids:
            new = rng.getrandbits(160).to_bytes(20, "big")
        elif scheme == "split":
            new = choose_join_id(ids, rng)
        else:
            loads = loads_of(ids, keyed)
            space = IdSpace(ids)

            def profile_of(node: bytes, space: IdSpace = space) -> tuple[float, list[float]]:
                return bit_loads((k, v) for k, v in keyed if space.owner(k) == node)

            new = choose_join_id(ids, rng, loads=loads, profile_of=profile_of)
        ids.append(new)
        if len(ids) in sizes:
            out[len(ids)] = balance(loads_of(ids, keyed))
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(args: argparse.Namespace) -> dict[str, dict[str, dict[int, dict[str, dict[str, float]]]]]:
    """results[partition][scheme][n] = {"variance": summary, "max_mean": summary}."""
    results: dict[str, dict[str, dict[int, dict[str, dict[str, float]]]]] = {}
    for partition in args.partition:
        per_scheme: dict[str, dict[int, dict[str, list[float]]]] = {
            s: {n: {"variance": [], "max_mean": []} for n in args.peers} for s in SCHEMES
        }
        for seed in range(1, args.seeds + 1):
            web = ZipfWeb(args.hosts, args.max_pages, args.exponent, seed)
            keyed = keyed_pages(web, partition)
            for scheme in SCHEMES:
                if scheme == "plan" and partition != "host":
                    continue  # a key per URL: too many for the search
                rng = random.Random(f"{scheme}:{seed}")
                for n, (var, mm) in grow(scheme, keyed, args.peers, rng).items():
                    per_scheme[scheme][n]["variance"].append(var)
                    per_scheme[scheme][n]["max_mean"].append(mm)
        results[partition] = {
            s: {
                n: {m: summary(v) for m, v in by_n.items()}
                for n, by_n in per_n.items()
                if by_n["max_mean"]
            }
            for s, per_n in per_scheme.items()
            if any(by_n["max_mean"] for by_n in per_n.values())
        }
    return results


def print_table(results: dict[str, dict[str, dict[int, dict[str, dict[str, float]]]]]) -> None:
    for partition, per_scheme in results.items():
        print(f"\n--partition {partition}: max/mean share and variance of normalised shares")
        print("(median [min-max] over seeds)")
        sizes = list(next(iter(per_scheme.values())))
        print(f"{'scheme':<11}" + "".join(f"{f'N={n}':>30}" for n in sizes))
        for scheme, per_n in per_scheme.items():
            cells = []
            for n in sizes:
                if n not in per_n:
                    cells.append("-")
                    continue
                mm, var = per_n[n]["max_mean"], per_n[n]["variance"]
                cells.append(
                    f"{mm['median']:.2f} [{mm['min']:.2f}-{mm['max']:.2f}] {var['median']:.1e}"
                )
            print(f"{scheme:<11}" + "".join(f"{c:>30}" for c in cells))


def plot(results: dict[str, dict[str, dict[int, dict[str, dict[str, float]]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (partition, per_scheme) in zip(axes[0], results.items(), strict=True):
        for scheme, per_n in per_scheme.items():
            ns = list(per_n)
            med = [per_n[n]["max_mean"]["median"] for n in ns]
            lo = [per_n[n]["max_mean"]["min"] for n in ns]
            hi = [per_n[n]["max_mean"]["max"] for n in ns]
            ax.plot(ns, med, marker="o", label=scheme)
            ax.fill_between(ns, lo, hi, alpha=0.15)
        ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1, label=f"target {TARGET}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("peers")
        ax.set_ylabel("max / mean share of pages")
        ax.set_title(f"--partition {partition}")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", type=int, default=3000)
    p.add_argument("--max-pages", type=int, default=1000, help="pages of the largest host")
    p.add_argument("--exponent", type=float, default=1.0, help="Zipf exponent of page counts")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--peers", default="2,4,8,16")
    p.add_argument("--partition", default="host,url")
    p.add_argument("--quick", action="store_true", help="1,000 hosts, 3 seeds")
    p.add_argument("--plot", type=Path, default=DOCS / "load_balance.png")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.hosts, args.max_pages, args.seeds = 1000, 300, 3
    args.peers = sorted({int(x) for x in args.peers.split(",")})
    args.partition = [x for x in args.partition.split(",") if x]
    if min(args.peers) < 1 or any(x not in PARTITIONS for x in args.partition):
        p.error("peers >= 1; partition from host,url")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    web = ZipfWeb(args.hosts, args.max_pages, args.exponent, 1)
    print(
        f"web: {args.hosts} hosts, Zipf exponent {args.exponent}, largest host "
        f"{args.max_pages} pages, {web.total_pages} pages (seed 1), largest host "
        f"{100 * max(web.pages) / web.total_pages:.1f}% of pages; {args.seeds} seeds"
    )
    t0 = time.perf_counter()
    results = run(args)
    print_table(results)
    print(f"\n{time.perf_counter() - t0:.1f} s")
    if not args.no_plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    headline: dict[str, object] = {
        "max_over_mean": {
            part: {
                s: {str(n): round(v["max_mean"]["median"], 3) for n, v in per_n.items()}
                for s, per_n in per_s.items()
            }
            for part, per_s in results.items()
        },
        "variance": {
            part: {
                s: {str(n): float(f"{v['variance']['median']:.2e}") for n, v in per_n.items()}
                for s, per_n in per_s.items()
            }
            for part, per_s in results.items()
        },
    }
    if "host" in results and TARGET_N in results["host"]["split+load"]:
        worst = results["host"]["split+load"][TARGET_N]["max_mean"]["max"]
        headline["target_host_8"] = {"max_over_mean_worst": round(worst, 3), "met": worst <= TARGET}
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
