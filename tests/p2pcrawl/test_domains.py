"""Per-domain rules: read from the config's [domains."…"] tables, matched to hosts, and
applied by whichever peer owns a host, the rules having travelled from the peer that was
given them."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from p2pcrawl.crawl import DomainTable, decode_rules, encode_rules, parse_domain_tables
from p2pcrawl.settings import PeerSettings
from p2pcrawl.ui.options import UsageError, build_parser, merge_config, settings_from
from tests.conftest import PeerFactory, WebFactory, crawl_settings_for

pytestmark = pytest.mark.timeout(120)


def test_a_table_is_checked_and_a_subdomain_takes_its_nearest_table() -> None:
    rules = dict(
        parse_domain_tables(
            {
                "Example.org": {"delay": 2, "user-agent": "site-bot/1", "max-pages": 10},
                "docs.example.org": {"concurrency": 1, "exclude": ["/private/"]},
            }
        )
    )
    assert set(rules) == {"example.org", "docs.example.org"}
    table = DomainTable(rules.items())
    domain, r = table.for_host("www.example.org") or ("", None)
    assert domain == "example.org" and r is not None and r.delay == 2.0 and r.max_pages == 10
    domain, r = table.for_host("a.docs.example.org") or ("", None)
    # A table of its own is taken whole: nothing of the parent's carries over.
    assert domain == "docs.example.org" and r is not None and r.delay is None
    assert not table.patterns(domain, r).allows("http://a.docs.example.org/private/x")
    assert table.for_host("example.com") is None and table.for_host("xexample.org") is None
    for bad, why in (
        ({"a.org": {"delay": -1}}, "delay must be a number of seconds"),
        ({"a.org": {"concurrency": 0}}, "concurrency must be a whole number from 1"),
        ({"a.org": {"max-pages": 1.5}}, "max-pages must be a whole number"),
        ({"a.org": {"include": ["("]}}, "is not a regular expression"),
        ({"a.org": {"speed": 1}}, "unknown key 'speed'"),
        ({"a.org": {"user-agent": "bad\nagent"}}, "user-agent must be printable ASCII"),
        ({"a.org": 3}, "must be a table"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_domain_tables(bad)


def test_rules_round_trip_and_what_the_network_says_is_checked() -> None:
    rules = parse_domain_tables({"a.org": {"delay": 1.5, "include": ["/docs/"]}})
    assert decode_rules(encode_rules(rules)) == dict(rules)
    for junk in (None, 3, "not json", '{"a.org": {"delay": "fast"}}', "[1]", "x" * (2 << 20)):
        assert decode_rules(junk) == {}
    own = DomainTable(rules)
    # The network's rules fill in domains this peer has none for; its own win.
    assert own.adopt(dict(parse_domain_tables({"a.org": {"delay": 9}, "b.org": {"delay": 3}})))
    got = own.for_host("b.org")
    assert got is not None and got[1].delay == 3.0
    got = own.for_host("a.org")
    assert got is not None and got[1].delay == 1.5


def test_the_config_takes_domain_tables_and_says_what_is_wrong(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[domains."example.org"]\ndelay = 3\nuser-agent = "site-bot/1"\n')
    args = build_parser().parse_args(["join", "--listen", "127.0.0.1:0", "--config", str(good)])
    crawl, _ = settings_from(merge_config(args))
    assert crawl.domains and crawl.domains[0][0] == "example.org"
    assert crawl.domains[0][1].delay == 3.0 and crawl.domains[0][1].user_agent == "site-bot/1"
    bad = tmp_path / "bad.toml"
    bad.write_text('[domains."example.org"]\ndelay = "slow"\n')
    args = build_parser().parse_args(["join", "--listen", "127.0.0.1:0", "--config", str(bad)])
    with pytest.raises(UsageError, match=r"bad\.toml: domains\.'example\.org': delay must be"):
        merge_config(args)


async def test_a_domains_rules_travel_to_the_peer_that_owns_its_hosts(
    make_web: WebFactory, make_peer: PeerFactory
) -> None:
    web = await make_web(hosts=8, pages_per_host=10, features=False)
    hosts = list(web.allow_domains)
    agent, delay = "site-rules/1.0", 0.25
    tables: dict[str, dict[str, object]] = {h: {"delay": delay, "user-agent": agent} for h in hosts}
    tables[hosts[1]]["max-pages"] = 4
    tables[hosts[2]]["exclude"] = [r"/p1[0-9]?\.html$"]
    base = crawl_settings_for(web)
    # Only the founder is given the rules; lending is off so that each host is fetched by
    # its owner alone, and the rest of the settings are the defaults.
    founder = await make_peer(
        crawl=replace(base, domains=parse_domain_tables(tables)), peer=PeerSettings(lend=False)
    )
    joiner = await make_peer(
        crawl=base,
        peer=PeerSettings(lend=False),
        bootstrap=((founder.me.host, founder.me.port),),
    )
    assert joiner.engine is not None
    async with asyncio.timeout(20):  # the joiner reads the network's rules
        while not joiner.engine.domains:  # noqa: ASYNC110 (polled: no event says so)
            await asyncio.sleep(0.2)
    await founder.seed([web.hub_url])
    async with asyncio.timeout(90):
        await asyncio.gather(*(p.finished.wait() for p in (founder, joiner)))
    assert joiner.engine.stats.pages_fetched > 0, "the joiner owned no host: nothing shown"
    by_host: dict[str, list[float]] = defaultdict(list)
    for t, url, ua in web.request_log:
        assert ua == agent, (url, ua)
        by_host[url.split("/")[2].split(":")[0]].append(t)
    for host, times in by_host.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # The server's clock sees a request a moment after the peer sent it.
        assert not gaps or min(gaps) >= delay - 0.05, (host, min(gaps))
    assert len(by_host[hosts[1]]) <= 4
    assert not any(
        re.search(r"/p1[0-9]?\.html$", u) for _, u, _ in web.request_log if hosts[2] in u
    )


async def test_a_domains_patterns_hold_where_links_are_found_and_its_refusals_stay_open(
    make_web: WebFactory, make_peer: PeerFactory, tmp_path: Path
) -> None:
    from p2pcrawl.network import Peer, PeerConfig

    web = await make_web(hosts=2, pages_per_host=10, features=False)
    ruled = web.allow_domains[0]
    refused = [u for u in web.ground_truth() if ruled in u and "/s1/" in u]
    assert refused
    tables = {ruled: {"exclude": ["/s1/"]}}
    base = crawl_settings_for(web)
    peer = await make_peer(crawl=replace(base, domains=parse_domain_tables(tables)))
    assert peer.engine is not None
    verdicts = await peer.seed([web.hub_url, refused[0]])
    assert verdicts[1].result == "out_of_scope"
    assert verdicts[1].reason == f"matches [domains.\"{ruled}\"] exclude '/s1/'"
    async with asyncio.timeout(30):
        await peer.finished.wait()
    assert not set(refused) & set(web.request_counts)
    # Dropped where found: none of them was queued to be refused at the fetch.
    assert peer.engine.stats.budget["domain_patterns"] == 0
    # A URL that reaches the fetching peer unchecked (found by a peer that had not read the
    # rules yet) is refused there, and not recorded done.
    await peer.engine.add_seeds(refused)
    async with asyncio.timeout(10):
        while peer.engine.stats.budget["domain_patterns"] < len(refused):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert not set(refused) & set(web.request_counts)
    data_dir = peer.config.data_dir
    await peer.aclose()
    # Restarted without the table: the refused pages were never done, so they are crawled.
    again = Peer(PeerConfig(data_dir=data_dir, listen=("127.0.0.1", 0), crawl=base))
    try:
        await again.start()
        verdicts = await again.seed(refused)
        assert {v.result for v in verdicts} == {"accepted"}, verdicts
        async with asyncio.timeout(30):
            while not set(refused) <= set(web.request_counts):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    finally:
        await again.aclose()
