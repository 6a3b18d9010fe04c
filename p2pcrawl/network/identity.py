"""The node's identity in its data directory: the same node ID across restarts.

Stored as JSON, never pickle: a data directory may come from anywhere. A founder's ID is drawn
at random and saved at once; a brand-new joiner chooses its ID from what it learns of the
network (``protocol.survey``) and saves it once it has joined (``Peer.start``).

In an open network (no key) the ID comes from the node's own key pair (``protocol.nodekey``,
docs/security.md): ``DATA/node.key`` (mode 0600) holds the private key's seed and the nonce
that solves its puzzle, made once per data directory. A founder's ID is the key's; a joiner
chooses only the leading bits that put it into the region it splits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

from p2pcrawl.aio import Backoff
from p2pcrawl.crawl import EventLog
from p2pcrawl.settings import PeerSettings
from protocol import (
    BootstrapError,
    CrawlNode,
    NodeKey,
    PeerRef,
    chosen_bits,
    joiner_depth,
    new_node_id,
    survey,
)
from storage import DataDirLocked, DirLock

__all__ = [
    "DataDirError",
    "choose_id",
    "create_key",
    "join_through",
    "load_identity",
    "load_key",
    "load_or_create_identity",
    "lock_data_dir",
    "save_identity",
]

log = logging.getLogger(__name__)

IDENTITY_FILE = "node.json"
NODE_KEY_FILE = "node.key"
JOIN_PAUSE_S = (0.5, 5.0)  # the first pause between join attempts, and the longest


class DataDirError(Exception):
    """The data directory is unusable; the message says why and what to do."""


def lock_data_dir(data_dir: Path) -> DirLock:
    """Take the data directory for this process alone (one peer per directory): a second
    peer on it would run as the same node and hand off the live peer's work on exit."""
    lock = DirLock(data_dir)
    try:
        lock.acquire()
    except DataDirLocked as exc:
        raise DataDirError(str(exc)) from exc
    except OSError as exc:
        raise DataDirError(f"cannot lock data directory {data_dir}: {exc}") from exc
    return lock


