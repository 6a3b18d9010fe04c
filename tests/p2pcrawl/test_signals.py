"""Site signals without sockets: robots directives, Link headers, requisites, stylesheets,
hops, sites, and politeness by server address on the frontier with a fake clock."""

from __future__ import annotations

import pytest

from p2pcrawl.archive import FetchRecord, serialize_pair, warcio_pair
from p2pcrawl.crawl import Frontier, Task, hops
from p2pcrawl.crawl.css import css_references
from p2pcrawl.crawl.directives import Directives, from_header_values, from_meta_content
from p2pcrawl.crawl.fetcher import parse_resolve
from p2pcrawl.crawl.parse import PageRules, extract_links
from p2pcrawl.crawl.signals import header_signals, warc_fields
from p2pcrawl.crawl.sites import queue_of, registrable_domain
from p2pcrawl.settings import CrawlSettings, PolitenessSettings
from tests.p2pcrawl.test_frontier import Clock

PAGE = "http://example.com/blog/index.html"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["nofollow"], Directives(nofollow=True)),
        (["NOINDEX, NOARCHIVE"], Directives(noindex=True, noarchive=True)),
        (["none"], Directives(nofollow=True, noindex=True)),
        (["otherbot: nofollow"], Directives()),  # speaks to another crawler only
        (["p2pcrawl: nofollow"], Directives(nofollow=True)),
        (["P2PCrawl: noindex"], Directives(noindex=True)),  # product tokens: any case
        (["otherbot: noindex, nofollow", "noarchive"], Directives(noarchive=True)),
        (["noindex, otherbot: nofollow"], Directives(noindex=True)),
        (["otherbot: nofollow, p2pcrawl: noarchive"], Directives(noarchive=True)),
        (["unavailable_after: 25 Jun 2010 15:00:00 PST"], Directives()),
        (["max-snippet: 20, nofollow"], Directives(nofollow=True)),
        (["all"], Directives()),
    ],
)
def test_x_robots_tag_applies_to_us_with_or_without_our_prefix(
    values: list[str], expected: Directives
) -> None:
    assert from_header_values(values, "p2pcrawl") == expected


def test_meta_robots_and_meta_with_our_token_add_up() -> None:
    assert from_meta_content("noindex,nofollow") == Directives(nofollow=True, noindex=True)
    body = b"""<meta name="robots" content="noindex"><meta name="P2PCrawl" content="noarchive">
    <meta name="otherbot" content="nofollow"><a href="/a">a</a>"""
    page = extract_links(body, PAGE)
    assert page.directives == Directives(noindex=True, noarchive=True)
    assert page.links == ["http://example.com/a"]
    # A crawler with another User-Agent listens to <meta name> of its own token.
    mybot = extract_links(body.replace(b"otherbot", b"mybot"), PAGE, rules=PageRules("mybot"))
    assert mybot.nofollow and mybot.links == []


def test_ignoring_robots_meta_keeps_the_links_and_the_record() -> None:
    body = b'<meta name="robots" content="none"><a href="/a">a</a>'
    page = extract_links(body, PAGE, rules=PageRules(obey_nofollow=False))
    assert page.links == ["http://example.com/a"] and page.nofollow and page.noindex


def test_link_header_canonical_and_x_robots_tag_from_headers() -> None:
    headers = [
        ("Content-Type", "text/html"),
        (
            "Link",
            "</style.css>; rel=preload; as=style, <https://Example.com/a/../b?y=2&x=1>; "
            'rel="canonical alternate"',
        ),
        ("X-Robots-Tag", "otherbot: noindex"),
        ("x-robots-tag", "noarchive"),
    ]
    said = header_signals(headers, PAGE, "p2pcrawl")
    assert said.canonical == "https://example.com/b?x=1&y=2"
    assert said.directives == Directives(noarchive=True)
    assert header_signals([("Link", "<x>; rel=next")], PAGE, "p2pcrawl").canonical is None
    assert warc_fields(Directives(noindex=True, noarchive=True), said.canonical) == (
        ("X-Crawler-Robots", "noarchive, noindex"),
        ("X-Crawler-Canonical", "https://example.com/b?x=1&y=2"),
    )
    assert warc_fields(Directives(), None) == ()


