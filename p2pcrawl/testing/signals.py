"""The test web's site signals (``TestWebConfig(signals=True)``): what sites say about
themselves, and what their pages need to render.

- Page requisites: every regular page of every host carries a stylesheet (which ``@import``s
  a second one, and names a font and background images, one on the CDN), a script, an image
  with a ``srcset``, and a script and an image on a CDN host outside the crawl's scope
  (:data:`CDN_IP`). The ground truth counts each once.
- Sitemaps: host 0's robots.txt names a sitemap index (a plain and a gzip sitemap), a text
  sitemap, and a sitemap on host 1 vouched for by host 0's robots.txt; host 1's robots.txt
  names none, and its ``/sitemap.xml`` exists. Pages listed only there are in the ground
  truth; the one a sitemap lists for another host is not (sitemaps.org's cross-host rule).
- Robots directives: ``X-Robots-Tag: nofollow``, ``X-Robots-Tag: otherbot: nofollow``,
  ``<meta name="p2pcrawl" content="nofollow">``, ``<meta name="otherbot" content="nofollow">``,
  ``noarchive`` and ``noindex``; a canonical URL named by a ``Link`` header; links marked
  ``rel="ugc"`` and ``rel="sponsored"`` (followed by default, like ``rel="nofollow"``).
"""

from __future__ import annotations

import functools
import gzip
from dataclasses import replace
from typing import TYPE_CHECKING

from p2pcrawl.testing.content import PNG
from p2pcrawl.testing.pages import Link, Resource

if TYPE_CHECKING:
    from p2pcrawl.testing.plan import SitePlan

__all__ = ["CDN_IP", "SITEMAP_LASTMOD", "build_signals", "page_requisites", "robots_lines"]

CDN_IP = "127.0.0.251"  # stands in for a CDN: outside every crawl's --allow-domain
SITEMAP_LASTMOD = "2024-05-17T10:00:00+00:00"
_WOFF2 = b"wOF2\x00\x01\x00\x00" + bytes(64)
_JS = b"document.documentElement.className += ' js';\n"


def _xml(tag: str, item: str, locs: list[str], lastmod: str = "") -> bytes:
    when = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
    entries = "".join(f"<{item}><loc>{loc}</loc>{when}</{item}>\n" for loc in locs)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<{tag} xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n{entries}</{tag}>\n'
    ).encode()


def urlset(locs: list[str], lastmod: str = "") -> bytes:
    return _xml("urlset", "url", locs, lastmod)


def sitemap_index(locs: list[str]) -> bytes:
    return _xml("sitemapindex", "sitemap", locs)


def robots_lines(plan: SitePlan, index: int) -> str:
    """The ``Sitemap:`` lines of host ``index``'s robots.txt."""
    if index != 0:
        return ""
    b0, b1 = plan.bases[0], plan.bases[1 % len(plan.bases)]
    return (
        f"Sitemap: {b0}/sitemaps/index.xml\nSitemap: {b0}/sitemaps/urls.txt\n"
        f"Sitemap: {b1}/sitemaps/for-h0.xml\n"
    )


def page_requisites(plan: SitePlan, index: int) -> tuple[str, str, tuple[str, ...]]:
    """(head markup, body markup, requisite URLs) of host ``index``'s regular pages."""
    base, cdn = plan.bases[index], plan.cdn_base
    head = (
        '<link rel="stylesheet" href="/static/site.css">\n'
        '<script src="/static/site.js"></script>\n'
        f'<script src="{cdn}/cdn/lib.js"></script>\n'
    )
    body = (
        '<img src="/static/logo.png" srcset="/static/logo-2x.png 2x" alt="logo">\n'
        f'<img src="{cdn}/cdn/img-{index}.png" alt="">\n'
    )
    needs = (
        base + "/static/site.css",
        base + "/static/site.js",
        cdn + "/cdn/lib.js",
        base + "/static/logo.png",
        base + "/static/logo-2x.png",
        f"{cdn}/cdn/img-{index}.png",
    )
    return head, body, needs


def build_signals(plan: SitePlan) -> tuple[Link, ...]:
    """Add the signal pages and static files to ``plan``; returns the hub's links to them."""
    n = len(plan.bases)
    cdn = plan.cdn_index
    png = Resource(content_type="image/png", body=PNG)
    for i in range(n):
        base = plan.bases[i]
        print_css = Resource(
            content_type="text/css",
            body=b"@media print { body { background: url('print-bg.png') } }\n",
            requisites=(base + "/static/print-bg.png",),
        )
        site_css = Resource(
            content_type="text/css",
            body=(
                '@import "print.css";\n/* url(/static/commented-out.png) */\n'
                "body { background: url(/static/bg.png) }\n"
                '@font-face { font-family: x; src: url("fonts/f.woff2") format("woff2") }\n'
                f"h1 {{ background-image: url({plan.cdn_base}/cdn/bg-{i}.png) }}\n"
            ).encode(),
            requisites=(
                base + "/static/print.css",
                base + "/static/bg.png",
                base + "/static/fonts/f.woff2",
                f"{plan.cdn_base}/cdn/bg-{i}.png",
            ),
        )
        plan.add(i, "/static/site.css", site_css)
        plan.add(i, "/static/print.css", print_css)
        plan.add(i, "/static/site.js", Resource(content_type="application/javascript", body=_JS))
        plan.add(i, "/static/fonts/f.woff2", Resource(content_type="font/woff2", body=_WOFF2))
        for name in ("logo.png", "logo-2x.png", "bg.png", "print-bg.png"):
            plan.add(i, "/static/" + name, png)
        plan.add(cdn, f"/cdn/img-{i}.png", png)
        plan.add(cdn, f"/cdn/bg-{i}.png", png)
    plan.add(cdn, "/cdn/lib.js", Resource(content_type="application/javascript", body=_JS))
    return _sitemaps(plan) + _directives(plan)


