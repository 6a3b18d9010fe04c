"""The network-wide default scope: the seeds' hosts, kept in the DHT's value store.

A peer started without ``--allow-domain`` crawls the hosts of the network's seeds. Seeds
arrive through one peer, so that peer publishes their hosts under one DHT key (Kademlia
STORE), and every peer reads it back periodically and when a seed reaches it.

The value store takes a STORE from any member, so the value is only as trustworthy as the
network's membership: it is read only when ``trusted`` (a keyed network, or one confined to
loopback). An open network off loopback must give every peer ``--allow-domain``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from p2pcrawl.aio import every
from protocol import PeerRef, PeerTimeout, RemoteError, key_for

__all__ = ["MAX_SCOPE_HOSTS", "SCOPE_KEY", "ScopeSync", "parse_scope"]

# The DHT value that carries the seeds' hosts, the default scope, to every peer.
SCOPE_KEY = "p2pcrawl/scope/v1"
SCOPE_REFRESH_S = 5.0
MAX_SCOPE_HOSTS = 10_000


class Values(Protocol):
    """A local copy of a value (``storage``), and the DHT's value store (``CrawlNode``)."""

    def __setitem__(self, key: bytes, value: Any) -> None: ...

    def get(self, key: bytes, default: Any = None) -> Any: ...


class Dht(Protocol):
    """Kademlia's value store as the node serves it (``protocol.CrawlNode``)."""

    @property
    def storage(self) -> Values: ...

    def peers(self) -> list[PeerRef]: ...

    async def get(self, key: str | bytes) -> Any: ...

    async def set(self, key: str | bytes, value: Any) -> bool: ...


class ScopeCrawl(Protocol):
    """Our crawler's scope (``crawl.Engine``)."""

    @property
    def scope_from_seeds(self) -> bool: ...

    def adopt_hosts(self, hostnames: Iterable[str]) -> None: ...


class ScopeSync:
    def __init__(self, node: Dht, crawl: ScopeCrawl, *, trusted: bool) -> None:
        self.node = node
        self.crawl = crawl
        self.trusted = trusted

    async def publish(self, hosts: set[str]) -> None:
        """Merge ``hosts`` into the scope kept in the DHT's value store (Kademlia STORE)."""
        merged = sorted(set(await self.fetch()) | hosts)[:MAX_SCOPE_HOSTS]
        value = json.dumps(merged)
        # Kept here too: a lone founder has no neighbour to store it on yet, and kademlia
        # hands stored values to nodes that join later (Kademlia §2.5).
        self.node.storage[key_for(SCOPE_KEY)] = value
        with contextlib.suppress(PeerTimeout, RemoteError, OSError):
            await self.node.set(SCOPE_KEY, value)

    async def fetch(self) -> list[str]:
        if not self.node.peers():
            # Alone (a founder before anyone joined): only the local copy exists, and asking
            # the network makes kademlia warn that there is no one to ask.
            return parse_scope(self.node.storage.get(key_for(SCOPE_KEY)))
        try:
            raw = await self.node.get(SCOPE_KEY)
        except (PeerTimeout, RemoteError, OSError):
            return []
        return parse_scope(raw)

    async def refresh(self) -> None:
        if self.crawl.scope_from_seeds and self.trusted:
            self.crawl.adopt_hosts(await self.fetch())

    async def run(self) -> None:
        """Owned by the peer: read the scope now and every ``SCOPE_REFRESH_S`` seconds (a
        peer that stops answers only after a timeout: such failures are expected)."""
        await every(SCOPE_REFRESH_S, self.refresh, first=0.0, failures=logging.DEBUG)


def parse_scope(raw: object) -> list[str]:
    """The published scope, checked: it comes from the network."""
    if not isinstance(raw, str | bytes) or len(raw) > 1 << 20:
        return []
    try:
        doc = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(doc, list):
        return []
    return [h for h in doc[:MAX_SCOPE_HOSTS] if isinstance(h, str) and 0 < len(h) <= 253]
