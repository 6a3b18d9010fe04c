"""Canonicalisation rules, the fast path's equivalence with the general path, and the helpers."""

from __future__ import annotations

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pcrawl.crawl import urls
from p2pcrawl.crawl.urls import (
    MAX_URL_LENGTH,
    LinkResolver,
    canonicalize,
    fingerprint,
    host_of,
    hostname_of,
    origin_of,
    partition_key,
    resolve,
)

CANONICALIZE = [
    # scheme and host case
    ("HTTP://Example.COM/Path", "http://example.com/Path"),
    ("hTTpS://WWW.Example.org/", "https://www.example.org/"),
    # ports
    ("http://example.com:80/a", "http://example.com/a"),
    ("https://example.com:443/a", "https://example.com/a"),
    ("http://example.com:443/a", "http://example.com:443/a"),
    ("https://example.com:80/a", "https://example.com:80/a"),
    ("http://127.0.0.3:8123/x", "http://127.0.0.3:8123/x"),
    ("http://example.com:0080/", "http://example.com/"),
    ("http://example.com:/", "http://example.com/"),
    ("http://example.com:0/", None),
    ("http://example.com:65536/", None),
    ("http://example.com:http/", None),
    # empty path, dot segments
    ("http://example.com", "http://example.com/"),
    ("http://example.com?q=1", "http://example.com/?q=1"),
    ("http://example.com/a/./b/../c", "http://example.com/a/c"),
    ("http://example.com/../../a", "http://example.com/a"),
    ("http://example.com/a/b/..", "http://example.com/a/"),
    ("http://example.com/a/%2e%2E/b", "http://example.com/b"),
    ("http://example.com/a..b/.c", "http://example.com/a..b/.c"),
    ("http://example.com//a//b", "http://example.com//a//b"),
    # fragments
    ("http://example.com/a#frag", "http://example.com/a"),
    ("http://example.com/a?b=1#frag?x=y", "http://example.com/a?b=1"),
    ("http://example.com/#", "http://example.com/"),
    # query sorting: by name then value, repeated keys, blank values kept
    ("http://example.com/?b=2&a=1", "http://example.com/?a=1&b=2"),
    ("http://example.com/?a=2&a=1&a=10", "http://example.com/?a=1&a=10&a=2"),
    ("http://example.com/?b&a=&c=3", "http://example.com/?a=&b=&c=3"),
    ("http://example.com/?a-b=1&a=1", "http://example.com/?a=1&a-b=1"),
    ("http://example.com/?a=1&&b=2&", "http://example.com/?a=1&b=2"),
    ("http://example.com/?", "http://example.com/"),
    ("http://example.com/?&&", "http://example.com/"),
    ("http://example.com/?q=a+b&q=a%20c", "http://example.com/?q=a+b&q=a+c"),
    ("http://example.com/?x=a/b:c", "http://example.com/?x=a%2Fb%3Ac"),
    ("http://example.com/?a=b=c", "http://example.com/?a=b%3Dc"),
    # percent-encoding: unreserved decoded, others upper-case, non-ASCII as UTF-8
    ("http://example.com/%7euser/%41b%2D", "http://example.com/~user/Ab-"),
    ("http://example.com/a%2fb%3f", "http://example.com/a%2Fb%3F"),
    ("http://example.com/caf%c3%a9", "http://example.com/caf%C3%A9"),
    ("http://example.com/café?q=é", "http://example.com/caf%C3%A9?q=%C3%A9"),
    ("http://example.com/a b", "http://example.com/a%20b"),
    ("http://example.com/100%", "http://example.com/100%25"),
    ("http://example.com/?q=%ff", "http://example.com/?q=%FF"),
    ("http://example.com/?q=%7E", "http://example.com/?q=~"),
    # IDNA (UTS 46, as browsers), IPv4 spellings, IPv6
    ("http://Bücher.example/", "http://xn--bcher-kva.example/"),
    ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
    ("http://straße.de/", "http://xn--strae-oqa.de/"),
    ("http://ex\u3002ample.com/", "http://ex.ample.com/"),
    ("http://0x7f.1/", "http://127.0.0.1/"),
    ("http://2130706433:8080/", "http://127.0.0.1:8080/"),
    ("http://1.2.3.09/", None),
    ("http://example.123/", None),
    ("http://[::0:1]:8080/a", "http://[::1]:8080/a"),
    ("http://[fe80::1%25eth0]/", None),
    ("http://a_b.example.com./x", "http://a_b.example.com/x"),
    ("http://Example.COM.:8080/", "http://example.com:8080/"),
    # userinfo dropped
    ("http://user:pass@example.com/", "http://example.com/"),
    ("http://user@example.com:8080/", "http://example.com:8080/"),
    # whitespace and backslashes
    ("  http://example.com/a \n", "http://example.com/a"),
    ("\thttp://exa\nmple.com/a\tb", "http://example.com/ab"),
    ("http:\\\\example.com\\a\\b?c\\d", "http://example.com/a/b?c%5Cd="),
    # not crawlable
    ("ftp://example.com/", None),
    ("mailto:me@example.com", None),
    ("javascript:alert(1)", None),
    ("data:text/html,hi", None),
    ("/relative/path", None),
    ("example.com/a", None),
    ("http://", None),
    ("http:///a", None),
    ("http://exa mple.com/", None),
    ("http://ex%41mple.com/", None),
    ("http://[::1/", None),
    ("http://[::1]@/", None),
    ("", None),
    ("   ", None),
]


