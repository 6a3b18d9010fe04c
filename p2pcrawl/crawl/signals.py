"""What one response says about itself in its headers, and how a capture records it.

The ``X-Robots-Tag`` header carries robots directives (:mod:`~p2pcrawl.crawl.directives`);
the ``Link`` header (RFC 8288) may name the canonical URL, as ``<link rel=canonical>`` does in
a page (RFC 6596). The response record of a capture carries what applied to this crawler in
two WARC fields of our own, so ``p2pcrawl export`` shows it without parsing the page again
(and even when ``--obey-noarchive`` kept only the headers):

``X-Crawler-Robots: noarchive, nofollow, noindex``
    the directives in force, from the meta tags and the header together;
``X-Crawler-Canonical: <url>``
    the canonical URL the page or its ``Link`` header named, canonicalised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from p2pcrawl.crawl.directives import NONE, Directives, from_header_values
from p2pcrawl.crawl.urls import MAX_URL_LENGTH, LinkResolver

__all__ = [
    "CANONICAL_FIELD",
    "ROBOTS_FIELD",
    "HeaderSignals",
    "header_signals",
    "warc_fields",
]

ROBOTS_FIELD = "X-Crawler-Robots"
CANONICAL_FIELD = "X-Crawler-Canonical"
# One Link header may list many links: "<a>; rel=preload, <b>; rel="canonical"".
_LINK = re.compile(r"<([^>]{0,4096})>((?:\s*;[^;,]{0,512}){0,16})")
_REL = re.compile(r"""\brel\s*=\s*(?:"([^"]*)"|([^\s;"]+))""", re.IGNORECASE)
_MAX_LINK_CHARS = 16384


@dataclass(frozen=True, slots=True)
class HeaderSignals:
    directives: Directives = NONE
    canonical: str | None = None


_NOTHING = HeaderSignals()


def header_signals(
    headers: Iterable[tuple[str, str]], url: str, agent: str, max_url_length: int = MAX_URL_LENGTH
) -> HeaderSignals:
    """The ``X-Robots-Tag`` directives for product token ``agent`` and the ``Link``
    header's canonical URL (resolved against ``url``) of a response's headers."""
    robots: list[str] = []
    links: list[str] = []
    for name, value in headers:
        lower = name.lower()
        if lower == "x-robots-tag":
            robots.append(value)
        elif lower == "link":
            links.append(value)
    if not robots and not links:
        return _NOTHING
    directives = from_header_values(robots, agent) if robots else NONE
    canonical = _canonical(links, url, max_url_length) if links else None
    return HeaderSignals(directives, canonical)


def _canonical(values: list[str], url: str, max_url_length: int) -> str | None:
    for value in values:
        for m in _LINK.finditer(value[:_MAX_LINK_CHARS]):
            for rel in _REL.finditer(m[2]):
                tokens = (rel[1] if rel[1] is not None else rel[2]).lower().split()
                if "canonical" in tokens:
                    return LinkResolver(url).resolve(m[1].strip(), max_url_length)
    return None


def warc_fields(directives: Directives, canonical: str | None) -> tuple[tuple[str, str], ...]:
    """The WARC fields recording a capture's signals (none for most captures)."""
    fields: list[tuple[str, str]] = []
    if directives:
        fields.append((ROBOTS_FIELD, ", ".join(directives.names())))
    if canonical is not None:
        fields.append((CANONICAL_FIELD, canonical))
    return tuple(fields)
