"""Bounded resources: ranged settings, the address guard, trap rules and budgets, the status
server's connection limits, the log rate limit and the disk budget."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import aiohttp
import pytest

from p2pcrawl.crawl import (
    Scope,
    crawl,
    is_forbidden_address,
    repeats_a_segment,
    strip_session_ids,
)
from p2pcrawl.crawl.disk import directory_bytes
from p2pcrawl.settings import (
    CrawlSettings,
    FetchLimits,
    PeerSettings,
    PolitenessSettings,
    ScopeSettings,
    SettingsError,
    bounds,
)
from p2pcrawl.ui import ConnectionLimits, StatusServer
from p2pcrawl.ui.logs import RateLimitFilter
from tests.conftest import PeerFactory, WebFactory

# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "kwargs", "words"),
    [
        (CrawlSettings, {"concurrency": 1_000_000_000}, ["concurrency", "from 1 to 4096"]),
        (CrawlSettings, {"concurrency": 0}, ["concurrency"]),
        (CrawlSettings, {"concurrency": 2.5}, ["whole number"]),
        (PeerSettings, {"ping_interval": 0.0}, ["ping_interval"]),
        (PeerSettings, {"refresh_interval": 0.0}, ["refresh_interval"]),
        (PeerSettings, {"republish_interval": 0.0}, ["republish_interval"]),
        (FetchLimits, {"total_timeout": float("nan")}, ["total_timeout"]),
        (FetchLimits, {"max_body_bytes": -1}, ["max_body_bytes"]),
        (PolitenessSettings, {"delay": float("inf")}, ["delay"]),
        (ScopeSettings, {"max_pages": "10"}, ["a number"]),
        (ScopeSettings, {"max_depth": True}, ["a number"]),
    ],
)
def test_out_of_range_settings_are_refused_clearly(
    cls: type, kwargs: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(SettingsError) as info:
        cls(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_every_numeric_setting_has_a_documented_range() -> None:
    import dataclasses

    for cls in (CrawlSettings, FetchLimits, PolitenessSettings, ScopeSettings, PeerSettings):
        for f in dataclasses.fields(cls):
            if isinstance(f.default, int | float) and not isinstance(f.default, bool):
                assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no range"
                assert bounds(cls, f.name) != "any"
    # The defaults are inside their own ranges.
    CrawlSettings()
    PeerSettings()


# -- the address guard -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "100.64.0.1",  # shared address space (RFC 6598)
        "100.100.100.200",  # a cloud metadata address inside it
        "169.254.169.254",
        "10.0.0.1",
        "192.168.1.1",
        "127.0.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:169.254.169.254",  # IPv4-mapped
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2002:0a00:0001::1",  # 6to4 of 10.0.0.1
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "ff02::1",
    ],
)
def test_non_global_addresses_are_forbidden(address: str) -> None:
    assert is_forbidden_address(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "2002:0808:0808::1"])
def test_global_addresses_are_allowed(address: str) -> None:
    assert not is_forbidden_address(address)


def test_loopback_only_admits_loopback_and_nothing_else() -> None:
    assert not is_forbidden_address("127.0.0.5", allow_loopback=True)
    assert not is_forbidden_address("::1", allow_loopback=True)
    assert not is_forbidden_address("::ffff:127.0.0.1", allow_loopback=True)
    for other in ("169.254.169.254", "100.64.0.1", "10.0.0.1", "2002:a9fe:a9fe::1"):
        assert is_forbidden_address(other, allow_loopback=True)
    scope = Scope(["127.0.0.2", "100.64.0.1"], allow_loopback=True)
    assert scope.allows_host("127.0.0.2")
    assert not scope.allows_host("100.64.0.1")


# -- trap rules ------------------------------------------------------------------------------


def test_session_ids_are_stripped() -> None:
    assert strip_session_ids("http://h/a?sid=1&b=2") == "http://h/a?b=2"
    assert strip_session_ids("http://h/a?b=2&PHPSESSID=zz") == "http://h/a?b=2"
    assert strip_session_ids("http://h/a;jsessionid=AB12?x=1") == "http://h/a?x=1"
    assert strip_session_ids("http://h/a?sid=1") == "http://h/a"
    # Names that merely contain "sid" are left alone.
    assert strip_session_ids("http://h/a?aside=1&inside=2") == "http://h/a?aside=1&inside=2"


def test_repeating_path_segments() -> None:
    assert repeats_a_segment("http://h/a/a/a/a/")
    assert repeats_a_segment("http://h/x/b/c/b/c/b/c/b/c")
    assert not repeats_a_segment("http://h/a/a/a/")
    assert not repeats_a_segment("http://h/2024/01/02/post.html")


async def test_per_host_budgets_bound_a_crawl(make_web: WebFactory, tmp_path: Path) -> None:
    web = await make_web(hosts=2, pages_per_host=60, features=False)
    settings = CrawlSettings(
        politeness=PolitenessSettings(delay=0.0, politeness_factor=0.0),
        scope=ScopeSettings(
            allow_domains=tuple(web.allow_domains),
            allow_loopback=True,
            max_pages_per_host=25,
            max_urls_per_host=40,
        ),
    )
    summary = await crawl([web.hub_url], settings, tmp_path / "data")
    per_host: dict[str, int] = {}
    for url in web.request_counts:
        host = url.split("/")[2]
        per_host[host] = per_host.get(host, 0) + 1
    assert per_host and all(n <= 25 for n in per_host.values())
    assert summary.stats.budget["host_urls"] > 0
    assert summary.stats.budget["host_pages"] > 0


async def test_max_disk_stops_fetching_and_keeps_the_queue(
    make_web: WebFactory, tmp_path: Path
) -> None:
    web = await make_web(hosts=2, pages_per_host=200, features=False, page_bytes=20_000)
    settings = CrawlSettings(
        concurrency=2,
        politeness=PolitenessSettings(delay=0.02, politeness_factor=0.0),
        scope=ScopeSettings(
            allow_domains=tuple(web.allow_domains), allow_loopback=True, max_disk_bytes=600_000
        ),
    )
    summary = await crawl([web.hub_url], settings, tmp_path / "data")
    assert summary.queued > 0  # stopped with work left, which stays queued
    assert len(web.request_counts) < len(web.ground_truth())


async def test_max_disk_holds_at_full_speed(make_web: WebFactory, tmp_path: Path) -> None:
    # No politeness gap and many fetchers: the data directory grows by megabytes a second,
    # while the directory itself is measured once a second.
    web = await make_web(hosts=4, pages_per_host=300, features=False, page_bytes=30_000)
    limit = 3_000_000
    settings = CrawlSettings(
        concurrency=16,
        politeness=PolitenessSettings(delay=0.0, politeness_factor=0.0),
        scope=ScopeSettings(
            allow_domains=tuple(web.allow_domains), allow_loopback=True, max_disk_bytes=limit
        ),
    )
    data = tmp_path / "data"
    summary = await crawl([web.hub_url], settings, data)
    assert summary.queued > 0
    used = directory_bytes(data)
    # The documented margin: what the fetches under way carry, and the stores' own growth.
    margin = settings.concurrency * 30_000 * 2 + 500_000
    assert used <= limit + margin, (used, limit)


# -- status server ---------------------------------------------------------------------------


async def test_half_open_connections_are_capped_and_timed_out(make_peer: PeerFactory) -> None:
    peer = await make_peer()
    limits = ConnectionLimits(max_connections=4, header_timeout=0.5, max_lifetime=30.0)
    server = StatusServer(peer, "127.0.0.1", 0, limits=limits)
    await server.start()
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    try:
        for _ in range(12):
            s = socket.socket()
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", server.port))
            await loop.sock_sendall(s, b"GET / HTTP/1.1\r\nHost: 127")  # and never the rest
            socks.append(s)
        guard = server.connections
        assert guard is not None
        for _ in range(100):
            if guard.refused >= 8 and guard.timed_out >= 4 and guard.open == 0:
                break
            await asyncio.sleep(0.05)
        assert guard.refused >= 8  # beyond the cap: reset at once
        assert guard.timed_out >= 4  # headers never completed: closed after the timeout
        assert guard.open == 0
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(server.url + "api/status") as resp,
        ):
            assert resp.status == 200
    finally:
        for s in socks:
            s.close()
        await server.aclose()


# -- logging ---------------------------------------------------------------------------------


def test_a_repeating_log_line_is_rate_limited_and_counted() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    limiter = RateLimitFilter(burst=5, window=0.2)
    handler.addFilter(limiter)
    log = logging.getLogger("p2pcrawl.test.flood")
    log.propagate = False
    log.addHandler(handler)
    try:
        for i in range(1000):
            log.error("accept failed: %s", i)
        log.error("another message")
        assert len(records) == 6
        assert limiter.suppressed_total == 995
        import time

        time.sleep(0.25)
        log.error("accept failed: %s", "again")
        assert "995 similar lines held back" in records[-1].getMessage()
    finally:
        log.removeHandler(handler)


# -- robots.txt cut short --------------------------------------------------------------------


async def test_a_robots_txt_cut_mid_body_is_unreachable_not_partial(tmp_path: Path) -> None:
    from aiohttp import web

    from p2pcrawl.testing.hostile import _reset
    from tests.p2pcrawl.loopback import serve

    rules = b"User-agent: *\n" + b"# padding\n" * 3000 + b"Disallow: /private/\n"

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        if request.raw_path == "/robots.txt":
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            resp.content_length = len(rules)
            await resp.prepare(request)
            await resp.write(rules[:1000])  # the Disallow line never arrives
            _reset(request)
            return resp
        return web.Response(text='<a href="/private/secret.html">x</a>', content_type="text/html")

    async with serve(handler) as served:
        settings = CrawlSettings(
            politeness=PolitenessSettings(
                delay=0.0, politeness_factor=0.0, max_retries=1, robots_error_ttl=0.1
            ),
            scope=ScopeSettings(allow_domains=(served.host,), allow_loopback=True),
        )
        summary = await crawl([served.base + "/"], settings, tmp_path / "data")
    # Without the rules, nothing may be fetched: the page waits, then ends unreachable.
    assert served.paths["/"] == 0 and served.paths["/private/secret.html"] == 0
    assert served.paths["/robots.txt"] >= 2
    assert summary.stats.errors["robots_unreachable"] == 1
