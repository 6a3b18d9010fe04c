"""Fixtures shared by every test package: real test webs, real peers, real status servers.

Everything binds port 0 on loopback and is closed at teardown in reverse order of creation
(status servers, then peers, then webs), so a failing test leaks no socket or task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from p2pcrawl.settings import CrawlSettings, PeerSettings, PolitenessSettings, ScopeSettings

if TYPE_CHECKING:
    # Imported where used, so that a half-edited peer module cannot stop the storage and
    # protocol suites from collecting: every test package loads this file.
    import aiohttp

    from p2pcrawl.network import Peer
    from p2pcrawl.testing import TestWeb
    from p2pcrawl.ui import StatusServer


def pytest_sessionstart(session: pytest.Session) -> None:
    """The peer processes the suite starts load cached bytecode (``testing.bytecode``)."""
    from p2pcrawl.testing import cache_bytecode

    cache_bytecode()


WebFactory = Callable[..., Awaitable["TestWeb"]]
PeerFactory = Callable[..., Awaitable["Peer"]]
StatusFactory = Callable[..., Awaitable["StatusServer"]]

# Joiners wait this long before they own keys (``--min-peer-age``; the default is for real
# networks, a few seconds): short, but not zero, so the rule is exercised everywhere.
TEST_MIN_PEER_AGE = 0.5

# A network key for tests whose peers or bare nodes take IDs chosen by hand: an open network
# counts only IDs made from a node key (docs/security.md), a keyed one whatever ID its key
# holders take, as these tests need.
TEST_SECRET = "tests-network-key"
KEYED = PeerSettings(min_peer_age=TEST_MIN_PEER_AGE, secret=TEST_SECRET)

# A small web that still has every feature (robots, redirects, errors, a large page).
SMALL_WEB = {"hosts": 3, "pages_per_host": 20, "slow_host_delay": 0.01, "large_page_bytes": 200_000}


def id_next_to(key: bytes) -> bytes:
    """A node ID XOR-closer to ``key`` than any other a test will meet: its owner."""
    return key[:-1] + bytes([key[-1] ^ 1])


def id_outranked_by(node_id: bytes, key: bytes) -> bytes:
    """Another node ID that ``node_id`` beats for ``key``: ``node_id`` with one bit flipped
    where it agrees with the key, so between the two, ``node_id`` owns the key."""
    mine, k = int.from_bytes(node_id, "big"), int.from_bytes(key, "big")
    bit = next(i for i in range(8 * len(key) - 1, -1, -1) if (mine >> i & 1) == (k >> i & 1))
    return (mine ^ (1 << bit)).to_bytes(len(node_id), "big")


async def open_identity(data_dir: Path, near: bytes, free: int) -> bytes:
    """Give a fresh data directory a node key, and an ID with ``near``'s leading ``free``
    bits: what an open network lets a peer choose (docs/security.md)."""
    from p2pcrawl.network.identity import create_key, save_identity

    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    key = await create_key(data_dir, PeerSettings().id_work_bits)
    node_id = key.node_id(near, free)
    await asyncio.to_thread(save_identity, data_dir, node_id)
    return node_id


def crawl_settings_for(web: TestWeb, *, delay: float = 0.0, **overrides: Any) -> CrawlSettings:
    """Settings that crawl ``web`` and nothing else, with no politeness wait unless asked."""
    return CrawlSettings(
        politeness=PolitenessSettings(delay=delay, politeness_factor=0.0),
        scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        **overrides,
    )


@pytest.fixture
async def make_web() -> AsyncIterator[WebFactory]:
    """``await make_web(**TestWebConfig fields)``; defaults to :data:`SMALL_WEB`."""
    webs: list[TestWeb] = []

    async def factory(**config: Any) -> TestWeb:
        from p2pcrawl.testing import TestWeb, TestWebConfig

        web = TestWeb(TestWebConfig(**{**SMALL_WEB, **config}))
        await web.start()
        webs.append(web)
        return web

    yield factory
    for web in reversed(webs):
        await web.aclose()


@pytest.fixture
async def make_peer(tmp_path: Path) -> AsyncIterator[PeerFactory]:
    """``await make_peer(crawl=..., peer=..., bootstrap=...)``: a started peer on loopback."""
    peers: list[Peer] = []

    async def factory(
        *,
        crawl: CrawlSettings | None = None,
        peer: PeerSettings | None = None,
        bootstrap: tuple[tuple[str, int], ...] = (),
    ) -> Peer:
        from p2pcrawl.network import Peer, PeerConfig

        p = Peer(
            PeerConfig(
                data_dir=tmp_path / f"peer{len(peers)}",
                listen=("127.0.0.1", 0),
                bootstrap=bootstrap,
                crawl=crawl or CrawlSettings(),
                peer=peer or PeerSettings(min_peer_age=TEST_MIN_PEER_AGE),
            )
        )
        await p.start()
        peers.append(p)
        return p

    yield factory
    for p in reversed(peers):
        await p.aclose()


@pytest.fixture
async def make_status(make_peer: PeerFactory) -> AsyncIterator[StatusFactory]:
    """``await make_status(peer, token=...)``: a started status server on 127.0.0.1:0.

    It depends on ``make_peer`` so that its servers close before the peers they report on.
    """
    servers: list[StatusServer] = []

    async def factory(peer: Peer, *, token: str = "") -> StatusServer:
        from p2pcrawl.ui import StatusServer

        server = StatusServer(peer, "127.0.0.1", 0, token=token)
        await server.start()
        servers.append(server)
        return server

    yield factory
    for server in reversed(servers):
        await server.aclose()


async def wait_idle(
    session: aiohttp.ClientSession,
    status_url: str,
    *,
    quiet: float = 1.0,
    timeout: float = 20.0,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll ``/api/status`` until "finished" (docs/architecture.md) holds for ``quiet`` seconds.

    Nothing queued, nothing in flight, no batch in transit, and at least one page fetched
    (so a crawl that has not started yet does not count as finished). Returns the last status.
    """
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while True:
        async with session.get(status_url + "api/status", headers=headers) as resp:
            st: dict[str, Any] = await resp.json()
        idle = (
            st["pages_fetched"] > 0
            and st["tasks_queued"] == 0
            and st["tasks_in_flight"] == 0
            and st["rpc_in_transit"] == 0
        )
        now = time.monotonic()
        if not idle:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= quiet:
            return st
        if now > deadline:
            raise AssertionError(f"crawl not idle after {timeout} s: {st}")
        await asyncio.sleep(0.1)


