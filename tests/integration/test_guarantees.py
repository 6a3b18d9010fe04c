"""Membership guarantees at full speed with every timer at its default (docs/membership.md).

The other membership tests shorten the timers (``FAST_DETECTION``, ``TEST_MIN_PEER_AGE``)
and crawl a small web slowly, so every event lands after the network has settled. Here a
web that one peer crawls at hundreds of pages a second (``scenarios.full_speed_web``: four
hosts, one of them 80% of the pages, no politeness delay) is crawled by real peer processes
with ``--min-peer-age``, the ping interval, the suspicion timeout and every other timer at
their defaults, and the events overlap the network's first seconds and its joins
(``p2pcrawl.testing.cases``). Each case ends asserting, from the test web's own request
counts and the peers' status APIs:

* every page of the ground truth fetched;
* duplicate fetches at most 0.5% of the pages plus what each killed peer had under way
  (``--concurrency`` fetches and two page tails per fetch slot);
* every live peer reports ``finished`` (within ``cases.FINISH_S`` of the seed, and before
  ``scenarios.STALL_S`` passes with no new page), and none did while a page was unfetched
  or a backup orphaned.

Each prints its crawl time (seed to the last new page) and when every peer reported
``finished`` (a peer declared dead holds that back for ``--partition-hold``, 36 s: a
partitioned half looks dead), its longest wait for a new page, and the calls made to peers
after they were declared dead or said goodbye (printed, not asserted: whether a call is under
way when its target is forgotten is a race; ``tests/p2pcrawl/test_departed.py`` pins the
deterministic part). Their crawl time against a steady run of the same network is
``benchmarks/churn.py --chaos``'s business: a steady run here would cost the suite half a
minute for a printed ratio.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from p2pcrawl.testing import Cluster, TestWeb
from p2pcrawl.testing.cases import CASES, FINISH_S, id_near, preset_id
from p2pcrawl.testing.scenarios import Outcome, Scenario, full_speed_args, full_speed_web
from protocol import key_for
from tests.integration.conftest import spawn_flood

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PAGES = 2_500  # about 2,700 URLs with the web's features: ~20 s for four steady peers


async def run_case(name: str, root: Path) -> Outcome:
    async with TestWeb(full_speed_web(PAGES)) as web, Cluster(root, full_speed_args(web)) as c:
        sc = Scenario(c, web)
        try:
            out = await CASES[name](sc)
        finally:
            await sc.aclose()
        if out.problems():
            print(sc.logs()[-20_000:])
        return out


Check = Callable[[str], Awaitable[None]]


@pytest.fixture
def check(tmp_path: Path) -> Check:
    """``await check(case)``: run the case, print it, assert."""

    async def run(name: str) -> None:
        out = await run_case(name, tmp_path)
        print(out.line(name))
        for call in out.lingering[:5]:
            print("  after it was forgotten:", call)
        assert not out.problems(), out.line(name) + "\n" + "\n".join(out.problems())

    return run


async def test_a_crash_in_the_first_seconds(check: Check) -> None:
    await check("first_seconds")


async def test_a_crash_while_peers_join(check: Check) -> None:
    await check("crash_during_joins")


async def test_a_graceful_leave(check: Check) -> None:
    await check("graceful_leave")


async def test_a_crash_then_joins_then_a_crash(check: Check) -> None:
    await check("crash_joins_crash")


async def test_a_flooded_successor_takes_a_dead_owner_s_host_on_the_others_word(
    tmp_path: Path,
) -> None:
    """The owner of the Crawl-delay host (the crawl's longest) dies while the peer next to
    its key is flooded. The flooded peer's local health stretches its own suspicion up to
    ninefold, as it should; but the other peers declare the death within their timeout, and
    when they answer its indirect probes that they did, it declares it too, on their word,
    without waiting for its health to recover (it took 16 s before, while the host stood
    still)."""
    async with TestWeb(full_speed_web(PAGES)) as web, Cluster(tmp_path, full_speed_args(web)) as c:
        sc = Scenario(c, web)
        flood = None
        try:
            key = key_for(web.crawl_delay_host or "")
            preset_id(sc, "p0", id_near(key, 134))  # the owner
            preset_id(sc, "p1", id_near(key, 136))  # next to it: its successor
            peers = await sc.start(4)
            await sc.wait_mesh()
            await sc.seed(peers[0])
            # 20,000 junk datagrams a second: over ``liveness.JUNK_PER_ROUND`` each round.
            flood = await spawn_flood(peers[1].listen, 8, 20_000)
            sc.note("flood:p1")
            await asyncio.sleep(5.0)  # its health score is up by now
            await sc.kill(peers[0])
            await flood.communicate()
            out = await sc.finish(FINISH_S)
            liveness = (await c.api(peers[1], "/api/peers"))["rpc"]["liveness"]
            events = (await c.api(peers[1], "/api/events"))["events"]
        finally:
            if flood is not None and flood.returncode is None:
                flood.kill()
                await flood.wait()
            await sc.aclose()
    print(out.line("a flooded successor"), liveness, sep="\n")
    assert not out.problems(), out.problems()
    victim = peers[0].node_id[:8]
    assert any(e["kind"] == "peer_lost" and e["peer"] == victim for e in events), events
    assert liveness["health_signals"].get("junk"), "the flood did not reach the successor"
    assert liveness["declared_as_others_did"] >= 1, liveness