def test_signal_fields_are_written_as_warcio_writes_them() -> None:
    rec = FetchRecord(
        url=PAGE,
        status=200,
        reason="OK",
        http_version="1.1",
        request_headers=[("User-Agent", "p2pcrawl")],
        response_headers=[("Content-Type", "text/html")],
        body=b"<p>x</p>",
        fetched_at=1.0e9,
        warc_fields=warc_fields(Directives(nofollow=True), "http://example.com/c"),
    )
    ours, theirs = serialize_pair(rec), warcio_pair(rec)
    assert ours is not None
    strip = [b"WARC-Record-ID", b"WARC-Concurrent-To"]  # random per record

    def lines(record: bytes) -> list[bytes]:
        return [ln for ln in record.split(b"\r\n") if not ln.startswith(tuple(strip))]

    assert lines(ours[0]) == lines(theirs[0])
    assert b"X-Crawler-Robots: nofollow\r\n" in ours[0]


def test_page_requisites_of_every_kind() -> None:
    body = b"""<html><head><base href="http://example.com/static/">
    <link rel="stylesheet" href="site.css"><link rel="Shortcut Icon" href="/favicon.ico">
    <link rel="preload" as="font" href="f.woff2"><link rel="preload" as="fetch" href="no.json">
    <link rel="next" href="/page2.html"><script src="app.js"></script><script>var x;</script>
    <style>@import url("print.css"); h1 { background: url('h1.png') }</style></head>
    <body><img src="a.png" srcset="a-2x.png 2x, a-3x.png 3x"><picture>
    <source srcset="b.webp 1x"></picture><video src="v.mp4" poster="p.jpg">
    <source src="v.webm"><track src="v.vtt"></video><audio src="s.mp3"></audio>
    <input type="image" src="go.png"><input type="text" src="no.png">
    <div style="background: url(bg.png)">x</div><img src="data:image/png;base64,AAAA">
    <a href="page.html">a link is no requisite</a><iframe src="frame.html"></iframe>
    </body></html>"""
    page = extract_links(body, PAGE, rules=PageRules(max_requisites=100))
    s = "http://example.com/static/"
    assert page.requisites == [
        s + "site.css",
        "http://example.com/favicon.ico",
        s + "f.woff2",
        s + "a.png",
        s + "a-2x.png",
        s + "a-3x.png",
        s + "b.webp",
        s + "v.webm",
        s + "app.js",
        s + "v.mp4",
        s + "p.jpg",
        s + "s.mp3",
        s + "v.vtt",
        s + "go.png",
        s + "print.css",
        s + "h1.png",
    ]  # style="..." attributes are not read (docs/signals.md)
    assert page.links == [s + "page.html"]
    capped = extract_links(body, PAGE, rules=PageRules(max_requisites=3))
    assert capped.requisites == page.requisites[:3]
    assert extract_links(body, PAGE).requisites == []  # not asked for


def test_css_references_skip_comments_and_data_and_stop_at_the_cap() -> None:
    css = """@import "a.css"; @import url(b.css) screen; /* url(c.png) */
    .x { background: url( "d.png" ) } .y { src: url(data:font/woff2;base64,AA) }
    .z { background: URL('../e.png') } .w { background: url(d.png) }"""
    base = "http://example.com/css/site.css"
    assert css_references(css, base, 10) == [
        "http://example.com/css/a.css",
        "http://example.com/css/b.css",
        "http://example.com/css/d.png",
        "http://example.com/e.png",
    ]
    assert css_references(css, base, 2) == css_references(css, base, 10)[:2]
    assert css_references("body { color: red }", base, 10) == []
    assert css_references("/* unterminated url(x.png)", base, 10) == []


