"""The generated web served on loopback: :class:`SitePlan` behind one HTTP server per host.

Every host listens on its own loopback address (host ``i`` is ``127.0.0.{first_ip + i}``;
Linux routes all of 127/8 to ``lo``) so per-host politeness and host-keyed ownership behave
as on the real web, while one shared port keeps URLs short. The server canonicalises request
targets only to count double fetches (:attr:`TestWeb.request_counts`); what each URL answers
and the ground truth are the plan's (:mod:`p2pcrawl.testing.plan`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time

from aiohttp import web

from p2pcrawl.aio import Service
from p2pcrawl.testing.canonical import canonical_target
from p2pcrawl.testing.hostile import HostileConfig, HostileWeb
from p2pcrawl.testing.pages import Link
from p2pcrawl.testing.plan import SitePlan, TestWebConfig, is_sitemap_target
from p2pcrawl.testing.signals import CDN_IP

__all__ = ["TestWeb", "TestWebConfig", "canonical_target"]

_BIND_ATTEMPTS = 20
REQUEST_LOG_MAX = 200_000
_SHUTDOWN_TIMEOUT = 2.0


class TestWeb(SitePlan, Service):
    """The generated web: plan, ground truth, and (after :meth:`start`) its server."""

    __test__ = False  # keep pytest from collecting it

    def __init__(self, config: TestWebConfig) -> None:
        super().__init__(config)
        # Keys are canonical URLs, so set(request_counts) can be compared with ground_truth().
        self.request_counts: collections.Counter[str] = collections.Counter()
        self.robots_counts: collections.Counter[str] = collections.Counter()  # per "ip:port"
        # (monotonic time, canonical URL, User-Agent) of each page request, newest last:
        # what politeness and per-domain rules are checked against.
        self.request_log: collections.deque[tuple[float, str, str]] = collections.deque(
            maxlen=REQUEST_LOG_MAX
        )
        # Sitemap requests (/sitemap.xml, /sitemaps/...), outside the ground truth as
        # robots.txt is: a crawl reads them, it does not archive them.
        self.sitemap_counts: collections.Counter[str] = collections.Counter()
        self._runners: list[web.ServerRunner] = []
        self.hostile: HostileWeb | None = None
        if config.hostile:
            self.hostile = HostileWeb(config.hostile_config or HostileConfig())
        if config.port and not config.hostile:
            self._set_port(config.port)

    @property
    def crawl_domains(self) -> list[str]:
        """What a crawl of this web puts in scope: its hosts, and the hostile ones if any."""
        extra = self.hostile.allow_domains if self.hostile is not None else []
        return self.allow_domains + extra

    def _extra_roots(self) -> tuple[Link, ...]:
        if self.hostile is None or not self.hostile.port:
            return ()
        # target None: outside the ground truth (what a crawl does with them is the hostile
        # tests' business).
        return tuple(Link(url, None) for url in self.hostile.entry_urls())

    def _set_port(self, port: int) -> None:
        if port != self.port:
            self.request_counts.clear()
            self.request_log.clear()
            self.robots_counts.clear()
            self.sitemap_counts.clear()
        super()._set_port(port)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every host on one shared port, retrying if another process holds it."""
        if self.hostile is not None:
            await self.hostile.start()  # first: the hub links to it
        for _attempt in range(_BIND_ATTEMPTS):
            port = self.config.port
            try:
                for i, ip in enumerate(self.allow_domains):
                    port = await self._bind(i, ip, port)
                if self.config.signals:
                    port = await self._bind(self.cdn_index, CDN_IP, port)
            except OSError:
                await self.aclose()
                if self.config.port:
                    raise
                continue
            self._set_port(port)
            return
        raise OSError(f"no free port shared by {self.allow_domains[0]}..{self.allow_domains[-1]}")

    async def _bind(self, index: int, ip: str, port: int) -> int:
        server = web.Server(functools.partial(self._handle, index), access_log=None)
        runner = web.ServerRunner(server, shutdown_timeout=_SHUTDOWN_TIMEOUT)
        self._runners.append(runner)
        await runner.setup()
        site = web.TCPSite(runner, ip, port, backlog=1024)
        await site.start()
        return int(runner.addresses[0][1])

    async def aclose(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            # One runner failing to close must not leak the others' sockets.
            with contextlib.suppress(Exception):
                await runner.cleanup()
        if self.hostile is not None:
            await self.hostile.aclose()

    # -- server ---------------------------------------------------------------------------

    async def _handle(self, index: int, request: web.BaseRequest) -> web.StreamResponse:
        target = canonical_target(request.raw_path)
        base = self.base_of(index)
        if target == "/robots.txt":
            self.robots_counts[base[7:]] += 1
            status, headers, body = self._robots_answer(index)
        elif is_sitemap_target(target):
            self.sitemap_counts[base + target] += 1
            status, headers, body = self._answer(index, target)
        else:
            url = base + target
            self.request_counts[url] += 1
            self.request_log.append((time.monotonic(), url, request.headers.get("User-Agent", "")))
            status, headers, body = self._answer(index, target)
        if index == self._slow_index:
            await asyncio.sleep(self.config.slow_host_delay)
        return web.Response(status=status, body=body, headers=headers)
