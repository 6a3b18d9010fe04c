"""The test web's one-off pages: each a case a crawler must get right.

Redirect chains and loops, errors and non-HTML bodies, meta robots and rel=canonical,
``<base href>`` on another host, gzip and Latin-1 bodies, percent-encodings, query
spellings, tricky relative links, and links never to follow. Each is planned as its
canonical URL first, so the ground truth never depends on a URL canonicaliser.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING

from p2pcrawl.testing.content import PDF, PNG
from p2pcrawl.testing.pages import Link, Resource

if TYPE_CHECKING:
    from p2pcrawl.testing.plan import SitePlan

__all__ = ["OUT_OF_SCOPE_IP", "build_features"]

OUT_OF_SCOPE_IP = "127.0.0.250"  # the loopback host the pages link to, outside the web


def build_features(plan: SitePlan) -> tuple[Link, ...]:
    """Add the one-off pages to ``plan``; returns the hub's links to them."""
    a, other = 0, 1 % plan.config.hosts
    base_a, base_b = plan.bases[a], plan.bases[other]
    add = functools.partial(plan.add, a)
    leaf = functools.partial(plan.leaf, a)
    links: list[Link] = []

    def link(href: str, target: str, nofollow: bool = False) -> None:
        links.append(Link(href, target, nofollow))

    # Redirects: each source is fetched, each Location is a newly discovered URL.
    end = add("/redirect/chain-end.html", leaf(), "redirect_chain_end")
    two = add("/redirect/chain-2", plan.redirect(302, "/redirect/chain-end.html", end))
    link(
        "/redirect/chain-1",
        add("/redirect/chain-1", plan.redirect(301, two, two), "redirect_chain"),
    )
    loop_b = base_a + "/redirect/loop-b"
    loop_a = add("/redirect/loop-a", plan.redirect(301, "loop-b", loop_b), "redirect_loop")
    add("/redirect/loop-b", plan.redirect(302, loop_a, loop_a))
    link("/redirect/loop-a", loop_a)
    landed = plan.add(other, "/redirect/landed.html", plan.leaf(other), "redirect_landed")
    link(
        "/redirect/cross",
        add("/redirect/cross", plan.redirect(301, landed, landed), "redirect_cross"),
    )
    away = "http://example.invalid/away"
    link(
        "/redirect/away",
        add("/redirect/away", plan.redirect(302, away, away), "redirect_away"),
    )

    # Errors and non-HTML: fetched, never parsed.
    link("/error/500.html", add("/error/500.html", Resource(status=500), "error_500"))
    plan.feature_urls["missing"] = base_a + "/missing/hub.html"
    link("/missing/hub.html", base_a + "/missing/hub.html")
    pdf = Resource(content_type="application/pdf", body=PDF)
    link("/files/report.pdf", add("/files/report.pdf", pdf, "pdf"))
    link(
        "img/logo.png",
        add("/img/logo.png", Resource(content_type="image/png", body=PNG), "png"),
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
        add(
            "/meta/canonical.html",
            replace(leaf(), head=head, canonical_target=canonical_to),
            "canonical",
        ),
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
        base_links.append(Link(href, plan.add(other, t, plan.leaf(other))))
    base_links.append(Link(base_a + "/", base_a + "/"))
    head = f'<meta charset="utf-8">\n<base href="{base_b}/basedir/">\n'
    based = Resource(head=head, links=tuple(base_links), text_at=7)
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

    if plan.config.large_page_bytes > 0:
        add("/big/after-large.html", leaf(), "large_child")
        large = replace(leaf("/big/after-large.html"), pad_to=plan.config.large_page_bytes)
        link("/big/large.html", add("/big/large.html", large, "large"))

    # Query spellings that canonicalise to the same URL (parameters sorted by name).
    page1, page2 = base_a + "/search?page=1&q=p2p", base_a + "/search?page=2&q=p2p"
    add("/search?page=1&q=p2p", Resource(links=(Link("?q=p2p&page=2", page2),)), "query")
    add("/search?page=2&q=p2p", Resource(links=(Link("/search?page=1&q=p2p#top", page1),)))
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
        Link("/tricky/dup-target.html", dup),
        Link("/tricky/dup-target.html#a", dup),
        Link(dup + "#b", dup),
        Link("dup-target.html", dup),
        Link("/search?page=1&q=p2p", page1),
    )
    link("tricky/dupes.html", add("/tricky/dupes.html", Resource(links=dup_links), "dupes"))
    rel_links = (
        Link("./a.html", add("/tricky/dir/a.html", leaf())),
        Link("../deep/b.html", add("/tricky/deep/b.html", leaf())),
        Link("sub/c.html", add("/tricky/dir/sub/c.html", leaf())),
        Link("../../", base_a + "/"),
    )
    link(
        "./tricky/dir/rel.html",
        add("/tricky/dir/rel.html", Resource(links=rel_links), "relative"),
    )

    # Never fetched: out of scope, not HTTP, or only linked with rel=nofollow.
    link("http://example.invalid/page.html", "http://example.invalid/page.html")
    link(f"http://{OUT_OF_SCOPE_IP}:{plan.port}/", f"http://{OUT_OF_SCOPE_IP}:{plan.port}/")
    links.append(Link("mailto:webmaster@example.invalid", None))
    links.append(Link("javascript:void(0)", None))
    link("", plan.hub_url)
    link("#top", plan.hub_url)
    link("/nofollow/hub.html", base_a + "/nofollow/hub.html", nofollow=True)
    return tuple(links)
