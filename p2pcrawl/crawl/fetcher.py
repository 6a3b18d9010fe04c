"""HTTP fetching: one shared aiohttp session, one keep-alive connection per host.

"High-performance crawl scheduling": HTTP/1.1 persistent connections doubled throughput over one
connection per request, and a server never gets more than one connection from us. Redirects are
not followed here: the engine treats a Location as a newly discovered URL, so the target is
deduplicated and routed to its owner like any link.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import xxhash
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from p2pcrawl.aio import Memo
from p2pcrawl.crawl.scope import is_forbidden_address
from p2pcrawl.settings import CrawlSettings

__all__ = ["FetchResult", "Fetcher", "ForbiddenAddress", "page_digest", "parse_resolve"]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_READ_CHUNK = 1 << 16


def page_digest(body: bytes) -> bytes:
    """8 bytes that stand for a fetched body: what a peer keeps of each page it fetched, so
    that another may check its word that the page is done by fetching it again
    (docs/security.md, "Forged work claims"). xxh3 hashes gigabytes a second, so a page
    costs microseconds on the loop; the WARC record's SHA-1 is taken in the writer process,
    and a ``noarchive`` page's record has no payload to take it of."""
    return xxhash.xxh3_64_digest(body)


class ForbiddenAddress(OSError):
    """A host name resolved only to addresses the SSRF guard refuses."""


def parse_resolve(entries: tuple[str, ...]) -> dict[str, str]:
    """``--resolve NAME:ADDRESS`` entries as {name: address}; ValueError names a bad one."""
    out: dict[str, str] = {}
    for entry in entries:
        name, sep, address = entry.strip().partition(":")
        address = address.strip().strip("[]")
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"--resolve {entry!r}: not NAME:ADDRESS with an IP address") from None
        if not sep or not name:
            raise ValueError(f"--resolve {entry!r}: not NAME:ADDRESS")
        out[name.lower().rstrip(".")] = address
    return out


class GuardedResolver(AbstractResolver):
    """Drops loopback/private/link-local answers unless private addresses are allowed.

    aiohttp never calls the resolver for IP literals, so :meth:`Fetcher.fetch` checks those.
    Names given with ``--resolve`` answer their address without a lookup (and still pass
    the guard).
    """

    def __init__(
        self,
        allow_private: bool,
        allow_loopback: bool = False,
        overrides: dict[str, str] | None = None,
    ) -> None:
        self._inner = DefaultResolver()
        self._allow_private = allow_private
        self._allow_loopback = allow_loopback
        self._overrides = overrides or {}
        # host -> the address aiohttp will try first, for WARC-IP-Address: the connection
        # object is often released before the caller could ask it for its peer.
        self.addresses: Memo[str, str] = Memo(10_000)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        fixed = self._overrides.get(host.lower().rstrip("."))
        if fixed is not None:
            ip = ipaddress.ip_address(fixed)
            af = socket.AF_INET if ip.version == 4 else socket.AF_INET6
            results: list[ResolveResult] = [
                {
                    "hostname": host,
                    "host": fixed,
                    "port": port,
                    "family": af,
                    "proto": 0,
                    "flags": socket.AI_NUMERICHOST,
                }
            ]
        else:
            results = await self._inner.resolve(host, port, family)
        if not self._allow_private:
            loop_ok = self._allow_loopback
            results = [
                r for r in results if not is_forbidden_address(r["host"], allow_loopback=loop_ok)
            ]
            if not results:
                raise ForbiddenAddress(f"{host} resolves only to private addresses")
        self.addresses.remember(host, results[0]["host"])
        return results

    async def close(self) -> None:
        await self._inner.close()


@dataclass(slots=True)
class FetchResult:
    url: str
    status: int = 0  # 0: no HTTP response (see error)
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    # Why the body is shorter than what the server sent or promised, as WARC 1.1's
    # WARC-Truncated says it: "length" (our size cap), "time" (our timeout), "disconnect"
    # (the connection broke); "" when the body is whole.
    truncated: str = ""
    content_type: str = ""
    charset: str | None = None
    elapsed: float = 0.0
    ip: str | None = None
    # timeout | connect | dns | forbidden | protocol | disconnect (after the headers: the
    # partial body is kept, retryable)
    error: str | None = None
    location: str | None = None
    retry_after: str | None = None
    fetched_at: float = 0.0

    @property
    def is_html(self) -> bool:
        return self.content_type in ("text/html", "application/xhtml+xml")

    @property
    def is_redirect(self) -> bool:
        return self.status in REDIRECT_STATUSES and self.location is not None


