"""Whose word a peer takes that pages are done (docs/security.md, "What an open network
guarantees").

Finished pages travel between peers as done fingerprints: a handoff's done range and a
takeover's history (STORE_TASK), the owner's news to its replicas (STORE_BACKUP,
DELETE_BACKUP). A peer that takes them never fetches those URLs, so in an open network a
stranger's word alone could stop the crawl of any host: one answered every loan with "all
done" and 9,345 pages were never fetched.

In a keyed network the word of every key holder is taken: the key admits only the operators'
machines. In an open network a claim about key K is taken only from a node that

* is or was a member here: it proved an ID made from its own key (``protocol.identities``)
  and stayed ``--min-peer-age``, and the request is signed with that key (``protocol``
  drops the claims of any other request before they get here); and
* counting it, is one of the ``replicas + 2`` members nearest K: the key's owner, its
  replicas, and one more.

Every honest claim comes from such a node: an old owner handing K to a joiner is second
nearest once the joiner counts; a leaver is nearest until its goodbye (which is why a node
that has left still counts as it stood); a replica handing a dead owner's history to the
successor was among the owner's next r; the owner telling its replicas is nearest; the spare
rank covers two peers whose views differ by a node. A node whose ID a stranger cannot place
at will is among K's nearest for about (r + 2) / N of the keys: about the share it could hold
as owner or replica anyway. Lending, whose reports come from a borrower that is none of these,
is off in an open network (``parts``).

What passes the rule is still only a member's word: in an open network it is held and checked
by a sample re-fetch before anything is recorded (``vouching``); a member caught lying is
believed nowhere after.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from p2pcrawl.network.ports import Ownership
from p2pcrawl.network.vouching import Apply, Vouching
from protocol import PeerRef, distance

__all__ = ["ClaimMembers", "Claims"]


class ClaimMembers(Protocol):
    def established_before(self, peer_id: bytes) -> bool:
        """Whether the node has been a member (it may have left since)."""
        ...


class Claims:
    def __init__(
        self,
        ownership: Ownership,
        members: ClaimMembers,
        *,
        keyed: bool,
        replicas: int,
        vouching: Vouching | None = None,
    ) -> None:
        """``vouching``: where an open network's claims wait for their check (without it,
        what passes the rule is recorded at once)."""
        self._ownership = ownership
        self._members = members
        self.keyed = keyed
        self._ranks = replicas + 2
        self.vouching = vouching
        self.refused = 0  # done fingerprints not taken

    def taken(
        self,
        sender: PeerRef,
        done: Mapping[bytes, list[int]],
        apply: Apply,
        *,
        urgent: bool = True,
        checked: bool = True,
    ) -> dict[bytes, list[int]]:
        """What of ``done`` (fingerprints by key) to record now, coming from ``sender``;
        what is held for a check is recorded later with ``apply``, if it passes
        (``urgent``: ``Vouching.hold``). ``checked=False``: the rule alone decides."""
        if self.keyed or not done:
            return dict(done)
        member = self._members.established_before(sender.id)
        out: dict[bytes, list[int]] = {}
        for key, fps in done.items():
            if member and self._near(sender.id, key):
                out[key] = fps
            else:
                self.refused += len(fps)
        if self.vouching is None or not out or not checked:
            return out
        self.vouching.hold(sender, out, apply, urgent=urgent)
        return {}

    def believes(self, sender: bytes, key: bytes) -> bool:
        """Whether ``sender``'s word about the finished pages of ``key`` is taken (a visit
        history row is such a word: ``network.history``). Counts nothing."""
        if self.keyed:
            return True
        return self._members.established_before(sender) and self._near(sender, key)

    def _near(self, sender: bytes, key: bytes) -> bool:
        nearest = self._ownership.closest_local(key, self._ranks, with_self=True)
        if len(nearest) < self._ranks or any(p.id == sender for p in nearest):
            return True
        # A node that has left is counted where it stood.
        return distance(sender, key) < distance(nearest[-1].id, key)
