"""The membership cases of ``p2pcrawl.testing.cases`` at full speed, against a steady run.

Each round runs the steady case, then each named case, on one test web (5,000 pages, the
big host 80% of them), every timer at its default. Per case and round: the crawl's time
(first fetch of the last new page, from the seed) against the same round's steady run,
pages lost and fetched twice, and the pace of the Crawl-delay host (the steady run's longest)
by the peers that fetched it. Prints the median ratio per case; the last line is one JSON
object.

    python benchmarks/cases.py                       # takeover and graceful_leave, 3 rounds
    python benchmarks/cases.py --cases crash_during_joins --rounds 5
    python benchmarks/cases.py --cases busy_lender   # the Crawl-delay host's pace on loan
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from p2pcrawl.testing import Cluster, TestWeb
from p2pcrawl.testing.cases import CASES
from p2pcrawl.testing.scenarios import AGENT, Outcome, Scenario, full_speed_args, full_speed_web


async def run_case(web: TestWeb, root: Path, name: str) -> Outcome:
    async with Cluster(root, full_speed_args(web)) as cluster:
        sc = Scenario(cluster, web)
        try:
            return await CASES[name](sc)
        finally:
            await sc.aclose()


def polite_pace(web: TestWeb) -> str:
    """The Crawl-delay host's first fetches per peer, and their pace from that peer's first
    to its last (the web's request log; each peer names itself in its User-Agent)."""
    times: dict[str, list[float]] = {}
    seen: set[str] = set()
    for t, url, agent in web.request_log:
        if web.crawl_delay_host and f"//{web.crawl_delay_host}/" in url and url not in seen:
            seen.add(url)
            times.setdefault(agent.removeprefix(AGENT), []).append(t)
    return ", ".join(
        f"{name} {len(ts)} pages at {(len(ts) - 1) / (ts[-1] - ts[0]):.1f}/s"
        if len(ts) > 1 and ts[-1] > ts[0]
        else f"{name} {len(ts)} pages"
        for name, ts in times.items()
    )


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="takeover,graceful_leave")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--web-pages", type=int, default=5000)
    args = ap.parse_args()
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES or n == "steady"]
    if unknown:
        raise SystemExit(f"--cases: choose among {','.join(n for n in CASES if n != 'steady')}")
    ratios: dict[str, list[float]] = {n: [] for n in names}
    worst: dict[str, dict[str, int]] = {n: {"lost": 0, "duplicates": 0} for n in names}
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-cases-") as tmp:
        async with TestWeb(full_speed_web(args.web_pages)) as web:
            for r in range(args.rounds):
                steady = await run_case(web, Path(tmp) / f"{r}-steady", "steady")
                print(f"round {r + 1} steady: Crawl-delay host {polite_pace(web)}", flush=True)
                for name in names:
                    out = await run_case(web, Path(tmp) / f"{r}-{name}", name)
                    ratio = out.crawled / steady.crawled if steady.crawled else float("nan")
                    ratios[name].append(ratio)
                    worst[name]["lost"] = max(worst[name]["lost"], out.lost)
                    worst[name]["duplicates"] = max(worst[name]["duplicates"], out.duplicates)
                    print(
                        f"round {r + 1} {name}: crawl {out.crawled:.1f} s against the steady "
                        f"{steady.crawled:.1f} s ({ratio:.2f}x), lost {out.lost}, duplicates "
                        f"{out.duplicates}, longest wait for a new page {out.longest_stall:.1f} s; "
                        f"Crawl-delay host {polite_pace(web)}; events {' '.join(out.events)}",
                        flush=True,
                    )
    summary: dict[str, Any] = {
        name: {"time_ratio_median": round(statistics.median(rs), 2), **worst[name]}
        for name, rs in ratios.items()
    }
    print(json.dumps(summary))
    return 0 if all(w["lost"] == 0 for w in worst.values()) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
