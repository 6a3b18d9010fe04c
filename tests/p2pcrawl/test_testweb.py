"""The generated test web: determinism, shape, served behaviour, and a self-consistent truth.

The breadth-first crawl here is deliberately independent of the crawler (urllib + selectolax +
protego): if it reaches exactly ``ground_truth()``, the truth matches what the server serves.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import posixpath
import re
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp
import pytest
from protego import Protego
from selectolax.lexbor import LexborHTMLParser as HTMLParser

from p2pcrawl.testing import TestWeb, TestWebConfig

FIXED_PORT = 18123  # never bound: pure tests only need the URLs it spells
SMALL = TestWebConfig(hosts=3, pages_per_host=30, slow_host_delay=0.05, large_page_bytes=256 * 1024)
REGULAR = re.compile(r"^http://[^/]+/(s\d/p\d+\.html)?$")
UA = "testweb-checker"

MakeWeb = Callable[..., Awaitable[TestWeb]]


@pytest.fixture
async def make_web() -> AsyncIterator[MakeWeb]:
    webs: list[TestWeb] = []

    async def make(config: TestWebConfig = SMALL) -> TestWeb:
        web = TestWeb(config)
        webs.append(web)
        await web.start()
        return web

    yield make
    for web in webs:
        await web.aclose()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


# --- an independent canonicaliser and link extractor ---------------------------------------

_UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _escape(match: re.Match[str]) -> str:
    char = chr(int(match[1], 16))
    return char if char in _UNRESERVED else "%" + match[1].upper()


def canonical(url: str) -> str:
    parts = urlsplit(url)
    path = re.sub(r"%([0-9A-Fa-f]{2})", _escape, parts.path) or "/"
    if "/." in path:
        trailing = path.endswith(("/", "/.", "/.."))
        path = posixpath.normpath(path)
        if trailing and path != "/":
            path += "/"
    params = sorted((p for p in parts.query.split("&") if p), key=lambda p: p.partition("=")[::2])
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, "&".join(params), ""))


def extract_links(html: str, page_url: str) -> list[str]:
    tree = HTMLParser(html)
    for meta in tree.css('meta[name="robots"]'):
        if "nofollow" in (meta.attributes.get("content") or "").lower():
            return []
    base = page_url
    base_tag = tree.css_first("base[href]")
    if base_tag is not None:
        base = urljoin(page_url, (base_tag.attributes.get("href") or "").strip())
    found = []
    # rel=nofollow links are followed (the crawler's default); so is rel=canonical.
    hrefs = [a.attributes.get("href") or "" for a in tree.css("a[href]")]
    hrefs += [link.attributes.get("href") or "" for link in tree.css('link[rel="canonical"]')]
    for href in hrefs:
        url = urljoin(base, href.strip())
        if urlsplit(url).scheme in ("http", "https"):
            found.append(canonical(url))
    return found


async def fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, str, str, bytes]:
    async with session.get(url, allow_redirects=False) as r:
        return r.status, r.content_type, r.headers.get("Location", ""), await r.read()


async def independent_bfs(web: TestWeb, session: aiohttp.ClientSession) -> dict[str, int]:
    robots: dict[str, Protego] = {}
    for host in web.hosts:
        status, _, _, body = await fetch(session, f"http://{host}/robots.txt")
        robots[host] = Protego.parse(body.decode() if status == 200 else "")
    allowed = set(web.allow_domains)
    seen = {web.hub_url}
    level = [web.hub_url]
    statuses: dict[str, int] = {}
    while level:
        # A level at a time, concurrently, so the slow host costs one delay per level.
        answers = await asyncio.gather(*(fetch(session, url) for url in level))
        following: list[str] = []
        for url, (status, ctype, location, body) in zip(level, answers, strict=True):
            statuses[url] = status
            if 300 <= status < 400:
                found = [canonical(urljoin(url, location))]
            elif status == 200 and ctype == "text/html":
                found = extract_links(body.decode("utf-8", "replace"), url)
            else:
                found = []
            for new in found:
                parts = urlsplit(new)
                if parts.hostname not in allowed or new in seen:
                    continue
                if not robots[parts.netloc].can_fetch(new, UA):
                    continue
                seen.add(new)
                following.append(new)
        level = following
    return statuses


# --- pure tests: no sockets ------------------------------------------------------------------


def test_same_config_same_web_and_seed_changes_it() -> None:
    config = TestWebConfig(hosts=3, pages_per_host=40, port=FIXED_PORT, large_page_bytes=4096)
    a, b = TestWeb(config), TestWeb(config)
    truth = a.ground_truth()
    assert truth == b.ground_truth()
    assert a.expected_status() == b.expected_status()
    assert all(a.render(url) == b.render(url) for url in truth)

    other = TestWeb(TestWebConfig(hosts=3, pages_per_host=40, port=FIXED_PORT, seed=2))
    pages = [url for url in truth if REGULAR.match(url)]
    differ = sum(a.render(url)[2] != other.render(url)[2] for url in pages)
    assert differ == len(pages)


def test_ground_truth_rules() -> None:
    web = TestWeb(TestWebConfig(hosts=5, pages_per_host=60, port=FIXED_PORT))
    truth = web.expected_status()
    h0, h1, h2 = (f"http://{h}" for h in web.hosts[:3])
    assert web.crawl_delay_host == web.hosts[1]
    assert web.no_robots_host == web.hosts[2]
    assert web.slow_host == web.hosts[4]
    regular = {f"http://{h}/" for h in web.hosts} | {
        f"http://{h}/s{j % 8}/p{j}.html" for h in web.hosts for j in range(1, 60)
    }
    assert regular <= set(truth)
    expected = {
        h0 + "/redirect/chain-1": 301,
        h0 + "/redirect/chain-2": 302,
        h0 + "/redirect/chain-end.html": 200,
        h0 + "/redirect/loop-a": 301,
        h0 + "/redirect/loop-b": 302,
        h0 + "/redirect/cross": 301,
        h1 + "/redirect/landed.html": 200,
        h0 + "/redirect/away": 302,
        h0 + "/error/500.html": 500,
        h0 + "/missing/hub.html": 404,
        h0 + "/files/report.pdf": 200,
        h0 + "/img/logo.png": 200,
        h0 + "/meta/noindex-child.html": 200,
        h0 + "/enc/caf%C3%A9.html": 200,
        h0 + "/enc/~user.html": 200,
        h0 + "/tricky/pct-x.html": 200,
        h0 + "/tricky/dots.html": 200,
        h0 + "/search?page=1&q=p2p": 200,
        h0 + "/search?page=2&q=p2p": 200,
        h1 + "/basedir/b1.html": 200,
        h1 + "/basedir/b4.html": 200,
        h0 + "/big/after-large.html": 200,
        h2 + "/private/0.html": 200,  # its host answers robots.txt with 404: allow all
        h2 + "/private/1.html": 200,
        # Followed by default: rel=nofollow links (an archive wants them) and rel=canonical.
        h0 + "/nofollow/hub.html": 200,
        h0 + "/nofollow/5.html": 200,
        h0 + "/meta/canonical-target.html": 200,
    }
    assert {url: truth.get(url) for url in expected} == expected
    dropped = web.ground_truth(rel_nofollow=False)
    assert {u for u in truth if "/nofollow/" in u} and not {u for u in dropped if "/nofollow/" in u}
    never = [
        h0 + "/private/0.html",
        h1 + "/private/0.html",
        h0 + "/meta/nofollow-target-0.html",
        h0 + "/base/b1.html",
        "http://example.invalid/away",
        "http://example.invalid/page.html",
        f"http://127.0.0.250:{FIXED_PORT}/",
    ]
    assert not set(never) & set(truth)
    assert all(url == canonical(url) for url in truth)
    assert "/robots.txt" not in "".join(truth)


def test_link_distribution_is_skewed_and_mostly_local() -> None:
    config = TestWebConfig(hosts=5, pages_per_host=400, port=FIXED_PORT, large_page_bytes=0)
    web = TestWeb(config)
    counts: list[int] = []
    local = cross = 0
    for i, host in enumerate(web.hosts):
        for j in range(1, config.pages_per_host):
            url = f"http://{host}/s{j % 8}/p{j}.html"
            links = extract_links(web.render(url)[2].decode(), url)
            counts.append(len(links))
            hosts = [urlsplit(link).netloc for link in links]
            cross += sum(h != web.hosts[i] for h in hosts)
            local += sum(h == web.hosts[i] for h in hosts)
    mean = statistics.fmean(counts)
    assert 0.75 * config.mean_links <= mean <= 1.25 * config.mean_links
    assert statistics.median(counts) < mean
    assert max(counts) <= 10 * config.mean_links + 10
    assert 0.15 <= cross / (cross + local) <= 0.25


def test_plain_web_has_only_plain_links_and_exact_page_size() -> None:
    config = TestWebConfig(
        hosts=4, pages_per_host=50, features=False, page_bytes=30_000, port=FIXED_PORT
    )
    web = TestWeb(config)
    truth = web.expected_status()
    assert len(truth) == 4 * 50
    assert set(truth.values()) == {200}
    assert web.slow_host is None
    assert web.render(f"http://{web.hosts[3]}/robots.txt")[2] == b"User-agent: *\nDisallow:\n"
    for url in truth:
        status, headers, body = web.render(url)
        assert (status, headers["Content-Type"], len(body)) == (200, "text/html", 30_000)
        for a in HTMLParser(body.decode()).css("a[href]"):
            href = a.attributes["href"] or ""
            assert re.fullmatch(r"(http://127\.0\.0\.\d+:\d+)?/(s\d/p\d+\.html)?", href), href


# --- served -----------------------------------------------------------------------------------


async def test_independent_crawl_reaches_exactly_the_ground_truth(
    make_web: MakeWeb, session: aiohttp.ClientSession
) -> None:
    web = await make_web()
    statuses = await independent_bfs(web, session)
    assert statuses == web.expected_status()
    # Every URL once: the server counts by canonical URL, so a double fetch would show here.
    assert set(web.request_counts) == web.ground_truth()
    assert set(web.request_counts.values()) == {1}
    assert web.robots_counts == dict.fromkeys(web.hosts, 1)
    status, _, _, body = await fetch(session, web.hub_url)
    assert (status, body) == (200, web.render(web.hub_url)[2])


async def test_server_counts_requests_by_canonical_url(
    make_web: MakeWeb, session: aiohttp.ClientSession
) -> None:
    web = await make_web()
    base = f"http://{web.hosts[0]}"
    for spelling in ("/search?q=p2p&page=1", "/search?page=1&q=p2p", "/tricky/pct%2dx.html"):
        status, _, _, _ = await fetch(session, base + spelling)
        assert status == 200
    assert web.request_counts == {
        base + "/search?page=1&q=p2p": 2,
        base + "/tricky/pct-x.html": 1,
    }


async def test_robots_txt(make_web: MakeWeb, session: aiohttp.ClientSession) -> None:
    web = await make_web()
    bodies = {}
    for host in web.hosts:
        status, ctype, _, body = await fetch(session, f"http://{host}/robots.txt")
        bodies[host] = (status, ctype, body.decode())
    rules = "User-agent: *\nDisallow: /private/\n"
    assert bodies[web.hosts[0]] == (200, "text/plain", rules)
    assert bodies[web.hosts[1]] == (200, "text/plain", rules + "Crawl-delay: 0.05\n")
    assert web.no_robots_host == web.hosts[2]
    assert bodies[web.hosts[2]][0] == 404
    assert web.request_counts == {}


async def test_redirects_and_errors(make_web: MakeWeb, session: aiohttp.ClientSession) -> None:
    web = await make_web()
    h0, h1 = (f"http://{h}" for h in web.hosts[:2])
    answers = {}
    for path in (
        "/redirect/chain-1",
        "/redirect/chain-2",
        "/redirect/loop-a",
        "/redirect/loop-b",
        "/redirect/cross",
        "/error/500.html",
        "/missing/hub.html",
    ):
        status, _, location, _ = await fetch(session, h0 + path)
        answers[path] = (status, location)
    assert answers == {
        "/redirect/chain-1": (301, h0 + "/redirect/chain-2"),
        "/redirect/chain-2": (302, "/redirect/chain-end.html"),
        "/redirect/loop-a": (301, "loop-b"),
        "/redirect/loop-b": (302, h0 + "/redirect/loop-a"),
        "/redirect/cross": (301, h1 + "/redirect/landed.html"),
        "/error/500.html": (500, ""),
        "/missing/hub.html": (404, ""),
    }
    status, ctype, _, body = await fetch(session, web.feature_urls["pdf"])
    assert (status, ctype, body[:5]) == (200, "application/pdf", b"%PDF-")
    status, ctype, _, body = await fetch(session, web.feature_urls["png"])
    assert (status, ctype, body[:4]) == (200, "image/png", b"\x89PNG")


async def test_slow_host_waits(make_web: MakeWeb, session: aiohttp.ClientSession) -> None:
    web = await make_web()
    assert web.slow_host == web.hosts[-1]
    started = time.monotonic()
    status, _, _, _ = await fetch(session, f"http://{web.slow_host}/")
    assert status == 200
    assert time.monotonic() - started >= SMALL.slow_host_delay


async def test_large_page_has_its_links_up_front(
    make_web: MakeWeb, session: aiohttp.ClientSession
) -> None:
    web = await make_web()
    status, _, _, body = await fetch(session, web.feature_urls["large"])
    assert (status, len(body)) == (200, SMALL.large_page_bytes)
    head = body[: 16 * 1024]
    assert body.count(b"<a ") == head.count(b"<a ") >= 1
    assert web.feature_urls["large_child"] in extract_links(
        head.decode(), web.feature_urls["large"]
    )


async def test_gzip_and_charset_pages(make_web: MakeWeb) -> None:
    web = await make_web()
    async with (
        aiohttp.ClientSession(auto_decompress=False) as raw,
        raw.get(web.feature_urls["gzip"]) as r,
    ):
        assert r.headers["Content-Encoding"] == "gzip"
        html = gzip.decompress(await r.read()).decode()
    assert web.feature_urls["gzip_child"] in extract_links(html, web.feature_urls["gzip"])
    async with aiohttp.ClientSession() as s, s.get(web.feature_urls["latin1"]) as r:
        assert r.headers["Content-Type"] == "text/html; charset=iso-8859-1"
        assert "Caf\u00e9" in await r.text()


async def test_cli_serves_until_sigterm(session: aiohttp.ClientSession) -> None:
    args = ["--hosts", "2", "--pages", "5", "--seed", "3", "--page-bytes", "2000"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "p2pcrawl.testing.serve", *args, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        info = json.loads(await asyncio.wait_for(proc.stdout.readline(), 15))
        port = info["port"]
        assert info["hub"] == f"http://127.0.0.2:{port}/"
        assert info["hosts"] == [f"127.0.0.2:{port}", f"127.0.0.3:{port}"]
        assert info["allow_domains"] == ["127.0.0.2", "127.0.0.3"]
        status, _, _, body = await fetch(session, info["hub"])
        local = TestWeb(
            TestWebConfig(hosts=2, pages_per_host=5, seed=3, page_bytes=2000, port=port)
        )
        assert (status, body) == (200, local.render(info["hub"])[2])
        assert info["hub"] in local.ground_truth()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 5) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
