"""A page's requisites: what a browser fetches to render it, as wget's ``--page-requisites``
and Heritrix's embed hops take them.

Images (``<img src>``, ``srcset``, ``<picture><source>``, ``<input type=image>``),
stylesheets and icons (``<link rel=stylesheet|icon|apple-touch-icon|mask-icon>``, and the
``preload``/``modulepreload`` hints for styles, scripts, fonts and images), scripts
(``<script src>``), media (``<video src poster>``, ``<audio src>``, their ``<source>`` and
``<track>``), and the ``url(...)`` and ``@import`` of ``<style>`` elements. Frames and ``<a>``
links are not requisites: they are pages. ``style`` attributes are not read: finding them
costs a scan of every page (20-50 us for 30 kB, a few per cent of a page's CPU, measured),
for the background images of a few.

This runs on every page. lexbor finds the elements of one name in a microsecond or two (a
regular expression over the bytes to say which names occur cost more than walking them all).
"""

from __future__ import annotations

from collections.abc import Iterable

from selectolax.lexbor import LexborHTMLParser, LexborNode

from p2pcrawl.crawl.css import css_references
from p2pcrawl.crawl.urls import LinkResolver

__all__ = ["page_requisites"]

_ELEMENTS = ("img", "source", "script", "video", "audio", "track", "input")
_LINK_RELS = frozenset(
    {"stylesheet", "icon", "apple-touch-icon", "apple-touch-icon-precomposed", "mask-icon"}
)
_PRELOAD_RELS = frozenset({"preload", "modulepreload"})
_PRELOAD_AS = frozenset({"style", "script", "font", "image"})
# Attributes that name one URL, per element; srcset attributes name several.
_URL_ATTRS: dict[str, tuple[str, ...]] = {
    "img": ("src",),
    "script": ("src",),
    "source": ("src",),
    "video": ("src", "poster"),
    "audio": ("src",),
    "track": ("src",),
}
_SRCSET = frozenset({"img", "source"})


def page_requisites(
    tree: LexborHTMLParser,
    base: LinkResolver,
    most: int,
    max_url_length: int,
    links: Iterable[LexborNode] | None = None,
) -> list[str]:
    """Canonical URLs of the page's requisites, deduplicated, in element order by kind,
    at most ``most``. ``links``: the page's ``<link>`` elements, if the caller walked the
    tree for them already."""
    raw: list[str] = []
    css: list[str] = []
    for node in tree.tags("link") if links is None else links:
        href = _link_href(node.attributes)
        if href is not None:
            raw.append(href)
    for tag in _ELEMENTS:
        for node in tree.tags(tag):
            attrs = node.attributes
            if tag == "input":
                if (attrs.get("type") or "").strip().lower() == "image" and attrs.get("src"):
                    raw.append(attrs["src"] or "")
                continue
            for attr in _URL_ATTRS[tag]:
                value = attrs.get(attr)
                if value:
                    raw.append(value)
            if tag in _SRCSET:
                srcset = attrs.get("srcset")
                if srcset:
                    raw.extend(_srcset_urls(srcset))
            if len(raw) >= 4 * most:
                break
    for node in tree.tags("style"):
        css.append(node.text(deep=True))
    out: list[str] = []
    seen: set[str] = set()
    for href in raw:
        url = base.resolve(href, max_url_length)
        if url is not None and url not in seen:
            seen.add(url)
            out.append(url)
            if len(out) >= most:
                return out
    for text in css:
        for url in css_references(text, base.url, most - len(out), max_url_length):
            if url not in seen:
                seen.add(url)
                out.append(url)
                if len(out) >= most:
                    return out
    return out


def _link_href(attrs: dict[str, str | None]) -> str | None:
    rel = attrs.get("rel")
    href = attrs.get("href")
    if not rel or not href:
        return None
    rels = set(rel.lower().split())
    if not _LINK_RELS.isdisjoint(rels):
        return href
    if not _PRELOAD_RELS.isdisjoint(rels):
        kind = (attrs.get("as") or "").strip().lower()
        if kind in _PRELOAD_AS or "modulepreload" in rels:
            return href
    return None


def _srcset_urls(srcset: str) -> list[str]:
    """The URLs of a ``srcset`` (HTML §4.8.4.2.2): candidates split on commas, each a URL
    and an optional width or density descriptor."""
    out = []
    for candidate in srcset.split(",")[:64]:
        words = candidate.split()
        if words:
            out.append(words[0])
    return out
