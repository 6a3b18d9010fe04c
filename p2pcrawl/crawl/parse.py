"""Link extraction: HTML bytes in, the canonical URLs a crawler may follow out.

This runs once per fetched page, so it is written for speed: lexbor builds the tree (the
modest backend is gone from selectolax 1.0), ``tags()`` walks it (cheaper than a CSS
selector, which lexbor compiles and matches per call), each distinct raw href is resolved
once, and the resolver built for the page's base URL takes string fast paths for hrefs that
are already canonical (``p2pcrawl.crawl.urls``). ``benchmarks/parse_links.py`` measures it against
a bare selectolax + urljoin loop.

Robots directives follow the HTML and robots meta conventions: ``<meta name="robots">``
``nofollow`` (or ``none``) drops every link, ``noindex`` (or ``none``) is reported, and
``rel="nofollow"`` drops one link. ``<base href>``: the first one with an href sets the base
(HTML §4.2.3); if it does not resolve to an http(s) URL the page URL stays the base.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser

from p2pcrawl.crawl.urls import MAX_URL_LENGTH, LinkResolver, canonicalize

__all__ = ["ParsedPage", "extract_links"]

DEFAULT_MAX_LINKS = 5000

_DIRECTIVE_SPLIT = re.compile(r"[\s,]+")
# Labels that mean windows-1252 to a browser (WHATWG Encoding), which Python would read as
# strict latin-1 and turn 0x80-0x9F into control characters.
_WINDOWS_1252 = frozenset({"latin-1", "iso8859-1", "ascii"})
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


@dataclass(slots=True)
class ParsedPage:
    """What a page says about where to go next.

    ``links`` are canonical absolute URLs, deduplicated, in document order, capped at
    ``max_links``; empty when the page is ``nofollow``. ``canonical`` is the resolved
    ``<link rel=canonical>``, recorded only (never followed or substituted). ``hrefs_seen``
    counts raw ``<a href>`` elements examined (examination stops at the cap); ``rejected``
    counts those that did not resolve to a crawlable URL. ``rel=nofollow`` links and the
    links of a ``nofollow`` page are neither resolved nor counted as rejected.
    """

    links: list[str]
    canonical: str | None
    base: str
    nofollow: bool
    noindex: bool
    hrefs_seen: int
    rejected: int


def extract_links(
    body: bytes,
    url: str,
    *,
    encoding: str | None = None,
    max_links: int = DEFAULT_MAX_LINKS,
    max_url_length: int = MAX_URL_LENGTH,
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
        href = node.attributes.get("href")
        if href is not None:
            resolved = LinkResolver(page_url).resolve(href, max_url_length)
            if resolved is not None:
                base_url = resolved
            break
    base = LinkResolver(base_url)

    nofollow = noindex = False
    for node in tree.tags("meta"):
        attributes = node.attributes
        name = attributes.get("name")
        if name is None or name.strip().lower() != "robots":
            continue
        directives = set(_DIRECTIVE_SPLIT.split((attributes.get("content") or "").lower()))
        if "none" in directives:
            nofollow = noindex = True
        nofollow = nofollow or "nofollow" in directives
        noindex = noindex or "noindex" in directives

    canonical = None
    for node in tree.tags("link"):
        attributes = node.attributes
        rel = attributes.get("rel")
        href = attributes.get("href")
        if rel is not None and href is not None and "canonical" in rel.lower().split():
            canonical = base.resolve(href, max_url_length)
            break

    links: list[str] = []
    hrefs_seen = rejected = 0
    if max_links <= 0:
        return ParsedPage(links, canonical, base_url, nofollow, noindex, hrefs_seen, rejected)
    # Raw href -> canonical URL or None: nav bars repeat the same hrefs many times a page.
    resolved_hrefs: dict[str, str | None] = {}
    emitted: set[str] = set()
    for node in tree.tags("a"):
        attributes = node.attributes
        href = attributes.get("href")
        if href is None:
            continue
        hrefs_seen += 1
        if nofollow:
            continue
        rel = attributes.get("rel")
        if rel is not None and "nofollow" in rel.lower().split():
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
    return ParsedPage(links, canonical, base_url, nofollow, noindex, hrefs_seen, rejected)


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
