from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import get_args

import pytest

from p2pcrawl.crawl.scheduling import (
    DEFAULT_REQUESTS_PER_CONNECTION,
    LONG_FOUND,
    POLICIES,
    ServerEstimate,
    capability,
    connection_time,
    expected_pages,
    found,
    host_key,
    pages_per_second,
    rank_of,
    request_priority,
    url_key,
    url_quality,
)
from p2pcrawl.settings import Policy

RPC = DEFAULT_REQUESTS_PER_CONNECTION


@dataclass
class Server:
    """A server queue entry as the frontier would hold it."""

    name: str
    arrival_seq: int
    est: ServerEstimate
    depths: Sequence[int] = field(default_factory=lambda: [1] * 10)
    taken: int = 0
    leading: bool = False
    borrowed: bool = False


def fast() -> ServerEstimate:
    return ServerEstimate(connect_time=0.01, response_time=0.05)


def slow() -> ServerEstimate:
    return ServerEstimate(connect_time=0.5, response_time=2.0)


def order(policy: str, servers: Sequence[Server], rpc: int = RPC) -> list[str]:
    """Names in the order the server queue would open connections to them."""

    def key(s: Server) -> tuple[float, int]:
        urls = sorted(range(len(s.depths)), key=lambda i: url_key(policy, depth=s.depths[i], seq=i))
        return host_key(
            policy,
            arrival_seq=s.arrival_seq,
            est=s.est,
            queued=len(s.depths),
            next_qualities=[url_quality(s.depths[i]) for i in urls],
            requests_per_connection=rpc,
            taken=s.taken,
            leading=s.leading,
            borrowed=s.borrowed,
        )

    return [s.name for s in sorted(servers, key=key)]


def test_policies_match_the_settings_literal() -> None:
    assert get_args(Policy) == POLICIES


def test_expected_pages_is_the_smaller_of_the_two() -> None:
    assert expected_pages(50, 10) == 10
    assert expected_pages(50, 500) == 50
    assert expected_pages(1, 500) == 1
    assert expected_pages(50, 0) == 0


def test_rate_is_pages_over_connection_time() -> None:
    est = ServerEstimate(connect_time=0.5, response_time=0.25)
    assert connection_time(est, 4) == 2 * 0.5 + 4 * 0.25
    assert pages_per_second(est, 4) == 4 / 2.0
    assert pages_per_second(est, 0) == 0.0


def test_capability_is_quality_over_connection_time() -> None:
    est = ServerEstimate(connect_time=0.5, response_time=0.25)
    assert capability(est, [1.0, 0.5, 0.5]) == pytest.approx(2.0 / 1.75)
    assert capability(est, []) == 0.0


def test_zero_times_do_not_divide_by_zero() -> None:
    est = ServerEstimate(connect_time=0.0, response_time=0.0)
    assert pages_per_second(est, 3) > 0
    assert capability(est, [1.0]) > 0


def test_url_quality_prefers_shallow_urls() -> None:
    assert url_quality(0) == 1.0
    assert url_quality(1) == 0.5
    assert url_quality(0) > url_quality(1) > url_quality(9) > 0
    assert url_quality(-3) == 1.0


def test_smoothing_uses_weight_and_converges() -> None:
    est = ServerEstimate(connect_time=1.0, response_time=1.0)
    est.observe(0.0, 2.0)
    assert est.connect_time == pytest.approx(0.8)
    assert est.response_time == pytest.approx(1.2)
    for _ in range(100):
        est.observe(0.2, 0.3)
    assert est.connect_time == pytest.approx(0.2, abs=1e-6)
    assert est.response_time == pytest.approx(0.3, abs=1e-6)


def test_smoothing_skips_unmeasured_values() -> None:
    est = ServerEstimate(connect_time=1.0, response_time=1.0)
    est.observe(None, 0.0)
    assert est.connect_time == 1.0
    assert est.response_time == pytest.approx(0.8)
    with pytest.raises(ValueError):
        est.observe(1.0, 1.0, weight=1.5)


def test_breadth_first_serves_servers_in_arrival_order_regardless_of_speed() -> None:
    servers = [
        Server("slow-first", 0, slow(), [5] * 2),
        Server("fast-second", 1, fast(), [0] * 100),
        Server("slow-third", 2, slow()),
    ]
    assert order("breadth-first", servers) == ["slow-first", "fast-second", "slow-third"]