@pytest.mark.parametrize(("raw", "expected"), CANONICALIZE)
def test_canonicalize_table(raw: str, expected: str | None) -> None:
    assert canonicalize(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), [r for r in CANONICALIZE if r[1] is not None])
def test_table_outputs_are_fixed_points(raw: str, expected: str) -> None:
    assert canonicalize(expected) == expected
    assert urls._canonicalize_general(expected, MAX_URL_LENGTH) == expected


def test_max_length_applies_to_the_canonical_form() -> None:
    prefix = "http://example.com/"
    exact = prefix + "a" * (MAX_URL_LENGTH - len(prefix))
    assert canonicalize(exact) == exact
    assert canonicalize(exact + "a") is None
    # Whitespace and dot segments do not count; escapes that expand do.
    assert canonicalize("   " + exact + "#" + "f" * 100) == exact
    assert canonicalize(prefix + "é" * 700) is None  # 700 chars -> 4,200 once escaped
    assert canonicalize(prefix + "abc", max_length=len(prefix) + 2) is None
    assert canonicalize(prefix + "x" * 10_000_000) is None


FAST_SHAPES = [
    "http://example.com/",
    "http://example.com",
    "https://www.example.org/articles/12/some-title",
    "http://127.0.0.3:8123/blog/post-1.html",
    "http://example.com:80/a",
    "https://example.com:443",
    "http://example.com:8080/a?b=1&a=2",
    "http://example.com/search?q=a+b&lang=en",
    "http://example.com/a;b/c:d@e!$&'()*+,=",
    "http://example.com/caf%C3%A9",
    "http://example.com/?a-b=1&a=1&a=",
    "http://10.0.0.1/",
    "http://example.com/a/./b",  # dot segments are removed by string operations
    "http://example.com/a/..",
    "http://example.com/../../x/./",
    "http://example.com/.well-known/a/.",
]


@pytest.mark.parametrize("url", FAST_SHAPES)
def test_fast_path_takes_and_agrees(url: str) -> None:
    fast = urls._canonicalize_fast(url)
    assert fast is not None
    assert fast == urls._canonicalize_general(url, MAX_URL_LENGTH)


@pytest.mark.parametrize(
    "url",
    [
        "HTTP://example.com/",
        "http://Example.com/",
        "http://example.com/%7e",
        "http://example.com/?b",
        "http://example.com/?a=%41",
        "http://example.com/a b",
        "http://127.1/",
        "http://a.0x1f/",
        "http://example.com:0/",
        "http://example.com:99999/",
        "http://u@example.com/",
    ],
)
def test_fast_path_declines_what_needs_the_general_path(url: str) -> None:
    assert urls._canonicalize_fast(url) is None


BASE = "http://example.com/a/b/page.html?x=1"

