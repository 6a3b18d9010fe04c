"""The hostile hosts that abuse site signals (:class:`p2pcrawl.testing.hostile.HostileWeb`
serves them beside the others).

``sitemapbomb``
    robots.txt names sitemaps that attack the reader: ``laughs.xml`` (the billion-laughs
    entity bomb), ``xxe.xml`` (an external entity naming a local file), ``huge.xml.gz``
    (a gzip file that inflates past the protocol's 50 MB), ``many.xml`` (more URLs than the
    protocol's 50,000 per file), ``broken.xml`` (malformed after two good URLs) and
    ``deep-0.xml``, a chain of indexes deeper than the reader follows. Each is cut and
    counted; the two good URLs are crawled, nothing else the bombs list.
``sitemapcross``
    robots.txt names a sitemap that lists one page of its own host and one of the
    ``otherbot`` host: sitemaps.org's cross-host rule drops the second.
``otherbot``
    ``/index.html`` says ``X-Robots-Tag: otherbot: nofollow``, which is not for us: its link
    is followed. ``/ours.html`` says ``X-Robots-Tag: p2pcrawl: nofollow``: its link is not.
"""

from __future__ import annotations

import functools
import zlib

from aiohttp import web

__all__ = ["SIGNAL_CASES", "SignalCases"]

SIGNAL_CASES = ("sitemapbomb", "sitemapcross", "otherbot")
_HTML = "text/html; charset=utf-8"
_XML = "application/xml"
_NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
_BOMB_SITEMAPS = ("laughs", "xxe", "huge", "many", "broken", "deep-0")
MANY_URLS = 60_000  # in many.xml: past the protocol's 50,000 (they name another host)
DEEP_INDEXES = 5  # deep-0.xml -> deep-1.xml -> ... -> deep-4.xml


def _laughs() -> bytes:
    entities = '<!ENTITY lol "lol">\n' + "".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">\n'
        for i in range(1, 10)
    )
    return (
        f'<?xml version="1.0"?>\n<!DOCTYPE urlset [\n{entities}]>\n'
        f"<urlset {_NS}><url><loc>&lol9;</loc></url></urlset>\n"
    ).encode()


def _huge_gzip() -> bytes:
    """60 MB of whitespace inside a urlset, gzip-compressed to about 60 kB."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(f"<urlset {_NS}>\n".encode())]
    block = b" " * (1 << 20)
    out += [z.compress(block) for _ in range(60)]
    out.append(z.compress(b"</urlset>\n") + z.flush())
    return b"".join(out)


@functools.lru_cache(maxsize=16)
def _bomb_body(base: str, other: str, name: str) -> bytes | None:
    """The sitemap ``name`` of the sitemapbomb host at ``base`` (``other``: another host)."""
    if name == "laughs.xml":
        return _laughs()
    if name == "xxe.xml":
        return (
            '<?xml version="1.0"?>\n<!DOCTYPE urlset [\n'
            '<!ENTITY xxe SYSTEM "file:///etc/hostname">]>\n'
            f"<urlset {_NS}><url><loc>{base}/&xxe;</loc></url></urlset>\n"
        ).encode()
    if name == "huge.xml.gz":
        return _huge_gzip()
    if name == "many.xml":
        locs = "".join(f"<url><loc>{other}/many/{i}</loc></url>\n" for i in range(MANY_URLS))
        return f"<urlset {_NS}>\n{locs}</urlset>\n".encode()
    if name == "broken.xml":
        return (
            f"<urlset {_NS}><url><loc>{base}/from-broken/1.html</loc></url>\n"
            f"<url><loc>{base}/from-broken/2.html</loc></url>\n<url><loc>{base}/x<</urlset"
        ).encode()
    if name.startswith("deep-leaf-"):
        loc = f"{base}/from-deep/{name[10:-4]}.html"
        return f"<urlset {_NS}><url><loc>{loc}</loc></url></urlset>\n".encode()
    level = name[5:-4]
    if name.startswith("deep-") and level.isdigit() and int(level) < DEEP_INDEXES:
        nxt = f"<sitemap><loc>{base}/sitemaps/deep-{int(level) + 1}.xml</loc></sitemap>"
        own = f"<sitemap><loc>{base}/sitemaps/deep-leaf-{level}.xml</loc></sitemap>"
        return f"<sitemapindex {_NS}>{nxt}{own}</sitemapindex>\n".encode()
    return None


class SignalCases:
    """The handlers of :data:`SIGNAL_CASES`, mixed into ``HostileWeb``."""

    def base(self, case: str) -> str:
        raise NotImplementedError  # HostileWeb's

    def prepare_sitemaps(self) -> None:
        """Build the large sitemaps before a crawl: the server shares a test's event loop."""
        for name in ("huge.xml.gz", "many.xml"):
            self._sitemap_body(name)

    def _sitemap_body(self, name: str) -> bytes | None:
        return _bomb_body(self.base("sitemapbomb"), self.base("otherbot"), name)

    def signal_robots(self, case: str) -> str:
        rules = "User-agent: *\nDisallow: /private/\n"
        if case == "sitemapbomb":
            return rules + "".join(
                f"Sitemap: {self.base(case)}/sitemaps/{name}"
                f"{'.xml.gz' if name == 'huge' else '.xml'}\n"
                for name in _BOMB_SITEMAPS
            )
        if case == "sitemapcross":
            return rules + f"Sitemap: {self.base(case)}/sitemaps/others.xml\n"
        return rules

    async def _sitemapbomb(self, request: web.BaseRequest, path: str) -> web.Response:
        if path.startswith("/sitemaps/"):
            body = self._sitemap_body(path.removeprefix("/sitemaps/"))
            if body is None:
                return web.Response(status=404)
            kind = "application/gzip" if path.endswith(".gz") else _XML
            return web.Response(body=body, headers={"Content-Type": kind})
        return _leaf(path)

    async def _sitemapcross(self, request: web.BaseRequest, path: str) -> web.Response:
        if path == "/sitemaps/others.xml":
            locs = (
                f"{self.base('sitemapcross')}/listed.html",
                f"{self.base('otherbot')}/listed-by-another.html",
            )
            entries = "".join(f"<url><loc>{loc}</loc></url>" for loc in locs)
            body = f"<urlset {_NS}>{entries}</urlset>\n".encode()
            return web.Response(body=body, headers={"Content-Type": _XML})
        return _leaf(path)

    async def _otherbot(self, request: web.BaseRequest, path: str) -> web.Response:
        if path in ("/index.html", "/ours.html"):
            agent = "otherbot" if path == "/index.html" else "p2pcrawl"
            child = "/child.html" if path == "/index.html" else "/never.html"
            body = (
                f"<!DOCTYPE html>\n<html><head><title>{path}</title></head><body>\n"
                f'<a href="{child}">child</a> <a href="/ours.html">ours</a></body></html>\n'
            ).encode()
            headers = {"Content-Type": _HTML, "X-Robots-Tag": f"{agent}: nofollow"}
            return web.Response(body=body, headers=headers)
        return _leaf(path)


def _leaf(path: str) -> web.Response:
    body = f"<!DOCTYPE html>\n<html><body><p>{path}</p></body></html>\n".encode()
    return web.Response(body=body, headers={"Content-Type": _HTML})
