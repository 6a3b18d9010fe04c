"""A deterministic generated web on loopback, with its own ground truth.

Tests, benchmarks and ``p2pcrawl demo`` crawl it and compare what the crawler fetched with
:meth:`TestWeb.ground_truth`. Every host listens on its own loopback address (host ``i`` is
``127.0.0.{first_ip + i}``; Linux routes all of 127/8 to ``lo``) so per-host politeness and
host-keyed ownership behave as on the real web, while one shared port keeps URLs short.

The web is a pure function of :class:`TestWebConfig`. Pages are *planned* from
``random.Random(f"{seed}:{host}:{page}")`` (never the global generator) and rendered on
request, so a benchmark can serve the web from another process (``python -m
p2pcrawl.testing.serve``) and still compute the ground truth locally from the same config.

Every link is planned as its canonical URL first and only then spelt (relative, with dot
segments, a fragment, ``HTTP://``...), so the ground truth never depends on a URL
canonicaliser; the server canonicalises request targets only to count double fetches.

Ground truth (what a correct crawl from ``hub_url`` requests, ``/robots.txt`` aside):

- URLs in canonical form: ``http://127.0.0.N:PORT/path?query``, lowercase scheme, dot
  segments resolved (RFC 3986 §5.2.4), no fragment, query parameters sorted by name then
  value, unreserved percent-escapes decoded and the others upper-cased.
- Breadth-first from the hub along every ``<a href>`` (after ``<base href>``, stripped of
  surrounding whitespace, ``&amp;`` decoded), limited to the test hosts (``allow_domains``).
- Not followed: ``rel="nofollow"`` links, every link of a ``<meta name="robots"
  content="nofollow">`` page, ``<link rel="canonical">``, non-HTTP links, and links inside
  non-HTML bodies or 3xx/4xx/5xx bodies. ``noindex`` pages are followed.
- Every fetched URL counts, whatever it answers: 200 pages and PDF/PNG, 404, 500, and each
  301/302 source; a ``Location`` (resolved against the request URL) is a new discovery.
- robots.txt (RFC 9309): ``Disallow: /private/`` everywhere except :attr:`no_robots_host`,
  whose robots.txt answers 404, which allows all, so its ``/private/`` pages are fetched.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gzip
import posixpath
import random
from dataclasses import dataclass, replace

from aiohttp import web

from p2pcrawl.aio.service import Service
from p2pcrawl.testing.canonical import canonical_target
from p2pcrawl.testing.content import (
    LINK_CAP,
    LINK_SIGMA,
    PDF,
    PNG,
    WORDS,
    lognormal_mu,
    make_text,
)
from p2pcrawl.testing.hostile import HostileConfig, HostileWeb

__all__ = ["TestWeb", "TestWebConfig", "canonical_target"]

_BIND_ATTEMPTS = 20
_SHUTDOWN_TIMEOUT = 2.0
_RENDER_CACHE = 512  # rendered answers kept; a crawl fetches each page once, so keep it small
_OUT_OF_SCOPE_IP = "127.0.0.250"
_ROBOTS_CRAWL_DELAY = 0.05


_Headers = tuple[tuple[str, str], ...]
_Answer = tuple[int, _Headers, bytes]

_HTML = "text/html"
_NOT_FOUND = (
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>"
    b"<body><h1>Not Found</h1></body></html>\n"
)
_SERVER_ERROR = (
    b"<!DOCTYPE html>\n<html><head><title>500 Internal Server Error</title></head>"
    b"<body><h1>Internal Server Error</h1></body></html>\n"
)


@dataclass(frozen=True, slots=True)
class TestWebConfig:
    """The shape of the generated web; with ``port`` fixed, everything follows from it."""

    __test__ = False  # a dataclass named Test*; keep pytest from collecting it

    hosts: int = 5
    pages_per_host: int = 60
    seed: int = 1
    mean_links: float = 40.0  # lognormal: median ~ mean / 2, capped at 10x the mean
    cross_host_ratio: float = 0.2  # share of random links to other hosts
    page_bytes: int = 0  # pad every HTML page to this many bytes (0 = natural size)
    features: bool = True  # robots, redirects, errors, non-HTML, slow host, tricky links...
    slow_host_delay: float = 0.2  # seconds the slow host waits before every answer
    large_page_bytes: int = 12 * 1024 * 1024  # 0 = no large page
    port: int = 0  # 0 = choose on start
    first_ip: int = 2  # hosts are 127.0.0.{first_ip + i}
    # Also serve the hostile hosts (p2pcrawl.testing.hostile) and link the hub to them. They
    # are outside the ground truth; crawl them by putting crawl_domains in scope.
    hostile: bool = False
    hostile_config: HostileConfig | None = None

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.pages_per_host < 1:
            raise ValueError("hosts and pages_per_host must be >= 1")
        # 127.0.0.250 is the out-of-scope loopback host the pages link to.
        if self.first_ip < 1 or self.first_ip + self.hosts > 250:
            raise ValueError("hosts must fit in 127.0.0.1 .. 127.0.0.249")
        hostile_ip = (self.hostile_config or HostileConfig()).first_ip
        if self.hostile and self.first_ip + self.hosts > hostile_ip:
            raise ValueError(f"with hostile hosts, hosts must end below 127.0.0.{hostile_ip}")


@dataclass(frozen=True, slots=True)
class _Link:
    href: str  # as written in the HTML
    target: str | None  # canonical absolute URL; None for mailto: and javascript:
    nofollow: bool = False


@dataclass(frozen=True, slots=True)
class _Resource:
    """What one URL answers; regular pages are planned on demand, the rest are fixed."""

    status: int = 200
    content_type: str = _HTML
    title: str = ""
    head: str = '<meta charset="utf-8">\n'
    links: tuple[_Link, ...] = ()
    meta_nofollow: bool = False
    location: str = ""  # Location header as sent (may be relative)
    location_target: str = ""  # its canonical absolute form
    pad_to: int = -1  # -1 = the config's page_bytes
    gzip: bool = False
    encoding: str = "utf-8"
    body: bytes = b""  # non-HTML bodies
    text_at: int = 0  # where the page's prose starts in the shared text

    @property
    def is_html(self) -> bool:
        return self.status == 200 and self.content_type.startswith(_HTML)


# --- URL helpers -------------------------------------------------------------------------


class TestWeb(Service):
    """The generated web: plan, ground truth, and (after :meth:`start`) its server."""

    __test__ = False  # keep pytest from collecting it

    def __init__(self, config: TestWebConfig) -> None:
        self.config = config
        self.port = 0
        self.hub_url = ""
        self.hosts: list[str] = []
        self.allow_domains: list[str] = [
            f"127.0.0.{config.first_ip + i}" for i in range(config.hosts)
        ]
        # Keys are canonical URLs, so set(request_counts) can be compared with ground_truth().
        self.request_counts: collections.Counter[str] = collections.Counter()
        self.robots_counts: collections.Counter[str] = collections.Counter()  # per "ip:port"
        self.feature_urls: dict[str, str] = {}
        features = config.features
        n = config.hosts
        self.slow_host: str | None = None
        self.crawl_delay_host: str | None = None
        self.no_robots_host: str | None = None
        self._slow_index = n - 1 if features and n >= 2 else -1
        self._crawl_delay_index = 1 % n if features else -1
        self._no_robots_index = 2 if features and n >= 3 else -1
        self._page_paths = ["/"] + [f"/s{j % 8}/p{j}.html" for j in range(1, config.pages_per_host)]
        self._page_index = {p: j for j, p in enumerate(self._page_paths)}
        self._mu = lognormal_mu(config.mean_links)
        self._cap = max(1, min(LINK_CAP, round(10 * config.mean_links)))
        self._text, self._para_starts = make_text(config.seed)
        self._text2 = self._text * 2  # slicing across the end without a copy per page
        self._prose = " ".join(WORDS) + " "
        self._bases: list[str] = []
        self._authority_index: dict[str, int] = {}
        self._special: dict[tuple[int, str], _Resource] = {}
        self._hub_extras: tuple[_Link, ...] = ()
        self._root_extras: tuple[str, ...] = ()
        self._answer = functools.lru_cache(maxsize=_RENDER_CACHE)(self._render)
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

    # -- ground truth ---------------------------------------------------------------------

    def ground_truth(self) -> set[str]:
        """Canonical URLs a correct breadth-first crawl from :attr:`hub_url` requests."""
        return set(self.expected_status())

    def expected_status(self) -> dict[str, int]:
        """Status each ground-truth URL answers (200, 301, 302, 404 or 500)."""
        self._require_port()
        seen = {self.hub_url}
        queue = collections.deque([self.hub_url])
        status: dict[str, int] = {}
        while queue:
            url = queue.popleft()
            index, target = self._split(url)
            resource = self._resource(index, target)
            if resource is None:
                status[url] = 404
                continue
            status[url] = resource.status
            if resource.location_target:
                found = [resource.location_target]
            elif resource.is_html and not resource.meta_nofollow:
                found = [
                    link.target for link in resource.links if link.target and not link.nofollow
                ]
            else:
                found = []
            for new in found:
                if new not in seen and self._crawlable(new):
                    seen.add(new)
                    queue.append(new)
        return status

    def _crawlable(self, url: str) -> bool:
        """In scope (one of our hosts) and allowed by that host's robots.txt."""
        if not url.startswith("http://"):
            return False
        authority, _, path = url[7:].partition("/")
        index = self._authority_index.get(authority)
        if index is None:
            return False
        return not ("/" + path).startswith("/private/") or not self._robots_blocks_private(index)

    def _robots_blocks_private(self, index: int) -> bool:
        return self.config.features and index != self._no_robots_index

    def robots_txt(self, index: int) -> str | None:
        """Host ``index``'s robots.txt; None means it answers 404 (RFC 9309 §2.3.1.3: allow all)."""
        if not self.config.features:
            return "User-agent: *\nDisallow:\n"
        if index == self._no_robots_index:
            return None
        text = "User-agent: *\nDisallow: /private/\n"
        if index == self._crawl_delay_index:
            text += f"Crawl-delay: {_ROBOTS_CRAWL_DELAY}\n"
        return text

    def render(self, url: str) -> tuple[int, dict[str, str], bytes]:
        """What the server answers for ``url`` (any spelling), without any I/O."""
        self._require_port()
        authority, _, rest = url.partition("://")[2].partition("/")
        index = self._authority_index[authority]
        target = canonical_target("/" + rest)
        if target == "/robots.txt":
            status, headers, body = self._robots_answer(index)
        else:
            status, headers, body = self._answer(index, target)
        return status, dict(headers), body

    # -- setup of the fixed resources -----------------------------------------------------

    def _require_port(self) -> None:
        if not self.port:
            raise RuntimeError("port unknown: set TestWebConfig.port or await start()")

    def _set_port(self, port: int) -> None:
        if port == self.port:
            return
        self.port = port
        self._special.clear()
        self.feature_urls.clear()
        self.hosts = [f"{ip}:{port}" for ip in self.allow_domains]
        self._bases = [f"http://{h}" for h in self.hosts]
        self._authority_index = {h: i for i, h in enumerate(self.hosts)}
        self.hub_url = self._bases[0] + "/"
        self._answer.cache_clear()
        self.request_counts.clear()
        self.robots_counts.clear()
        roots = tuple(_Link(b + "/", b + "/") for b in self._bases)
        if self.hostile is not None and self.hostile.port:
            # target None: outside the ground truth (what a crawl does with them is the
            # hostile tests' business).
            roots += tuple(_Link(url, None) for url in self.hostile.entry_urls())
        if not self.config.features:
            self._hub_extras = roots
            return
        self.slow_host = self.hosts[self._slow_index] if self._slow_index >= 0 else None
        self.crawl_delay_host = self.hosts[self._crawl_delay_index]
        if self._no_robots_index >= 0:
            self.no_robots_host = self.hosts[self._no_robots_index]
        self._hub_extras = roots + self._build_features()
        self._root_extras = ("/private/0.html",)
        for i in range(self.config.hosts):
            self._add(i, "/private/0.html", self._leaf(i, "/private/1.html", "/"))
            self._add(i, "/private/1.html", self._leaf(i, "/"))

    def _add(self, index: int, target: str, resource: _Resource, name: str = "") -> str:
        url = self._bases[index] + target
        self._special[(index, target)] = resource
        if name:
            self.feature_urls[name] = url
        return url

    def _leaf(self, index: int, *targets: str) -> _Resource:
        base = self._bases[index]
        links = tuple(_Link(t, base + t) for t in targets or ("/",))
        return _Resource(links=links, text_at=len(self._special))

    def _redirect(self, status: int, location: str, target: str) -> _Resource:
        return _Resource(status=status, location=location, location_target=target)

    def _build_features(self) -> tuple[_Link, ...]:
        """The one-off pages; returns the hub's links to them (features=True only)."""
        a, other = 0, 1 % self.config.hosts
        base_a, base_b = self._bases[a], self._bases[other]
        add = functools.partial(self._add, a)
        leaf = functools.partial(self._leaf, a)
        links: list[_Link] = []

        def link(href: str, target: str, nofollow: bool = False) -> None:
            links.append(_Link(href, target, nofollow))

        # Redirects: each source is fetched, each Location is a newly discovered URL.
        end = add("/redirect/chain-end.html", leaf(), "redirect_chain_end")
        two = add("/redirect/chain-2", self._redirect(302, "/redirect/chain-end.html", end))
        link(
            "/redirect/chain-1",
            add("/redirect/chain-1", self._redirect(301, two, two), "redirect_chain"),
        )
        loop_b = base_a + "/redirect/loop-b"
        loop_a = add("/redirect/loop-a", self._redirect(301, "loop-b", loop_b), "redirect_loop")
        add("/redirect/loop-b", self._redirect(302, loop_a, loop_a))
        link("/redirect/loop-a", loop_a)
        landed = self._add(other, "/redirect/landed.html", self._leaf(other), "redirect_landed")
        link(
            "/redirect/cross",
            add("/redirect/cross", self._redirect(301, landed, landed), "redirect_cross"),
        )
        away = "http://example.invalid/away"
        link(
            "/redirect/away",
            add("/redirect/away", self._redirect(302, away, away), "redirect_away"),
        )

        # Errors and non-HTML: fetched, never parsed.
        link("/error/500.html", add("/error/500.html", _Resource(status=500), "error_500"))
        self.feature_urls["missing"] = base_a + "/missing/hub.html"
        link("/missing/hub.html", base_a + "/missing/hub.html")
        pdf = _Resource(content_type="application/pdf", body=PDF)
        link("/files/report.pdf", add("/files/report.pdf", pdf, "pdf"))
        link(
            "img/logo.png",
            add("/img/logo.png", _Resource(content_type="image/png", body=PNG), "png"),
        )

        # Meta robots and rel=canonical.
        targets = ("/meta/nofollow-target-0.html", "/meta/nofollow-target-1.html")
        for t in targets:
            add(t, leaf())
        head = '<meta charset="utf-8">\n<meta name="robots" content="nofollow">\n'
        meta_nofollow = replace(leaf(*targets), head=head, meta_nofollow=True)
        link("/meta/nofollow.html", add("/meta/nofollow.html", meta_nofollow, "meta_nofollow"))
        canonical_to = add("/meta/canonical-target.html", leaf(), "canonical_target")
        head = f'<meta charset="utf-8">\n<link rel="canonical" href="{canonical_to}">\n'
        link(
            "/meta/canonical.html",
            add("/meta/canonical.html", replace(leaf(), head=head), "canonical"),
        )
        add("/meta/noindex-child.html", leaf(), "noindex_child")
        head = '<meta charset="utf-8">\n<meta name="robots" content="noindex">\n'
        noindex = replace(leaf("/meta/noindex-child.html"), head=head)
        link("/meta/noindex.html", add("/meta/noindex.html", noindex, "noindex"))

        # <base href> on another host: relative links resolve there, not next to the page.
        spelt = ("b1.html", "./b2.html", "../basedir/b3.html", "/basedir/b4.html")
        base_links = []
        for k, href in enumerate(spelt, 1):
            t = f"/basedir/b{k}.html"
            base_links.append(_Link(href, self._add(other, t, self._leaf(other))))
        base_links.append(_Link(base_a + "/", base_a + "/"))
        head = f'<meta charset="utf-8">\n<base href="{base_b}/basedir/">\n'
        based = _Resource(head=head, links=tuple(base_links), text_at=7)
        link("/base/index.html", add("/base/index.html", based, "base"))

        # Transfer encodings: gzip body, and a charset parameter on the Content-Type.
        add("/enc/gzip-child.html", leaf(), "gzip_child")
        link(
            "/enc/gzip.html",
            add("/enc/gzip.html", replace(leaf("/enc/gzip-child.html"), gzip=True), "gzip"),
        )
        add("/enc/latin1-child.html", leaf(), "latin1_child")
        latin1 = replace(
            leaf("/enc/latin1-child.html"),
            head="",
            title="Caf\u00e9 cr\u00e8me (ISO-8859-1)",
            content_type="text/html; charset=iso-8859-1",
            encoding="iso-8859-1",
        )
        link("/enc/latin1.html", add("/enc/latin1.html", latin1, "latin1"))
        link("/enc/caf%c3%a9.html", add("/enc/caf%C3%A9.html", leaf(), "percent_utf8"))
        link("/enc/%7euser.html", add("/enc/~user.html", leaf(), "percent_tilde"))

        if self.config.large_page_bytes > 0:
            add("/big/after-large.html", leaf(), "large_child")
            large = replace(leaf("/big/after-large.html"), pad_to=self.config.large_page_bytes)
            link("/big/large.html", add("/big/large.html", large, "large"))

        # Query spellings that canonicalise to the same URL (parameters sorted by name).
        page1, page2 = base_a + "/search?page=1&q=p2p", base_a + "/search?page=2&q=p2p"
        add("/search?page=1&q=p2p", _Resource(links=(_Link("?q=p2p&page=2", page2),)), "query")
        add("/search?page=2&q=p2p", _Resource(links=(_Link("/search?page=1&q=p2p#top", page1),)))
        link("/search?q=p2p&page=1", page1)
        link("/search?page=2&q=p2p#results", page2)

        # Tricky spellings, each of a page linked from nowhere else.
        upper = add("/tricky/upper.html", leaf(), "upper")
        link(upper.replace("http://", "HTTP://"), upper)
        link("/tricky/./x/../dots.html", add("/tricky/dots.html", leaf(), "dots"))
        link(" \n /tricky/ws.html \t", add("/tricky/ws.html", leaf(), "whitespace"))
        link("/tricky/pct%2dx.html", add("/tricky/pct-x.html", leaf(), "percent_unreserved"))
        dup = add("/tricky/dup-target.html", leaf(), "dup_target")
        dup_links = (
            _Link("/tricky/dup-target.html", dup),
            _Link("/tricky/dup-target.html#a", dup),
            _Link(dup + "#b", dup),
            _Link("dup-target.html", dup),
            _Link("/search?page=1&q=p2p", page1),
        )
        link("tricky/dupes.html", add("/tricky/dupes.html", _Resource(links=dup_links), "dupes"))
        rel_links = (
            _Link("./a.html", add("/tricky/dir/a.html", leaf())),
            _Link("../deep/b.html", add("/tricky/deep/b.html", leaf())),
            _Link("sub/c.html", add("/tricky/dir/sub/c.html", leaf())),
            _Link("../../", base_a + "/"),
        )
        link(
            "./tricky/dir/rel.html",
            add("/tricky/dir/rel.html", _Resource(links=rel_links), "relative"),
        )

        # Never fetched: out of scope, not HTTP, or only linked with rel=nofollow.
        link("http://example.invalid/page.html", "http://example.invalid/page.html")
        link(f"http://{_OUT_OF_SCOPE_IP}:{self.port}/", f"http://{_OUT_OF_SCOPE_IP}:{self.port}/")
        links.append(_Link("mailto:webmaster@example.invalid", None))
        links.append(_Link("javascript:void(0)", None))
        link("", self.hub_url)
        link("#top", self.hub_url)
        link("/nofollow/hub.html", base_a + "/nofollow/hub.html", nofollow=True)
        return tuple(links)

    # -- planning -------------------------------------------------------------------------

    def _split(self, url: str) -> tuple[int, str]:
        authority, _, rest = url[7:].partition("/")
        return self._authority_index[authority], "/" + rest

    def _resource(self, index: int, target: str) -> _Resource | None:
        page = self._page_index.get(target)
        if page is not None:
            return self._plan(index, page)
        special = self._special.get((index, target))
        if special is not None:
            return special
        if self.config.features and target.startswith("/nofollow/"):
            return self._leaf(index)
        return None

    def _link_count(self, rng: random.Random) -> int:
        if self.config.mean_links <= 0:
            return 0
        return min(self._cap, max(1, round(rng.lognormvariate(self._mu, LINK_SIGMA))))

    def _plan(self, index: int, page: int) -> _Resource:
        """A regular page: a tree link to each child, then random links, then extras."""
        cfg = self.config
        rng = random.Random(f"{cfg.seed}:{index}:{page}")
        count = self._link_count(rng)
        pages, hosts = cfg.pages_per_host, cfg.hosts
        # Children 2j+1 and 2j+2 make every page reachable within log2(pages) hops,
        # far below any crawler's max depth, whatever the random links do.
        children = [(index, c) for c in (2 * page + 1, 2 * page + 2) if c < pages]
        draw = rng.random  # int(draw() * n) rather than randrange: 10x cheaper per link
        targets: list[tuple[int, int]] = []
        for _ in range(count - len(children)):
            if hosts > 1 and draw() < cfg.cross_host_ratio:
                other = int(draw() * (hosts - 1))
                targets.append((other + (other >= index), int(draw() * pages)))
            else:
                targets.append((index, int(draw() * pages)))
        targets[len(targets) // 2 : len(targets) // 2] = children
        src = self._page_paths[page]
        spell = self._spell if cfg.features else self._spell_plain
        links = [spell(rng, index, src, host, self._page_paths[p]) for host, p in targets]
        if page == 0:
            if index == 0:
                links[:0] = self._hub_extras
            base = self._bases[index]
            links.extend(_Link(t, base + t) for t in self._root_extras)
        if cfg.features:
            self._sprinkle(index, page, links)
        return _Resource(
            title=f"{self.hosts[index]} page {page}",
            links=tuple(links),
            text_at=int(draw() * len(self._para_starts)),
        )

    def _sprinkle(self, index: int, page: int, links: list[_Link]) -> None:
        """Robots-disallowed, broken, nofollow and non-HTTP links on some regular pages."""
        base = self._bases[index]
        if page % 10 == 3:
            t = f"/private/{page % 2}.html"
            links.append(_Link(t, base + t))
        if page % 15 == 7:
            t = f"/missing/{page}.html"
            links.append(_Link(t, base + t))
        if page % 12 == 5:
            t = f"/nofollow/{page}.html"
            links.append(_Link(t, base + t, nofollow=True))
            links.append(_Link("/", base + "/", nofollow=True))
        if page % 9 == 4:
            own = base + self._page_paths[page]
            links.append(_Link("mailto:info@example.invalid", None))
            links.append(_Link("javascript:history.back()", None))
            links.append(_Link("", own))
            links.append(_Link("#top", own))

    def _spell_plain(
        self, rng: random.Random, src: int, src_path: str, dst: int, path: str
    ) -> _Link:
        url = self._bases[dst] + path
        return _Link(path if dst == src and rng.random() < 0.5 else url, url)

    def _spell(self, rng: random.Random, src: int, src_path: str, dst: int, path: str) -> _Link:
        """One of the spellings a real page uses for ``path`` on host ``dst``."""
        url = self._bases[dst] + path
        same = dst == src
        local = path if same else url
        r = rng.random()
        if r < 0.30:
            href = url
        elif r < 0.60:
            href = local
        elif r < 0.75:
            if same and path != "/":
                href = posixpath.relpath(path, posixpath.dirname(src_path))
                if r < 0.70 and not href.startswith("."):
                    href = "./" + href
            else:
                href = local
        elif r < 0.82:
            href = f"{local}#sec{int(r * 1000) % 7}"
        elif r < 0.87:
            head, _, tail = local.rpartition("/")
            href = f"{head}/./x/../{tail}"
        elif r < 0.91:
            href = "HTTP://" + url[7:]
        elif r < 0.96:
            href = f"  {local}\n"
        else:
            head, _, tail = local.rpartition("/")
            href = f"{head}/{tail.replace('p', '%70', 1)}"
        return _Link(href, url)

    # -- rendering ------------------------------------------------------------------------

    def _robots_answer(self, index: int) -> _Answer:
        text = self.robots_txt(index)
        if text is None:
            return 404, (("Content-Type", _HTML),), _NOT_FOUND
        return 200, (("Content-Type", "text/plain"),), text.encode()

    def _render(self, index: int, target: str) -> _Answer:
        resource = self._resource(index, target)
        if resource is None:
            return 404, (("Content-Type", _HTML),), _NOT_FOUND
        if resource.status == 500:
            return 500, (("Content-Type", _HTML),), _SERVER_ERROR
        if resource.location:
            moved = (
                f"<!DOCTYPE html>\n<html><body><p>Moved to {resource.location}</p></body></html>\n"
            )
            headers = (("Content-Type", _HTML), ("Location", resource.location))
            return resource.status, headers, moved.encode()
        if not resource.is_html:
            return resource.status, (("Content-Type", resource.content_type),), resource.body
        body = self._html(index, target, resource).encode(resource.encoding)
        if resource.gzip:
            return (
                200,
                (("Content-Type", _HTML), ("Content-Encoding", "gzip")),
                gzip.compress(body, mtime=0),
            )
        return 200, (("Content-Type", resource.content_type),), body

    def _html(self, index: int, target: str, resource: _Resource) -> str:
        title = resource.title or f"{self.hosts[index]}{target}"
        parts = [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n',
            resource.head,
            f"<title>{title}</title>\n</head>\n<body>\n<h1>{title}</h1>\n",
            self._paragraphs(resource.text_at, 2),
            '<ul class="links">\n',
        ]
        for k, link in enumerate(resource.links):
            rel = ' rel="nofollow"' if link.nofollow else ""
            href = link.href.replace("&", "&amp;")  # as real HTML escapes it in attributes
            parts.append(f'<li><a href="{href}"{rel}>link {k}</a></li>\n')
        parts.append("</ul>\n")
        tail = "</body>\n</html>\n"
        pad_to = self.config.page_bytes if resource.pad_to < 0 else resource.pad_to
        size = sum(map(len, parts)) + len(tail)
        if pad_to > size:
            parts.append(self._padding(resource.text_at + 2, pad_to - size))
        parts.append(tail)
        return "".join(parts)

    def _paragraphs(self, at: int, count: int) -> str:
        starts = self._para_starts
        first = at % len(starts)
        start = starts[first]
        stop = starts[first + count] if first + count < len(starts) else len(self._text)
        return self._text[start:stop]

    def _padding(self, at: int, size: int) -> str:
        """Exactly ``size`` bytes of whole paragraphs, then one cut to fit."""
        text, starts = self._text, self._para_starts
        repeats, size = divmod(size, len(text))
        start = starts[at % len(starts)]
        chunk = self._text2[start : start + size]
        end = chunk.rfind("</p>\n") + 5 if "</p>\n" in chunk else 0
        rest = size - end
        if rest >= 8:
            fill = f"<p>{(self._prose * (rest // len(self._prose) + 1))[: rest - 8]}</p>\n"
        else:
            fill = " " * rest
        whole = (text[start:] + text[:start]) * repeats if repeats else ""
        return whole + chunk[:end] + fill

    # -- server ---------------------------------------------------------------------------

    async def _handle(self, index: int, request: web.BaseRequest) -> web.StreamResponse:
        target = canonical_target(request.raw_path)
        if target == "/robots.txt":
            self.robots_counts[self.hosts[index]] += 1
            status, headers, body = self._robots_answer(index)
        else:
            self.request_counts[self._bases[index] + target] += 1
            status, headers, body = self._answer(index, target)
        if index == self._slow_index:
            await asyncio.sleep(self.config.slow_host_delay)
        return web.Response(status=status, body=body, headers=headers)