def load_identity(data_dir: Path) -> bytes | None:
    """The saved node ID, or None for a fresh data directory (created here)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataDirError(f"cannot create data directory {data_dir}: {exc}") from exc
    path = data_dir / IDENTITY_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        node_id = bytes.fromhex(doc["node_id"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataDirError(
            f"{path} is corrupt ({exc}); move the data directory aside to start afresh"
        ) from exc
    if len(node_id) != 20:
        raise DataDirError(f"{path}: node_id must be 20 bytes, got {len(node_id)}")
    return node_id


def save_identity(data_dir: Path, node_id: bytes) -> None:
    """Write the node ID atomically (a crash leaves the old file or the new one)."""
    path = data_dir / IDENTITY_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"node_id": node_id.hex(), "version": 1}), encoding="utf-8")
    os.replace(tmp, path)


def load_key(data_dir: Path, node_id: bytes | None, work_bits: int) -> NodeKey | None:
    """The node key saved in the data directory (None if there is none yet), checked: it
    must have ``work_bits`` of work, and the saved ``node_id`` must be one of its IDs."""
    path = data_dir / NODE_KEY_FILE
    if not path.exists():
        if node_id is not None:
            raise DataDirError(
                f"{data_dir} holds a node ID without a key ({NODE_KEY_FILE}): it was made for a "
                "network with a --secret, and an open network counts only IDs made from a "
                "key; give this peer the network's --secret, or a fresh --data directory"
            )
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        key = NodeKey(bytes.fromhex(doc["seed"]), int(doc["nonce"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataDirError(
            f"{path} is corrupt ({exc}); move the data directory aside to start afresh"
        ) from exc
    if key.work_bits < work_bits:
        raise DataDirError(
            f"{path}: its key's puzzle has {key.work_bits} bits of work and this network "
            f"asks for {work_bits}; start with a fresh --data directory"
        )
    if node_id is not None and not key.answers_for(node_id):
        raise DataDirError(f"{path} does not match the node ID in {IDENTITY_FILE}")
    return key


async def create_key(data_dir: Path, work_bits: int) -> NodeKey:
    """A new node key with its puzzle solved (2**work_bits hashes), saved; in a thread."""
    return await asyncio.to_thread(_create_key, data_dir, work_bits)


def _create_key(data_dir: Path, work_bits: int) -> NodeKey:
    key = NodeKey.generate(work_bits)
    path = data_dir / NODE_KEY_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"seed": key.seed.hex(), "nonce": key.nonce, "version": 1}, f)
    os.replace(tmp, path)
    return key


def load_or_create_identity(data_dir: Path) -> bytes:
    """The saved node ID, or a random one saved now."""
    node_id = load_identity(data_dir)
    if node_id is None:
        node_id = new_node_id()
        save_identity(data_dir, node_id)
    return node_id


async def choose_id(
    bootstrap: tuple[tuple[str, int], ...],
    listen: tuple[str, int],
    settings: PeerSettings,
    fallback: bytes,
    events: EventLog,
    key: NodeKey | None = None,
) -> bytes:
    """An ID that halves the most loaded peer's region (``protocol.survey``), learned by a
    probe on our --listen address before our node exists; ``fallback`` (random) if the probe
    learns nothing in time. With ``key`` (an open network) only the leading bits that decide
    the region are chosen, the rest are the key's, and ``fallback`` should be the key's ID."""
    try:
        async with asyncio.timeout(settings.id_survey_timeout):
            found = await survey(bootstrap, listen=listen, config=settings.node_config())
    except (BootstrapError, TimeoutError) as exc:
        why = str(exc) or f"no answer within {settings.id_survey_timeout:g} s"
        log.warning("could not survey the network (%s); taking a random node ID", why)
        events.add("id_random", reason=why[:200])
        return fallback
    if not found.known:
        log.warning("the survey found no peer; taking a random node ID")
        events.add("id_random", reason="no peer found")
        return fallback
    if key is None:
        chosen = found.choose()
    else:
        known = found.known
        target = found.choose(max_depth=joiner_depth(len(known) + 1))
        chosen = key.node_id(target, chosen_bits(target, known))
    load = sum(r.load for r in found.reports.values())
    log.info(
        "chose node ID %s, which halves the busiest peer's part of the key space, from %d "
        "known peers (%d reported, %d pages)",
        chosen.hex()[:8],
        len(found.known),
        len(found.reports),
        load,
    )
    events.add("id_chosen", known=len(found.known), reported=len(found.reports), load=load)
    return chosen


async def join_through(
    node: CrawlNode, bootstrap: list[tuple[str, int]], retry_s: float, events: EventLog
) -> list[PeerRef]:
    """Join through ``bootstrap``, asking again for ``retry_s`` seconds (``--join-retry``):
    a bootstrap peer restarting, paused (SIGSTOP) or swamped by a flood answers a moment
    later, and one that answered and died before it admitted us leaves us no member. The
    last attempt's outcome stands: ``BootstrapError`` if nobody answered, else the members
    it found (none: this peer runs alone, and ``healing`` keeps trying its contacts)."""
    deadline = time.monotonic() + retry_s
    backoff = Backoff(*JOIN_PAUSE_S)
    while True:
        try:
            peers = await node.join(bootstrap)
        except BootstrapError as exc:
            if time.monotonic() >= deadline:
                n = backoff.attempt + 1
                raise BootstrapError(
                    f"{exc}; {n} attempt{'s' * (n > 1)} in {retry_s:g} s (--join-retry)"
                ) from None
            why = str(exc)
        else:
            if peers or time.monotonic() >= deadline:
                return peers
            why = "a bootstrap peer answered, but no member admitted this peer"
        wait = min(backoff.next(), max(0.0, deadline - time.monotonic()))
        log.warning(
            "join attempt %d failed: %s; trying again in %.1f s", backoff.attempt, why, wait
        )
        events.add("join_retry", attempt=backoff.attempt, reason=why[:200])
        await asyncio.sleep(wait)
