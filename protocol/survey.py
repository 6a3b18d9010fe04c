"""A joiner's look at the network before it takes a node ID: who is there, and how loaded.

A brand-new peer should not draw its ID blindly (``balance``: random IDs leave one peer with
about ``ln N / N`` of the keys). To choose, it must know the IDs around the regions it might
split and, in a crawl under way, their loads. ``survey`` learns both with a short-lived probe
node and closes it before the real node starts, so the real node joins (and announces itself)
once, under the ID it keeps.

The probe must leave no trace in anyone's routing table: a contact there would own keys and be
sent tasks. It never gets in, because admission (``admission``) adds a sender only after a ping
to its address comes back naming its ID, and the probe answers every request, pings included,
with an error. So it needs no GOODBYE, and when the real node later answers at the same address
under another ID, nobody holds a ghost to replace.

What the probe does, bounded by the caller's timeout:

1. joins like any node (ping the bootstrap addresses, FIND_NODE on its own ID, Kademlia §2.3):
   its table fills with contacts that proved their IDs;
2. when that table may not hold everyone (``ksize`` contacts or more), looks up the owners of
   a few random keys: a random key lands in a region with probability equal to its share, so
   the large regions are found (``balance.choose_join_id``);
3. asks up to ``max_asked`` nodes for their LOAD (``loadreport``): first its contacts and
   those owners, then the nodes their replies list. A reply lists the responder's contacts,
   nearest its ID first: what the size of its region depends on, and in a network smaller
   than a k-bucket, everyone (the probe's own lookups cannot list everyone: a stranger's
   FIND_NODE answers are cut to a few contacts by the amplification bound).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from random import Random

from protocol.balance import choose_join_id
from protocol.errors import PeerTimeout, RemoteError
from protocol.loadreport import LoadReport
from protocol.messages import PeerRef
from protocol.node import CrawlNode, NodeConfig
from protocol.ownership import new_node_id
from protocol.serving import NoWork

__all__ = ["Survey", "survey"]

DAY = 86_400.0
LOOKUPS = 8  # random keys looked up when the table may not know everyone (as simulation.py)
MAX_ASKED = 32  # LOAD requests per survey


@dataclass(frozen=True, slots=True)
class Survey:
    """What the probe learned: its proven contacts, and the LOAD reports by node ID (which
    name further nodes)."""

    contacts: tuple[bytes, ...]
    reports: dict[bytes, LoadReport] = field(default_factory=dict)

    @property
    def known(self) -> set[bytes]:
        ids = set(self.contacts) | set(self.reports)
        for r in self.reports.values():
            ids.update(p.id for p in r.peers)
        return ids

    @property
    def loaded(self) -> bool:
        return any(r.load > 0 for r in self.reports.values())

    def choose(self, rng: Random | None = None, *, max_depth: int | None = None) -> bytes:
        """The ID to take: it halves the region of the most loaded node that reported a load
        (on the bit that divides its load most evenly), or, before any load exists, of the
        node with the largest share of the key space. Nobody known: a random ID. No split
        deeper than ``max_depth`` (``balance.split_id``)."""
        if self.loaded:
            reports = self.reports
            return choose_join_id(
                self.known,
                rng,
                candidates=list(reports),
                loads={i: float(r.load) for i, r in reports.items()},
                profile_of=lambda i: reports[i].profile,
                max_depth=max_depth,
            )
        # A node that reported listed its nearest contacts, so its region is known exactly.
        pool = list(self.reports) or list(self.contacts) or None
        return choose_join_id(self.known, rng, candidates=pool, max_depth=max_depth)


async def survey(
    bootstrap: Sequence[tuple[str, int]],
    *,
    listen: tuple[str, int],
    config: NodeConfig,
    max_asked: int = MAX_ASKED,
) -> Survey:
    """Learn the network through ``bootstrap`` from a probe bound to ``listen`` (the address
    the real node will use, so a firewall that lets it in lets the probe in). Raises
    ``BootstrapError`` when no bootstrap address answers; bound it with a timeout."""
    # The probe lives seconds: no liveness rounds, no refreshes, no waiting for ages, and no
    # key: it learns who is there, and proves nothing to anyone.
    cfg = replace(config, ping_interval=DAY, refresh_interval=DAY, min_owner_age=0.0, key=None)
    probe = CrawlNode(new_node_id(), NoWork(), cfg, silent=True)
    try:
        await probe.listen_on(*listen)
        await probe.join(bootstrap)
        owners: dict[bytes, PeerRef] = {}
        if len(probe.peers()) >= cfg.ksize:
            for _ in range(LOOKUPS):
                found = await probe.closest(secrets.token_bytes(20), 1)
                owners.update((p.id, p) for p in found if p.id != probe.id)
            await probe.rpc.admission.settle(3 * cfg.rpc_timeout)
        contacts = {p.id: p for p in probe.peers()}
        seen = {**owners, **contacts}
        queue = list(seen.values())
        reports: dict[bytes, LoadReport] = {}
        asked = 0
        while queue and asked < max_asked:
            batch, queue = queue[: max_asked - asked], queue[max_asked - asked :]
            asked += len(batch)
            answers = await asyncio.gather(
                *(probe.load_report(p) for p in batch), return_exceptions=True
            )
            for peer, answer in zip(batch, answers, strict=True):
                if isinstance(answer, LoadReport):
                    reports[peer.id] = answer
                    for listed in answer.peers:
                        if listed.id not in seen and listed.id != probe.id:
                            seen[listed.id] = listed
                            queue.append(listed)
                elif not isinstance(answer, PeerTimeout | RemoteError):
                    raise answer  # a bug, not a peer's silence or refusal
        return Survey(tuple(contacts), reports)
    finally:
        await probe.aclose()
