"""The plan of the generated test web, and its ground truth: pure, no I/O.

Tests, benchmarks and ``p2pcrawl demo`` crawl the web (:class:`p2pcrawl.testing.TestWeb`
serves this plan) and compare what the crawler fetched with :meth:`SitePlan.ground_truth`.

The web is a pure function of :class:`TestWebConfig`. Pages are *planned* from
``random.Random(f"{seed}:{host}:{page}")`` (never the global generator) and rendered on
request, so a benchmark can serve the web from another process (``python -m
p2pcrawl.testing.serve``) and still compute the ground truth locally from the same config.

Every link is planned as its canonical URL first and only then spelt (relative, with dot
segments, a fragment, ``HTTP://``...), so the ground truth never depends on a URL
canonicaliser.

Ground truth (what a correct crawl from ``hub_url`` at the default settings requests,
``/robots.txt`` and sitemaps aside):

- URLs in canonical form: ``http://127.0.0.N:PORT/path?query``, lowercase scheme, dot
  segments resolved (RFC 3986 §5.2.4), no fragment, query parameters sorted by name then
  value, unreserved percent-escapes decoded and the others upper-cased.
- Breadth-first from the hub along every ``<a href>`` (after ``<base href>``, stripped of
  surrounding whitespace, ``&amp;`` decoded), ``rel="nofollow"`` ones included (the default;
  ``rel_nofollow=False`` for ``--drop-rel-nofollow``), and every ``<link rel="canonical">``,
  limited to the test hosts (``allow_domains``).
- Not followed: every link of a ``<meta name="robots" content="nofollow">`` page, non-HTTP
  links, and links inside non-HTML bodies or 3xx/4xx/5xx bodies. ``noindex`` pages are
  followed.
- Every fetched URL counts, whatever it answers: 200 pages and PDF/PNG, 404, 500, and each
  301/302 source; a ``Location`` (resolved against the request URL) is a new discovery.
- robots.txt (RFC 9309): ``Disallow: /private/`` everywhere except :attr:`no_robots_host`,
  whose robots.txt answers 404, which allows all, so its ``/private/`` pages are fetched.
- With ``signals`` (:mod:`p2pcrawl.testing.signals`): every page's requisites (stylesheets,
  what they reference, scripts, images; some on the CDN host, which is outside the scope),
  what the sitemaps of a host list for it once the crawl reaches it, and the pages the robots
  directives let a crawl follow.
"""

from __future__ import annotations

import collections
import functools
import posixpath
import random
from dataclasses import dataclass, replace

from p2pcrawl.testing.canonical import canonical_target
from p2pcrawl.testing.content import LINK_CAP, LINK_SIGMA, lognormal_mu
from p2pcrawl.testing.features import build_features
from p2pcrawl.testing.hostile import HostileConfig
from p2pcrawl.testing.pages import Answer, Link, Renderer, Resource
from p2pcrawl.testing.signals import CDN_IP, build_signals, page_requisites, robots_lines

__all__ = ["SitePlan", "TestWebConfig", "is_sitemap_target"]


def is_sitemap_target(target: str) -> bool:
    """A request target a crawler fetches as a sitemap: ``/sitemap.xml`` (which it tries on
    every host whose robots.txt names none) and what ``/sitemaps/`` holds."""
    return target == "/sitemap.xml" or target.startswith("/sitemaps/")


_RENDER_CACHE = 512  # rendered answers kept; a crawl fetches each page once, so keep it small
_ROBOTS_CRAWL_DELAY = 0.05


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
    # Site signals (p2pcrawl.testing.signals): page requisites on every page and a CDN host,
    # sitemaps, robots headers and meta tags, a canonical Link header.
    signals: bool = False

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.pages_per_host < 1:
            raise ValueError("hosts and pages_per_host must be >= 1")
        # 127.0.0.250 is the out-of-scope loopback host the pages link to.
        if self.first_ip < 1 or self.first_ip + self.hosts > 250:
            raise ValueError("hosts must fit in 127.0.0.1 .. 127.0.0.249")
        hostile_ip = (self.hostile_config or HostileConfig()).first_ip
        if self.signals and self.hosts < 2:
            raise ValueError("signals need at least 2 hosts")
        if self.hostile and self.first_ip + self.hosts > hostile_ip:
            raise ValueError(f"with hostile hosts, hosts must end below 127.0.0.{hostile_ip}")


