from __future__ import annotations

import pytest

from p2pcrawl.crawl.robots import (
    KEPT_ROBOTS_CHARS,
    MAX_ROBOTS_BYTES,
    RobotsCache,
    RobotsPolicy,
    policy_from_lent,
    policy_from_response,
    ua_token,
)
from p2pcrawl.settings import PolitenessSettings

UA = "p2pcrawl/0.1.0 (+http://example.org/bot)"
SETTINGS = PolitenessSettings(robots_ttl=1000.0, robots_error_ttl=60.0)


def parse(text: str, now: float = 0.0) -> RobotsPolicy:
    return policy_from_response(200, text.encode(), now, SETTINGS)


@pytest.mark.parametrize(
    ("user_agent", "token"),
    [
        (UA, "p2pcrawl"),
        ("P2PCrawl", "p2pcrawl"),
        ("my_bot-x/2.0", "my_bot-x"),
        ("Mozilla/5.0 (compatible; p2pcrawl/1.0)", "mozilla"),
        ("", ""),
        ("   ", ""),
        ("360Spider/1", "360spider"),
        ("/1.0", ""),
    ],
)
def test_ua_token_is_the_product_token(user_agent: str, token: str) -> None:
    assert ua_token(user_agent) == token


def test_disallowed_subtree_and_longest_match() -> None:
    policy = parse("User-agent: *\nDisallow: /private/\nAllow: /private/open\n")
    assert policy.kind == "rules"
    assert policy.allowed("http://a.test/", UA)
    assert policy.allowed("http://a.test/public/page", UA)
    assert not policy.allowed("http://a.test/private/", UA)
    assert not policy.allowed("http://a.test/private/deep/x?q=1", UA)
    # RFC 9309 §2.2.2: the longer (more specific) Allow wins.
    assert policy.allowed("http://a.test/private/open/file", UA)


def test_group_named_for_our_token_beats_the_star_group() -> None:
    text = (
        "User-agent: *\nDisallow: /\n\n"
        "User-agent: P2PCrawl\nDisallow: /only-this\nCrawl-delay: 7\n\n"
        "User-agent: otherbot\nDisallow: /other\n"
    )
    policy = parse(text)
    assert policy.allowed("http://a.test/page", UA)
    assert not policy.allowed("http://a.test/only-this", UA)
    assert policy.allowed("http://a.test/other", UA)
    assert policy.crawl_delay(UA) == 7.0
    # Another agent falls back to the * group.
    assert not policy.allowed("http://a.test/page", "somebot/1.0")
    assert policy.crawl_delay("somebot/1.0") is None


def test_group_for_a_longer_name_does_not_capture_us() -> None:
    policy = parse("User-agent: p2pcrawler-pro\nDisallow: /\n")
    assert policy.allowed("http://a.test/page", UA)


def test_crawl_delay_honoured() -> None:
    policy = parse("User-agent: *\nCrawl-delay: 2.5\nDisallow: /x\n")
    assert policy.crawl_delay(UA) == 2.5
    assert parse("User-agent: *\nDisallow: /x\n").crawl_delay(UA) is None


def test_request_rate_becomes_a_delay_and_the_longer_gap_wins() -> None:
    assert parse("User-agent: *\nRequest-rate: 1/10s\n").crawl_delay(UA) == 10.0
    policy = parse("User-agent: *\nRequest-rate: 1/10s\nCrawl-delay: 30\n")
    assert policy.crawl_delay(UA) == 30.0


def test_empty_robots_allows_everything() -> None:
    policy = policy_from_response(200, b"", 0.0, SETTINGS)
    assert policy.allowed("http://a.test/anything", UA)
    assert policy_from_response(204, None, 0.0, SETTINGS).allowed("http://a.test/x", UA)


def test_byte_order_mark_does_not_hide_the_first_group() -> None:
    body = b"\xef\xbb\xbfUser-agent: *\nDisallow: /secret\n"
    policy = policy_from_response(200, body, 0.0, SETTINGS)
    assert not policy.allowed("http://a.test/secret", UA)


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    body = b"User-agent: *\nDisallow: /caf\xe9\nDisallow: /admin\n"
    policy = policy_from_response(200, body, 0.0, SETTINGS)
    assert not policy.allowed("http://a.test/admin", UA)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410])
def test_4xx_allows_all(status: int) -> None:
    # RFC 9309 §2.3.1.3.
    policy = policy_from_response(status, b"<html>not found</html>", 100.0, SETTINGS)
    assert policy.kind == "allow_all"
    assert policy.allowed("http://a.test/private/", UA)
    assert policy.crawl_delay(UA) is None
    assert policy.expires_at == 100.0 + SETTINGS.robots_ttl