def test_performance_first_puts_fast_servers_first() -> None:
    servers = [Server("slow", 0, slow()), Server("fast", 1, fast())]
    assert order("performance-first", servers) == ["fast", "slow"]


def test_performance_first_prefers_more_queued_urls_at_equal_speed() -> None:
    # P effect: the connect cost is shared by more pages, so R = P / T grows with P.
    servers = [Server("one-url", 0, fast(), [0]), Server("ten-urls", 1, fast(), [0] * 10)]
    assert order("performance-first", servers) == ["ten-urls", "one-url"]


def test_performance_first_caps_p_at_requests_per_connection() -> None:
    # Past the per-connection limit, more queued URLs no longer help: a tie, broken FIFO.
    servers = [Server("a", 0, fast(), [0] * 20), Server("b", 1, fast(), [0] * 500)]
    assert order("performance-first", servers, rpc=10) == ["a", "b"]
    servers = [Server("b", 0, fast(), [0] * 500), Server("a", 1, fast(), [0] * 20)]
    assert order("performance-first", servers, rpc=10) == ["b", "a"]


def test_performance_first_ignores_quality() -> None:
    servers = [Server("shallow", 0, fast(), [0] * 5), Server("deep", 1, fast(), [9] * 5)]
    assert order("performance-first", servers) == ["shallow", "deep"]
    servers = [Server("deep", 0, fast(), [9] * 5), Server("shallow", 1, fast(), [0] * 5)]
    assert order("performance-first", servers) == ["deep", "shallow"]


def test_crawl_capability_prefers_shallow_urls_at_equal_speed() -> None:
    servers = [Server("deep", 0, fast(), [6] * 10), Server("shallow", 1, fast(), [1] * 10)]
    assert order("crawl-capability", servers) == ["shallow", "deep"]


def test_crawl_capability_prefers_fast_servers_at_equal_quality() -> None:
    servers = [Server("slow", 0, slow(), [1] * 10), Server("fast", 1, fast(), [1] * 10)]
    assert order("crawl-capability", servers) == ["fast", "slow"]


def test_crawl_capability_weighs_quality_against_speed() -> None:
    # A much faster server with slightly deeper pages still yields more quality per second.
    servers = [
        Server("slow-shallow", 0, slow(), [0] * 10),
        Server("fast-a-bit-deeper", 1, fast(), [2] * 10),
    ]
    assert order("crawl-capability", servers) == ["fast-a-bit-deeper", "slow-shallow"]


def test_crawl_capability_counts_only_the_next_p_urls() -> None:
    # Both servers' next connection fetches 2 URLs of depth 0; the deep tail is not counted.
    servers = [Server("a", 0, fast(), [0, 0, 9, 9]), Server("b", 1, fast(), [0, 0])]
    assert order("crawl-capability", servers, rpc=2) == ["a", "b"]


def test_longest_first_takes_the_most_queued_server_whatever_its_speed() -> None:
    # Past the per-connection cap too: a crawl ends no sooner than its longest queue.
    servers = [
        Server("fast-short", 0, fast(), [0] * 20, taken=1),
        Server("slow-long", 1, slow(), [0] * 500, taken=1),
        Server("fast-middle", 2, fast(), [0] * 100, taken=1),
    ]
    assert order("longest-first", servers, rpc=10) == ["slow-long", "fast-middle", "fast-short"]


def test_longest_first_counts_what_was_found_of_a_server_not_only_its_queue() -> None:
    # The long server's queue has just drained to two URLs (their links not yet arrived);
    # fifty fetched already say it is the long one.
    servers = [
        Server("ten-new", 0, fast(), [0] * 10, taken=1),
        Server("long-drained", 1, fast(), [0] * 2, taken=50),
    ]
    assert order("longest-first", servers) == ["long-drained", "ten-new"]
    # The other policies do not read it.
    assert order("breadth-first", servers) == ["ten-new", "long-drained"]