class SitePlan:
    """The generated web as a pure function of its config and port: every page's links,
    the ground truth, and each URL's answer, without any I/O."""

    def __init__(self, config: TestWebConfig) -> None:
        self.config = config
        self.port = 0
        self.hub_url = ""
        self.hosts: list[str] = []
        self.allow_domains: list[str] = [
            f"127.0.0.{config.first_ip + i}" for i in range(config.hosts)
        ]
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
        self._pages = Renderer(config.seed, config.page_bytes)
        self.bases: list[str] = []
        self._authority_index: dict[str, int] = {}  # the web's own hosts (in scope)
        self._index_of: dict[str, int] = {}  # those and the CDN host
        self.cdn_index = n  # the CDN host's index (signals only)
        self.cdn_base = ""
        # Host index -> the page URLs its sitemaps list for it (signals only).
        self.sitemap_pages: dict[int, list[str]] = {}
        self._special: dict[tuple[int, str], Resource] = {}
        self._hub_extras: tuple[Link, ...] = ()
        self._root_extras: tuple[str, ...] = ()
        self._answer = functools.lru_cache(maxsize=_RENDER_CACHE)(self._render)

    def _extra_roots(self) -> tuple[Link, ...]:
        """Links the hub carries beyond the web's own hosts (none here)."""
        return ()

    # -- ground truth ---------------------------------------------------------------------

    def ground_truth(self, *, rel_nofollow: bool = True) -> set[str]:
        """Canonical URLs a correct breadth-first crawl from :attr:`hub_url` requests."""
        return set(self.expected_status(rel_nofollow=rel_nofollow))

    def expected_status(self, *, rel_nofollow: bool = True) -> dict[str, int]:
        """Status each ground-truth URL answers (200, 301, 302, 404 or 500); with
        ``rel_nofollow`` False, as a crawl with ``--drop-rel-nofollow`` would find it."""
        self._require_port()
        seen = {self.hub_url}
        queue = collections.deque([self.hub_url])
        status: dict[str, int] = {}
        reached: set[int] = set()
        while queue:
            url = queue.popleft()
            index, target = self._split(url)
            if index not in reached:
                # The host's robots.txt is read before its first page: its sitemaps too.
                reached.add(index)
                for new in self.sitemap_pages.get(index, ()):
                    if new not in seen and self._crawlable(new):
                        seen.add(new)
                        queue.append(new)
            resource = self._resource(index, target)
            if resource is None:
                status[url] = 404
                continue
            status[url] = resource.status
            if resource.location_target:
                found = [resource.location_target]
            elif resource.is_html and not resource.meta_nofollow:
                found = [
                    link.target
                    for link in resource.links
                    if link.target and (rel_nofollow or not link.nofollow)
                ]
            else:
                found = []
            if resource.is_html and resource.canonical_target:
                found.append(resource.canonical_target)
            if resource.status == 200:
                for need in resource.requisites:
                    if need not in seen and self._requisite_ok(need):
                        seen.add(need)
                        queue.append(need)
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

    def _requisite_ok(self, url: str) -> bool:
        """A page requisite is fetched from any host (``--requisites any``), robots.txt
        permitting: the CDN's allows all."""
        authority = url[7:].partition("/")[0]
        return self._index_of.get(authority) == self.cdn_index or self._crawlable(url)

    def _robots_blocks_private(self, index: int) -> bool:
        return self.config.features and index != self._no_robots_index

    def robots_txt(self, index: int) -> str | None:
        """Host ``index``'s robots.txt; None means it answers 404 (RFC 9309 §2.3.1.3: allow all)."""
        sitemaps = robots_lines(self, index) if self.config.signals else ""
        if not self.config.features or index == self.cdn_index:
            return "User-agent: *\nDisallow:\n" + sitemaps
        if index == self._no_robots_index:
            return None
        text = "User-agent: *\nDisallow: /private/\n" + sitemaps
        if index == self._crawl_delay_index:
            text += f"Crawl-delay: {_ROBOTS_CRAWL_DELAY}\n"
        return text

    def render(self, url: str) -> tuple[int, dict[str, str], bytes]:
        """What the server answers for ``url`` (any spelling), without any I/O."""
        self._require_port()
        authority, _, rest = url.partition("://")[2].partition("/")
        index = self._index_of[authority]
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
        self.bases = [f"http://{h}" for h in self.hosts]
        self._authority_index = {h: i for i, h in enumerate(self.hosts)}
        self._index_of = dict(self._authority_index)
        self.hub_url = self.bases[0] + "/"
        self._answer.cache_clear()
        self.sitemap_pages.clear()
        roots = tuple(Link(b + "/", b + "/") for b in self.bases) + self._extra_roots()
        if self.config.signals:
            self.cdn_base = f"http://{CDN_IP}:{port}"
            self._index_of[self.cdn_base[7:]] = self.cdn_index
            roots += build_signals(self)
        if not self.config.features:
            self._hub_extras = roots
            return
        self.slow_host = self.hosts[self._slow_index] if self._slow_index >= 0 else None
        self.crawl_delay_host = self.hosts[self._crawl_delay_index]
        if self._no_robots_index >= 0:
            self.no_robots_host = self.hosts[self._no_robots_index]
        self._hub_extras = roots + build_features(self)
        self._root_extras = ("/private/0.html",)
        for i in range(self.config.hosts):
            self.add(i, "/private/0.html", self.leaf(i, "/private/1.html", "/"))
            self.add(i, "/private/1.html", self.leaf(i, "/"))

    def base_of(self, index: int) -> str:
        return self.cdn_base if index == self.cdn_index else self.bases[index]

    def add(self, index: int, target: str, resource: Resource, name: str = "") -> str:
        url = self.base_of(index) + target
        self._special[(index, target)] = resource
        if name:
            self.feature_urls[name] = url
        return url

    def leaf(self, index: int, *targets: str) -> Resource:
        base = self.bases[index]
        links = tuple(Link(t, base + t) for t in targets or ("/",))
        return Resource(links=links, text_at=len(self._special))

    def redirect(self, status: int, location: str, target: str) -> Resource:
        return Resource(status=status, location=location, location_target=target)

    # -- planning -------------------------------------------------------------------------

    def _split(self, url: str) -> tuple[int, str]:
        authority, _, rest = url[7:].partition("/")
        return self._index_of[authority], "/" + rest

    def _resource(self, index: int, target: str) -> Resource | None:
        page = self._page_index.get(target)
        if page is not None:
            return self._plan(index, page)
        special = self._special.get((index, target))
        if special is not None:
            return special
        if self.config.features and target.startswith("/nofollow/"):
            return self.leaf(index)
        return None

    def _link_count(self, rng: random.Random) -> int:
        if self.config.mean_links <= 0:
            return 0
        return min(self._cap, max(1, round(rng.lognormvariate(self._mu, LINK_SIGMA))))

    def _plan(self, index: int, page: int) -> Resource:
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
            base = self.bases[index]
            links.extend(Link(t, base + t) for t in self._root_extras)
        if cfg.features:
            self._sprinkle(index, page, links)
        resource = Resource(
            title=f"{self.hosts[index]} page {page}",
            links=tuple(links),
            text_at=int(draw() * self._pages.paragraphs),
        )
        if cfg.signals:
            head, body, needs = page_requisites(self, index)
            resource = replace(resource, head=resource.head + head, body_top=body, requisites=needs)
        return resource

    def _sprinkle(self, index: int, page: int, links: list[Link]) -> None:
        """Robots-disallowed, broken, nofollow and non-HTTP links on some regular pages."""
        base = self.bases[index]
        if page % 10 == 3:
            t = f"/private/{page % 2}.html"
            links.append(Link(t, base + t))
        if page % 15 == 7:
            t = f"/missing/{page}.html"
            links.append(Link(t, base + t))
        if page % 12 == 5:
            t = f"/nofollow/{page}.html"
            links.append(Link(t, base + t, nofollow=True))
            links.append(Link("/", base + "/", nofollow=True))
        if page % 9 == 4:
            own = base + self._page_paths[page]
            links.append(Link("mailto:info@example.invalid", None))
            links.append(Link("javascript:history.back()", None))
            links.append(Link("", own))
            links.append(Link("#top", own))

    def _spell_plain(
        self, rng: random.Random, src: int, src_path: str, dst: int, path: str
    ) -> Link:
        url = self.bases[dst] + path
        return Link(path if dst == src and rng.random() < 0.5 else url, url)

    def _spell(self, rng: random.Random, src: int, src_path: str, dst: int, path: str) -> Link:
        """One of the spellings a real page uses for ``path`` on host ``dst``."""
        url = self.bases[dst] + path
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
        return Link(href, url)

    # -- rendering ------------------------------------------------------------------------

    def _robots_answer(self, index: int) -> Answer:
        return self._pages.robots(self.robots_txt(index))

    def _render(self, index: int, target: str) -> Answer:
        host = self.cdn_base[7:] if index == self.cdn_index else self.hosts[index]
        return self._pages.answer(self._resource(index, target), f"{host}{target}")