RESOLVE = [
    ("other.html", "http://example.com/a/b/other.html"),
    ("./other.html", "http://example.com/a/b/other.html"),
    ("../other.html", "http://example.com/a/other.html"),
    ("../../../../other.html", "http://example.com/other.html"),
    (".", "http://example.com/a/b/"),
    ("..", "http://example.com/a/"),
    ("sub/", "http://example.com/a/b/sub/"),
    ("/root.html", "http://example.com/root.html"),
    ("/root.html?b=2&a=1", "http://example.com/root.html?a=1&b=2"),
    ("?q=2", "http://example.com/a/b/page.html?q=2"),
    ("?", "http://example.com/a/b/page.html"),
    ("#frag", BASE),
    ("#", BASE),
    ("other.html#frag", "http://example.com/a/b/other.html"),
    ("//cdn.example.org/x", "http://cdn.example.org/x"),
    ("//CDN.example.org:80", "http://cdn.example.org/"),
    ("https://other.example/x?b&a", "https://other.example/x?a=&b="),
    ("HTTP://Other.Example/x", "http://other.example/x"),
    ("http:other.html", "http://example.com/a/b/other.html"),
    ("g;x=1", "http://example.com/a/b/g;x=1"),
    (";x", "http://example.com/a/b/;x"),
    ("  other.html\n", "http://example.com/a/b/other.html"),
    ("x #f", "http://example.com/a/b/x%20"),  # a space before the fragment stays in the path
    ("..:x", None),  # a ":" in the first segment of a relative path
    ("\\\\evil.example\\x", "http://evil.example/x"),
    ("caf%c3%a9", "http://example.com/a/b/caf%C3%A9"),
    ("café", "http://example.com/a/b/caf%C3%A9"),
    ("", None),
    ("   \n\t", None),
    ("mailto:me@example.com", None),
    ("javascript:void(0)", None),
    ("JavaScript:alert(1)", None),
    ("data:text/html,hi", None),
    ("tel:+15555550100", None),
    ("ftp://example.com/f", None),
    ("a:b", None),
    ("//[::1/x", None),
    ("http://", None),
]


@pytest.mark.parametrize(("href", "expected"), RESOLVE)
def test_resolve_table(href: str, expected: str | None) -> None:
    assert resolve(BASE, href) == expected
    assert LinkResolver(BASE).resolve_general(href) == expected


def test_resolve_respects_max_length() -> None:
    assert resolve("http://e.com/", "a" * 30, max_length=40) is None
    assert resolve("http://e.com/", "a" * 20, max_length=40) == "http://e.com/" + "a" * 20
    assert resolve("http://e.com/", "#x", max_length=10) is None


def test_resolve_tolerates_a_base_without_path() -> None:
    assert resolve("http://example.com", "a.html") == "http://example.com/a.html"


def test_helpers_on_canonical_urls() -> None:
    url = "http://127.0.0.3:8123/a/b?c=1"
    assert host_of(url) == "127.0.0.3:8123"
    assert hostname_of(url) == "127.0.0.3"
    assert origin_of(url) == "http://127.0.0.3:8123"
    assert partition_key(url, "host") == "127.0.0.3:8123"
    assert partition_key(url, "url") == url
    plain = "https://example.com/"
    assert (host_of(plain), hostname_of(plain), origin_of(plain)) == (
        "example.com",
        "example.com",
        "https://example.com",
    )
    v6 = "http://[::1]:8080/x"
    assert (host_of(v6), hostname_of(v6), origin_of(v6)) == (
        "[::1]:8080",
        "::1",
        "http://[::1]:8080",
    )
    assert partition_key("http://a.b.example.co.uk:81/x", "domain") == "example.co.uk"
    assert partition_key(url, "domain") == "127.0.0.3"
    with pytest.raises(ValueError):
        partition_key(url, "site")


def test_fingerprint_is_unsigned_xxh3_of_utf8() -> None:
    url = "http://example.com/caf%C3%A9"
    assert fingerprint(url) == xxhash.xxh3_64_intdigest(url.encode("utf-8"))
    assert 0 <= fingerprint(url) < 2**64
    assert fingerprint(url) != fingerprint(url + "x")
    # Pinned so that a library change cannot silently move every URL to another owner.
    assert fingerprint("http://example.com/") == xxhash.xxh3_64_intdigest(b"http://example.com/")


# --- generated inputs ----------------------------------------------------------------------

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))

_PIECES = st.sampled_from(
    [
        *"aAzZ09-._~!$&'()*+,;=:@/?#%[]|\\ é\t",
        *("%41", "%2f", "%2F", "%C3%A9", "%c3", "%FF", "%7E", "%2e"),
        *("..", ".", "/./", "/../", "&&", "=", "0x", "?a=1&b=2", "//"),
    ]
)
_TAILS = st.lists(_PIECES, max_size=16).map("".join)
_HOSTS = st.sampled_from(
    [
        *("example.com", "a-b.c", "127.0.0.3", "127.1", "0x7f.1", "EXAMPLE.com"),
        *("bücher.example", "a_b.c", "[::1]", "[::0:1]", "1.2.3.04", "x.", "h.123"),
        *("user:pw@h", ""),
    ]
)
_PORTS = st.sampled_from(["", ":80", ":443", ":8080", ":0", ":99999", ":080", ":"])
_SCHEMES = st.sampled_from(["http", "https", "HTTP", "ftp", "javascript"])
URL_LIKE = st.builds(lambda s, h, p, t: f"{s}://{h}{p}{t}", _SCHEMES, _HOSTS, _PORTS, _TAILS)
BASES = st.sampled_from(
    [
        "http://example.com/",
        "http://example.com/a/b",
        "http://example.com/a/b/?x=1",
        "https://example.com:8443/d/",
        "http://127.0.0.3:8123/p/q.html?a=&b=2",
    ]
)


