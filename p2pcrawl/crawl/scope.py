"""What may be crawled: the allowed domains and the SSRF guard.

A domain matches itself and its subdomains; an IP address or a host name given with
``--allow-domain`` matches that host on any port. Addresses in loopback, private,
link-local, multicast or reserved ranges are refused unless ``--allow-private``, because a
crawler fed hostile links must not become a way to reach an operator's internal services.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

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


def is_forbidden_address(address: str) -> bool:
    """True for addresses a public crawl must never connect to."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Scope:
    """Decides whether a host name is inside the crawl."""

    def __init__(self, domains: Iterable[str], *, allow_private: bool = False) -> None:
        self.allow_private = allow_private
        self._exact: set[str] = set()
        self._suffixes: list[str] = []
        for raw in domains:
            d = normalise_domain(raw)
            if not d:
                continue
            self._exact.add(d)
            if not _is_ip(d):
                self._suffixes.append("." + d)
        self._cache: dict[str, bool] = {}

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
            self._suffixes.append("." + d)
        self._cache.clear()
        return True

    def allows_host(self, hostname: str) -> bool:
        """``hostname`` is the bare host (no port), lowercase."""
        hit = self._cache.get(hostname)
        if hit is not None:
            return hit
        # "example.com." is the fully qualified spelling of "example.com" (RFC 1034 §3.1).
        name = hostname[:-1] if hostname.endswith(".") else hostname
        ok = name in self._exact or any(name.endswith(s) for s in self._suffixes)
        if ok and not self.allow_private and _is_ip(name) and is_forbidden_address(name):
            ok = False
        if len(self._cache) > 65536:
            self._cache.clear()
        self._cache[hostname] = ok
        return ok
