"""Hostile hosts for the test web: servers that try to freeze, fool or flood a crawler.

Each case is one host on its own loopback address, so politeness toward one never delays
another, and a crawl that handles them all still reaches the regular web's ground truth.
:class:`HostileWeb` serves them; :class:`p2pcrawl.testing.web.TestWeb` links its hub to
:meth:`HostileWeb.entry_urls` when its config says ``hostile=True``.

The cases, and what a well-behaved crawler does with each:

``tarpit``
    ``/tarpit.html`` promises 100 kB and drips one byte every ``drip_interval`` seconds
    after a first chunk holding a link. Cut by the fetch's total timeout: archived with
    ``WARC-Truncated: time``, its link followed.
``reset``
    ``/reset.html`` promises 100 kB, sends 50 kB holding :data:`RESET_LINKS` links, then
    resets the connection. A retryable error, retried a bounded number of times; after the
    last try archived with ``WARC-Truncated: disconnect`` and its links followed.
    ``/reset-once.html`` resets only the first time: retried, then archived whole.
``bomb``
    ``/bomb.html`` is ``bomb_depth`` nested ``<div>`` (100,000: 81 s of lexbor time) with
    links before, inside and after them. Parsed within a bound; all three links followed.
``trap``
    ``/trap/`` is an endless generator: each page links to unique pages, to a path that
    repeats its last segment, and to itself with a fresh session ID. Bounded by the
    per-host budgets and the trap-URL rules, never by the global page limit.
``guard``
    ``/robots.txt`` redirects to ``169.254.169.254``; its pages redirect to the shared
    address space (``100.64.0.0/10``), a 6to4, a Teredo and an IPv4-mapped address. None
    of these may be connected to (nothing listens there, and nothing must be sent there).
``slowrobots``
    ``/robots.txt`` answers after ``slow_robots_delay`` seconds; the host's pages wait for
    it (RFC 9309 §2.3.1.4) while the rest of the crawl goes on.
``sitemapbomb``, ``sitemapcross``, ``otherbot``
    Site signals turned against the crawler: :mod:`p2pcrawl.testing.hostilesignals`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import socket
import struct
from dataclasses import dataclass

from aiohttp import web

from p2pcrawl.aio import Service
from p2pcrawl.testing.hostilesignals import SIGNAL_CASES, SignalCases

__all__ = ["CASES", "GUARD_TARGETS", "RESET_LINKS", "HostileConfig", "HostileWeb"]

CASES = ("tarpit", "reset", "bomb", "trap", "guard", "slowrobots", *SIGNAL_CASES)
RESET_LINKS = 20
# Where the guard host's redirects point. No test may connect to any of them.
GUARD_TARGETS = {
    "robots": "http://169.254.169.254/latest/meta-data/",
    "shared": "http://100.64.0.1/",
    "shared_metadata": "http://100.100.100.200/latest/meta-data/",
    "6to4": "http://[2002:a9fe:a9fe::1]/",
    "teredo": "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
    "mapped": "http://[::ffff:169.254.169.254]/",
}
_HTML = "text/html; charset=utf-8"
_BIND_ATTEMPTS = 20
_SHUTDOWN_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class HostileConfig:
    port: int = 0  # 0 = choose on start (TestWeb passes its own)
    first_ip: int = 240  # hosts are 127.0.0.{first_ip + i}, one per case
    drip_interval: float = 0.2
    drip_for: float = 60.0  # a tarpit gives up after this long, so no test hangs on it
    reset_after: int = 50 * 1024
    bomb_depth: int = 100_000
    trap_fanout: int = 6
    slow_robots_delay: float = 3.0

    def __post_init__(self) -> None:
        if self.first_ip < 1 or self.first_ip + len(CASES) > 255:
            raise ValueError("hostile hosts must fit in 127.0.0.1 .. 127.0.0.254")
        if self.drip_interval <= 0 or self.drip_for <= 0 or self.slow_robots_delay < 0:
            raise ValueError("drip_interval and drip_for must be > 0, slow_robots_delay >= 0")
        if self.reset_after < 1024 or self.bomb_depth < 1 or self.trap_fanout < 1:
            raise ValueError("reset_after >= 1024, bomb_depth and trap_fanout >= 1")


class HostileWeb(SignalCases, Service):
    """The hostile hosts: one server per case, all on one port."""

    __test__ = False

    def __init__(self, config: HostileConfig | None = None) -> None:
        self.config = config or HostileConfig()
        self.ips = {case: f"127.0.0.{self.config.first_ip + i}" for i, case in enumerate(CASES)}
        self.port = 0
        # Requests per case and path (robots.txt included), for tests to assert on.
        self.requests: dict[str, collections.Counter[str]] = {
            case: collections.Counter() for case in CASES
        }
        self._runners: list[web.ServerRunner] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._bomb_body = b""
        if self.config.port:
            self.port = self.config.port

    # -- addresses ------------------------------------------------------------------------

    @property
    def allow_domains(self) -> list[str]:
        return list(self.ips.values())

    def base(self, case: str) -> str:
        if not self.port:
            raise RuntimeError("port unknown: pass HostileConfig.port or await start()")
        return f"http://{self.ips[case]}:{self.port}"

    def url(self, case: str, path: str) -> str:
        return self.base(case) + path

    def entry_urls(self) -> list[str]:
        """The one URL per case a hub links to."""
        return [
            self.url("tarpit", "/tarpit.html"),
            self.url("reset", "/reset.html"),
            self.url("reset", "/reset-once.html"),
            self.url("bomb", "/bomb.html"),
            self.url("trap", "/trap/"),
            self.url("guard", "/guard/index.html"),
            self.url("slowrobots", "/index.html"),
            self.url("sitemapbomb", "/index.html"),
            self.url("sitemapcross", "/index.html"),
            self.url("otherbot", "/index.html"),
        ]

    def followed_links(self) -> dict[str, list[str]]:
        """Links a crawler must follow from the pages it can only partly read or parse."""
        return {
            "tarpit": [self.url("tarpit", "/tarpit/child.html")],
            "reset": [self.url("reset", f"/reset/child-{i}.html") for i in range(RESET_LINKS)],
            "bomb": [
                self.url("bomb", f"/bomb/{where}.html") for where in ("before", "inside", "after")
            ],
        }

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        for _attempt in range(_BIND_ATTEMPTS):
            port = self.port
            try:
                for case in CASES:
                    port = await self._bind(case, port)
            except OSError:
                await self._close_runners()
                if self.port:
                    raise
                continue
            self.port = port
            self.prepare_sitemaps()
            return
        raise OSError("no free port for the hostile hosts")

    async def _bind(self, case: str, port: int) -> int:
        handler = functools.partial(self._handle, case)
        server = web.Server(handler, access_log=None)
        runner = web.ServerRunner(server, shutdown_timeout=_SHUTDOWN_TIMEOUT)
        self._runners.append(runner)
        await runner.setup()
        site = web.TCPSite(runner, self.ips[case], port, backlog=128)
        await site.start()
        return int(runner.addresses[0][1])

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        await self._close_runners()

    async def _close_runners(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()

    # -- handlers -------------------------------------------------------------------------

    async def _handle(self, case: str, request: web.BaseRequest) -> web.StreamResponse:
        path = request.raw_path
        self.requests[case][path] += 1
        if path == "/robots.txt":
            return await self._robots(case)
        handler = getattr(self, f"_{case}")
        response: web.StreamResponse = await handler(request, path)
        return response

    async def _robots(self, case: str) -> web.Response:
        if case == "guard":
            location = GUARD_TARGETS["robots"]
            return web.Response(status=302, headers={"Location": location})
        if case == "slowrobots":
            await asyncio.sleep(self.config.slow_robots_delay)
        return web.Response(text=self.signal_robots(case))

    async def _tarpit(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if path != "/tarpit.html":
            return _page(path)
        first = _html_start("tarpit") + b'<a href="/tarpit/child.html">child</a>\n<p>'
        resp = web.StreamResponse(headers={"Content-Type": _HTML})
        resp.content_length = 100_000
        await resp.prepare(request)
        await resp.write(first)
        loop = asyncio.get_running_loop()
        until = loop.time() + self.config.drip_for
        with contextlib.suppress(ConnectionError):
            while loop.time() < until:
                await asyncio.sleep(self.config.drip_interval)
                await resp.write(b"z")
        _reset(request)
        return resp

    async def _reset(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if path not in ("/reset.html", "/reset-once.html"):
            return _page(path)
        links = "".join(
            f'<li><a href="/reset/child-{i}.html">child {i}</a></li>\n' for i in range(RESET_LINKS)
        )
        head = _html_start("reset") + f"<ul>\n{links}</ul>\n".encode()
        size = self.config.reset_after
        body = head + b"<p>" + b"x" * (2 * size) + b"</p></body></html>\n"
        if path == "/reset-once.html":
            body = _html_start("reset once") + b"<p>whole</p></body></html>\n"
            if self.requests["reset"][path] > 1:
                return web.Response(body=body, headers={"Content-Type": _HTML})
        resp = web.StreamResponse(headers={"Content-Type": _HTML})
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[:size] if path == "/reset.html" else body[: len(body) // 2])
        _reset(request)
        return resp

    async def _bomb(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if path != "/bomb.html":
            return _page(path)
        if not self._bomb_body:
            depth = self.config.bomb_depth
            self._bomb_body = b"".join(
                (
                    _html_start("bomb"),
                    b'<a href="/bomb/before.html">before</a>\n',
                    b"<div>" * depth,
                    b'<a href="/bomb/inside.html">inside</a>',
                    b"</div>" * depth,
                    b'\n<a href="/bomb/after.html">after</a>\n</body></html>\n',
                )
            )
        return web.Response(body=self._bomb_body, headers={"Content-Type": _HTML})

    async def _trap(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if not path.startswith("/trap/"):
            return _page(path)
        # Unique children, a repeating segment and a session ID: the shapes real traps
        # take (calendars, relative-link loops, per-visit IDs in links).
        stem = path.split("?", 1)[0].rstrip("/")
        last = stem.rsplit("/", 1)[-1] or "trap"
        n = self.requests["trap"].total()
        links = [f"{stem}/{n}-{k}.html" for k in range(self.config.trap_fanout)]
        links.append(f"{stem}/{last}/")
        links.append(f"{stem}/?sid={n:08x}{n * 7919:08x}")
        links.append(f"{stem}/;jsessionid={n * 104729:016x}")
        items = "".join(f'<li><a href="{href}">{k}</a></li>\n' for k, href in enumerate(links))
        body = _html_start("trap") + f"<ul>\n{items}</ul>\n</body></html>\n".encode()
        return web.Response(body=body, headers={"Content-Type": _HTML})

    async def _guard(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if path == "/guard/index.html":
            items = "".join(
                f'<li><a href="/guard/{name}">{name}</a></li>\n'
                for name in GUARD_TARGETS
                if name != "robots"
            )
            items += f'<li><a href="{GUARD_TARGETS["shared"]}">direct</a></li>\n'
            items += '<li><a href="/guard/ok.html">ok</a></li>\n'
            body = _html_start("guard") + f"<ul>\n{items}</ul></body></html>\n".encode()
            return web.Response(body=body, headers={"Content-Type": _HTML})
        name = path.removeprefix("/guard/")
        if name in GUARD_TARGETS:
            return web.Response(status=301, headers={"Location": GUARD_TARGETS[name]})
        return _page(path)

    async def _slowrobots(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        return _page(path)


def _html_start(title: str) -> bytes:
    return f"<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n".encode()


def _page(path: str) -> web.Response:
    """A leaf page: the pages the hostile pages link to."""
    body = _html_start(path) + b"<p>leaf</p></body></html>\n"
    return web.Response(body=body, headers={"Content-Type": _HTML})


def _reset(request: web.BaseRequest) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed server would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
