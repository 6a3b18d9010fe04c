"""The parts of a canonical URL (``p2pcrawl.crawl.urls`` makes them and re-exports these):
its fingerprint, host key, hostname, origin and DHT partition key, and RFC 3986's removal of
dot segments from a path. Plain string operations: a canonical URL needs no parsing.
"""

from __future__ import annotations

import xxhash

__all__ = [
    "fingerprint",
    "host_of",
    "hostname_of",
    "origin_of",
    "partition_key",
    "remove_dot_segments",
]


def fingerprint(url: str) -> int:
    """The 64-bit fingerprint the done record and seen filters key on (xxh3, unsigned)."""
    return xxhash.xxh3_64_intdigest(url.encode())


def host_of(url: str) -> str:
    """The host key of a canonical URL, the unit of ownership under ``--partition host``: its
    authority, "host" or "host:port" (canonical URLs carry no userinfo and no default port)."""
    start = url.find("://") + 3
    end = url.find("/", start)
    return url[start:] if end == -1 else url[start:end]


def hostname_of(url: str) -> str:
    """The host of a canonical URL without the port; IPv6 without brackets ("::1")."""
    authority = host_of(url)
    if authority.startswith("["):
        return authority[1 : authority.find("]")]
    return authority.partition(":")[0]


def partition_key(url: str, partition: str) -> str:
    """What a canonical URL contributes to its DHT key: its host key, the URL itself, or its
    host's registrable domain (``p2pcrawl.crawl.sites``)."""
    if partition == "host":
        return host_of(url)
    if partition == "url":
        return url
    if partition == "domain":
        from p2pcrawl.crawl.sites import site_of  # it builds on p2pcrawl.crawl.urls

        return site_of(url)
    raise ValueError(f"unknown partition {partition!r}")


def origin_of(url: str) -> str:
    """ "scheme://host[:port]" of a canonical URL."""
    start = url.find("://") + 3
    end = url.find("/", start)
    return url if end == -1 else url[:end]


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 on a path that starts with "/": "." segments go, ".." takes the
    segment before it (none above the root), and a path ending in either ends in "/"."""
    segments = path.split("/")
    out: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)
