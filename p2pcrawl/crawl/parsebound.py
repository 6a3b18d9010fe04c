"""Bounds on what the HTML parser is given, checked before lexbor sees a byte.

lexbor's tree builder walks its stack of open elements for many tags, so a page of deeply
nested elements costs time quadratic in the depth: measured with selectolax 0.3.x, 10,000
nested ``<div>`` take 0.06 s, 20,000 take 0.5 s, 100,000 take 81 s (during which a peer's
event loop, its status page and its UDP replies are dead). Browsers bound the same thing:
Blink's HTML tree builder stops nesting at a depth of 512 and attaches deeper elements to
the element at that depth. :func:`flatten_deep_nesting` does the same outside the parser,
by dropping the start and end tags of elements opened beyond the cap, so the text and the
links inside them are still seen, in document order.

The scan is approximate (a tag is ``<name`` or ``</name``; comments, scripts and attributes
are not parsed) but errs only one way: elements that the parser closes implicitly (``p``,
``li``, table cells...) and void elements never count as nesting, so an ordinary page never
reaches the cap, and a page that does is one no parser should nest that deeply.

It costs nothing on ordinary pages: a page with fewer start tags than the cap cannot exceed
it, and ``bytes.count`` decides that at C speed before any scan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_DEPTH", "Flattened", "flatten_deep_nesting"]

DEFAULT_MAX_DEPTH = 512  # Blink's kMaximumHTMLParserDOMTreeDepth

_TAG = re.compile(rb"<(/?)([A-Za-z][A-Za-z0-9-]{0,31})")
# Elements that never deepen the tree: void elements (HTML §13.1.2) and those whose start
# tag implicitly closes an open one of their kind (HTML §13.2.6.4.7), so a run of unclosed
# <p> or <li> stays at one level.
_FLAT = frozenset(
    b"area base br col embed hr img input link meta source track wbr "
    b"p li dt dd option optgroup tr td th tbody thead tfoot rt rp "
    # <a> inside an open <a> closes it (the adoption agency, HTML §13.2.6.4.7).
    b"a html head body".split()
)


@dataclass(frozen=True, slots=True)
class Flattened:
    """``body`` as the parser should see it; ``dropped`` elements were opened beyond the cap."""

    body: bytes
    dropped: int
    max_depth_seen: int


def flatten_deep_nesting(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Flattened:
    """``body`` with the tags of elements nested deeper than ``max_depth`` removed.

    Returns ``body`` itself (no copy) when nothing is that deep.
    """
    starts = body.count(b"<") - body.count(b"</")
    if starts <= max_depth:
        return Flattened(body, 0, 0)
    # A first pass without match objects: most pages that get here are merely large.
    depth = deepest = 0
    for slash, raw in _TAG.findall(body):
        name = raw.lower()
        if name in _FLAT:
            continue
        if slash:
            if depth:
                depth -= 1
        else:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > max_depth:
                    break
    if deepest <= max_depth:
        return Flattened(body, 0, deepest)
    depth = deepest = 0
    excess = most = 0  # open elements beyond the cap whose tags were dropped
    cuts: list[tuple[int, int]] = []
    for m in _TAG.finditer(body):
        name = m[2].lower()
        if name in _FLAT:
            continue
        if m[1]:  # an end tag
            if excess:
                excess -= 1
                cuts.append(_tag_span(body, m.start()))
            elif depth:
                depth -= 1
            continue
        if depth < max_depth:
            depth += 1
            if depth > deepest:
                deepest = depth
            continue
        excess += 1
        most = max(most, excess)
        cuts.append(_tag_span(body, m.start()))
    if not cuts:
        return Flattened(body, 0, deepest)
    dropped = sum(1 for start, _ in cuts if body[start + 1] != 0x2F)  # b"/"
    parts: list[bytes] = []
    pos = 0
    for start, end in cuts:
        if start < pos:  # a tag inside a tag already cut (``<div<div>``)
            continue
        parts.append(body[pos:start])
        pos = end
    parts.append(body[pos:])
    return Flattened(b"".join(parts), dropped, max_depth + most)


def _tag_span(body: bytes, start: int) -> tuple[int, int]:
    """The byte span of the tag starting at ``start``, up to its ``>`` (or the body's end)."""
    end = body.find(b">", start)
    return (start, len(body) if end < 0 else end + 1)