@pytest.mark.parametrize("status", [None, 500, 502, 503, 599, 429, 301, 100])
def test_unreachable_disallows_all_with_the_error_ttl(status: int | None) -> None:
    # RFC 9309 §2.3.1.4.
    policy = policy_from_response(status, None, 100.0, SETTINGS)
    assert policy.kind == "disallow_all"
    assert not policy.allowed("http://a.test/", UA)
    assert policy.crawl_delay(UA) is None
    assert policy.expires_at == 100.0 + SETTINGS.robots_error_ttl


def test_success_expires_after_the_ttl() -> None:
    policy = parse("User-agent: *\nDisallow:\n", now=5.0)
    assert policy.expires_at == 5.0 + SETTINGS.robots_ttl
    assert not policy.expired(5.0 + SETTINGS.robots_ttl - 0.001)
    assert policy.expired(5.0 + SETTINGS.robots_ttl)


def test_a_lent_policy_keeps_the_owners_rules_and_expiry() -> None:
    """What a borrower makes of the robots.txt an owner lent with a host: the same rules and
    Crawl-delay, expiring when the owner's does (never later than its own fetch would)."""
    text = "User-agent: *\nDisallow: /private/\nCrawl-delay: 2\n"
    owner = parse(text)
    assert owner.body == text.encode()
    lent = policy_from_lent(owner.body, 30, 100.0, SETTINGS)
    assert lent.kind == "rules" and lent.expires_at == 130.0
    assert not lent.allowed("http://example.org/private/x", UA)
    assert lent.allowed("http://example.org/public", UA)
    assert lent.crawl_delay(UA) == 2.0
    assert policy_from_lent(None, 10**6, 0.0, SETTINGS).expires_at == SETTINGS.robots_ttl
    assert policy_from_lent(None, 30, 0.0, SETTINGS).kind == "allow_all"
    # A long file is parsed as ever, but not kept to be lent.
    assert parse("#" * KEPT_ROBOTS_CHARS + "\nDisallow: /\n").body is None


def test_huge_body_is_parsed_up_to_the_limit_only() -> None:
    head = b"User-agent: *\nDisallow: /early\n"
    filler = b"# padding\n" * (MAX_ROBOTS_BYTES // 10)
    late = b"Disallow: /late\n"
    body = head + filler + late + b"x" * (2 * MAX_ROBOTS_BYTES)
    policy = policy_from_response(200, body, 0.0, SETTINGS)
    assert not policy.allowed("http://a.test/early", UA)
    # Past 500 KiB (RFC 9309 §2.5): ignored.
    assert policy.allowed("http://a.test/late", UA)


def test_rule_cut_by_the_limit_is_dropped_not_shortened() -> None:
    head = b"User-agent: *\n"
    pad = b"#" * (MAX_ROBOTS_BYTES - len(head) - len(b"\nDisallow: /a")) + b"\n"
    body = head + pad + b"Disallow: /abcdef\n"
    assert len(head + pad + b"Disallow: /a") == MAX_ROBOTS_BYTES
    policy = policy_from_response(200, body, 0.0, SETTINGS)
    # Had we kept the cut line we would read "Disallow: /a" and block /apple.
    assert policy.allowed("http://a.test/apple", UA)


def test_cache_returns_fresh_policies_and_drops_expired_ones() -> None:
    cache = RobotsCache()
    assert cache.get("http://a.test", 0.0) is None
    policy = policy_from_response(404, None, 0.0, SETTINGS)
    cache.put("http://a.test", policy)
    assert cache.get("http://a.test", SETTINGS.robots_ttl - 1) is policy
    assert len(cache) == 1
    assert cache.get("http://a.test", SETTINGS.robots_ttl) is None
    assert len(cache) == 0


def test_cache_error_policy_expires_sooner() -> None:
    cache = RobotsCache()
    cache.put("http://a.test", policy_from_response(None, None, 0.0, SETTINGS))
    assert cache.get("http://a.test", SETTINGS.robots_error_ttl - 1) is not None
    assert cache.get("http://a.test", SETTINGS.robots_error_ttl) is None


def test_cache_put_replaces() -> None:
    cache = RobotsCache()
    cache.put("h", policy_from_response(None, None, 0.0, SETTINGS))
    cache.put("h", policy_from_response(404, None, 0.0, SETTINGS))
    assert len(cache) == 1
    got = cache.get("h", 1.0)
    assert got is not None and got.kind == "allow_all"


def test_cache_is_a_bounded_lru() -> None:
    cache = RobotsCache(max_hosts=2)
    policy = policy_from_response(404, None, 0.0, SETTINGS)
    cache.put("a", policy)
    cache.put("b", policy)
    assert cache.get("a", 1.0) is policy  # a is now the most recently used
    cache.put("c", policy)
    assert len(cache) == 2
    assert cache.get("b", 1.0) is None
    assert cache.get("a", 1.0) is policy
    assert cache.get("c", 1.0) is policy


def test_cache_rejects_a_zero_bound() -> None:
    with pytest.raises(ValueError):
        RobotsCache(max_hosts=0)
