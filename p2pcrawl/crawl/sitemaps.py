"""Sitemap documents (the sitemaps.org protocol), parsed as they arrive: bytes in, URLs out.

A sitemap is an XML ``<urlset>`` of ``<url><loc>..</loc><lastmod>..</lastmod></url>``, a
``<sitemapindex>`` of ``<sitemap><loc>`` naming further sitemaps, or a plain text file of
one URL per line; any of them may be gzip-compressed. The protocol caps a file at 50,000
URLs and 50 MB uncompressed; :class:`SitemapParser` stops at either and says so.

Sitemaps come from strangers, so the parser is fed one network chunk at a time (a 50 MB
file never sits in memory, and the event loop is held for one chunk's parse only), and the
XML parser is expat with every entity declaration refused: the "billion laughs" and
quadratic-blowup bombs need an entity declared before it is used, and an external entity
(XXE) would read a file or a URL. That is what ``defusedxml`` does to expat
(``forbid_entities``, ``forbid_external``); a document that tries is cut there and counted,
the URLs before it kept. Malformed XML likewise ends the document where the error is.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from xml.parsers import expat

__all__ = [
    "MAX_SITEMAP_BYTES",
    "MAX_SITEMAP_URLS",
    "SitemapDoc",
    "SitemapParser",
    "parse_lastmod",
]

MAX_SITEMAP_URLS = 50_000  # sitemaps.org: per file
MAX_SITEMAP_BYTES = 50 * 1000 * 1000  # sitemaps.org: 50 MB (52,428,800 bytes) uncompressed
_MAX_TEXT = 4096  # characters kept of one <loc> or <lastmod>
_GZIP_MAGIC = b"\x1f\x8b"
# Inflated bytes parsed per call: a gzip bomb inflates a network chunk a thousandfold, and
# the caller yields to the event loop between calls while :attr:`SitemapParser.pending`.
INFLATE_STEP = 1 << 18
# <lastmod> before the protocol existed, or more than a day ahead, is not believed.
_EARLIEST = datetime(1995, 1, 1, tzinfo=UTC).timestamp()


class _Refused(Exception):
    """The document declared an entity (or named an external one)."""


@dataclass(slots=True)
class SitemapDoc:
    """What one sitemap file said: page URLs with their ``<lastmod>`` (Unix time or None),
    or the sitemaps an index names; ``bound``: why it was cut short, if it was
    (``entities``, ``malformed``, ``too_large``, ``too_many_urls``)."""

    kind: str = ""  # "urlset", "sitemapindex", "text", or "" (nothing recognised)
    urls: list[tuple[str, float | None]] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)
    bound: str | None = None


def parse_lastmod(text: str, now: float | None = None) -> float | None:
    """A W3C Datetime (``2024``, ``2024-05``, ``2024-05-17``, ``2024-05-17T10:00:00+02:00``)
    as Unix time; None if it is not one, or lies before 1995 or more than a day ahead."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    if len(text) in (4, 7):  # YYYY, YYYY-MM
        text += "-01-01" if len(text) == 4 else "-01"
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    stamp = when.timestamp()
    latest = (time.time() if now is None else now) + 86400
    return stamp if _EARLIEST <= stamp <= latest else None