def test_longest_first_explores_a_server_never_fetched_from_before_the_short_ones() -> None:
    # Its size is unknown and one request tells: the long server found late ends a crawl.
    servers = [Server("short", 0, fast(), [0] * 5, taken=10), Server("root", 1, fast(), [0])]
    assert order("longest-first", servers) == ["root", "short"]
    # Just short of LONG_FOUND found, a server still waits for the roots.
    servers[0].depths, servers[0].taken = [0] * 3, LONG_FOUND - 4
    assert order("longest-first", servers) == ["root", "short"]


def test_longest_first_serves_a_server_known_to_be_long_before_the_roots() -> None:
    """A peer explores its ~125 roots over seconds while its pace is shared: a second long
    server behind them all waited 10 s, and ended the crawl (cluster benchmark)."""
    servers = [
        Server("long", 0, fast(), [0] * 3, taken=LONG_FOUND - 3),
        Server("root", 1, fast(), [0]),
    ]
    assert order("longest-first", servers) == ["long", "root"]
    assert request_priority(queued=3, taken=LONG_FOUND - 2) < request_priority(queued=0, taken=1)


def test_the_pacer_serves_a_servers_first_page_then_the_server_with_most_found() -> None:
    """Read while the request is under way, its own URL taken: the root of a server never
    fetched from goes before a short server's page, a long server's page before it, and
    among explored servers the one with most found goes first, however far its queue has
    drained."""
    root = request_priority(queued=0, taken=1)
    long_drained = request_priority(queued=1, taken=80)
    short = request_priority(queued=5, taken=2)
    assert sorted([short, long_drained, root]) == [long_drained, root, short]
    # The frontier's longest-first rank agrees, counted before the request took its URL.
    assert long_drained == -found(2, 79) and short == -found(6, 1)
    assert found(1, 0) == math.inf
    # A borrowed server goes first as a root does: its owner is behind, and its borrower
    # saw only what it was lent.
    assert request_priority(queued=0, taken=3, borrowed=True) < root
    # The leading server (Frontier.leader) goes even before a root: while the roots are
    # explored, one long server's chain keeps going.
    assert request_priority(queued=0, taken=3, leading=True) < root
    assert rank_of(found(1, 0)) == root and root > -math.inf


def test_longest_first_puts_the_leading_server_before_the_roots() -> None:
    root = Server("root", 0, fast(), [0])
    short = Server("short", 1, fast(), [0] * 3, taken=2)
    assert order("longest-first", [root, short]) == ["root", "short"]
    short.leading = True
    assert order("longest-first", [root, short]) == ["short", "root"]


def test_a_borrowed_server_goes_first_under_every_policy() -> None:
    """Its owner is behind, and cannot fetch it while it is lent: ranked as a server never
    fetched from, it waited behind every root its borrower was exploring."""
    for policy in POLICIES:
        root = Server("root", 0, fast(), [0])
        lent = Server("lent", 9, slow(), [9])
        assert order(policy, [root, lent]) == ["root", "lent"], policy
        lent.borrowed = True
        assert order(policy, [root, lent]) == ["lent", "root"], policy


def test_equal_servers_tie_break_by_arrival() -> None:
    for policy in POLICIES:
        servers = [Server("later", 5, fast()), Server("earlier", 2, fast())]
        assert order(policy, servers) == ["earlier", "later"]


def test_urls_are_fifo_for_breadth_and_performance_first() -> None:
    for policy in ("breadth-first", "performance-first"):
        urls = [(0, 9), (1, 0), (2, 3)]  # (seq, depth)
        got = sorted(urls, key=lambda u: url_key(policy, depth=u[1], seq=u[0]))
        assert [seq for seq, _ in got] == [0, 1, 2]


def test_urls_are_best_quality_first_for_crawl_capability() -> None:
    urls = [(0, 9), (1, 0), (2, 3), (3, 0)]  # (seq, depth)
    got = sorted(urls, key=lambda u: url_key("crawl-capability", depth=u[1], seq=u[0]))
    assert [seq for seq, _ in got] == [1, 3, 2, 0]


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        url_key("quality-first", depth=0, seq=0)
    for borrowed in (False, True):  # a borrowed server goes first only under a known policy
        with pytest.raises(ValueError):
            host_key(
                "random",
                arrival_seq=0,
                est=fast(),
                queued=1,
                next_qualities=[1.0],
                requests_per_connection=RPC,
                borrowed=borrowed,
            )
