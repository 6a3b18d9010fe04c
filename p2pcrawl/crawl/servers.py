"""Politeness by server (``--politeness-by ip``): hosts at one address share one gap and
one connection slot on this peer.

BUbiNG keeps a politeness delay per IP address as well as per host, and Heritrix can queue
by IP: ``a.example.org`` and ``b.example.org`` (or ``host:8001`` and ``host:8002``) are often
one machine, which per-host politeness would hit with two requests at once. A host's address
is learnt before its first request here (:meth:`p2pcrawl.crawl.fetcher.Fetcher.address_of`);
from then on its queue's :class:`~p2pcrawl.crawl.politeness.HostPoliteness` *is* the
server's, shared by every host at that address, so the frontier's rule (no request while
busy, none before the gap has run) holds per server. What this does not do across peers is
said in docs/signals.md: two hosts at one address owned by two peers are fetched by both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from p2pcrawl.crawl.politeness import HostPoliteness

if TYPE_CHECKING:
    from p2pcrawl.crawl.frontier import HostQueue

__all__ = ["Servers"]


class Servers:
    """Server address -> its politeness state and the host queues under it."""

    def __init__(self) -> None:
        self._state: dict[str, HostPoliteness] = {}
        self._hosts: dict[str, set[HostQueue]] = {}

    def __len__(self) -> int:
        return len(self._state)

    def join(self, hq: HostQueue, address: str, now: float) -> bool:
        """Put ``hq`` (held by a slot: its own state busy) under the server at ``address``.
        True: its request may go ahead now, the server marked busy for it. False: the
        server is busy or resting; ``hq``'s own state is released and the host waits."""
        hq.unit = address
        self._hosts.setdefault(address, set()).add(hq)
        server = self._state.get(address)
        if server is None:
            self._state[address] = hq.polite  # the first host's state becomes the server's
            return True
        if server is hq.polite:
            return True
        own, hq.polite = hq.polite, server
        own.busy = False
        if server.busy or server.next_allowed > now:
            return False
        server.start(now)
        return True

    def waiting(self, hq: HostQueue) -> Iterator[HostQueue]:
        """The other hosts at ``hq``'s server that have work and are not in line."""
        for other in self._hosts.get(hq.unit or "", ()):
            if (
                other is not hq
                and other.tasks
                and not other.queued
                and not other.removed
                and other.reserved is None
            ):
                yield other

    def leave(self, hq: HostQueue) -> None:
        """``hq`` leaves the frontier (pruned, or handed to another peer)."""
        if hq.unit is None:
            return
        hosts = self._hosts.get(hq.unit)
        if hosts is None:
            return
        hosts.discard(hq)
        server = self._state.get(hq.unit)
        if not hosts and (server is None or not server.busy):
            del self._hosts[hq.unit]
            self._state.pop(hq.unit, None)
