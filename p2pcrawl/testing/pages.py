"""The test web's pages as bytes: what one planned resource answers on the wire.

A :class:`Resource` is what the plan (:mod:`p2pcrawl.testing.plan`) says a URL is; the
:class:`Renderer` turns it into a status, headers and a body, padding pages with prose from
one shared text so every page costs a slice, not a fresh string.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass

from p2pcrawl.testing.content import WORDS, make_text

__all__ = ["Answer", "Link", "Renderer", "Resource"]

Headers = tuple[tuple[str, str], ...]
Answer = tuple[int, Headers, bytes]

HTML = "text/html"
_NOT_FOUND = (
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>"
    b"<body><h1>Not Found</h1></body></html>\n"
)
_SERVER_ERROR = (
    b"<!DOCTYPE html>\n<html><head><title>500 Internal Server Error</title></head>"
    b"<body><h1>Internal Server Error</h1></body></html>\n"
)
NOT_FOUND: Answer = (404, (("Content-Type", HTML),), _NOT_FOUND)


@dataclass(frozen=True, slots=True)
class Link:
    href: str  # as written in the HTML
    target: str | None  # canonical absolute URL; None for mailto: and javascript:
    nofollow: bool = False  # marked rel=nofollow (or ``rel``, one of ugc, sponsored)
    rel: str = "nofollow"


@dataclass(frozen=True, slots=True)
class Resource:
    """What one URL answers; regular pages are planned on demand, the rest are fixed."""

    status: int = 200
    content_type: str = HTML
    title: str = ""
    head: str = '<meta charset="utf-8">\n'
    links: tuple[Link, ...] = ()
    meta_nofollow: bool = False  # robots nofollow for us (meta tag or X-Robots-Tag)
    canonical_target: str = ""  # the canonical URL it names (<link> or Link header)
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers
    # Page requisites (canonical URLs) its markup or stylesheet names, and the markup that
    # names the images among them (rendered at the top of the body).
    requisites: tuple[str, ...] = ()
    body_top: str = ""
    location: str = ""  # Location header as sent (may be relative)
    location_target: str = ""  # its canonical absolute form
    pad_to: int = -1  # -1 = the config's page_bytes
    gzip: bool = False
    encoding: str = "utf-8"
    body: bytes = b""  # non-HTML bodies
    text_at: int = 0  # where the page's prose starts in the shared text

    @property
    def is_html(self) -> bool:
        return self.status == 200 and self.content_type.startswith(HTML)


class Renderer:
    """Resources to answers, with the prose of one web's seed."""

    def __init__(self, seed: int, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self._text, self._para_starts = make_text(seed)
        self._text2 = self._text * 2  # slicing across the end without a copy per page
        self._prose = " ".join(WORDS) + " "

    @property
    def paragraphs(self) -> int:
        return len(self._para_starts)

    def robots(self, text: str | None) -> Answer:
        if text is None:
            return NOT_FOUND
        return 200, (("Content-Type", "text/plain"),), text.encode()

    def answer(self, resource: Resource | None, title: str) -> Answer:
        """``title`` is the page's title when the resource names none."""
        if resource is None:
            return NOT_FOUND
        if resource.status == 500:
            return 500, (("Content-Type", HTML),), _SERVER_ERROR
        if resource.location:
            moved = (
                f"<!DOCTYPE html>\n<html><body><p>Moved to {resource.location}</p></body></html>\n"
            )
            headers = (("Content-Type", HTML), ("Location", resource.location))
            return resource.status, headers, moved.encode()
        extra = resource.headers
        if not resource.is_html:
            return (
                resource.status,
                (("Content-Type", resource.content_type), *extra),
                resource.body,
            )
        body = self.html(resource, title).encode(resource.encoding)
        if resource.gzip:
            return (
                200,
                (("Content-Type", HTML), ("Content-Encoding", "gzip"), *extra),
                gzip.compress(body, mtime=0),
            )
        return 200, (("Content-Type", resource.content_type), *extra), body

    def html(self, resource: Resource, title: str) -> str:
        title = resource.title or title
        parts = [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n',
            resource.head,
            f"<title>{title}</title>\n</head>\n<body>\n<h1>{title}</h1>\n",
            resource.body_top,
            self._paragraphs(resource.text_at, 2),
            '<ul class="links">\n',
        ]
        for k, link in enumerate(resource.links):
            rel = f' rel="{link.rel}"' if link.nofollow else ""
            href = link.href.replace("&", "&amp;")  # as real HTML escapes it in attributes
            parts.append(f'<li><a href="{href}"{rel}>link {k}</a></li>\n')
        parts.append("</ul>\n")
        tail = "</body>\n</html>\n"
        pad_to = self.page_bytes if resource.pad_to < 0 else resource.pad_to
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