def _sitemaps(plan: SitePlan) -> tuple[Link, ...]:
    b0, b1 = plan.bases[0], plan.bases[1 % len(plan.bases)]
    one = 1 % len(plan.bases)
    for t in ("plain-1", "plain-2", "gz-1", "gz-2", "text-1", "vouched"):
        plan.add(0, f"/from-sitemap/{t}.html", plan.leaf(0), f"sitemap_{t}")
    plan.add(one, "/from-sitemap/guessed.html", plan.leaf(one), "sitemap_guessed")
    plan.add(one, "/from-sitemap/cross.html", plan.leaf(one), "sitemap_cross_host")
    xml = Resource(content_type="application/xml")
    plan.add(
        0,
        "/sitemaps/index.xml",
        replace(
            xml, body=sitemap_index([b0 + "/sitemaps/plain.xml", b0 + "/sitemaps/pages.xml.gz"])
        ),
    )
    plain = [b0 + "/from-sitemap/plain-1.html", b0 + "/from-sitemap/plain-2.html", b0 + "/"]
    plain.append(b1 + "/from-sitemap/cross.html")  # another host: dropped
    plan.add(0, "/sitemaps/plain.xml", replace(xml, body=urlset(plain, SITEMAP_LASTMOD)))
    gz = gzip.compress(
        urlset([b0 + "/from-sitemap/gz-1.html", b0 + "/from-sitemap/gz-2.html"]), mtime=0
    )
    plan.add(0, "/sitemaps/pages.xml.gz", Resource(content_type="application/gzip", body=gz))
    text = f"{b0}/from-sitemap/text-1.html\n".encode()
    plan.add(0, "/sitemaps/urls.txt", Resource(content_type="text/plain", body=text))
    plan.sitemap_pages[0] = [
        *plain[:3],
        b0 + "/from-sitemap/gz-1.html",
        b0 + "/from-sitemap/gz-2.html",
        b0 + "/from-sitemap/text-1.html",
        b0 + "/from-sitemap/vouched.html",
    ]
    plan.sitemap_pages[one] = [b1 + "/from-sitemap/guessed.html"]
    vouched = urlset([b0 + "/from-sitemap/vouched.html"])
    plan.add(one, "/sitemaps/for-h0.xml", replace(xml, body=vouched))
    guessed = urlset([b1 + "/from-sitemap/guessed.html"])
    plan.add(one, "/sitemap.xml", replace(xml, body=guessed))
    return ()


def _directives(plan: SitePlan) -> tuple[Link, ...]:
    add = functools.partial(plan.add, 0)
    leaf = functools.partial(plan.leaf, 0)
    links: list[Link] = []

    def page(name: str, resource: Resource) -> None:
        links.append(Link(f"/signals/{name}.html", add(f"/signals/{name}.html", resource, name)))

    def target(name: str) -> str:
        """A leaf page; returns its path."""
        path = f"/signals/{name}.html"
        add(path, leaf(), name)
        return path

    meta = '<meta charset="utf-8">\n<meta name="{}" content="{}">\n'
    for name, header, nofollow in (
        ("header_nofollow", "nofollow", True),
        ("header_otherbot", "otherbot: nofollow", False),
    ):
        t = target(name + "_target")
        page(name, replace(leaf(t), headers=(("X-Robots-Tag", header),), meta_nofollow=nofollow))
    for name, agent, nofollow in (
        ("meta_p2pcrawl", "p2pcrawl", True),
        ("meta_otherbot", "otherbot", False),
    ):
        t = target(name + "_target")
        head = meta.format(agent, "nofollow")
        page(name, replace(leaf(t), head=head, meta_nofollow=nofollow))
    page(
        "noarchive",
        replace(
            leaf(),
            head=meta.format("robots", "noindex"),
            headers=(("X-Robots-Tag", "noarchive"),),
        ),
    )
    canon = plan.bases[0] + target("canonical_by_header")
    page(
        "canonical_header",
        replace(
            leaf(),
            headers=(("Link", '</signals/canonical_by_header.html>; rel="canonical"'),),
            canonical_target=canon,
        ),
    )
    ugc, sponsored = target("ugc_target"), target("sponsored_target")
    b0 = plan.bases[0]
    rel_links = (
        Link(ugc, b0 + ugc, nofollow=True, rel="ugc"),
        Link(sponsored, b0 + sponsored, nofollow=True, rel="sponsored nofollow"),
    )
    page("rel_ugc", replace(leaf(), links=rel_links))
    return tuple(links)
