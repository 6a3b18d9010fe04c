"""Seeds and scope without surprises: a verdict per seed URL, and nothing refused by this
peer's own configuration recorded done for good; ``--recrawl``; include and exclude."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import Scope, check_seed
from p2pcrawl.crawl.patterns import UrlPatterns
from p2pcrawl.network import Peer, PeerConfig
from p2pcrawl.settings import CrawlSettings
from p2pcrawl.ui.status import StatusServer
from tests.conftest import PeerFactory, StatusFactory, WebFactory, crawl_settings_for

pytestmark = pytest.mark.timeout(120)


async def _verdict(raw: str, **kw: Any) -> tuple[str, str]:
    args: dict[str, Any] = {
        "scope": Scope(["a.example", "127.0.0.5"], allow_private=False),
        "scope_from_seeds": False,
        "patterns": UrlPatterns(),
        "max_url_length": 2048,
    }

    async def resolve(host: str) -> list[str]:
        return {"a.example": ["93.184.215.14"], "intranet.a.example": ["10.1.2.3"]}.get(host, [])

    args.update(kw)
    v = await check_seed(raw, resolve=resolve, **args)
    return v.result, v.reason


async def test_each_seed_gets_a_verdict_with_its_reason() -> None:
    assert await _verdict("https://a.example/") == ("accepted", "")
    result, reason = await _verdict("a.example")
    assert result == "invalid" and reason == "no scheme: did you mean https://a.example?"
    result, reason = await _verdict("https://b.example/x")
    assert result == "out_of_scope"
    assert reason == "host b.example is not in --allow-domain (127.0.0.5, a.example)"
    for private in ("http://127.0.0.5/", "http://intranet.a.example/"):
        result, reason = await _verdict(private)
        assert result == "refused_private" and "--allow-private" in reason, private
    allowing = Scope(["127.0.0.5"], allow_private=True)
    assert (await _verdict("http://127.0.0.5/", scope=allowing))[0] == "accepted"
    excluded = UrlPatterns(exclude=[r"/private/"])
    result, reason = await _verdict("https://a.example/private/x", patterns=excluded)
    assert (result, reason) == ("out_of_scope", "matches --exclude '/private/'")
    only_blog = UrlPatterns(include=[r"/blog/"])
    assert (await _verdict("https://a.example/shop", patterns=only_blog))[0] == "out_of_scope"
    assert (await _verdict("https://a.example/blog/1", patterns=only_blog))[0] == "accepted"
    # No --allow-domain: a seed defines the scope, so any host is accepted.
    assert (await _verdict("https://b.example/", scope_from_seeds=True))[0] == "accepted"


async def test_localhost_is_refused_by_the_guard_like_its_address() -> None:
    # The real resolver: "localhost" resolves to loopback on every machine.
    v = await check_seed(
        "http://localhost:8000/",
        scope=Scope([]),
        scope_from_seeds=True,
        patterns=UrlPatterns(),
        max_url_length=2048,
    )
    assert v.result == "refused_private" and v.canonical == "http://localhost:8000/"


async def test_allow_loopback_admits_loopback_seeds_and_nothing_else() -> None:
    # The guard a seed meets is the scope's, as at the fetch: --allow-loopback admits a
    # site on this machine, by address or by name, and still refuses the intranet.
    loopback = Scope(["127.0.0.5", "localhost", "a.example"], allow_loopback=True)
    assert (await _verdict("http://127.0.0.5/", scope=loopback)) == ("accepted", "")
    v = await check_seed(
        "http://localhost:8000/",
        scope=loopback,
        scope_from_seeds=False,
        patterns=UrlPatterns(),
        max_url_length=2048,
    )
    assert v.result == "accepted"
    result, reason = await _verdict("http://intranet.a.example/", scope=loopback)
    assert result == "refused_private" and "--allow-private" in reason
    result, reason = await _verdict("http://127.0.0.5/")
    assert result == "refused_private" and "--allow-loopback" in reason


def test_bad_patterns_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match=r"^--include '\(' is not a regular expression"):
        UrlPatterns(include=["("])


def _settings(web: Any, **scope: Any) -> CrawlSettings:
    base = crawl_settings_for(web)
    return replace(base, scope=replace(base.scope, **scope))


async def _wait_quiet(peer: Peer, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        st = peer.status()
        idle = not (st["tasks_queued"] or st["tasks_in_flight"] or st["rpc_in_transit"])
        quiet = quiet + 1 if idle else 0
        if quiet >= 10:
            return st
        await asyncio.sleep(0.1)
    raise AssertionError(f"not idle: {peer.status()}")


async def test_a_url_refused_without_allow_private_is_crawled_once_allowed(
    tmp_path: Path, make_web: WebFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: a loopback site seeded without --allow-private, then with it."""
    web = await make_web(hosts=1, pages_per_host=5)
    data = tmp_path / "peer"
    strict = _settings(web, allow_private=False)
    peer = Peer(PeerConfig(data_dir=data, crawl=strict))
    await peer.start()
    try:
        verdicts = await peer.seed([web.hub_url])
        assert [v.result for v in verdicts] == ["refused_private"]
        assert "--allow-private" in verdicts[0].reason
        # Had it been routed anyway (a link, a peer with another configuration), the fetch
        # is refused, counted and dropped, and said once, but not recorded done.
        with caplog.at_level(logging.WARNING, logger="p2pcrawl"):
            assert await peer.add_seeds([web.hub_url]) == 1
            st = await _wait_quiet(peer)
        # robots.txt and the page: both refused by the guard.
        assert st["errors_by_kind"].get("forbidden", 0) >= 1 and st["done"] == 0
        assert st["pages_fetched"] == 0 and st["tasks_queued"] == 0
        refusals = [r for r in caplog.records if "--allow-private" in r.getMessage()]
        assert len(refusals) == 1
    finally:
        await peer.aclose()

    peer = Peer(PeerConfig(data_dir=data, crawl=_settings(web, allow_private=True)))
    await peer.start()
    try:
        verdicts = await peer.seed([web.hub_url])
        assert [v.result for v in verdicts] == ["accepted"]
        st = await _wait_quiet(peer)
        assert st["pages_fetched"] == len(web.ground_truth())
    finally:
        await peer.aclose()


