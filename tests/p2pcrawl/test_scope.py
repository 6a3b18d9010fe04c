"""Scope: which hosts a crawl may touch, and the SSRF guard, from tables and end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from p2pcrawl.crawl import Scope, crawl, is_forbidden_address, normalise_domain, urls
from tests.p2pcrawl.loopback import fast_settings, serve

# (allowed domains, host name, allowed?) with allow_private=False throughout.
DOMAIN_CASES = [
    (("example.com",), "example.com", True),
    (("example.com",), "www.example.com", True),
    (("example.com",), "a.b.example.com", True),
    (("example.com",), "notexample.com", False),
    (("example.com",), "example.com.evil.net", False),
    (("example.com",), "example.org", False),
    (("example.com",), "com", False),
    (("www.example.com",), "example.com", False),  # a subdomain does not allow its parent
    (("www.example.com",), "img.www.example.com", True),
    (("Example.COM",), "example.com", True),  # case
    (("EXAMPLE.com",), "www.example.com", True),
    (("example.com.",), "example.com", True),  # trailing dot in the allow list
    (("example.com.",), "www.example.com", True),
    (("example.com",), "example.com.", True),  # trailing dot on the host (FQDN form)
    (("example.com",), "www.example.com.", True),
    (("https://example.com:8443/path",), "example.com", True),  # what users paste
    (("example.com:8080",), "example.com", True),
    (("example.com", "example.org"), "x.example.org", True),
    ((), "example.com", False),
    (("",), "example.com", False),
    # An IP address matches that host only (on any port), never "subdomains".
    (("8.8.8.8",), "8.8.8.8", True),
    (("8.8.8.8:53",), "8.8.8.8", True),
    (("8.8.8.8",), "8.8.8.80", False),
    (("8.8.8.8",), "x.8.8.8.8", False),
    (("8.8.4.4",), "8.8.8.8", False),
    (("2001:4860:4860::8888",), "2001:4860:4860::8888", True),
    (("[2001:4860:4860::8888]:443",), "2001:4860:4860::8888", True),
    (("http://[2001:4860:4860::8888]/",), "2001:4860:4860::8888", True),
]


@pytest.mark.parametrize(("domains", "host", "allowed"), DOMAIN_CASES)
def test_domain_matching(domains: tuple[str, ...], host: str, allowed: bool) -> None:
    assert Scope(domains).allows_host(host) is allowed
    # The answer is cached per host; asking again must not change it.
    assert Scope(domains).allows_host(host) is allowed


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.5/",
        "http://127.0.0.5:8080/a",
        "https://127.0.0.5:8443/b?c=d",
        "HTTP://127.0.0.5:1/",
    ],
)
def test_ip_matches_on_any_port(url: str) -> None:
    canonical = urls.canonicalize(url)
    assert canonical is not None
    assert Scope(["127.0.0.5"], allow_private=True).allows_host(urls.hostname_of(canonical))
    assert not Scope(["127.0.0.6"], allow_private=True).allows_host(urls.hostname_of(canonical))


PRIVATE = [
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    "169.254.1.1",  # link-local (cloud metadata lives at 169.254.169.254)
    "127.0.0.1",
    "127.0.0.2",
    "0.0.0.0",
    "224.0.0.1",  # multicast
    "::1",
    "fc00::1",  # unique local
    "fe80::1",  # link-local
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:10.0.0.1",
    "::",
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2001:4860:4860::8888"]


@pytest.mark.parametrize("address", PRIVATE)
def test_private_addresses_refused_unless_allowed(address: str) -> None:
    assert is_forbidden_address(address)
    assert not Scope([address]).allows_host(address)
    assert Scope([address], allow_private=True).allows_host(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_allowed_when_in_scope(address: str) -> None:
    assert not is_forbidden_address(address)
    assert Scope([address]).allows_host(address)
    assert not Scope(["example.com"]).allows_host(address)


def test_forbidden_address_edge_cases() -> None:
    assert is_forbidden_address("fe80::1%eth0")  # a zone index does not hide link-local
    # Host names are not addresses: the resolver checks what they resolve to.
    assert not is_forbidden_address("localhost")
    assert not is_forbidden_address("example.com")


def test_normalise_and_add() -> None:
    assert normalise_domain(" Example.COM. ") == "example.com"
    assert normalise_domain("http://a.example/x") == "a.example"
    assert normalise_domain("[::1]:80") == "::1"
    scope = Scope([])
    assert not scope.allows_host("www.example.net")  # cached as refused...
    scope.add("Example.NET")
    assert scope.allows_host("www.example.net")  # ...and the cache forgets it on add
    assert scope.domains == ["example.net"]


# --- the SSRF guard, end to end ------------------------------------------------------------


async def _page(request: web.BaseRequest) -> web.StreamResponse:
    if request.path == "/robots.txt":
        return web.Response(status=404)
    return web.Response(text='<a href="/next.html">n</a>', content_type="text/html")


@pytest.mark.parametrize("host_form", ["ip", "name"])
async def test_ssrf_guard_refuses_loopback_seed(tmp_path: Path, host_form: str) -> None:
    """A seed on loopback without --allow-private: nothing is fetched, the refusal counted.

    ``ip`` is an IP-literal seed (the scope/fetcher check), ``name`` is ``localhost``, which
    only the resolver can see through.
    """
    async with serve(_page, "127.0.0.7") as server:
        seed = server.base + "/"
        if host_form == "name":
            async with serve(_page, "127.0.0.1") as local:
                summary = await crawl(
                    [f"http://localhost:{local.port}/"],
                    fast_settings([], allow_private=False),
                    tmp_path,
                )
                assert local.total == 0
        else:
            summary = await crawl([seed], fast_settings([], allow_private=False), tmp_path)
        assert server.total == 0
    assert summary.pages_fetched == 0
    assert summary.errors.get("forbidden", 0) + summary.stats.out_of_scope >= 1
    assert summary.queued == 0
    assert "internal" not in summary.errors


async def test_allow_private_lets_loopback_through(tmp_path: Path) -> None:
    async with serve(_page, "127.0.0.7") as server:
        summary = await crawl([server.base + "/"], fast_settings([]), tmp_path)
        # robots.txt names no sitemap, so /sitemap.xml is tried, once.
        assert server.paths == {"/robots.txt": 1, "/sitemap.xml": 1, "/": 1, "/next.html": 1}
    assert summary.pages_fetched == 2
    assert summary.errors == {}
