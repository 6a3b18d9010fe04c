"""Freshness under churn: the visit history moves with its key at the default timers.

    python benchmarks/revisit_handoff.py            # 800 pages, about 2-3 min
    python benchmarks/revisit_handoff.py --quick    # 200 pages

The guarantee of docs/freshness.md ("When keys move") at full speed, every membership timer
and ``--min-peer-age`` at its default: real peer processes (``p2pcrawl join``, keyed) crawl
the changing test web (``p2pcrawl.testing.changing``: four hosts, no politeness delay, no page
changing) in continuous mode (``--revisit 10s``). Three peers start, p0 next to the key of
host 0 (it owns it); once every page was fetched and host 0's pages were revisited (304), p3
joins with an ID nearer the key than p0's and takes host 0 over; once p3 itself was answered
304 for as many revisits as host 0 has pages, p3 is killed (a crash: nothing handed over),
and host 0 falls back to p0, which holds p3's rows as its replica.

Printed, from the test web's log and the peers' status APIs: the seconds from p3's start to
its own 304s for host 0, from the crash until every page of host 0 was answered 304 again,
and the full re-fetches (a 200 for a page after its first fetch). The history moved with its
key through the join and the crash if host 0 has none: a new owner with the done range and
no history would never revisit the pages, one with rows without validators would fetch
them whole. The other hosts' re-fetches are printed apart: a page first fetched on loan
(by a borrower, docs/membership.md) leaves its owner a row without validators, and its
first revisit fetches it whole. The last line is one JSON object. Not in CI: the join waits out
``--min-peer-age`` and the crash the default suspicion timeout (tests/p2pcrawl/test_revisit.py
is the shortened-timer test of the same guarantee, also through a graceful leave).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from p2pcrawl.crawl import urls
from p2pcrawl.testing import ChangingConfig, ChangingWeb
from p2pcrawl.testing.cases import id_near
from p2pcrawl.testing.cluster import Cluster, PeerProc
from p2pcrawl.testing.scenarios import SCENARIO_SECRET
from protocol import key_for

PHASE_S = 180.0  # the longest any step may take before the run is called failed


def preset_id(root: Path, name: str, node_id: str) -> None:
    data = root / name
    data.mkdir(parents=True, exist_ok=True)
    (data / "node.json").write_text(json.dumps({"node_id": node_id, "version": 1}))


async def until(check: Callable[[], bool | Awaitable[bool]], what: str) -> float:
    """Seconds until ``check()`` (sync or async) is true; RuntimeError after PHASE_S."""
    start = time.monotonic()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > PHASE_S:
            raise RuntimeError(f"not within {PHASE_S} s: {what}")
        await asyncio.sleep(0.2)


async def run(pages: int, root: Path) -> dict[str, object]:
    web = ChangingWeb(ChangingConfig(hosts=4, pages_per_host=pages // 4, new_links=False))
    await web.start()
    key = key_for(urls.host_of(web.hub_url))
    host0 = [u for u in web.page_urls() if u.startswith(web.bases[0] + "/")]
    args = ["--allow-private", "--politeness-factor", "0", "--delay", "0"]
    args += ["--secret", SCENARIO_SECRET, "--revisit", "10s"]
    for d in web.allow_domains:
        args += ["--allow-domain", d]

    def statuses(url: str) -> list[tuple[float, int]]:
        return [(t, s) for t, s, _ in web.requests(url)]

    def answered_304_after(t0: float) -> bool:
        return all(any(s == 304 and t >= t0 for t, s in statuses(u)) for u in host0)

    async def not_modified(c: Cluster, peer: PeerProc) -> int:
        st = await c.api(peer, "/api/status")
        return int(st["revisit"]["not_modified"])

    try:
        async with Cluster(root, args) as c:
            preset_id(root, "p0", id_near(key, 134))  # p0 owns host 0
            p0 = await c.start_peer("p0")
            others = await asyncio.gather(*(c.start_peer(f"p{i}", bootstrap=p0) for i in (1, 2)))
            await until(lambda: _mesh(c, 3), "a mesh of three")
            await c.api(p0, "/api/seed", "POST", {"urls": [web.hub_url]})
            t_seed = web.now()
            first = await until(
                lambda: all(statuses(u) for u in web.page_urls()), "every page fetched"
            )
            await until(lambda: answered_304_after(t_seed), "host 0 revisited (304)")

            preset_id(root, "p3", id_near(key, 130))  # nearer the key than p0
            t_join = time.monotonic()
            p3 = await c.start_peer("p3", bootstrap=others[0])
            await until(
                lambda: _at_least(not_modified(c, p3), len(host0)),
                "p3 answered 304 for host 0's revisits",
            )
            join_s = time.monotonic() - t_join
            c.kill(p3)  # a crash: no goodbye, nothing handed over
            t_crash = web.now()
            crash_s = await until(
                lambda: answered_304_after(t_crash), "host 0 revisited (304) after the crash"
            )
    finally:
        await web.aclose()

    def refetched(pages: list[str]) -> int:
        return sum(max(0, [s for _, s in statuses(u)].count(200) - 1) for u in pages)

    other_pages = [u for u in web.page_urls() if u not in host0]
    revisits = sum(len(statuses(u)) - 1 for u in web.page_urls())
    return {
        "pages": len(web.page_urls()),
        "host0_pages": len(host0),
        "first_pass_s": round(first, 1),
        "join_to_own_304s_s": round(join_s, 1),
        "crash_to_304s_s": round(crash_s, 1),
        "revisits": revisits,
        "full_refetches_host0": refetched(host0),
        "full_refetches_other_hosts": refetched(other_pages),
        "history_moved": refetched(host0) == 0,
    }


async def _mesh(c: Cluster, n: int) -> bool:
    try:
        return all(s["peers"] == n - 1 for s in await c.statuses()) and len(c.peers) == n
    except Exception:  # a peer still starting
        return False


async def _at_least(count: Awaitable[int], n: int) -> bool:
    return await count >= n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 pages instead of 800")
    opts = ap.parse_args()
    pages = 200 if opts.quick else 800
    with tempfile.TemporaryDirectory(prefix="revisit-handoff-") as tmp:
        out = asyncio.run(run(pages, Path(tmp)))
    print(
        f"{out['pages']} pages ({out['host0_pages']} on host 0), first pass "
        f"{out['first_pass_s']} s; p3's join to its own 304s for host 0: "
        f"{out['join_to_own_304s_s']} s; p3's crash to host 0 answered 304 again: "
        f"{out['crash_to_304s_s']} s; {out['revisits']} revisits; full re-fetches of host 0 "
        f"(its key moved twice): {out['full_refetches_host0']} (target 0); of the other hosts "
        f"(their keys never moved): {out['full_refetches_other_hosts']}"
    )
    print(json.dumps(out))
    if not out["history_moved"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
