"""Healing: a peer remembers its recent contacts and finds its network again.

Kademlia only learns of peers through traffic, so a peer whose table emptied (a partition,
a burst that got everyone declared dead, a long stall) stays alone forever: nobody it knows
is left to talk to. Here a peer

* saves the addresses of its recent contacts in its data directory (``contacts.json``), so a
  restarted peer rejoins its last network without ``--bootstrap``;
* watches its routing table: when it is empty, or under half of the largest size seen in the
  last ``WINDOW_S`` seconds, it joins again through the saved contacts and the original
  ``--bootstrap`` addresses, with exponential backoff (``heal_interval`` doubling up to
  ``heal_max_backoff``) while nobody answers.

Two halves of a split network therefore merge within ``heal_interval + heal_max_backoff``
seconds (plus one join round trip) after the cause stops: each half still has the other's
addresses on disk. docs/membership.md states the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from p2pcrawl.aio import Backoff, every
from p2pcrawl.crawl import EventLog
from protocol import BootstrapError, PeerRef, PeerTimeout, RemoteError

__all__ = ["CONTACTS_FILE", "Healing", "Rejoin", "read_contacts"]

log = logging.getLogger(__name__)

CONTACTS_FILE = "contacts.json"
MAX_CONTACTS = 32
WINDOW_S = 300.0


def read_contacts(data_dir: Path) -> list[tuple[str, int]]:
    """Saved contact addresses, validated (the file may be stale, edited or damaged)."""
    try:
        doc = json.loads((data_dir / CONTACTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out: list[tuple[str, int]] = []
    for item in doc.get("contacts", []) if isinstance(doc, dict) else []:
        if (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and type(item[1]) is int
            and 0 < item[1] < 65536
        ):
            out.append((item[0], item[1]))
    return out[:MAX_CONTACTS]


def _write_contacts(data_dir: Path, contacts: list[tuple[str, int]]) -> None:
    target = data_dir / CONTACTS_FILE
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=CONTACTS_FILE, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": 1, "contacts": [[h, p] for h, p in contacts]}, f)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Rejoin(Protocol):
    """What healing asks of the node (``protocol.CrawlNode``)."""

    @property
    def me(self) -> PeerRef: ...

    def peers(self) -> list[PeerRef]: ...

    async def join(self, addrs: Sequence[tuple[str, int]]) -> list[PeerRef]: ...


class Healing:
    def __init__(
        self,
        node: Rejoin,
        events: EventLog,
        *,
        data_dir: Path,
        saved: list[tuple[str, int]],
        bootstrap: Sequence[tuple[str, int]],
        active: Callable[[], bool],
        rebalance_soon: Callable[[], None],
        interval: float,
        max_backoff: float,
    ) -> None:
        """``saved``: the contacts read from ``data_dir`` (``read_contacts``)."""
        self.node = node
        self.events = events
        self.data_dir = data_dir
        self.bootstrap = tuple(bootstrap)
        self._active = active
        self._rebalance_soon = rebalance_soon
        self.interval = interval
        self._backoff = Backoff(interval, max_backoff)
        self.rejoins = 0
        self._sizes: deque[tuple[float, int]] = deque()
        self._saved = list(saved)

    @property
    def saved(self) -> list[tuple[str, int]]:
        return list(self._saved)

    def _recent_max(self, now: float, size: int) -> int:
        self._sizes.append((now, size))
        while self._sizes and self._sizes[0][0] < now - WINDOW_S:
            self._sizes.popleft()
        return max(n for _, n in self._sizes)

    async def save(self) -> None:
        """Remember who we know now, newest first, keeping older addresses behind them."""
        me = self.node.me.addr
        current = [p.addr for p in self.node.peers()]
        merged = list(dict.fromkeys([*current, *self._saved]))
        merged = [a for a in merged if a != me][:MAX_CONTACTS]
        if merged != self._saved:
            self._saved = merged
            await asyncio.to_thread(_write_contacts, self.data_dir, merged)

    def _needs_healing(self) -> bool:
        size = len(self.node.peers())
        recent = self._recent_max(time.monotonic(), size)
        return size == 0 or size * 2 < recent

    async def rejoin(self) -> bool:
        """Join again through the saved contacts and the bootstrap addresses."""
        addrs = list(dict.fromkeys([*self._saved, *self.bootstrap]))
        if not addrs:
            return False
        try:
            await self.node.join(addrs)
        except (BootstrapError, PeerTimeout, RemoteError, OSError) as exc:
            log.info("rejoin failed: %s", exc)
            return False
        self.rejoins += 1
        self.events.add("rejoined", peers=len(self.node.peers()))
        self._rebalance_soon()
        return True

    async def run(self) -> None:
        """Owned by the peer: save contacts, and heal a shrunken table with backoff."""
        await every(self.interval, self._round)

    async def _round(self) -> None:
        try:
            if self._needs_healing() and self._active():
                if await self.rejoin():
                    self._backoff.reset()
                else:
                    await asyncio.sleep(self._backoff.next())
            await self.save()
        except OSError as exc:
            log.warning("saving contacts failed: %s", exc)
