"""extract_links on saved HTML fixtures (tests/p2pcrawl/data) and on hostile bodies."""

from __future__ import annotations

import codecs
import gzip
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pcrawl.crawl import ParsedPage, extract_links
from p2pcrawl.crawl.parse import PageRules
from p2pcrawl.crawl.urls import hostname_of, resolve
from p2pcrawl.testing import TestWeb, TestWebConfig

DATA = Path(__file__).parent / "data"
PAGE = "http://example.com/blog/index.html"


def parse(name: str, url: str = PAGE, **kwargs: object) -> ParsedPage:
    return extract_links((DATA / name).read_bytes(), url, **kwargs)  # type: ignore[arg-type]


def test_base_href_first_one_wins_and_is_canonicalised() -> None:
    page = parse("base_href.html")
    base = "http://other.example/docs/guide/index.html?x=1"
    assert page.base == base
    assert page.links == [
        "http://other.example/docs/guide/intro.html",
        "http://other.example/docs/guide/setup.html",
        "http://other.example/docs/api/",
        "http://other.example/root.html",
        "http://other.example/docs/guide/index.html?page=2",
        base,  # "#top" is the base document itself
        "http://cdn.example/lib.js",
        "https://abs.example/x",
    ]
    assert (page.hrefs_seen, page.rejected) == (8, 0)


def test_base_href_with_javascript_falls_back_to_the_page_url() -> None:
    page = parse("base_javascript.html")
    assert page.base == PAGE
    assert page.links == ["http://example.com/blog/next.html", "http://example.com/top.html"]


def test_rel_nofollow_links_are_followed_by_default() -> None:
    page = parse("nofollow_rel.html")
    assert page.links == [
        "http://example.com/followed-1.html",
        "http://example.com/skipped-1.html",
        "http://example.com/skipped-2.html",
        "http://example.com/skipped-3.html",
        "http://example.com/followed-2.html",
        "http://example.com/followed-3.html",
    ]


def test_rel_nofollow_ugc_and_sponsored_are_dropped_when_asked() -> None:
    drop = PageRules(follow_rel_nofollow=False)
    body = b"""<a href=/a rel=ugc>a</a><a href=/b rel="Sponsored noopener">b</a>
    <a href=/c rel=nofollow>c</a><a href=/d rel=noopener>d</a>"""
    assert extract_links(body, PAGE, rules=drop).links == ["http://example.com/d"]
    assert len(extract_links(body, PAGE).links) == 4


def test_rel_nofollow_is_a_case_insensitive_token() -> None:
    page = parse("nofollow_rel.html", rules=PageRules(follow_rel_nofollow=False))
    assert page.links == [
        "http://example.com/followed-1.html",
        "http://example.com/followed-2.html",
        "http://example.com/followed-3.html",
        # The same URL linked without rel=nofollow later on is followed.
        "http://example.com/skipped-1.html",
    ]
    assert (page.hrefs_seen, page.rejected) == (7, 0)
    assert not page.nofollow


def test_meta_robots_nofollow_drops_every_link() -> None:
    page = parse("meta_nofollow.html")
    assert page.nofollow and not page.noindex
    assert page.links == []
    assert (page.hrefs_seen, page.rejected) == (3, 0)


def test_meta_robots_none_means_noindex_and_nofollow() -> None:
    page = parse("meta_none.html")
    assert page.nofollow and page.noindex
    assert page.links == []


def test_meta_robots_noindex_still_follows() -> None:
    page = parse("meta_noindex.html")
    assert page.noindex and not page.nofollow
    assert page.links == ["http://example.com/child.html"]


def test_link_rel_canonical_is_recorded_not_followed() -> None:
    page = parse("canonical.html")
    assert page.canonical == "http://example.com/articles/Canonical-Page?a=1&b=2"
    assert page.links == ["http://example.com/articles/other"]


def test_duplicates_collapse_in_document_order_and_rejects_are_counted() -> None:
    page = parse("duplicates.html", "http://example.com/blog/index.html")
    assert page.links == [
        "http://example.com/",
        "http://example.com/blog/",
        "http://example.com/blog/post.html",
        "http://example.com/search?page=2&q=a",
        "http://example.com/blog/index.html",  # "#top"
    ]
    assert page.hrefs_seen == 22
    # "", javascript:, mailto:, tel:, data:, ftp: and a broken IPv6 host.
    assert page.rejected == 7


def test_unclosed_and_nested_tags_parse_like_a_browser() -> None:
    page = parse("unclosed.html")
    assert set(page.links) == {
        f"http://example.com/{name}.html"
        for name in ("one", "two", "three", "four", "five", "six", "seven", "in-svg")
    }
    # Comments, script, textarea text and an attribute cut off by EOF are not links.
    assert not any(
        word in link
        for link in page.links
        for word in ("commented", "scripted", "textarea", "eight")
    )


def test_binary_garbage_keeps_the_real_links() -> None:
    page = parse("garbage.html")
    assert "http://example.com/real-1.html" in page.links
    # Invalid bytes decode to U+FFFD, which is then UTF-8 percent-encoded.
    assert "http://example.com/r%EF%BF%BDal-2.html" in page.links
    assert "http://example.com/real-3%EF%BF%BD.html" in page.links