class SitemapParser:
    """Feed a sitemap's bytes as they arrive (:meth:`feed` returns False once it will take
    no more), then :meth:`close` for the document."""

    def __init__(self, max_urls: int = MAX_SITEMAP_URLS, max_bytes: int = MAX_SITEMAP_BYTES):
        self.doc = SitemapDoc()
        self._max_urls = min(max_urls, MAX_SITEMAP_URLS)
        self._left = max_bytes  # uncompressed bytes still allowed
        self._gunzip: zlib._Decompress | None = None
        self._mode = ""  # "", "xml" or "text" once the first bytes tell
        self._text_tail = b""
        self._xml = expat.ParserCreate()
        self._xml.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self._xml.EntityDeclHandler = self._refuse
        self._xml.UnparsedEntityDeclHandler = self._refuse
        self._xml.ExternalEntityRefHandler = self._refuse
        self._xml.StartElementHandler = self._start
        self._xml.EndElementHandler = self._end
        self._xml.CharacterDataHandler = self._chars
        self._depth = 0
        self._field = ""  # "loc" or "lastmod" while inside one
        self._text: list[str] = []
        self._text_len = 0
        self._loc: str | None = None
        self._lastmod: str | None = None
        self._started = False  # the first bytes were seen (gzip or not)
        self._tail = b""  # compressed input not inflated yet
        self.fed = 0  # bytes fed, as they came off the wire

    @property
    def done(self) -> bool:
        return self.doc.bound is not None

    @property
    def pending(self) -> bool:
        """Compressed input is waiting: call :meth:`feed` with ``b""`` to go on."""
        return bool(self._tail) and not self.done

    def feed(self, chunk: bytes) -> bool:
        self.fed += len(chunk)
        if self.done or not (chunk or self._tail):
            return not self.done
        if not self._started:
            self._started = True
            if chunk.startswith(_GZIP_MAGIC):
                self._gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self._gunzip is not None:
            try:
                data = self._tail + chunk
                chunk = self._gunzip.decompress(data, min(INFLATE_STEP, self._left + 1))
                self._tail = self._gunzip.unconsumed_tail
            except zlib.error:
                self._stop("malformed")
                return False
        if len(chunk) > self._left:
            chunk = chunk[: self._left]
            self._data(chunk)
            self._stop("too_large")
            return False
        self._left -= len(chunk)
        self._data(chunk)
        return not self.done

    def close(self) -> SitemapDoc:
        if not self.done:
            if self._mode == "xml":
                self._parse(b"", final=True)
            elif self._mode == "text":
                self._text_lines(b"\n")
        return self.doc

    # -- the two formats ----------------------------------------------------------------------

    def _data(self, data: bytes) -> None:
        if not data:
            return
        if not self._mode:
            head = data.lstrip()
            if not head:
                return
            # sitemaps.org also allows a text file of URLs, one per line (UTF-8).
            self._mode = "xml" if head.startswith((b"<", b"\xef\xbb\xbf<")) else "text"
            if self._mode == "text":
                self.doc.kind = "text"
        if self._mode == "xml":
            self._parse(data, final=False)
        else:
            self._text_lines(data)

    def _parse(self, data: bytes, *, final: bool) -> None:
        try:
            self._xml.Parse(data, final)
        except _Refused:
            self._stop("entities")
        except expat.ExpatError:
            if not self.done:
                self._stop("malformed")

    def _text_lines(self, data: bytes) -> None:
        data = self._text_tail + data
        lines = data.split(b"\n")
        self._text_tail = lines.pop()
        if len(self._text_tail) > _MAX_TEXT:
            self._text_tail = b""
        for line in lines:
            url = line.strip().decode("utf-8", "replace")
            if url.startswith(("http://", "https://")) and len(url) <= _MAX_TEXT:
                self._add_url(url, None)
            if self.done:
                return

    # -- expat callbacks ------------------------------------------------------------------

    def _refuse(self, *args: object) -> int:
        raise _Refused()

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        local = name.rpartition(":")[2]
        self._depth += 1
        if self._depth == 1:
            self.doc.kind = local if local in ("urlset", "sitemapindex") else ""
        elif self._depth == 3 and local in ("loc", "lastmod"):
            self._field = local
            self._text, self._text_len = [], 0

    def _end(self, name: str) -> None:
        local = name.rpartition(":")[2]
        if self._field and self._depth == 3:
            value = "".join(self._text).strip()
            if self._field == "loc":
                self._loc = value
            else:
                self._lastmod = value
            self._field = ""
        elif self._depth == 2 and local in ("url", "sitemap"):
            loc, lastmod = self._loc, self._lastmod
            self._loc = self._lastmod = None
            if loc:
                if self.doc.kind == "sitemapindex":
                    self._add_sitemap(loc)
                elif self.doc.kind == "urlset":
                    self._add_url(loc, parse_lastmod(lastmod) if lastmod else None)
        self._depth -= 1

    def _chars(self, data: str) -> None:
        if self._field and self._text_len < _MAX_TEXT:
            self._text.append(data)
            self._text_len += len(data)

    # -- bounds -----------------------------------------------------------------------------

    def _add_url(self, url: str, lastmod: float | None) -> None:
        if len(self.doc.urls) >= self._max_urls:
            self._stop("too_many_urls")
        else:
            self.doc.urls.append((url, lastmod))

    def _add_sitemap(self, url: str) -> None:
        if len(self.doc.sitemaps) >= self._max_urls:
            self._stop("too_many_urls")
        else:
            self.doc.sitemaps.append(url)

    def _stop(self, why: str) -> None:
        if self.doc.bound is None:
            self.doc.bound = why
        # Later callbacks of this chunk's parse are ignored; expat cannot stop mid-Parse.
        self._xml.StartElementHandler = None
        self._xml.EndElementHandler = None
        self._xml.CharacterDataHandler = None