def test_hops_pack_redirects_and_embeds() -> None:
    page = 0
    css = hops.embedded(page)
    assert (hops.embeds(css), hops.redirects(css)) == (1, 0)
    moved = hops.redirected(hops.redirected(css))
    assert (hops.embeds(moved), hops.redirects(moved)) == (1, 2)
    font = hops.embedded(hops.embedded(css))
    assert hops.embeds(font) == hops.MAX_EMBEDS
    assert hops.embeds(hops.embedded(font)) == hops.MAX_EMBEDS  # never past the cap
    assert hops.redirects(hops.redirected(0)) == 1 and hops.embeds(hops.redirected(0)) == 0
    assert max(font, moved) < 1 << 16  # fits the wire's u16


def test_registrable_domains() -> None:
    assert registrable_domain("a.example.org") == "example.org"
    assert registrable_domain("b.a.example.co.uk") == "example.co.uk"
    assert registrable_domain("user.github.io") == "user.github.io"  # a private suffix
    assert registrable_domain("example.org.") == "example.org"
    assert registrable_domain("127.0.0.1") == "127.0.0.1"
    assert registrable_domain("::1") == "::1"
    assert registrable_domain("localhost") == "localhost"
    assert registrable_domain("a.site.test") == "site.test"
    assert queue_of("http://a.example.org:8080/x", "domain") == "example.org"
    assert queue_of("http://a.example.org:8080/x", "host") == "a.example.org:8080"


def test_resolve_entries() -> None:
    assert parse_resolve(("A.Site.test:127.0.0.5", "b.site.test:[::1]")) == {
        "a.site.test": "127.0.0.5",
        "b.site.test": "::1",
    }
    for bad in ("a.site.test", "a.site.test:nowhere", ":127.0.0.1"):
        with pytest.raises(ValueError, match="--resolve"):
            parse_resolve((bad,))


def _task(url: str) -> Task:
    return Task(url=url, fp=hash(url) & (2**64 - 1), key=b"k" * 20, depth=0)


def test_hosts_at_one_server_share_its_gap_and_its_one_request() -> None:
    clock = Clock()
    by_ip = CrawlSettings(politeness=PolitenessSettings(politeness_by="ip"))
    f = Frontier(by_ip, clock=clock)
    for host in ("a:1", "b:2", "c:3"):
        f.push(host, _task(f"http://{host}/"))
        f.push(host, _task(f"http://{host}/x"))
    first = f.acquire_nowait()
    assert first is not None and first.host == "a:1"
    from p2pcrawl.crawl.frontier import HostSlot

    slot_a = HostSlot(f, first)
    assert slot_a.join_server("10.0.0.1")
    second = f.acquire_nowait()
    assert second is not None and second.host == "b:2"
    slot_b = HostSlot(f, second)
    assert not slot_b.join_server("10.0.0.1")  # a:1's request is under way at that server
    third = f.acquire_nowait()
    assert third is not None and third.host == "c:3"  # another server: goes ahead
    slot_c = HostSlot(f, third)
    assert slot_c.join_server("10.0.0.2")
    assert f.acquire_nowait() is None
    slot_b.release()  # given up: a no-op, the server stays a:1's
    assert first.polite.busy and second.polite is first.polite
    slot_a.after(0.1, 1.0)
    slot_a.release()
    assert f.acquire_nowait() is None  # the server's gap runs for both hosts
    clock.now += 1.0
    nxt = f.acquire_nowait()
    assert nxt is not None and nxt.host in ("a:1", "b:2")
    assert f.acquire_nowait() is None  # one request at that server at a time
    f.release(nxt, response_time=0.0, gap=0.0)
    again = f.acquire_nowait()
    assert again is not None and again.host in ("a:1", "b:2") and len(f.servers) == 2


def test_by_host_each_host_keeps_its_own_gap() -> None:
    f = Frontier(CrawlSettings(), clock=Clock())
    for host in ("a:1", "b:2"):
        f.push(host, _task(f"http://{host}/"))
    assert f.acquire_nowait() is not None and f.acquire_nowait() is not None
