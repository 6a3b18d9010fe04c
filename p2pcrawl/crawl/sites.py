"""Sites: a host's registrable domain, the unit of ``--partition domain``.

``a.example.org`` and ``b.example.org`` are two hosts, often one site on the same servers.
With ``--partition domain`` the DHT key of a URL is its host's registrable domain (the
public suffix plus one label: ``example.org``, ``example.co.uk``, but ``user.github.io``),
so one peer owns the whole site and fetches it one request at a time. The Public Suffix List
comes from the ``publicsuffixlist`` package, which ships a snapshot of the list: nothing is
fetched at run time, so every peer of one version computes the same keys (peers of versions
with different snapshots could disagree about a suffix added in between, as they would
about any canonicalisation rule).

An IP address is its own site, as is a name with no public suffix (``localhost``).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from publicsuffixlist import PublicSuffixList

from p2pcrawl.crawl import urls
from p2pcrawl.settings import Partition

__all__ = ["queue_of", "registrable_domain", "site_of"]

_psl: PublicSuffixList | None = None


def _list() -> PublicSuffixList:
    global _psl
    if _psl is None:
        _psl = PublicSuffixList()  # the packaged snapshot: about 0.2 s to load, once
    return _psl


@lru_cache(maxsize=65536)
def registrable_domain(hostname: str) -> str:
    """The registrable domain of a lower-case host name (no port); the name itself for an
    IP address, a public suffix, or a name the list does not cover."""
    name = hostname[:-1] if hostname.endswith(".") else hostname
    if not name or name.startswith("[") or _is_ip(name):
        return name
    found = _list().privatesuffix(name)
    return found if isinstance(found, str) and found else name


def site_of(url: str) -> str:
    """The registrable domain of a canonical URL's host."""
    return registrable_domain(urls.hostname_of(url))


def queue_of(url: str, partition: Partition) -> str:
    """The frontier queue a canonical URL waits in: its host, or under the domain
    partition its site (one request at a time, one politeness gap for the whole site)."""
    return site_of(url) if partition == "domain" else urls.host_of(url)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