# The multi-process integration modules in two chains of about equal length (seconds on
# a quiet 2-core machine): the peers under test use about a third of a core on average.
INTEGRATION_CHAINS = {
    "test_guarantees.py": "a",  # ~200 s
    "test_partition.py": "a",
    "test_service.py": "a",
    "test_cluster_netns.py": "a",
    "test_admission.py": "a",
    "test_cluster_crawl.py": "a",
    "test_signals.py": "a",
    "test_lifecycle.py": "b",  # ~215 s
    "test_churn.py": "b",  # ~200 s
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n`` (pyproject.toml's addopts), every test is its own unit of work except
    the multi-process integration tests, which form two chains: a worker runs a chain's
    tests one at a time, so at most two clusters of peer processes run at once (each starts
    a cluster with every timer at its default or tuned short; more at once on two cores
    would test the machine rather than the crawler). The suite mostly waits on real peers
    and webs, so three workers share two cores: the chains run beside each other and the
    in-process tests fill the gaps. (xdist's own ``--dist loadgroup`` marks do not take
    effect with pytest 9.2.)"""
    from xdist.scheduler import LoadScopeScheduling

    class TwoClusterChains(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if not nodeid.startswith("tests/integration/"):
                return nodeid
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            return "integration-" + INTEGRATION_CHAINS.get(module, "b")

    return TwoClusterChains(config, log)
