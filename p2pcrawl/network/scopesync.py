"""The network-wide scope, kept in the DHT's value store: the seeds' hosts, and the
per-domain rules.

A peer started without ``--allow-domain`` crawls the hosts of the network's seeds. Seeds
arrive through one peer, so that peer publishes their hosts under one DHT key (Kademlia
STORE), and every peer reads it back periodically and when a seed reaches it.

A host's owner applies its domain's rules (the config's ``[domains."…"]`` tables: delay,
concurrency, budget, patterns, User-Agent), and any peer may own it: so a peer with such
tables publishes them under a second key, and the others adopt them for the domains they
have no table of their own for, read back every few seconds.

The value store takes a STORE from any member, so the value is only as trustworthy as the
network's membership: it is read only when ``trusted`` (a keyed network, or one confined to
loopback). An open network off loopback must give every peer ``--allow-domain``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from p2pcrawl.aio import every
from p2pcrawl.crawl import DomainTable, decode_rules, encode_rules
from protocol import PeerRef, PeerTimeout, RemoteError, key_for

__all__ = ["MAX_SCOPE_HOSTS", "SCOPE_KEY", "ScopeSync", "parse_scope"]

# The DHT value that carries the seeds' hosts, the default scope, to every peer.
SCOPE_KEY = "p2pcrawl/scope/v1"
RULES_KEY = "p2pcrawl/domains/v1"
SCOPE_REFRESH_S = 5.0
RULES_REPUBLISH_S = 60.0
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

    @property
    def domains(self) -> DomainTable: ...


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
        return parse_scope(await self._get(SCOPE_KEY))

    async def _get(self, key: str) -> object:
        if not self.node.peers():
            # Alone (a founder before anyone joined): only the local copy exists, and asking
            # the network makes kademlia warn that there is no one to ask.
            return self.node.storage.get(key_for(key))
        try:
            return await self.node.get(key)
        except (PeerTimeout, RemoteError, OSError):
            return None

    @property
    def needed(self) -> bool:
        """Whether there is anything to keep in step with the network."""
        return self.trusted or self.crawl.scope_from_seeds or bool(self.crawl.domains.own)

    async def publish_rules(self) -> None:
        """Put this peer's own per-domain rules where the others read them, merged into
        what is there (a peer's own tables win over the network's for its domains)."""
        own = self.crawl.domains.own
        if not own:
            return
        merged = {**decode_rules(await self._get(RULES_KEY)), **own}
        value = encode_rules(sorted(merged.items()))
        self.node.storage[key_for(RULES_KEY)] = value
        with contextlib.suppress(PeerTimeout, RemoteError, OSError):
            await self.node.set(RULES_KEY, value)

    async def refresh(self) -> None:
        if self.crawl.scope_from_seeds and self.trusted:
            self.crawl.adopt_hosts(await self.fetch())
        if self.trusted:
            self.crawl.domains.adopt(decode_rules(await self._get(RULES_KEY)))

    async def run(self) -> None:
        """Owned by the peer: publish this peer's own rules now and every
        ``RULES_REPUBLISH_S`` (a value lives on the nodes nearest its key, and those change
        as peers come and go), and read the scope and the rules every ``SCOPE_REFRESH_S``
        (a peer that stops answers only after a timeout: such failures are expected)."""
        if self.crawl.domains.own:
            await self.publish_rules()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(every(RULES_REPUBLISH_S, self.publish_rules, failures=logging.DEBUG))
            tasks.create_task(
                every(SCOPE_REFRESH_S, self.refresh, first=0.0, failures=logging.DEBUG)
            )


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
