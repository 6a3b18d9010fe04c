"""The fetcher against a real aiohttp server on loopback: decoding, limits, errors, headers."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import zlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from p2pcrawl import __version__
from p2pcrawl.crawl import Fetcher
from p2pcrawl.settings import CrawlSettings, FetchLimits, ScopeSettings
from tests.p2pcrawl.loopback import Served, free_port, serve

HTML = b"<!DOCTYPE html><html><body>" + b"<p>hello peer</p>" * 500 + b"</body></html>"
BIG = bytes(range(256)) * 1000  # 256,000 bytes


async def handler(request: web.BaseRequest, release: asyncio.Event) -> web.StreamResponse:
    path = request.path
    if path == "/gzip":
        return web.Response(
            body=gzip.compress(HTML),
            headers={"Content-Type": "text/html", "Content-Encoding": "gzip"},
        )
    if path == "/deflate":
        return web.Response(
            body=zlib.compress(HTML),
            headers={"Content-Type": "text/html", "Content-Encoding": "deflate"},
        )
    if path == "/br":
        import brotli

        return web.Response(
            body=brotli.compress(HTML),
            headers={"Content-Type": "text/html", "Content-Encoding": "br"},
        )
    if path == "/big":
        return web.Response(body=BIG, content_type="application/octet-stream")
    if path == "/chunked":
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(20):
            await resp.write(b"x" * 10_000)
        await resp.write_eof()
        return resp
    if path == "/redirect":
        return web.Response(status=301, headers={"Location": "/target?a=1"})
    if path == "/pdf":
        return web.Response(body=b"%PDF-1.4\n%%EOF\n", content_type="application/pdf")
    if path == "/latin1":
        return web.Response(
            body="caf\u00e9".encode("iso-8859-1"),
            headers={"Content-Type": "text/html; charset=ISO-8859-1"},
        )
    if path == "/xhtml":
        return web.Response(body=b"<html/>", content_type="application/xhtml+xml")
    if path == "/slow":
        await release.wait()
        return web.Response(text="late")
    if path == "/retry":
        return web.Response(status=503, headers={"Retry-After": "7"})
    return web.Response(body=HTML, content_type="text/html")


@pytest.fixture
async def server() -> AsyncIterator[Served]:
    release = asyncio.Event()  # lets /slow answer at teardown, so the server can stop

    async def bound(request: web.BaseRequest) -> web.StreamResponse:
        return await handler(request, release)

    async with serve(bound) as served:
        try:
            yield served
        finally:
            release.set()


def settings(
    *,
    allow_private: bool = True,
    fetch: FetchLimits | None = None,
    user_agent: str = "",
    contact_url: str = "",
) -> CrawlSettings:
    return CrawlSettings(
        fetch=fetch or FetchLimits(),
        scope=ScopeSettings(allow_private=allow_private),
        user_agent=user_agent,
        contact_url=contact_url,
    )


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    f = Fetcher(settings())
    await f.start()
    yield f
    await f.aclose()


async def test_plain_html(fetcher: Fetcher, server: Served) -> None:
    res = await fetcher.fetch(server.base + "/page")
    assert res.error is None
    assert res.status == 200 and res.reason == "OK"
    assert res.body == HTML
    assert res.is_html and res.content_type == "text/html"
    assert not res.truncated and not res.is_redirect
    assert res.elapsed >= 0 and res.fetched_at > 0
    assert ("Content-Length", str(len(HTML))) in res.headers
    assert dict(res.request_headers)["User-Agent"] == f"p2pcrawl/{__version__}"


async def test_peer_ip_recorded(fetcher: Fetcher, server: Served) -> None:
    res = await fetcher.fetch(server.base + "/page")
    assert res.status == 200
    assert res.ip == "127.0.0.1"


@pytest.mark.parametrize(
    "path",
    [
        "/gzip",
        "/deflate",
        pytest.param(
            "/br",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("brotli") is None, reason="brotli not installed"
            ),
        ),
    ],
)
async def test_compressed_bodies_are_decoded(fetcher: Fetcher, server: Served, path: str) -> None:
    res = await fetcher.fetch(server.base + path)
    assert res.error is None and res.status == 200
    assert res.body == HTML
    encoding = path.strip("/")
    assert ("Content-Encoding", encoding) in res.headers  # the wire headers are kept as sent
    sent = dict(res.request_headers)["Accept-Encoding"]
    assert "gzip" in sent and "deflate" in sent


async def test_body_over_the_limit_is_truncated(server: Served) -> None:
    limit = 100_000
    f = Fetcher(settings(fetch=FetchLimits(max_body_bytes=limit)))
    await f.start()
    try:
        res = await f.fetch(server.base + "/big")
        assert res.status == 200 and res.truncated
        assert res.body == BIG[:limit]
        exact = await f.fetch(server.base + "/big", max_body=len(BIG))
        assert not exact.truncated and exact.body == BIG
        chunked = await f.fetch(server.base + "/chunked", max_body=50_001)
        assert chunked.truncated and chunked.body == b"x" * 50_001
        # The connection of a cut-off body is dropped, not reused mid-body: the next fetch works.
        after = await f.fetch(server.base + "/page")
        assert after.status == 200 and after.body == HTML
    finally:
        await f.aclose()


async def test_redirect_is_not_followed(fetcher: Fetcher, server: Served) -> None:
    res = await fetcher.fetch(server.base + "/redirect")
    assert res.status == 301
    assert res.location == "/target?a=1"
    assert res.is_redirect
    assert server.paths["/target?a=1"] == 0


async def test_retry_after_is_reported(fetcher: Fetcher, server: Served) -> None:
    res = await fetcher.fetch(server.base + "/retry")
    assert res.status == 503 and res.retry_after == "7" and res.error is None


async def test_content_types(fetcher: Fetcher, server: Served) -> None:
    pdf = await fetcher.fetch(server.base + "/pdf")
    assert pdf.status == 200 and not pdf.is_html
    assert pdf.content_type == "application/pdf"
    latin1 = await fetcher.fetch(server.base + "/latin1")
    assert latin1.is_html and (latin1.charset or "").lower() == "iso-8859-1"
    assert latin1.body == "caf\u00e9".encode("iso-8859-1")  # bytes as sent; the parser decodes
    xhtml = await fetcher.fetch(server.base + "/xhtml")
    assert xhtml.is_html


async def test_connect_refused(fetcher: Fetcher) -> None:
    res = await fetcher.fetch(f"http://127.0.0.1:{free_port()}/")
    assert res.status == 0 and res.error == "connect"


async def test_timeout(server: Served) -> None:
    limits = FetchLimits(connect_timeout=0.5, read_timeout=0.2, total_timeout=0.3)
    f = Fetcher(settings(fetch=limits))
    await f.start()
    try:
        res = await f.fetch(server.base + "/slow")
        assert res.status == 0 and res.error == "timeout"
        assert server.paths["/slow"] == 1
    finally:
        await f.aclose()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_private_address_forbidden_without_allow_private(server: Served, host: str) -> None:
    f = Fetcher(settings(allow_private=False))
    await f.start()
    try:
        res = await f.fetch(f"http://{host}:{server.port}/page")
        assert res.status == 0 and res.error == "forbidden"
        assert server.total == 0
    finally:
        await f.aclose()


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, f"p2pcrawl/{__version__}"),
        (
            {"contact_url": "https://example.org/bot"},
            f"p2pcrawl/{__version__} (+https://example.org/bot)",
        ),
        ({"user_agent": "MyBot/2.0"}, "MyBot/2.0"),
    ],
)
async def test_user_agent_sent(server: Served, kw: dict[str, str], expected: str) -> None:
    f = Fetcher(
        settings(user_agent=kw.get("user_agent", ""), contact_url=kw.get("contact_url", ""))
    )
    await f.start()
    try:
        res = await f.fetch(server.base + "/page")
        assert res.status == 200
    finally:
        await f.aclose()
    assert server.headers[-1]["User-Agent"] == expected
    assert f.user_agent == expected


async def test_one_keepalive_connection_per_host(fetcher: Fetcher) -> None:
    """Seed 004: requests to one server share one persistent connection, never two at once."""
    peers: list[tuple[str, int]] = []

    async def remember(request: web.BaseRequest) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        await asyncio.sleep(0.01)
        return web.Response(text="ok")

    async with serve(remember) as s:
        results = await asyncio.gather(*(fetcher.fetch(f"{s.base}/{i}") for i in range(6)))
        assert all(r.status == 200 for r in results)
        assert s.max_concurrent == 1
    assert len(set(peers)) == 1  # one TCP connection served all six
