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
from pathlib import Path
from typing import TYPE_CHECKING

from protocol import BootstrapError, PeerTimeout, RemoteError

if TYPE_CHECKING:
    from p2pcrawl.network.peer import Peer

__all__ = ["CONTACTS_FILE", "Healing", "read_contacts"]

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


class Healing:
    def __init__(self, peer: Peer, interval: float, max_backoff: float) -> None:
        self.peer = peer
        self.interval = interval
        self.max_backoff = max_backoff
        self.rejoins = 0
        self._sizes: deque[tuple[float, int]] = deque()
        self._saved: list[tuple[str, int]] = read_contacts(peer.config.data_dir)

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
        node = self.peer.node
        if node is None:
            return
        me = node.me.addr
        current = [p.addr for p in node.peers()]
        merged = list(dict.fromkeys([*current, *self._saved]))
        merged = [a for a in merged if a != me][:MAX_CONTACTS]
        if merged != self._saved:
            self._saved = merged
            await asyncio.to_thread(_write_contacts, self.peer.config.data_dir, merged)

    def _needs_healing(self) -> bool:
        node = self.peer.node
        if node is None:
            return False
        size = len(node.peers())
        recent = self._recent_max(time.monotonic(), size)
        return size == 0 or size * 2 < recent

    async def rejoin(self) -> bool:
        """Join again through the saved contacts and the bootstrap addresses."""
        node = self.peer.node
        assert node is not None
        addrs = list(dict.fromkeys([*self._saved, *self.peer.config.bootstrap]))
        if not addrs:
            return False
        try:
            await node.join(addrs)
        except (BootstrapError, PeerTimeout, RemoteError, OSError) as exc:
            log.info("rejoin failed: %s", exc)
            return False
        self.rejoins += 1
        self.peer.events.add("rejoined", peers=len(node.peers()))
        self.peer.membership.kick.set()
        return True

    async def run(self) -> None:
        """Owned by the peer: save contacts, and heal a shrunken table with backoff."""
        backoff = self.interval
        while True:
            await asyncio.sleep(self.interval)
            try:
                if self._needs_healing() and self.peer.state == "active":
                    if await self.rejoin():
                        backoff = self.interval
                    else:
                        await asyncio.sleep(backoff)
                        backoff = min(2 * backoff, self.max_backoff)
                await self.save()
            except OSError as exc:
                log.warning("saving contacts failed: %s", exc)