@PROPERTY
@given(st.text())
def test_canonicalize_never_raises_and_is_idempotent(raw: str) -> None:
    once = canonicalize(raw)
    if once is not None:
        assert canonicalize(once) == once
        assert once.isascii()


@PROPERTY
@given(URL_LIKE)
def test_url_like_fast_equals_general_and_idempotent(raw: str) -> None:
    general = urls._canonicalize_general(raw, MAX_URL_LENGTH)
    fast = urls._canonicalize_fast(raw)
    if fast is not None:
        assert fast == general
    assert canonicalize(raw) == general
    if general is not None:
        assert canonicalize(general) == general
        assert urls._canonicalize_general(general, MAX_URL_LENGTH) == general


@PROPERTY
@given(BASES, st.one_of(_TAILS, URL_LIKE, st.text()))
def test_resolve_fast_equals_general(base: str, href: str) -> None:
    resolver = LinkResolver(base)
    assert resolver.resolve(href) == resolver.resolve_general(href)


_SEGMENTS = st.sampled_from(
    ["a", "b.html", ".", "..", "", ".x", "...", "%C3%A9", "é", "c:d", "..:"]
)
PATH_SHAPED = st.builds(
    lambda pad, lead, segs, query, frag, tail: f"{pad}{lead}{'/'.join(segs)}{query}{frag}{tail}",
    st.sampled_from(["", "  ", "\n\t ", "\x00"]),
    st.sampled_from(["", "/", "./", "../", "../../", "//"]),
    st.lists(_SEGMENTS, max_size=6),
    st.sampled_from(["", "?b=2&a=1", "?q", "?"]),
    st.sampled_from(["", "#f", "#"]),
    st.sampled_from(["", "\n", " \t"]),
)


@PROPERTY
@given(BASES, PATH_SHAPED)
def test_resolve_dot_segments_and_padding_fast_equals_general(base: str, href: str) -> None:
    resolver = LinkResolver(base)
    assert resolver.resolve(href) == resolver.resolve_general(href)


class _FastOnly(LinkResolver):
    def resolve_general(self, href: str, max_length: int = MAX_URL_LENGTH) -> str | None:
        raise AssertionError(f"{href!r} took the general path")


@pytest.mark.parametrize(
    ("href", "expected"),
    [
        ("../other.html", "http://example.com/a/other.html"),
        ("./x/../y.html?b=1&a=2", "http://example.com/a/b/y.html?a=2&b=1"),
        ("..", "http://example.com/a/"),
        ("/s7/./x/../p2.html", "http://example.com/s7/p2.html"),
        ("sub/./c/../d", "http://example.com/a/b/sub/d"),
        ("  /s7/p295.html\n", "http://example.com/s7/p295.html"),
        ("\n  ../up.html#top ", "http://example.com/a/up.html"),
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
    ],
)
def test_dot_segments_and_padding_take_the_fast_path(href: str, expected: str) -> None:
    # Real pages indent hrefs and link up the tree; the general (yarl) path costs several
    # times the fast one (benchmarks/parse_links.py).
    assert _FastOnly(BASE).resolve(href) == expected
    assert LinkResolver(BASE).resolve_general(href) == expected


@PROPERTY
@given(
    st.lists(st.sampled_from([*"ab+-._~=&%2Z ", "%20", "%2B", "%41", "%FF", "%e9"]), max_size=14)
)
def test_query_fast_path_sorts_like_the_general_path(pieces: list[str]) -> None:
    query = "".join(pieces)
    url = "http://example.com/p?" + query
    assert canonicalize(url) == urls._canonicalize_general(url, MAX_URL_LENGTH)
    resolver = LinkResolver("http://example.com/p?z=1")
    assert resolver.resolve("?" + query) == resolver.resolve_general("?" + query)
