"""A test web whose pages change: ground truth for continuous mode (docs/freshness.md).

Each page changes as a Poisson process of its own rate, drawn from a heavy-tailed
(lognormal) distribution and generated from the seed, so two webs of the same config change
their pages at the same moments after their start; tests change (:meth:`ChangingWeb.change`)
and remove (:meth:`ChangingWeb.remove`) pages at will besides. The server honours
``If-None-Match`` and ``If-Modified-Since`` (RFC 9110 §13.1: the first wins when both are
sent) and answers 304 when the page is unchanged; a changed page links to a page new with
its version (``/new/<page>-<version>.html``), so a crawler that follows a change finds it.

What it keeps is the ground truth: every page's change times, and what it answered to each
request, from which :meth:`ChangingWeb.report` works out how fresh a crawler's copy was
over a span of time (Cho and Garcia-Molina's freshness and age) and how many bytes it cost.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import math
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime

from aiohttp import web

from p2pcrawl.aio import Service

__all__ = ["ChangingConfig", "ChangingWeb", "Freshness"]

_WORDS = [
    "page",
    "text",
    "that",
    "changes",
    "now",
    "and",
    "then",
    "as",
    "pages",
    "on",
    "the",
    "web",
    "do",
]
_BIND_ATTEMPTS = 20
_SHUTDOWN_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class ChangingConfig:
    hosts: int = 2
    pages_per_host: int = 10
    seed: int = 1
    # Pages change at rates drawn from a lognormal: median gap ``median_gap_s`` seconds,
    # log-spread ``sigma`` (the rate's heavy right tail: a few pages change very often).
    # 0: no page changes by itself (tests change them by hand).
    median_gap_s: float = 0.0
    sigma: float = 2.0
    horizon_s: float = 3600.0  # change times are drawn this far ahead
    page_bytes: int = 4000
    links_per_page: int = 3
    new_links: bool = True  # a page's version v > 0 links to /new/<page>-<v>.html
    etag: bool = True
    last_modified: bool = True
    sitemap: bool = False  # /sitemap.xml lists each host's pages with their <lastmod>
    port: int = 0
    first_ip: int = 200  # hosts are 127.0.0.{first_ip + i}

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.first_ip < 1 or self.first_ip + self.hosts > 255:
            raise ValueError("hosts must fit in 127.0.0.1 .. 127.0.0.254")
        if self.pages_per_host < 1 or self.page_bytes < 0 or self.median_gap_s < 0:
            raise ValueError("bad changing web config")


@dataclass(slots=True)
class _Page:
    changes: list[float]  # seconds after the start, sorted
    gone: tuple[float, int] | None = None  # (since, status)
    # What each request got: (seconds after start, status, version answered or confirmed).
    log: list[tuple[float, int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Freshness:
    """How current a crawler's copy of the pages was over a span (and what it cost)."""

    freshness: float  # time-averaged share of pages whose stored copy was current
    age_s: float  # time-averaged age: how long a stale copy had been stale, 0 when fresh
    requests: int  # page requests in the span (robots.txt and new pages left out)
    not_modified: int  # of which answered 304
    body_bytes: int  # page bytes sent
    full_bytes: int  # page bytes had every request got the whole page


