"""The four membership cases of a young, busy network (tests and benchmarks).

Each takes a fresh :class:`~p2pcrawl.testing.scenarios.Scenario`, applies its events at
full speed with every timer at its default, and returns the
:class:`~p2pcrawl.testing.scenarios.Outcome`:

* ``first_seconds``: four peers started together, the founder seeded, and the founder (the
  only owner yet) SIGKILLed 3 s after the three joiners entered its routing table, while
  they are younger than ``--min-peer-age``;
* ``crash_during_joins``: three peers, the founder owning the big host; three more join
  within 1.5 s, two of them with IDs next to the founder's (one of them nearer the big host,
  so the join moves it), and the founder, the busiest peer, is SIGKILLed while the joins run;
* ``graceful_leave``: four peers; the owner of the big host leaves (``p2pcrawl leave``) at
  30%;
* ``crash_joins_crash``: four peers; the busiest crashes at 15%, two peers join at once,
  and the busiest crashes at 60% (or as soon as the joins are through, if that is later);
* ``takeover``: four peers, the founder owning the big host; at 30% a peer joins with an
  ID nearer the host's key and takes the host over (``benchmarks/cases.py``);
* ``busy_lender``: four peers, the founder owning the big host and the Crawl-delay host (the
  crawl's longest) with four fetchers: busy with the big host, it lends the Crawl-delay host,
  whose pace on loan then sets the crawl's end (no membership event: what a loan costs);
* ``steady``: four peers and no event, the time the others are compared with.

Where a case depends on who owns the big host (host 0, most of the pages), the peers' node
IDs are written into their data directories before they start (a joiner keeps a saved ID, as
after a restart): survey-chosen IDs would move the big host between runs, and the case with
it. The other IDs are the survey's, as a new user's would be.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from p2pcrawl.crawl import urls
from p2pcrawl.testing.cluster import PeerProc
from p2pcrawl.testing.scenarios import Outcome, Scenario
from protocol import key_for

__all__ = ["CASES", "FINISH_S", "id_near", "preset_id"]

# Seconds from the seed by which every live peer must report finished: a hang guard, not a
# timing. The steady run takes about 20 s and a case its detection time and handoffs on top;
# a new owner whose every page waits on a forgotten replica crawls at about 13 pages a
# second and still ends within it (its stall shows in the time printed against the steady
# run); the failures this catches stood still for minutes.
FINISH_S = 120.0


def id_near(key: bytes, bit: int) -> str:
    """A node ID at XOR distance ``2**bit`` from ``key``: a smaller ``bit`` is nearer, so
    among IDs made this way the one with the smallest ``bit`` owns the key. Bits 128-159
    keep the IDs' first 8 hex digits apart (logs and events name peers by them); a random ID
    is that near a key once in about 2**28."""
    value = int.from_bytes(key, "big") ^ (1 << bit)
    return value.to_bytes(len(key), "big").hex()


def big_key(sc: Scenario) -> bytes:
    """The key of the big host (host 0, the hub's), as the peers compute it."""
    return key_for(urls.host_of(sc.web.hub_url))


def preset_id(sc: Scenario, name: str, node_id: str) -> None:
    """Write ``node_id`` where peer ``name`` keeps its identity, before it starts."""
    data = sc.cluster.root / name
    data.mkdir(parents=True, exist_ok=True)
    (data / "node.json").write_text(json.dumps({"node_id": node_id, "version": 1}))


async def steady(sc: Scenario) -> Outcome:
    peers = await sc.start(4)
    await sc.wait_mesh()
    await sc.seed(peers[0])
    return await sc.finish(FINISH_S)


async def first_seconds(sc: Scenario) -> Outcome:
    founder = (await sc.start(1))[0]
    joining = asyncio.ensure_future(sc.join(founder, 3, together=True))
    try:
        # Seeded once all three are in its routing table, killed 3 s later, while they are
        # younger than --min-peer-age: the founder alone crawls about half the web meanwhile.
        await sc.admitted(founder, 3, timeout=30.0)
        await sc.seed(founder)
        await asyncio.sleep(3.0)
        await sc.kill(founder)
    finally:
        await joining
    return await sc.finish(FINISH_S)


async def crash_during_joins(sc: Scenario) -> Outcome:
    key = big_key(sc)
    preset_id(sc, "p0", id_near(key, 134))  # the founder owns the big host
    peers = await sc.start(3)
    await sc.wait_mesh()
    await sc.seed(peers[0])
    await sc.until_share(0.2)
    # Two joiners next to the founder, the first nearer the big host than the founder (it
    # takes the host over from it), the second just behind it; the third chooses its own.
    preset_id(sc, "p3", id_near(key, 130))
    preset_id(sc, "p4", id_near(key, 132))
    victim = await sc.busiest()
    joining = asyncio.ensure_future(_staggered_joins(sc, peers[1], 3, 0.5))
    try:
        # Killed once the joiners are in its routing table (and it in theirs), while they
        # are younger than --min-peer-age and wait for its handoff.
        await sc.admitted(victim, 5, timeout=30.0)
        await sc.kill(victim)
    finally:
        await joining
    return await sc.finish(FINISH_S)


async def _staggered_joins(sc: Scenario, boot: PeerProc, n: int, gap: float) -> None:
    starts = []
    for _ in range(n):
        starts.append(asyncio.ensure_future(sc.join(boot, 1)))
        await asyncio.sleep(gap)
    await asyncio.gather(*starts)


async def graceful_leave(sc: Scenario) -> Outcome:
    preset_id(sc, "p1", id_near(big_key(sc), 134))  # p1 owns the big host
    peers = await sc.start(4)
    await sc.wait_mesh()
    await sc.seed(peers[0])
    await sc.until_share(0.3)
    await sc.leave(peers[1])
    return await sc.finish(FINISH_S)


async def takeover(sc: Scenario) -> Outcome:
    """Four peers, the founder owning the big host; at 30% a fifth joins with an ID nearer
    the host's key, and takes the host over once it is old enough: a join's whole cost."""
    key = big_key(sc)
    preset_id(sc, "p0", id_near(key, 134))
    peers = await sc.start(4)
    await sc.wait_mesh()
    await sc.seed(peers[0])
    await sc.until_share(0.3)
    preset_id(sc, "p4", id_near(key, 130))
    await sc.join(peers[1], 1)
    return await sc.finish(FINISH_S)


async def busy_lender(sc: Scenario) -> Outcome:
    polite = int.from_bytes(key_for(sc.web.crawl_delay_host or ""), "big")
    preset_id(sc, "p0", id_near(big_key(sc), 0))  # nearest the big host
    for i in (1, 2, 3):
        # Far from the Crawl-delay host (their distance to it starts with ten 1 bits), so the
        # founder, the nearest to the big host, is also the nearest to it but about once in
        # a thousand webs.
        preset_id(sc, f"p{i}", _hex(polite ^ (0x3FF << 150) ^ (i << 140)))
    peers = await sc.start(4, founder_args=["--concurrency", "4"])
    await sc.wait_mesh()
    await sc.seed(peers[0])
    return await sc.finish(FINISH_S)


def _hex(node_id: int) -> str:
    return node_id.to_bytes(20, "big").hex()


async def crash_joins_crash(sc: Scenario) -> Outcome:
    peers = await sc.start(4)
    await sc.wait_mesh()
    await sc.seed(peers[0])
    await sc.until_share(0.15)
    await sc.kill(await sc.busiest())
    # At once: a join takes the survey and --min-peer-age, 6-10 s, most of what is left.
    await sc.join(sc.live()[0], 2, together=True)
    await sc.until_share(0.6)
    await sc.kill(await sc.busiest())
    return await sc.finish(FINISH_S)


CASES: dict[str, Callable[[Scenario], Awaitable[Outcome]]] = {
    "steady": steady,
    "first_seconds": first_seconds,
    "crash_during_joins": crash_during_joins,
    "graceful_leave": graceful_leave,
    "crash_joins_crash": crash_joins_crash,
    "takeover": takeover,
    "busy_lender": busy_lender,
}
