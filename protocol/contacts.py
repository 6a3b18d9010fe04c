"""Who is in the routing table: welcoming contacts, replacing ghosts, honouring goodbyes.

``Contacts`` holds the table (``routing.ContactTable``), the failure detector
(``liveness.Detector``) and admission (``admission.Admission``), and is one idea: the rules
for trusting a contact. The RPC layer (``rpc.Rpc``) feeds it what it hears and lends it the
three calls it makes itself (a ping, a STORE, an admission probe).

* ``welcome_if_new`` decides which stored values a new node should receive (Kademlia §2.5).
  kademlia measured distances to ``digest(key)`` -- a hash of the stored digest -- so it
  handed values to the wrong nodes; and it fired the stores with ``ensure_future`` and no
  owner. Known contacts are moved to the tail of their bucket (§2.2), which stock skipped.
* A reply proves who lives at an address. A request claiming a new ID from an address we know
  under another ID is checked by pinging the old contact: the answer tells whether it restarted
  with a new ID (the ghost is replaced) or the claim was false.
* A new contact, or a known one at a new address, enters the table only with proof of its ID
  at that address; without it, ``admission.Admission`` challenges the claim first.
* A missed reply makes a suspect, never an eviction; anything heard from a suspect clears
  it. The probe loop (``upkeep.probe_suspects``) declares a suspect dead on the rules of
  ``liveness`` (time, indirect probes, local health), and only then is it removed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from protocol.admission import Admission, AdmissionLimits
from protocol.kbucket import Node
from protocol.liveness import Detector, LivenessConfig
from protocol.model import PeerRef
from protocol.routing import ContactTable
from protocol.taskset import TaskSet

__all__ = ["Contacts", "peer_of"]

log = logging.getLogger(__name__)

WELCOME_STORES = 32


def peer_of(node: Node) -> PeerRef:
    return PeerRef(node.id, node.ip, node.port)


class Contacts:
    def __init__(
        self,
        me: Node,
        ksize: int,
        *,
        values: Iterable[tuple[bytes, Any]],
        ping: Callable[[Node], Awaitable[tuple[bool, Any]]],
        store: Callable[[Node, bytes, Any], Coroutine[Any, Any, tuple[bool, Any]]],
        probe: Callable[[tuple[str, int]], Awaitable[bytes | None]],
        tasks: TaskSet,
        liveness: LivenessConfig,
        on_added: Callable[[PeerRef], None],
        on_removed: Callable[[PeerRef, str], None],
        admission: AdmissionLimits | None = None,
    ) -> None:
        """``values``: the DHT values this node stores (a new contact gets those it should
        hold, §2.5); ``ping``, ``store`` and ``probe``: the RPC layer's calls; ``tasks``
        owns the pings and stores started here."""
        self.source_node = me
        self._values = values
        self._ping = ping
        self._store = store
        self._tasks = tasks
        self.liveness = Detector(liveness)

        def removed(node: Node, why: str) -> None:
            self.liveness.forget(node.id)
            _notify(on_removed, peer_of(node), why)

        self.router = ContactTable(
            self.source_node,
            ksize,
            on_added=lambda n: _notify(on_added, peer_of(n)),
            on_removed=removed,
            on_full=self.check_alive,
        )
        self._checking: set[bytes] = set()
        self.admission = Admission(
            probe, self._admit, self._move, tasks, admission or AdmissionLimits()
        )

    @property
    def my_id(self) -> bytes:
        node_id: bytes = self.source_node.id
        return node_id

    def contact_failed(self, node: Node) -> None:
        """A call went unanswered: a suspect, not yet a corpse (``liveness``)."""
        if self.router.knows(node.id):
            self.router.record_failure(node)
            self.liveness.failed(node.id)

    def declare_dead(self, node: Node) -> None:
        """The failure detector's verdict: drop the contact (its keys move to others)."""
        self.liveness.declare(node.id)
        if self.router.knows(node.id):
            log.info("declared %s dead after %s", peer_of(node), "direct and indirect probes")
            self.router.remove_contact(node, "unresponsive")

    def welcome_if_new(self, node: Node, proven: bool = False) -> None:
        """Record a contact we heard from. A known one at its known address is moved to the
        tail (§2.2); anything else needs ``proven`` (a reply naming ``node.id`` came from its
        address), or it is challenged first."""
        if node.id == self.my_id or self.router.is_departed(node.id):
            return
        known = self.router.get(node.id)
        if known is not None and (known.ip, known.port) == (node.ip, node.port):
            self.liveness.heard(node.id)  # SWIM: any message from a suspect refutes it
            self.router.add_contact(node)  # §2.2: move to the tail as most recently seen
            return
        if not proven:
            self.admission.challenge(node, known)
            return
        self.liveness.heard(node.id)
        if known is not None:
            self.router.add_contact(node)  # proven at its new address
            return
        self._admit(node)

    def _move(self, old: Node, new: Node) -> None:
        if self.router.get(old.id) is not None:
            log.info(
                "%s moved from %s:%s to %s:%s", peer_of(new), old.ip, old.port, new.ip, new.port
            )
            self.router.add_contact(new)

    def _admit(self, node: Node) -> None:
        """Add a proven new contact; hand it the values it should hold (§2.5)."""
        if node.id == self.my_id or self.router.is_departed(node.id):
            return
        if not self.router.is_new_node(node):
            self.router.add_contact(node)
            return
        welcomed = 0
        for key, value in self._values:
            if welcomed >= WELCOME_STORES:  # each new contact costs us at most this many STOREs
                break
            keynode = Node(key)  # stock: Node(digest(key)), a digest of the stored digest
            neighbors = self.router.find_neighbors(keynode)
            if neighbors:
                last = neighbors[-1].distance_to(keynode)
                new_node_close = node.distance_to(keynode) < last
                first = neighbors[0].distance_to(keynode)
                this_closest = self.source_node.distance_to(keynode) < first
            if not neighbors or (new_node_close and this_closest):
                welcomed += 1
                self._tasks.spawn(self._store(node, key, value), "welcome-store")
        self.router.add_contact(node)

    def welcome_sender(self, node: Node) -> None:
        """A request arrived from ``node``; an ID conflict at its address is checked first."""
        if node.id == self.my_id or self.router.is_departed(node.id):
            return
        if self.router.is_new_node(node):
            ghost = self.router.by_address(node.ip, node.port)
            if ghost is not None and ghost.id != node.id:
                self.check_alive(ghost)  # the ping replaces it if someone else answers
                return
        self.welcome_if_new(node)

    def replace(self, old: Node | None, new: Node) -> None:
        """A reply from ``new``'s address proved that ``new`` lives there: drop anyone else
        recorded at that address (``old``, or whoever the table has)."""
        ghost = old if old is not None else self.router.by_address(new.ip, new.port)
        if ghost is not None and ghost.id != new.id and self.router.knows(ghost.id):
            who, gone = new.id.hex()[:8], ghost.id.hex()[:8]
            log.info("%s now answers at %s:%s; dropping %s", who, new.ip, new.port, gone)
            self.router.remove_contact(ghost, "replaced")
        self.router.clear_departed(new.id)
        self.welcome_if_new(new, proven=True)

    def said_goodbye(self, node_id: bytes, addr: tuple[str, int], ttl: float) -> None:
        """GOODBYE from ``addr``: drop the node at once (stock waits for failed pings)."""
        known = self.router.get(node_id)
        if known is not None and (known.ip, known.port) != addr:
            return  # only believe a goodbye from the address we know the node at
        if known is not None:
            self.router.remove_contact(known, "goodbye")
        self.router.mark_departed(node_id, ttl)

    def check_alive(self, node: Node) -> None:
        """Ping ``node`` in an owned task, at most one check per contact at a time."""
        if node.id in self._checking:
            return
        self._checking.add(node.id)

        async def check() -> None:
            try:
                await self._ping(node)
            finally:
                self._checking.discard(node.id)

        self._tasks.spawn(check(), "check-alive")


def _notify(callback: Callable[..., None], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:  # the crawler's bug must not break the routing table
        log.exception("membership callback %r failed", callback)
