"""What a stylesheet needs: the URLs of its ``@import`` rules and ``url(...)`` values.

A page replays with its look only if the fonts, background images and imported stylesheets
its CSS names are archived too (wget's ``--page-requisites`` and Heritrix's embed hops fetch
them). CSS Syntax Level 3 (§4.3.6) reads ``url(x)`` unquoted, or ``url("x")``/``url('x')``
as a function with a string; ``@import "x"`` takes a bare string as well. Comments are
dropped first, so a commented-out rule fetches nothing. The scan is regular expressions over
at most :data:`MAX_CSS_CHARS` characters, and yields at most ``max_refs`` URLs: a hostile
stylesheet costs a bounded amount of work and queues a bounded number of requests.
"""

from __future__ import annotations

import re

from p2pcrawl.crawl.urls import MAX_URL_LENGTH, LinkResolver

__all__ = ["MAX_CSS_CHARS", "css_references", "decode_css"]

# A real stylesheet is rarely past a few hundred KiB; what is beyond this is not read.
MAX_CSS_CHARS = 2 << 20
_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)", re.DOTALL)
_REFERENCE = re.compile(
    r"""url\(\s*(?:"([^"]{0,4096})"|'([^']{0,4096})'|([^)"'\s]{0,4096}))\s*\)"""
    r"""|@import\s+(?:"([^"]{0,4096})"|'([^']{0,4096})')""",
    re.IGNORECASE,
)


def decode_css(body: bytes, charset: str | None) -> str:
    """The stylesheet as text: its HTTP charset if Python knows it, else UTF-8, with
    undecodable bytes replaced (a URL in CSS is ASCII in practice)."""
    body = body[: MAX_CSS_CHARS * 2]
    if charset:
        try:
            return body.decode(charset, "replace")
        except (LookupError, ValueError):
            pass
    return body.decode("utf-8", "replace")


def css_references(
    text: str, base: str, max_refs: int, max_url_length: int = MAX_URL_LENGTH
) -> list[str]:
    """Canonical http(s) URLs ``text`` references, resolved against ``base`` (canonical),
    deduplicated, in order, at most ``max_refs``. ``data:`` and other schemes are skipped."""
    if max_refs <= 0 or ("url(" not in text.lower() and "@import" not in text.lower()):
        return []
    text = _COMMENT.sub("", text[:MAX_CSS_CHARS])
    resolver = LinkResolver(base)
    out: list[str] = []
    seen: set[str] = set()
    found: set[str] = set()
    for m in _REFERENCE.finditer(text):
        raw = next((g for g in m.groups() if g is not None), "").strip()
        if not raw or raw.startswith(("data:", "#")) or raw in seen:
            continue
        seen.add(raw)
        url = resolver.resolve(raw, max_url_length)
        if url is not None and url not in found:
            found.add(url)
            out.append(url)
            if len(out) >= max_refs:
                break
    return out