class ChangingWeb(Service):
    __test__ = False  # keep pytest from collecting it

    def __init__(self, config: ChangingConfig) -> None:
        self.config = config
        rng = random.Random(config.seed)
        self.pages: dict[str, _Page] = {}
        self.ips = [f"127.0.0.{config.first_ip + i}" for i in range(config.hosts)]
        self.paths = [f"/p{i}.html" for i in range(config.pages_per_host)]
        self._rates: dict[str, float] = {}
        for h in range(config.hosts):
            for path in self.paths:
                rate = 0.0
                if config.median_gap_s:
                    rate = 1 / (config.median_gap_s * math.exp(rng.gauss(0, config.sigma)))
                changes: list[float] = []
                t = rng.expovariate(rate) if rate else math.inf
                while t < config.horizon_s:
                    changes.append(t)
                    t += rng.expovariate(rate)
                self.pages[f"{h}{path}"] = _Page(changes)
                self._rates[f"{h}{path}"] = rate
        self.robots_txt = "User-agent: *\nAllow: /\n"
        self.robots_counts: list[int] = [0] * config.hosts
        self.sitemap_counts: list[int] = [0] * config.hosts
        self.new_requests: collections.Counter[str] = collections.Counter()  # by URL
        # When each host was asked for anything (robots.txt included): politeness checks.
        self.host_times: list[list[float]] = [[] for _ in range(config.hosts)]
        self.port = 0
        self.t0 = 0.0  # monotonic time of the start
        self.wall0 = 0.0
        self._runners: list[web.ServerRunner] = []

    # -- addresses ------------------------------------------------------------------------

    @property
    def bases(self) -> list[str]:
        return [f"http://{ip}:{self.port}" for ip in self.ips]

    @property
    def hub_url(self) -> str:
        return self.bases[0] + "/"

    @property
    def allow_domains(self) -> list[str]:
        return list(self.ips)

    def page_urls(self) -> list[str]:
        """Every changing page (the hub and the new pages are not counted)."""
        return [f"{base}{path}" for base in self.bases for path in self.paths]

    def _page_key(self, url: str) -> str:
        for h, base in enumerate(self.bases):
            if url.startswith(base + "/"):
                return f"{h}{url[len(base) :]}"
        raise KeyError(url)

    def rate(self, url: str) -> float:
        """The page's change rate (changes a second) its schedule was drawn from."""
        return self._rates[self._page_key(url)]

    # -- changing pages by hand -----------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def change(self, url: str) -> int:
        """Change a page now; returns its new version."""
        page = self.pages[self._page_key(url)]
        bisect.insort(page.changes, self.now())
        return self.version(url)

    def remove(self, url: str, status: int = 404) -> None:
        self.pages[self._page_key(url)].gone = (self.now(), status)

    def version(self, url: str, at: float | None = None) -> int:
        page = self.pages[self._page_key(url)]
        return bisect.bisect_right(page.changes, self.now() if at is None else at)

    def requests(self, url: str) -> list[tuple[float, int, int]]:
        """(seconds after start, status, version) of every request for ``url``."""
        return list(self.pages[self._page_key(url)].log)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        for _ in range(_BIND_ATTEMPTS):
            port = self.config.port
            try:
                for h, ip in enumerate(self.ips):
                    handler = functools.partial(self._handle, h)
                    runner = web.ServerRunner(
                        web.Server(handler, access_log=None), shutdown_timeout=_SHUTDOWN_TIMEOUT
                    )
                    self._runners.append(runner)
                    await runner.setup()
                    await web.TCPSite(runner, ip, port, backlog=1024).start()
                    port = int(runner.addresses[0][1])
            except OSError:
                await self.aclose()
                if self.config.port:
                    raise
                continue
            self.port = port
            self.t0, self.wall0 = time.monotonic(), time.time()
            return
        raise OSError(f"no free port shared by {self.ips[0]}..{self.ips[-1]}")

    async def aclose(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()

    # -- the server -----------------------------------------------------------------------

    async def _handle(self, h: int, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if len(self.host_times[h]) < 100_000:
            self.host_times[h].append(self.now())
        if path == "/robots.txt":
            self.robots_counts[h] += 1
            return web.Response(text=self.robots_txt, content_type="text/plain")
        if path == "/sitemap.xml" and self.config.sitemap:
            self.sitemap_counts[h] += 1
            return self._sitemap(h)
        if path == "/" and h == 0:
            links = "".join(f'<a href="{u}">{u}</a>\n' for u in self.page_urls())
            return _html("hub", links)
        if path.startswith("/new/"):
            return self._new_page(h, path)
        page = self.pages.get(f"{h}{path}")
        if page is None:
            return web.Response(status=404, text="not found")
        t = self.now()
        if page.gone is not None and page.gone[0] <= t:
            page.log.append((t, page.gone[1], -1))
            return web.Response(status=page.gone[1], text="gone")
        version = bisect.bisect_right(page.changes, t)
        changed_at = page.changes[version - 1] if version else 0.0
        headers: dict[str, str] = {}
        if self.config.etag:
            headers["ETag"] = f'"{h}-{path[2:-5]}-{version}"'
        if self.config.last_modified:
            headers["Last-Modified"] = formatdate(self.wall0 + changed_at, usegmt=True)
        if self._not_modified(request, headers, self.wall0 + changed_at):
            page.log.append((t, 304, version))
            return web.Response(status=304, headers=headers)
        page.log.append((t, 200, version))
        return web.Response(
            body=self._page(h, path, version), content_type="text/html", headers=headers
        )

    def _sitemap(self, h: int) -> web.Response:
        t = self.now()
        entries = []
        for path in self.paths:
            changes = self.pages[f"{h}{path}"].changes
            version = bisect.bisect_right(changes, t)
            at = self.wall0 + (changes[version - 1] if version else 0.0)
            when = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
            entries.append(f"<url><loc>{self.bases[h]}{path}</loc><lastmod>{when}</lastmod></url>")
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(entries)
            + "</urlset>\n"
        )
        return web.Response(text=body, content_type="application/xml")

    def _page(self, h: int, path: str, version: int) -> bytes:
        return _document(f"page {h}{path} version {version}", self._body(h, path, version))

    def _not_modified(self, request: web.BaseRequest, headers: dict[str, str], lm: float) -> bool:
        inm = request.headers.get("If-None-Match")
        if inm is not None:  # RFC 9110 §13.2.2: If-None-Match wins over If-Modified-Since
            etag = headers.get("ETag")
            return etag is not None and etag in [e.strip() for e in inm.split(",")]
        ims = request.headers.get("If-Modified-Since")
        if ims is None or "Last-Modified" not in headers:
            return False
        try:
            return int(lm) <= parsedate_to_datetime(ims).timestamp()
        except (TypeError, ValueError):
            return False

    def _body(self, h: int, path: str, version: int) -> str:
        n = len(self.paths)
        index = int(path[2:-5])
        rng = random.Random(f"{self.config.seed}-{h}-{index}-{version}")
        targets = {self.paths[(index + 1 + k * 7) % n] for k in range(self.config.links_per_page)}
        links = "".join(f'<a href="{p}">{p}</a>\n' for p in sorted(targets))
        if self.config.new_links and version:
            links += f'<a href="/new/{index}-{version}.html">new in version {version}</a>\n'
        words: list[str] = []
        size = 0
        while size < self.config.page_bytes:
            w = rng.choice(_WORDS)
            words.append(w)
            size += len(w) + 1
        return f"<p>version {version}</p>\n{links}<p>{' '.join(words)}</p>\n"

    def _new_page(self, h: int, path: str) -> web.Response:
        try:
            index, version = (int(x) for x in path[5:-5].split("-"))
            current = self.version(f"{self.bases[h]}{self.paths[index]}")
        except (ValueError, IndexError, KeyError):
            return web.Response(status=404, text="not found")
        if not 1 <= version <= current:
            return web.Response(status=404, text="not found")
        self.new_requests[self.bases[h] + path] += 1
        return _html(f"new {index}-{version}", "<p>a page that appeared with a change</p>\n")

    # -- the ground truth -----------------------------------------------------------------

    def report(self, start: float, end: float) -> Freshness:
        """Freshness and age of what the crawler fetched, averaged over pages and over
        ``start``..``end`` (seconds after the web's start; a page counts as stale until
        its first fetch), and the requests in that span."""
        total_fresh = total_age = 0.0
        requests = not_modified = body = full = 0
        span = end - start
        for key, page in self.pages.items():
            h, path = int(key[0 : key.index("/")]), key[key.index("/") :]
            stored: int | None = None
            fetched = [e for e in page.log if e[1] in (200, 304)]
            i = 0
            while i < len(fetched) and fetched[i][0] <= start:
                stored = fetched[i][2]
                i += 1
            t = start
            for ft, status, version in [*fetched[i:], (end, 0, -1)]:
                stop = min(ft, end)
                total_fresh += _fresh_time(page.changes, stored, t, stop)
                total_age += _age_time(page.changes, stored, t, stop)
                if ft >= end:
                    break
                requests += 1
                size = len(self._page(h, path, version))
                full += size
                if status == 304:
                    not_modified += 1
                else:
                    body += size
                stored, t = version, ft
        pages = len(self.pages)
        return Freshness(
            freshness=total_fresh / (pages * span),
            age_s=total_age / (pages * span),
            requests=requests,
            not_modified=not_modified,
            body_bytes=body,
            full_bytes=full,
        )


def _fresh_time(changes: list[float], stored: int | None, t0: float, t1: float) -> float:
    """Time in ``t0``..``t1`` when a copy of version ``stored`` was current."""
    if stored is None or t1 <= t0:
        return 0.0
    # Version ``stored`` is current from changes[stored - 1] until changes[stored].
    begins = changes[stored - 1] if stored else -math.inf
    ends = changes[stored] if stored < len(changes) else math.inf
    return max(0.0, min(t1, ends) - max(t0, begins))


def _age_time(changes: list[float], stored: int | None, t0: float, t1: float) -> float:
    """The integral of the copy's age over ``t0``..``t1`` (age: time since the first change
    the copy missed; a page never fetched is as old as the span so far)."""
    if t1 <= t0:
        return 0.0
    stale_from = t0 if stored is None else changes[stored] if stored < len(changes) else math.inf
    a = max(t0, stale_from)
    if a >= t1:
        return 0.0
    return ((t1 - stale_from) ** 2 - (a - stale_from) ** 2) / 2


def _document(title: str, body: str) -> bytes:
    head = f"<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n"
    return (head + body + "</body></html>\n").encode()


def _html(title: str, body: str) -> web.Response:
    return web.Response(body=_document(title, body), content_type="text/html")
