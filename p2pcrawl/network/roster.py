"""Who is in the network, as this peer sees it, and who hears when that changes.

The node keeps the routing table and its rules (``protocol``: a contact is a *member* once
admitted and established, until it is declared dead, says GOODBYE or is replaced). The
peer's collaborators ask the roster, not the node, and hear from it when membership changes:

* ``on_change``: who owns which key may have changed (a member came or went, or this node
  began owning keys at the end of its join): cached owners and replica sets are stale, and
  a rebalance pass is due;
* ``on_contacts``: a contact entered the table too young to be a member: it owns nothing
  yet, but it may be among a key's replicas now (``replication``);
* ``on_departure``: a contact left the table, member or not, declared dead
  (``"unresponsive"``), gone with a GOODBYE (``"goodbye"``) or replaced by another contact
  (``"replaced"``): whatever this peer keeps for it (leases, loans, copies to tell, history
  sent, a join's wait for its answer) is let go. Work queued for it before then is not sent
  after: every lane asks ``gone`` when it flushes (docs/membership.md, "A dead or departed
  peer is forgotten everywhere").

The node tells the roster through the peer's inbox (``inbox.Inbox``), which is the node's
``CrawlHandler``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from p2pcrawl.crawl import EventLog
from protocol import PeerRef

__all__ = ["MemberTable", "Roster"]

Departure = Callable[[bytes, str], None]

GONE_REMEMBERED = 4096  # departed IDs remembered until they come back (bounded)


class MemberTable(Protocol):
    """The node's answers about its members (``protocol.CrawlNode``)."""

    def peers(self) -> list[PeerRef]: ...

    def is_member(self, peer_id: bytes) -> bool: ...

    def member(self, peer_id: bytes) -> PeerRef | None: ...

    def suspects(self) -> list[bytes]: ...


class Roster:
    def __init__(self, table: MemberTable, events: EventLog) -> None:
        self._table = table
        self._events = events
        self._on_change: list[Callable[[], None]] = []
        self._on_contacts: list[Callable[[], None]] = []
        self._on_departure: list[Departure] = []
        self._gone: OrderedDict[bytes, None] = OrderedDict()

    # -- the answers ---------------------------------------------------------------------

    def peers(self) -> list[PeerRef]:
        """Every member (never this peer)."""
        return self._table.peers()

    def is_member(self, peer_id: bytes) -> bool:
        return self._table.is_member(peer_id)

    def member(self, peer_id: bytes) -> PeerRef | None:
        """The member with this ID at the address the table knows now, or None: a peer
        restarted with its data directory keeps its ID on a new port."""
        return self._table.member(peer_id)

    def suspects(self) -> list[bytes]:
        """Members the failure detector suspects now (not yet declared dead)."""
        return self._table.suspects()

    def gone(self, peer_id: bytes) -> bool:
        """Whether ``peer_id`` left the table (dead, GOODBYE, replaced) and has not come
        back since: nothing queued for it before it left is sent to it now."""
        return peer_id in self._gone

    # -- who hears of changes --------------------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> None:
        self._on_change.append(listener)

    def on_contacts(self, listener: Callable[[], None]) -> None:
        self._on_contacts.append(listener)

    def on_departure(self, listener: Departure) -> None:
        self._on_departure.append(listener)

    def arrived(self, peer: PeerRef) -> None:
        """A contact became a member."""
        self._gone.pop(peer.id, None)
        self._events.add("peer_added", peer=peer.id.hex()[:8], addr=f"{peer.host}:{peer.port}")
        self.owners_changed()

    def contact_arrived(self, peer: PeerRef) -> None:
        """A contact entered the table, too young to own keys: a replica candidate."""
        self._gone.pop(peer.id, None)
        for listener in self._on_contacts:
            listener()

    def departed(self, peer: PeerRef, reason: str) -> None:
        """A contact left the table (``reason``: "unresponsive", "goodbye", "replaced")."""
        gone = self._gone
        gone[peer.id] = None
        gone.move_to_end(peer.id)
        if len(gone) > GONE_REMEMBERED:
            gone.popitem(last=False)
        kind = "peer_left" if reason == "goodbye" else "peer_lost"
        self._events.add(
            kind, peer=peer.id.hex()[:8], addr=f"{peer.host}:{peer.port}", reason=reason
        )
        for listener in self._on_departure:
            listener(peer.id, reason)
        self.owners_changed()

    def owners_changed(self) -> None:
        """Who owns which key may have changed (also when this node takes ownership)."""
        for listener in self._on_change:
            listener()
