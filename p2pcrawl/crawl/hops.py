"""How a task's URL was reached, packed into the 16-bit ``hops`` every task carries.

Heritrix keeps a hop path per URI (``LLRE``: link, link, redirect, embed) and decides by its
last letters whether a URI is a page or something a page embeds. A task here carries the part
of that path the crawl acts on, in the field that travels with it on the wire and in the task
store, so neither changes shape:

- bits 0-7: redirects followed to reach the URL (``--max-redirects`` is at most 50);
- bits 8-9: embed hops: 0 for a page reached by links, 1 for a page requisite (an image, a
  stylesheet, a script...), 2 and 3 for what a stylesheet references (``@import``, fonts,
  background images).

A requisite does not count against ``--max-depth`` (it keeps its page's depth), has its own
scope rule (``--requisites``), and its links are never followed: only a stylesheet's
references are taken, up to :data:`MAX_EMBEDS` hops from the page.
"""

from __future__ import annotations

__all__ = ["MAX_EMBEDS", "embedded", "embeds", "redirected", "redirects"]

_REDIRECTS = 0xFF
_EMBED_SHIFT = 8
_EMBEDS = 0x3 << _EMBED_SHIFT
# page -> stylesheet -> imported stylesheet -> font: the chain a browser follows to render.
MAX_EMBEDS = 3


def redirects(hops: int) -> int:
    """Redirects followed to reach the URL."""
    return hops & _REDIRECTS


def embeds(hops: int) -> int:
    """Embed hops from the page that needs the URL; 0 for a page."""
    return (hops & _EMBEDS) >> _EMBED_SHIFT


def redirected(hops: int) -> int:
    """The hops of a redirect's target: one more redirect, the same embed hops."""
    return (hops & _EMBEDS) | min(_REDIRECTS, redirects(hops) + 1)


def embedded(hops: int) -> int:
    """The hops of a URL the resource reached by ``hops`` embeds: no redirect yet, one
    more embed hop (callers stop at :data:`MAX_EMBEDS`)."""
    return min(MAX_EMBEDS, embeds(hops) + 1) << _EMBED_SHIFT
