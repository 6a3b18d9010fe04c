"""What may be crawled: the allowed domains and the SSRF guard.

A domain matches itself and its subdomains; an IP address or a host name given with
``--allow-domain`` matches that host on any port. Every address that is not globally
reachable (loopback, private, link-local, shared, reserved, multicast, and IPv6 forms that
embed one of those) is refused unless ``--allow-private`` (``--allow-loopback`` admits only
this machine's loopback), because a crawler fed hostile links must not become a way to
reach an operator's internal services or a cloud metadata endpoint.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from p2pcrawl.aio import Memo

__all__ = ["Scope", "is_forbidden_address", "normalise_domain"]


def normalise_domain(domain: str) -> str:
    """Lowercase, strip a scheme/port/trailing dot: what users type into --allow-domain."""
    d = domain.strip().lower()
    if "://" in d:
        d = d.split("://", 1)[1]
    d = d.split("/", 1)[0]
    if d.startswith("["):  # [v6]:port
        return d[1:].split("]", 1)[0]
    if d.count(":") == 1:
        d = d.split(":", 1)[0]
    return d.rstrip(".")


# NAT64 prefixes (RFC 6052 well-known, RFC 8215 local-use): the last 32 bits are an IPv4
# address the translator connects to.
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_LOOPBACK_V4 = ipaddress.ip_network("127.0.0.0/8")


def is_forbidden_address(address: str, *, allow_loopback: bool = False) -> bool:
    """True for addresses a public crawl must never connect to.

    Allowed are only globally reachable unicast addresses (``ipaddress``'s ``is_global``:
    the IANA special-purpose registries, which also exclude the shared address space
    100.64.0.0/10 that carries cloud metadata services). An IPv6 address that embeds an
    IPv4 one (IPv4-mapped, 6to4, Teredo, NAT64) is judged by the embedded address too, since
    that is where a packet to it ends up. ``allow_loopback`` admits 127.0.0.0/8 and ::1
    alone, for crawls of servers on this machine that must still refuse everything else.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            candidates = [ip.ipv4_mapped]
        if ip.sixtofour is not None:
            candidates.append(ip.sixtofour)
        if ip.teredo is not None:
            candidates.extend(ip.teredo)
        if any(ip in net for net in _NAT64):
            candidates.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return any(_forbidden_one(c, allow_loopback) for c in candidates)


def _forbidden_one(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool) -> bool:
    if allow_loopback and (ip.is_loopback or ip in _LOOPBACK_V4):
        return False
    return bool(not ip.is_global or ip.is_multicast or ip.is_unspecified)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Scope:
    """Decides whether a host name is inside the crawl."""

    def __init__(
        self, domains: Iterable[str], *, allow_private: bool = False, allow_loopback: bool = False
    ) -> None:
        self.allow_private = allow_private
        self.allow_loopback = allow_loopback
        self._exact: set[str] = set()
        # Names (not addresses): their subdomains are in scope too. A lookup walks the
        # host's parent names (a few) instead of the list (300,000 entries took 0.4 s a host).
        self._names: set[str] = set()
        self._cache: Memo[str, bool] = Memo(65536)
        for raw in domains:
            self.add(raw)

    @property
    def domains(self) -> list[str]:
        return sorted(self._exact)

    def add(self, domain: str) -> bool:
        """Allow ``domain`` too; True when the scope grew."""
        d = normalise_domain(domain)
        if not d or d in self._exact:
            return False
        self._exact.add(d)
        if not _is_ip(d):
            self._names.add(d)
        self._cache.clear()
        return True

    def _under_a_name(self, name: str) -> bool:
        dot = name.find(".")
        while dot >= 0:
            if name[dot + 1 :] in self._names:
                return True
            dot = name.find(".", dot + 1)
        return False

    def allows_host(self, hostname: str) -> bool:
        """``hostname`` is the bare host (no port), lowercase."""
        hit = self._cache.get(hostname)
        if hit is not None:
            return hit
        # "example.com." is the fully qualified spelling of "example.com" (RFC 1034 §3.1).
        name = hostname[:-1] if hostname.endswith(".") else hostname
        ok = name in self._exact or self._under_a_name(name)
        if (
            ok
            and not self.allow_private
            and _is_ip(name)
            and is_forbidden_address(name, allow_loopback=self.allow_loopback)
        ):
            ok = False
        self._cache.remember(hostname, ok)
        return ok
