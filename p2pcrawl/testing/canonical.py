"""The test web's own URL canonicaliser (RFC 3986 §6.2.2, §5.2.4), independent of the crawler's.

The server canonicalises request targets only to count double fetches; the ground truth
never depends on a canonicaliser, and this one shares no code with
:mod:`p2pcrawl.crawl.urls`, so a bug there cannot hide itself in the test.
"""

from __future__ import annotations

import re

__all__ = ["canonical_target"]

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def _fix_escape(match: re.Match[str]) -> str:
    char = chr(int(match[1], 16))
    return char if char in _UNRESERVED else "%" + match[1].upper()


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 for an absolute path."""
    out: list[str] = []
    segments = path.split("/")[1:]
    for segment in segments:
        if segment == ".":
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    if segments and segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _sort_query(query: str) -> str:
    params = [p for p in query.split("&") if p]
    params.sort(key=lambda p: p.partition("=")[::2])
    return "&".join(params)


def canonical_target(raw: str) -> str:
    """Canonical path and query of a request target, by the rules the crawler follows."""
    raw = raw.partition("#")[0]
    path, _, query = raw.partition("?")
    if "%" in raw:
        path = _PERCENT.sub(_fix_escape, path)
        query = _PERCENT.sub(_fix_escape, query)
    if "/." in path:
        path = _remove_dot_segments(path)
    if not path.startswith("/"):
        path = "/" + path
    if query:
        query = _sort_query(query)
        return f"{path}?{query}" if query else path
    return path


# --- fixed bodies ------------------------------------------------------------------------
