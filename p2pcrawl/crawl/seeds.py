"""What becomes of a seed URL, said per URL before it is routed.

A seed can be refused for a reason the operator can fix (no scheme, a host outside
``--allow-domain``, an ``--exclude`` pattern or a ``[domains."…"]`` table's, an address the
SSRF guard refuses without ``--allow-private``); each is reported with that reason instead
of being dropped later out of sight. What the owner then says (new, or already queued or
done) is added by the peer.

Host names are compared as they are spelled: ``localhost`` and ``127.0.0.1`` are two hosts
(two owners, two robots.txt, two entries in the WARC index), as in the WARC and CDX
formats; seeding both crawls that site twice.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar

from p2pcrawl.crawl import urls
from p2pcrawl.crawl.domains import DomainTable
from p2pcrawl.crawl.patterns import UrlPatterns
from p2pcrawl.crawl.scope import Scope, is_forbidden_address

__all__ = ["SeedVerdict", "check_seed", "resolve_addresses", "scheme_hint"]

ACCEPTED = "accepted"
INVALID = "invalid"
OUT_OF_SCOPE = "out_of_scope"
PRIVATE = "refused_private"
ALREADY_KNOWN = "already_known"
RESOLVE_TIMEOUT_S = 3.0
SHOWN_CHARS = 200

Resolve = Callable[[str], Awaitable[list[str]]]


@dataclass(slots=True)
class SeedVerdict:
    ACCEPTED: ClassVar[str] = ACCEPTED
    ALREADY_KNOWN: ClassVar[str] = ALREADY_KNOWN

    url: str  # as given
    result: str  # accepted | invalid | out_of_scope | refused_private | already_known
    reason: str = ""
    canonical: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {
            "url": self.url,
            "canonical": self.canonical,
            "result": self.result,
            "reason": self.reason,
        }


async def resolve_addresses(host: str) -> list[str]:
    """Every address ``host`` resolves to (the loop's resolver, never a blocking call)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError):
        return []
    return [str(info[4][0]) for info in infos]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _guard_reason(host: str, loopback_allowed: bool) -> str:
    if loopback_allowed:
        return (
            f"{host} is a private or link-local address, which the SSRF guard refuses "
            "(--allow-loopback admits only this machine's loopback); start the peers with "
            "--allow-private to crawl it"
        )
    return (
        f"{host} is a loopback, private or link-local address, which the SSRF guard "
        "refuses; start the peers with --allow-loopback (this machine only) or "
        "--allow-private to crawl it"
    )


def scheme_hint(raw: str) -> str:
    text = raw.strip()
    if "://" not in text and text and " " not in text:
        return f"no scheme: did you mean https://{text}?"
    return "not an http(s) URL with a host"


async def check_seed(
    raw: str,
    *,
    scope: Scope,
    scope_from_seeds: bool,
    patterns: UrlPatterns,
    max_url_length: int,
    domains: DomainTable | None = None,
    resolve: Resolve = resolve_addresses,
) -> SeedVerdict:
    """The verdict on one seed by this peer's own configuration (not yet the owner's).

    The address guard is the scope's own (``--allow-private``, ``--allow-loopback``), the one
    the fetcher applies, so a seed is refused here exactly when its fetch would be.
    """
    url = urls.canonicalize(raw, max_length=max_url_length)
    if url is None:
        # Echoed back in the verdict: a few hundred characters say which one it was.
        shown = raw[:SHOWN_CHARS]
        return SeedVerdict(shown, INVALID, scheme_hint(shown))
    host = urls.hostname_of(url)
    if not scope.allow_private:
        loop_ok = scope.allow_loopback
        if _is_ip(host):
            refused = is_forbidden_address(host, allow_loopback=loop_ok)
        else:
            addresses = await resolve(host)
            # A name that does not resolve now is left to the fetch, which records the error.
            refused = bool(addresses) and all(
                is_forbidden_address(a, allow_loopback=loop_ok) for a in addresses
            )
        if refused:
            return SeedVerdict(raw, PRIVATE, _guard_reason(host, loop_ok), url)
    if not scope_from_seeds and not scope.allows_host(host):
        allowed = ", ".join(scope.domains[:5]) + (" ..." if len(scope.domains) > 5 else "")
        return SeedVerdict(
            raw, OUT_OF_SCOPE, f"host {host} is not in --allow-domain ({allowed})", url
        )
    refusal = patterns.refusal(url)
    if refusal is None and domains:
        refusal = domains.refusal(url)  # names the [domains."…"] table
    if refusal is not None:
        return SeedVerdict(raw, OUT_OF_SCOPE, refusal, url)
    return SeedVerdict(raw, ACCEPTED, "", url)
