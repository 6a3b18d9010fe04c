"""Robots directives of one response: the robots meta tags and the ``X-Robots-Tag`` header.

A page speaks to crawlers in three places besides robots.txt (which says what may be
fetched): ``<meta name="robots" content="...">`` for every crawler, ``<meta name="p2pcrawl">``
(our product token, :func:`p2pcrawl.crawl.robots.ua_token` of the User-Agent) for this one,
and the ``X-Robots-Tag`` response header, which also covers what has no ``<head>`` (images,
PDFs). A header value may start with a product token and a colon (``otherbot: nofollow``):
then it speaks to that crawler only. Directives from every place that applies add up; the
most restrictive wins, as the robots meta tag specification and the major crawlers read them.

Four directives change what this crawler does or records: ``nofollow`` (the response's links
are not followed; ``--ignore-robots-meta`` follows them all the same), ``noindex`` and
``noarchive`` (recorded with the capture; ``--obey-noarchive`` keeps only the headers of a
``noarchive`` response), and ``none``, which means ``noindex, nofollow``. Everything else
(``all``, ``nosnippet``, ``max-snippet:20``, ``unavailable_after: <date>``...) is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["NONE", "Directives", "from_header_values", "from_meta_content"]

_SPLIT = re.compile(r"[\s,]+")
# "otherbot: noindex": a product token, then a colon. Directives with a value of their own
# ("max-snippet: 20", "unavailable_after: 25 Jun 2010") start the same way; those names are
# known and are not agents.
_AGENT = re.compile(r"\s*([A-Za-z0-9_-]+)\s*:(.*)", re.DOTALL)
_VALUED = frozenset({"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"})
# Bounds on what a hostile response can make us read.
MAX_HEADER_CHARS = 4096
MAX_HEADER_VALUES = 16


@dataclass(frozen=True, slots=True)
class Directives:
    """What applies to this crawler; the empty value means "index, follow, archive"."""

    nofollow: bool = False
    noindex: bool = False
    noarchive: bool = False

    def __or__(self, other: Directives) -> Directives:
        return Directives(
            self.nofollow or other.nofollow,
            self.noindex or other.noindex,
            self.noarchive or other.noarchive,
        )

    def __bool__(self) -> bool:
        return self.nofollow or self.noindex or self.noarchive

    def names(self) -> list[str]:
        """The directives in force, by name, in a fixed order (what the export shows)."""
        return [
            name
            for name, on in (
                ("noarchive", self.noarchive),
                ("nofollow", self.nofollow),
                ("noindex", self.noindex),
            )
            if on
        ]


NONE = Directives()


def _from_tokens(tokens: Iterable[str]) -> Directives:
    nofollow = noindex = noarchive = False
    for raw in tokens:
        token = raw.strip().lower()
        if token == "none":
            nofollow = noindex = True
        elif token == "nofollow":
            nofollow = True
        elif token == "noindex":
            noindex = True
        elif token == "noarchive":
            noarchive = True
    return Directives(nofollow, noindex, noarchive)


def from_meta_content(content: str) -> Directives:
    """The directives of one robots meta tag's ``content``."""
    return _from_tokens(_SPLIT.split(content[:MAX_HEADER_CHARS]))


def from_header_values(values: Iterable[str], agent: str) -> Directives:
    """The directives of ``X-Robots-Tag`` header values that apply to the product token
    ``agent`` (lower case): those without an agent, and those naming it.

    Within one value an agent prefix holds for the directives after it, up to the next
    prefix (``otherbot: noindex, nofollow`` is two directives for otherbot only).
    """
    out = NONE
    for n, value in enumerate(values):
        if n >= MAX_HEADER_VALUES:
            break
        target: str | None = None  # None: every crawler
        tokens: list[str] = []
        for part in value[:MAX_HEADER_CHARS].split(","):
            m = _AGENT.match(part)
            if m is not None and m[1].lower() not in _VALUED and not _is_directive(m[1]):
                if target is None or target == agent:
                    out |= _from_tokens(tokens)
                target, tokens = m[1].lower(), []
                part = m[2]
            tokens.extend(_SPLIT.split(part))
        if target is None or target == agent:
            out |= _from_tokens(tokens)
    return out


def _is_directive(word: str) -> bool:
    return word.lower() in ("all", "none", "nofollow", "noindex", "noarchive", "nosnippet")
