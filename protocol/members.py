"""Who counts: the one answer to "is this peer a member?" and to "may it own keys yet?".

The routing table (``routing.ContactTable``) holds every contact admitted to it. A contact
counts as a *member*, one that owns keys and is sent work, only once *established*: it has
stayed in the table ``min_owner_age`` seconds, so a node that appears next to a busy key and
vanishes again cannot catch the key's queue on the way. Contacts found while this node joins
count at once (a joiner has nothing older to compare with), and so does an ID that was
established before and comes back (a restart with its data directory: it proved itself
already, and making it wait would leave its own queue and the replicas' takeover of it
crawling the same hosts). A contact old enough that asks for its keys (REFRESH_TASK) is
counted at once, even if its timer has not run yet (``establish_early``).

The rule holds for this node about itself too: while it joins (``hold_ownership`` until
``take_ownership``) it names itself owner of nothing, so the keys it will own stay with their
old owner until that owner has handed them over; otherwise the newcomer would crawl a host
while its old owner, which does not count the newcomer yet, crawls it too.

A contact too young to own keys may still hold copies: ``contacts`` lists every contact of
the table, young or established, and is where a key's replicas are drawn from (the age rule
keeps a new ID from *owning* keys, never from *replicating* them: docs/membership.md, "No
window without redundancy"). ``on_contact`` hears of a young contact as it enters the table,
``on_removed`` of every contact that leaves it, young or established.

On an open wire where this node has a key, a contact counts only once it has also proven its
ID (``identities``): the minimum age runs from its admission, but it is not established
before the proof, however old. A contact that cannot prove its ID (a stock kademlia node)
stays a contact of the routing table and never becomes a member.

``version`` changes whenever any of this may have changed (the table's contacts or
addresses, an establishment, the hold): caches of answers derived from the members
(``owners.Owners``) are valid while it stays the same.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from protocol.contacts import peer_of
from protocol.identities import Identities
from protocol.kbucket import Node
from protocol.model import PeerRef
from protocol.routing import ContactTable

__all__ = ["PROVEN_IDS", "Members"]

PROVEN_IDS = 4096  # established IDs remembered after they leave the table


class Members:
    def __init__(
        self,
        table: ContactTable,
        min_owner_age: float,
        *,
        on_added: Callable[[PeerRef], None],
        on_removed: Callable[[PeerRef, str], None],
        on_contact: Callable[[PeerRef], None] = lambda peer: None,
        identities: Identities | None = None,
    ) -> None:
        """``on_added``: a contact became a member; ``on_contact``: a contact entered the
        table too young to be one; ``on_removed``: a contact left the table, member or not;
        ``identities``: who has proven its ID (``required`` on an open wire with a key)."""
        self._table = table
        self._min_age = min_owner_age
        self._identities = identities if identities is not None and identities.required else None
        self._unproven: set[bytes] = set()  # admitted contacts whose proof is awaited
        if self._identities is not None:
            self._identities.on_proven = self._identity_proven
        self._on_added = on_added
        self._on_removed = on_removed
        self._on_contact = on_contact
        self._admitted: dict[bytes, asyncio.TimerHandle | None] = {}  # None once established
        self._admitted_at: dict[bytes, float] = {}  # loop time a contact entered the table
        self._changes = 0
        self.owner_ready = True  # False while joining: this node owns no key yet
        self.joining = False  # contacts found meanwhile are established at once
        # IDs established before, most recent last (bounded: an attacker's IDs are new ones).
        self._proven: OrderedDict[bytes, None] = OrderedDict()
        self._cache: tuple[int, dict[bytes, Node]] = (-1, {})
        self._contacts: tuple[int, dict[bytes, Node]] = (-1, {})

    @property
    def version(self) -> int:
        return self._table.version + self._changes

    # --- the answers ---------------------------------------------------------------------

    def nodes(self) -> dict[bytes, Node]:
        """The members by ID (cached until ``version`` changes; do not modify)."""
        version, members = self._cache
        if version != self.version:
            members = {
                n.id: n
                for n in self._table.members()
                if n.id in self._admitted and self._admitted[n.id] is None
            }
            self._cache = (self.version, members)
        return members

    def contacts(self) -> dict[bytes, Node]:
        """Every contact of the routing table by ID, young or established, its ID proven
        where proofs are required (cached until ``version`` changes; do not modify): the
        candidates for a key's copies."""
        version, contacts = self._contacts
        if version != self.version:
            # On an open wire a contact that has not proven its ID holds no copy either: an
            # ID placed at will next to a key would otherwise be handed that key's backups.
            unproven = self._unproven
            contacts = {n.id: n for n in self._table.members() if n.id not in unproven}
            self._contacts = (self.version, contacts)
        return contacts

    def in_table(self, peer_id: bytes) -> bool:
        """In the routing table, young or established: a peer our calls may still reach."""
        return peer_id in self.contacts()

    def peers(self) -> list[PeerRef]:
        """Every member (never this node)."""
        return [peer_of(n) for n in self.nodes().values()]

    def is_member(self, peer_id: bytes) -> bool:
        return peer_id in self.nodes()

    def member(self, peer_id: bytes) -> PeerRef | None:
        """The member with this ID as the table knows it now (its address may have changed
        since a caller last looked), or None."""
        node = self.nodes().get(peer_id)
        return None if node is None else peer_of(node)

    def established_before(self, peer_id: bytes) -> bool:
        """Whether the node was a member at some time (it may be one still, or have left)."""
        return peer_id in self._proven

    def owner_wait(self, peer_id: bytes) -> float | None:
        """Seconds until the contact may own keys: 0 once established, None if it is not in
        the routing table (not admitted yet, or gone) or has not proven its ID yet."""
        if peer_id not in self._admitted:
            return None
        if self._admitted[peer_id] is None:
            return 0.0
        age = asyncio.get_running_loop().time() - self._admitted_at.get(peer_id, 0.0)
        return max(0.0, self._min_age - age)

    # --- changes -------------------------------------------------------------------------

    def contact_added(self, peer: PeerRef) -> None:
        """The table admitted ``peer``: establish it now or after the minimum age (once it
        has proven its ID, where that is required)."""
        self._admitted_at.setdefault(peer.id, asyncio.get_running_loop().time())
        ids = self._identities
        if ids is not None and not ids.proven(peer.id):
            self._unproven.add(peer.id)
            ids.check(peer)
            return
        self._admit(peer)

    def _admit(self, peer: PeerRef) -> None:
        loop = asyncio.get_running_loop()
        if self._min_age <= 0 or self.joining or peer.id in self._proven:
            self._establish(peer)
        elif peer.id not in self._admitted:
            age = loop.time() - self._admitted_at.get(peer.id, loop.time())
            wait = max(0.0, self._min_age - age)
            self._admitted[peer.id] = loop.call_later(wait, self._establish, peer)
            self._on_contact(peer)

    def _identity_proven(self, peer_id: bytes) -> None:
        if peer_id not in self._unproven:
            return
        self._unproven.discard(peer_id)
        self._changes += 1  # a candidate for copies now (``contacts``)
        node = self._table.get(peer_id)
        if node is not None:
            self._admit(peer_of(node))

    def contact_removed(self, peer: PeerRef, reason: str) -> None:
        self._unproven.discard(peer.id)
        self._admitted_at.pop(peer.id, None)
        if peer.id not in self._admitted:
            return
        timer = self._admitted.pop(peer.id)
        if timer is None:
            self._changes += 1
        else:
            timer.cancel()
        # Young or established, it may hold copies and be owed news: the crawler lets go.
        self._on_removed(peer, reason)

    def establish_early(self, peer_id: bytes) -> bool:
        """Make sure a contact that has reached the minimum age counts as a member now, even
        if its timer has not run yet. False if it is absent or too young."""
        if self.owner_wait(peer_id) != 0.0:
            return False
        timer = self._admitted.get(peer_id)
        node = self._table.get(peer_id)
        if timer is not None and node is not None:
            timer.cancel()
            self._establish(peer_of(node))
        return True

    def hold_ownership(self) -> None:
        """Own no key until ``take_ownership``: this node is joining."""
        if self.owner_ready:
            self.owner_ready = False
            self._changes += 1

    def take_ownership(self) -> bool:
        """Own the keys closest to this node from now on; True if that is a change."""
        if self.owner_ready:
            return False
        self.owner_ready = True
        self._changes += 1
        return True

    def close(self) -> None:
        """Cancel the timers of contacts not established yet."""
        for timer in self._admitted.values():
            if timer is not None:
                timer.cancel()

    def _establish(self, peer: PeerRef) -> None:
        if peer.id in self._admitted and self._admitted[peer.id] is None:
            return
        if self._table.get(peer.id) is None:
            self._admitted.pop(peer.id, None)  # left before it was established
            return
        self._admitted[peer.id] = None
        self._proven[peer.id] = None
        self._proven.move_to_end(peer.id)
        if len(self._proven) > PROVEN_IDS:
            self._proven.popitem(last=False)
        self._changes += 1
        self._on_added(peer)