async def test_a_done_seed_is_already_known_until_recrawl(
    make_web: WebFactory, make_peer: PeerFactory
) -> None:
    web = await make_web(hosts=1, pages_per_host=5)
    peer = await make_peer(crawl=crawl_settings_for(web))
    assert [v.result for v in await peer.seed([web.hub_url])] == ["accepted"]
    first = (await _wait_quiet(peer))["pages_fetched"]
    again = await peer.seed([web.hub_url])
    assert again[0].result == "already_known" and "--recrawl" in again[0].reason
    await asyncio.sleep(0.5)
    assert peer.status()["pages_fetched"] == first
    recrawl = await peer.seed([web.hub_url], recrawl=True)
    assert recrawl[0].result == "accepted" and "queued again" in recrawl[0].reason
    st = await _wait_quiet(peer)
    assert st["pages_fetched"] == first + 1  # the seed itself; its links stay done


async def test_seed_command_reports_each_url_across_peers(
    make_web: WebFactory, make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    web = await make_web(hosts=3, pages_per_host=5)
    crawl = crawl_settings_for(web)
    founder = await make_peer(crawl=crawl)
    await make_peer(crawl=crawl, bootstrap=((founder.me.host, founder.me.port),))
    server: StatusServer = await make_status(founder)
    assert [v.result for v in await founder.seed([web.hub_url])] == ["accepted"]
    await _wait_quiet(founder)
    others = [f"http://{h}:{web.port}/" for h in web.allow_domains[1:]]
    args = ["--peer", f"127.0.0.1:{server.port}", web.hub_url, *others]
    args += ["http://127.0.0.250:9/", "example.org"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "p2pcrawl",
        "seed",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    lines = out.decode().splitlines()
    assert proc.returncode == 1, (out, err)  # a seed was out of scope, one invalid
    assert lines[0].startswith("already known") and web.hub_url in lines[0]
    # The other hosts' front pages were crawled through links: known to their owners too.
    assert all(line.startswith("already known") for line in lines[1 : len(others) + 1])
    assert lines[len(others) + 1].startswith("out of scope")
    assert "127.0.0.250 is not in --allow-domain" in lines[len(others) + 1]
    # One URL without a scheme gets its own verdict and the hint; the rest are answered.
    assert lines[len(others) + 2].startswith("invalid")
    assert "did you mean https://example.org?" in lines[len(others) + 2]
    assert lines[-1] == f"accepted 0 of {len(others) + 3} seed(s)"


async def test_include_and_exclude_patterns_shape_the_crawl(
    tmp_path: Path, make_web: WebFactory, make_peer: PeerFactory
) -> None:
    web = await make_web(hosts=2, pages_per_host=10)
    truth = web.ground_truth()
    settings = _settings(web, exclude=(r"/s[0-9]+/p1[0-9]?\.html$",))
    peer = await make_peer(crawl=settings)
    await peer.seed([web.hub_url])
    await _wait_quiet(peer)
    await peer.aclose()
    got = set(read_warc_urls(peer.config.data_dir / "warc"))
    patterns = UrlPatterns(exclude=settings.scope.exclude)
    excluded = {u for u in truth if patterns.refusal(u)}
    assert excluded and got and not got & excluded
    assert got <= truth


async def test_include_and_exclude_come_from_the_command_line_and_toml(tmp_path: Path) -> None:
    from p2pcrawl.ui.options import build_parser, merge_config, settings_from

    toml = tmp_path / "c.toml"
    toml.write_text('include = ["^https://a\\\\.org/"]\nexclude = ["\\\\.pdf$"]\n')
    args = build_parser().parse_args(
        ["join", "--listen", "127.0.0.1:0", "--config", str(toml), "--exclude", "/tmp/"]
    )
    crawl, _ = settings_from(merge_config(args))
    assert crawl.scope.include == (r"^https://a\.org/",)
    assert crawl.scope.exclude == ("/tmp/",)  # the command line wins over the file
    bad = build_parser().parse_args(["join", "--listen", "127.0.0.1:0", "--include", "("])
    with pytest.raises(Exception, match=r"--include '\(' is not a regular expression"):
        settings_from(merge_config(bad))


async def test_recrawl_of_a_url_another_peer_owns_asks_that_peer(
    make_web: WebFactory, make_peer: PeerFactory, make_status: StatusFactory
) -> None:
    web = await make_web(hosts=4, pages_per_host=5)
    crawl = crawl_settings_for(web)
    founder = await make_peer(crawl=crawl)
    joiner = await make_peer(crawl=crawl, bootstrap=((founder.me.host, founder.me.port),))
    servers = {p.node_id: await make_status(p) for p in (founder, joiner)}
    await founder.seed([web.hub_url])
    await _wait_quiet(founder)
    await _wait_quiet(joiner)
    # Some host belongs to one of the two; seed it again through the other.
    url = f"http://{web.allow_domains[0]}:{web.port}/"
    assert founder.node is not None and founder.engine is not None
    owner_id = (await founder.node.owner(founder.engine.key_of(url))).id
    owner, asker = (founder, joiner) if owner_id == founder.node_id else (joiner, founder)
    before = int(owner.status()["pages_fetched"])  # type: ignore[call-overload]
    ask = servers[asker.node_id].url + "api/seed"
    async with aiohttp.ClientSession() as s:
        async with s.post(ask, json={"urls": [url]}) as resp:
            plain = (await resp.json())["seeds"][0]
        async with s.post(ask, json={"urls": [url], "recrawl": True}) as resp:
            again = (await resp.json())["seeds"][0]
    short = owner.node_id.hex()[:8]
    assert plain["result"] == "already_known" and short in plain["reason"], plain
    assert again["result"] == "accepted", again
    assert "queued again" in again["reason"] and short in again["reason"], again
    await asyncio.sleep(0.3)
    await _wait_quiet(owner)
    assert owner.status()["pages_fetched"] == before + 1