class Fetcher:
    """Owns the aiohttp session; ``fetch`` never raises for network trouble."""

    def __init__(self, settings: CrawlSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None
        scope = settings.scope
        self._resolver = GuardedResolver(
            scope.allow_private, scope.allow_loopback, parse_resolve(settings.fetch.resolve)
        )
        self.user_agent = settings.effective_user_agent()

    async def start(self) -> None:
        limits = self._settings.fetch
        connector = aiohttp.TCPConnector(
            limit=max(self._settings.concurrency * 2, 8),
            limit_per_host=1,
            ttl_dns_cache=300,
            resolver=self._resolver,
            keepalive_timeout=30,
        )
        timeout = aiohttp.ClientTimeout(
            total=limits.total_timeout,
            connect=limits.connect_timeout,
            sock_read=limits.read_timeout,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": self.user_agent},
            max_line_size=limits.max_header_bytes,
            max_field_size=limits.max_header_bytes,
            auto_decompress=True,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _peer_ip(self, resp: aiohttp.ClientResponse) -> str | None:
        conn = resp.connection
        if conn is not None and conn.transport is not None:
            peer = conn.transport.get_extra_info("peername")
            if peer:
                return str(peer[0])
        host = resp.url.raw_host or ""
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            return self._resolver.addresses.get(host)

    async def address_of(self, host: str) -> str | None:
        """The address a request to ``host`` (a bare host name or IP) connects to first, or
        None if it cannot be resolved or the guard refuses it (the fetch will say why)."""
        name = host.strip("[]")
        try:
            return str(ipaddress.ip_address(name))
        except ValueError:
            pass
        known = self._resolver.addresses.get(name)
        if known is not None:
            return known
        try:
            found = await self._resolver.resolve(name, 0, socket.AF_UNSPEC)
        except (OSError, ValueError, UnicodeError):
            return None
        return str(found[0]["host"]) if found else None

    async def fetch(
        self,
        url: str,
        *,
        max_body: int | None = None,
        sink: Sink | None = None,
        total_timeout: float | None = None,
        user_agent: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> FetchResult:
        """Fetch ``url`` without following redirects. With ``sink`` the body is not kept:
        each chunk goes to it as it arrives, and a False answer ends the read ("length").
        ``total_timeout`` replaces the session's for this request; ``headers`` are added to
        the session's (a revisit's validators)."""
        assert self._session is not None, "Fetcher.start() not called"
        limit = self._settings.fetch.max_body_bytes if max_body is None else max_body
        result = FetchResult(url=url, fetched_at=time.time())
        scope = self._settings.scope
        if not scope.allow_private and _forbidden_literal(url, scope.allow_loopback):
            # Every connection passes here, robots.txt and each of its redirects included;
            # host names are checked by the resolver, IP literals (which aiohttp never
            # resolves) here.
            result.error = "forbidden"
            return result
        started = time.monotonic()
        try:
            if user_agent:
                # A domain's own User-Agent ([domains."…"] user-agent) replaces the session's.
                headers = {**(headers or {}), "User-Agent": user_agent}
            # timeout=None would mean none at all: the session's unless one is given.
            timeout = self._session.timeout
            if total_timeout is not None:
                timeout = aiohttp.ClientTimeout(
                    total=total_timeout, connect=timeout.connect, sock_read=timeout.sock_read
                )
            async with self._session.get(
                url, allow_redirects=False, headers=headers, timeout=timeout
            ) as resp:
                result.status = resp.status
                result.reason = resp.reason or ""
                result.headers = [
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers
                ]
                result.request_headers = list(resp.request_info.headers.items())
                result.content_type = resp.content_type
                result.charset = resp.charset
                result.location = resp.headers.get("Location")
                result.retry_after = resp.headers.get("Retry-After")
                result.ip = self._peer_ip(resp)
                result.body, result.truncated = await _read_body(resp, limit, sink)
                if result.truncated == "disconnect":
                    result.error = "disconnect"
        except TimeoutError:
            result.error = "timeout"
        except ForbiddenAddress:
            result.error = "forbidden"
        except aiohttp.ClientConnectorError as exc:
            # aiohttp wraps whatever the resolver raises, ForbiddenAddress included, in
            # ClientConnectorDNSError, so the guard's refusal is told apart by its cause.
            if isinstance(exc.os_error, ForbiddenAddress):
                result.error = "forbidden"
            elif isinstance(exc, aiohttp.ClientConnectorDNSError):
                result.error = "dns"
            else:
                result.error = "connect"
        except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError):
            result.error = "protocol"
        except (aiohttp.ClientError, OSError, ValueError, UnicodeError):
            result.error = "protocol"
        result.elapsed = time.monotonic() - started
        return result


Sink = Callable[[bytes], Awaitable[bool]]


async def _read_body(
    resp: aiohttp.ClientResponse, limit: int, sink: Sink | None = None
) -> tuple[bytes, str]:
    """The body, up to ``limit`` bytes, and why it is cut short ("" if whole).

    What arrived before a timeout or a broken connection is kept: it is what the server
    sent, archived with WARC-Truncated, and its links are still worth following.
    """
    chunks: list[bytes] = []
    size = 0
    reason = ""
    try:
        while True:
            chunk = await resp.content.read(_READ_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if sink is not None:
                if not await sink(chunk[: len(chunk) - max(0, size - limit)]) or size > limit:
                    reason = "length"
                    resp.close()
                    break
                continue
            if size > limit:
                chunks.append(chunk[: len(chunk) - (size - limit)])
                reason = "length"
                # The rest of the body is unread, so the connection cannot be reused.
                resp.close()
                break
            chunks.append(chunk)
    except TimeoutError:
        reason = "time"
        resp.close()
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError):
        # A reset, or a connection closed before the promised Content-Length or the last
        # chunk.
        reason = "disconnect"
        resp.close()
    return b"".join(chunks), reason


def _forbidden_literal(url: str, allow_loopback: bool) -> bool:
    """The URL's host is an IP address the SSRF guard refuses (names go to the resolver)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    return host is not None and is_forbidden_address(host, allow_loopback=allow_loopback)
