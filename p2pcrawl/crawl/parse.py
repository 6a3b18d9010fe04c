"""Link extraction: HTML bytes in, the canonical URLs a crawler may follow out.

This runs once per fetched page, so it is written for speed: lexbor builds the tree (the
modest backend is gone from selectolax 1.0), ``tags()`` walks it (cheaper than a CSS
selector, which lexbor compiles and matches per call), each distinct raw href is resolved
once, and the resolver built for the page's base URL takes string fast paths for hrefs that
are already canonical (``p2pcrawl.crawl.urls``). ``benchmarks/parse_links.py`` measures it against
a bare selectolax + urljoin loop.

Robots directives follow the HTML and robots meta conventions (:mod:`~p2pcrawl.crawl.directives`):
``<meta name="robots">`` and ``<meta name="p2pcrawl">`` (our product token) ``nofollow`` (or
``none``) drops every link unless the crawl ignores it, ``noindex`` and ``noarchive`` are
reported. ``rel="nofollow"``, ``"ugc"`` and ``"sponsored"`` drop one link only when
:attr:`PageRules.follow_rel_nofollow` is off: they are hints about endorsement, not about
crawling, and an archive wants what they point to (docs/signals.md). ``<base href>``: the
first one with an href sets the base (HTML §4.2.3); if it does not resolve to an http(s) URL
the page URL stays the base.

Page requisites (:mod:`~p2pcrawl.crawl.requisites`) are taken when the rules ask for them.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

from selectolax.lexbor import LexborHTMLParser

from p2pcrawl.crawl.directives import NONE, Directives, from_meta_content
from p2pcrawl.crawl.requisites import page_requisites
from p2pcrawl.crawl.urls import MAX_URL_LENGTH, LinkResolver, canonicalize

__all__ = ["DEFAULT_RULES", "PageRules", "ParsedPage", "extract_links"]

DEFAULT_MAX_LINKS = 5000

_NOT_ENDORSED = frozenset({"nofollow", "ugc", "sponsored"})
# Labels that mean windows-1252 to a browser (WHATWG Encoding), which Python would read as
# strict latin-1 and turn 0x80-0x9F into control characters.
_WINDOWS_1252 = frozenset({"latin-1", "iso8859-1", "ascii"})
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


@dataclass(slots=True)
class ParsedPage:
    """What a page says about where to go next.

    ``links`` are canonical absolute URLs, deduplicated, in document order, capped at
    ``max_links``; empty when the page is ``nofollow`` and the rules obey that.
    ``canonical`` is the resolved ``<link rel=canonical>`` (never substituted for the page's
    URL). ``hrefs_seen`` counts raw ``<a href>`` elements examined (examination stops at the
    cap); ``rejected`` counts those that did not resolve to a crawlable URL. Dropped
    ``rel=nofollow`` links and the links of an obeyed ``nofollow`` page are neither resolved
    nor counted as rejected. ``requisites``: what the page needs to render, when asked for.
    """

    links: list[str]
    canonical: str | None
    base: str
    nofollow: bool
    noindex: bool
    hrefs_seen: int
    rejected: int
    noarchive: bool = False
    requisites: list[str] = field(default_factory=list)

    @property
    def directives(self) -> Directives:
        return Directives(self.nofollow, self.noindex, self.noarchive)


@dataclass(frozen=True, slots=True)
class PageRules:
    """What a crawl asks of a page besides its links (the crawl's settings, per page)."""

    agent: str = "p2pcrawl"  # our product token: <meta name="p2pcrawl"> speaks to us
    obey_nofollow: bool = True  # a nofollow page's links are dropped
    follow_rel_nofollow: bool = True  # rel=nofollow, ugc, sponsored links are followed
    max_requisites: int = 0  # page requisites taken (0: none)

    def as_tuple(self) -> tuple[str, bool, bool, int]:
        return (self.agent, self.obey_nofollow, self.follow_rel_nofollow, self.max_requisites)


DEFAULT_RULES = PageRules()


def extract_links(
    body: bytes,
    url: str,
    *,
    encoding: str | None = None,
    max_links: int = DEFAULT_MAX_LINKS,
    max_url_length: int = MAX_URL_LENGTH,
    rules: PageRules = DEFAULT_RULES,
) -> ParsedPage:
    """Parse ``body`` fetched from ``url`` (canonical) and return its followable links.

    ``encoding`` is the charset from the HTTP Content-Type, if any; a byte-order mark
    overrides it, and without either the ``<meta charset>`` in the first 1024 bytes decides,
    else UTF-8 (HTML §13.2.3). Undecodable bytes become U+FFFD. Never raises on hostile
    bodies. If ``url`` itself is not a crawlable URL the page yields nothing.
    """
    page_url = canonicalize(url, max_length=max_url_length)
    if page_url is None:
        return ParsedPage([], None, url, False, False, 0, 0)
    tree = _parse(body, encoding)

    base_url = page_url
    for node in tree.tags("base"):
        href = node.attrs.get("href")
        if href is not None:
            resolved = LinkResolver(page_url).resolve(href, max_url_length)
            if resolved is not None:
                base_url = resolved
            break
    base = LinkResolver(base_url)

    said = NONE
    for node in tree.tags("meta"):
        attributes = node.attrs
        name = attributes.get("name")
        if name is None:
            continue
        name = name.strip().lower()
        if name == "robots" or name == rules.agent:
            said |= from_meta_content(attributes.get("content") or "")
    nofollow, noindex, noarchive = said.nofollow, said.noindex, said.noarchive

    canonical = None
    link_elements = list(tree.tags("link"))  # page_requisites reads them too
    for node in link_elements:
        attributes = node.attrs
        rel = attributes.get("rel")
        href = attributes.get("href")
        if rel is not None and href is not None and "canonical" in rel.lower().split():
            canonical = base.resolve(href, max_url_length)
            break
    requisites = (
        page_requisites(tree, base, rules.max_requisites, max_url_length, link_elements)
        if rules.max_requisites > 0
        else []
    )

    links: list[str] = []
    hrefs_seen = rejected = 0
    if max_links <= 0:
        return ParsedPage(
            links, canonical, base_url, nofollow, noindex, 0, 0, noarchive, requisites
        )
    skip_all = nofollow and rules.obey_nofollow
    drop_rel = not rules.follow_rel_nofollow
    # Raw href -> canonical URL or None: nav bars repeat the same hrefs many times a page.
    resolved_hrefs: dict[str, str | None] = {}
    emitted: set[str] = set()
    for node in tree.tags("a"):
        # ``attrs`` reads one attribute from lexbor; ``attributes`` would build a dict of all.
        attributes = node.attrs
        href = attributes.get("href")
        if href is None:
            continue
        hrefs_seen += 1
        if skip_all:
            continue
        if drop_rel:
            rel = attributes.get("rel")
            if rel is not None and not _NOT_ENDORSED.isdisjoint(rel.lower().split()):
                continue
        if href in resolved_hrefs:
            link = resolved_hrefs[href]
        else:
            link = resolved_hrefs[href] = base.resolve(href, max_url_length)
        if link is None:
            rejected += 1
        elif link not in emitted:
            emitted.add(link)
            links.append(link)
            if len(links) >= max_links:
                break
    return ParsedPage(
        links, canonical, base_url, nofollow, noindex, hrefs_seen, rejected, noarchive, requisites
    )


def _parse(body: bytes, encoding: str | None) -> LexborHTMLParser:
    """Build the tree, decoding by BOM, then ``encoding``, then lexbor's meta prescan."""
    if encoding is not None and not body.startswith(_BOMS):
        codec = _codec_name(encoding)
        if codec == "utf-8":
            # The transport's charset outranks <meta charset>, so no prescan; lexbor decodes
            # UTF-8 (with U+FFFD for bad bytes) faster than bytes.decode would.
            return LexborHTMLParser(body)
        if codec is not None:
            text = _decode(body, codec)
            if text is not None:
                return LexborHTMLParser(text)
    # lexbor does the BOM check, the <meta charset> prescan and the UTF-8 default itself,
    # replacing invalid sequences with U+FFFD.
    return LexborHTMLParser(body, encoding=True)


def _codec_name(label: str) -> str | None:
    try:
        return codecs.lookup(label.strip()).name
    except (LookupError, ValueError):  # ValueError: a NUL in the label
        return None


def _decode(body: bytes, codec: str) -> str | None:
    """``body`` decoded with ``codec``; None if Python cannot use it as a text encoding with
    replacement ("rot13", "idna")."""
    if codec in _WINDOWS_1252:
        codec = "cp1252"
    try:
        return body.decode(codec, "replace")
    except (LookupError, UnicodeError, ValueError, TypeError):
        return None
