"""The status page's first values, written on the server.

The page refreshes itself from ``/api/status`` with JavaScript, but ``curl /``, a text
browser, or a browser with scripts off should still show the peer's state: every element
that names a status field (``data-key``, formatted by ``data-fmt``) gets its value here, in
the same format the page's script uses (``static/common.js``, ``fmt``). Only the elements'
text changes, never the scripts or styles, so the page's CSP hashes still hold.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["prerender"]

# An element whose text is the placeholder, with the field (and format) it shows. The tag
# may span lines; its text is the "…" the page ships with.
_FIELD = re.compile(
    r'(<(?P<tag>[a-z]+)\b[^>]*?\bdata-key="(?P<key>[a-z_0-9]+)"'
    r'(?:[^>]*?\bdata-fmt="(?P<fmt>[a-z]+)")?[^>]*>)…(</(?P=tag)>)'
)
_DASH = "\u2013"  # the page script's placeholder for no value


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _text(v: object) -> str:
    return _DASH if v is None or v == "" else str(v)


def _int(v: object) -> str:
    n = _number(v)
    return _DASH if n is None else f"{round(n):,}"


def _rate(v: object) -> str:
    n = _number(v)
    return _DASH if n is None else (f"{n:.0f}" if n >= 100 else f"{n:.1f}")


def _bytes(v: object) -> str:
    n = _number(v)
    if n is None:
        return _DASH
    units, i = ("B", "KB", "MB", "GB", "TB"), 0
    while n >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:.0f} {units[i]}" if i == 0 else f"{n:.1f} {units[i]}"


def _duration(v: object) -> str:
    s = _number(v)
    if s is None:
        return _DASH
    if s < 60:
        return f"{s:.1f} s"
    d, h = int(s // 86400), int(s // 3600) % 24
    m, sec = int(s // 60) % 60, int(s) % 60
    head = f"{d}d " if d else ""
    return head + (f"{h}h {m:02d}" if d or h else f"{m}") + f"m {sec:02d}s"


FORMATS: dict[str, Callable[[object], str]] = {
    "text": _text,
    "int": _int,
    "rate": _rate,
    "bytes": _bytes,
    "duration": _duration,
}


def prerender(page: str, status: Mapping[str, Any]) -> str:
    """``page`` with each status field's placeholder replaced by its value."""

    def one(m: re.Match[str]) -> str:
        fmt = FORMATS.get(m["fmt"] or "text", _text)
        return m.group(1) + html.escape(fmt(status.get(m["key"]))) + m.group(5)

    out = _FIELD.sub(one, page)
    state = html.escape(str(status.get("state", "")))
    node = html.escape(str(status.get("node_id", ""))[:8])
    out = out.replace('class="badge" data-key="state"', f'class="badge s-{state}" data-key="state"')
    return out.replace("<title>p2pcrawl peer</title>", f"<title>p2pcrawl {node} · {state}</title>")
