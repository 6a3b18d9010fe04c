"""Small real servers on loopback for the crawler's tests (no mocks), and crawl settings.

``serve`` runs one aiohttp handler on ``host``, port 0, and records every request it sees,
when it arrived and left, and how many were in flight at once per host, so tests check
politeness from the server's side of the wire.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from p2pcrawl.settings import (
    CrawlSettings,
    FetchLimits,
    PolitenessSettings,
    ScopeSettings,
)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@dataclass
class Served:
    """A running loopback server and what it saw."""

    base: str  # "http://host:port"
    host: str
    port: int
    paths: Counter[str] = field(default_factory=Counter)  # raw path + query
    headers: list[dict[str, str]] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)  # monotonic (start, end)
    max_concurrent: int = 0
    _now: int = 0

    @property
    def total(self) -> int:
        return sum(self.paths.values())


@asynccontextmanager
async def serve(handler: Handler, host: str = "127.0.0.1") -> AsyncIterator[Served]:
    """Serve ``handler`` on ``host``:0 until the block ends."""
    served: Served | None = None

    async def wrapped(request: web.BaseRequest) -> web.StreamResponse:
        assert served is not None
        served.paths[request.raw_path] += 1
        served.headers.append(dict(request.headers))
        served._now += 1
        served.max_concurrent = max(served.max_concurrent, served._now)
        start = time.monotonic()
        try:
            return await handler(request)
        finally:
            served._now -= 1
            served.spans.append((start, time.monotonic()))

    runner = web.ServerRunner(web.Server(wrapped, access_log=None), shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = int(runner.addresses[0][1])
    served = Served(base=f"http://{host}:{port}", host=host, port=port)
    try:
        yield served
    finally:
        await runner.cleanup()


def free_port(host: str = "127.0.0.1", kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """A port nobody listens on right now (for connect-refused and --status)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def fast_settings(
    allow_domains: list[str] | tuple[str, ...],
    *,
    allow_private: bool = True,
    concurrency: int = 8,
    max_pages: int = 0,
    max_depth: int = 50,
    fetch: FetchLimits | None = None,
    max_retries: int = 3,
) -> CrawlSettings:
    """Settings for crawling servers we own: no delay, no politeness factor."""
    return CrawlSettings(
        concurrency=concurrency,
        fetch=fetch or FetchLimits(),
        politeness=PolitenessSettings(delay=0, politeness_factor=0, max_retries=max_retries),
        scope=ScopeSettings(
            allow_domains=tuple(allow_domains),
            allow_private=allow_private,
            max_pages=max_pages,
            max_depth=max_depth,
        ),
    )