def test_meta_charset_decides_without_a_transport_encoding() -> None:
    page = parse("windows1251.html")
    assert page.links == ["http://example.com/%D0%9F%D1%80%D0%B8%D0%B2%D0%B5%D1%82.html"]


def test_transport_encoding_outranks_meta_and_bom_outranks_both() -> None:
    body = '<meta charset="windows-1251"><a href="/café">x</a>'
    cafe = "http://example.com/caf%C3%A9"
    assert extract_links(body.encode("utf-8"), PAGE, encoding="utf-8").links == [cafe]
    assert extract_links(body.encode("latin-1"), PAGE, encoding="ISO-8859-1").links == [cafe]
    with_bom = codecs.BOM_UTF8 + body.encode("utf-8")
    assert extract_links(with_bom, PAGE, encoding="latin-1").links == [cafe]


@pytest.mark.parametrize("label", ["no-such-charset", "rot13", "idna", "x-user-defined", "a\x00"])
def test_unusable_transport_encodings_fall_back_to_detection(label: str) -> None:
    body = '<a href="/café">x</a>'.encode()
    assert extract_links(body, PAGE, encoding=label).links == ["http://example.com/caf%C3%A9"]


def test_max_links_caps_unique_links() -> None:
    body = "".join(f'<a href="/p{i}">x</a><a href="/p{i}">x</a>' for i in range(10_000))
    page = extract_links(body.encode(), PAGE, max_links=5000)
    assert len(page.links) == 5000
    assert page.links[-1] == "http://example.com/p4999"
    assert extract_links(body.encode(), PAGE, max_links=0).links == []


def test_huge_attribute_values_are_rejected_not_raised() -> None:
    body = (
        f'<a href="/{"a" * 3_000_000}">huge</a><a href="/ok" rel="{"x " * 100_000}">'
        f'<a href="/long-{"b" * 3000}">long</a>'
    ).encode()
    page = extract_links(body, PAGE)
    assert page.links == ["http://example.com/ok"]
    assert (page.hrefs_seen, page.rejected) == (3, 2)
    assert extract_links(body, PAGE, max_url_length=4000).links == [
        "http://example.com/ok",
        "http://example.com/long-" + "b" * 3000,
    ]


def test_page_url_is_canonicalised_and_an_invalid_one_yields_nothing() -> None:
    body = b'<a href="x.html">x</a>'
    assert extract_links(body, "HTTP://Example.com/d/").links == ["http://example.com/d/x.html"]
    page = extract_links(body, "mailto:x@example.com")
    assert page.links == [] and page.hrefs_seen == 0


@pytest.mark.parametrize(
    "body", [b"", b"\x00" * 100, b"<", b"<a href", b"\xff\xfe\x00<", b"<a href=>"]
)
def test_degenerate_bodies(body: bytes) -> None:
    page = extract_links(body, PAGE)
    assert page.links == []
    assert page.base == PAGE


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from(
                [
                    b"<a href=",
                    b'<a href="',
                    b"</a>",
                    b"<base href=",
                    b"<meta name=robots ",
                    b'"',
                    b"content=nofollow>",
                    b"<link rel=canonical href=",
                    b" rel=nofollow>",
                    b">",
                    b"../",
                    b"#",
                    b"?a=1",
                    b"http://",
                    b"javascript:",
                    b"\xc3",
                    b"<!--",
                    b"\\",
                ]
            ),
        ),
        max_size=30,
    ).map(b"".join),
    st.sampled_from([None, "utf-8", "windows-1252", "shift_jis", "utf-16", "bogus"]),
)
def test_hostile_bodies_never_raise(body: bytes, encoding: str | None) -> None:
    page = extract_links(body, PAGE, encoding=encoding)
    assert len(page.links) == len(set(page.links))
    assert all(link.startswith(("http://", "https://")) and link.isascii() for link in page.links)
    assert page.hrefs_seen >= len(page.links) + page.rejected


def test_crawling_the_test_web_reaches_its_ground_truth() -> None:
    """A breadth-first walk by extract_links alone finds what the test web says a crawl must.

    The test web plans every link as its canonical URL before spelling it (dot segments,
    fragments, whitespace, "HTTP://", escapes, <base href>, rel=nofollow (followed by
    default), meta robots, rel=canonical (followed)), so this
    checks our rules against an independent statement of them. robots.txt is not consulted
    here, so the walk may also reach /private/ pages, and nothing else beyond the truth.
    """
    web = TestWeb(TestWebConfig(port=8123, large_page_bytes=0))
    in_scope = set(web.allow_domains)
    reached = {web.hub_url}
    queue = [web.hub_url]
    while queue:
        url = queue.pop()
        status, headers, body = web.render(url)
        if "Location" in headers:
            found = [resolve(url, headers["Location"])]
        elif status == 200 and headers.get("Content-Type", "").startswith("text/html"):
            if headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            charset = re.search(r"charset=([\w-]+)", headers["Content-Type"])
            encoding = charset.group(1) if charset else None
            page = extract_links(body, url, encoding=encoding)
            found = [*page.links, *([page.canonical] if page.canonical else [])]
        else:
            found = []
        for link in found:
            if link is not None and link not in reached and hostname_of(link) in in_scope:
                reached.add(link)
                queue.append(link)
    truth = web.ground_truth()
    assert truth <= reached
    assert all("/private/" in url for url in reached - truth)
