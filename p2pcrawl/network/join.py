"""A join, from both sides: the newcomer asks for its keys, its neighbours hand them over.

"Distributed Crawler Based on the Improved Kademlia Protocol" (§2.4.1): a joiner sends
REFRESH_TASK to its neighbours, which send it every key now closer to it. Beyond the paper
(docs/membership.md, "Joining"): a key's done fingerprints go with it, keys with no queued
task left move too (their history is what keeps the new owner from re-fetching), and a key
has one crawler while it changes hands:

* ``Join`` (the newcomer): it names itself the owner of nothing until every neighbour has
  answered with a count, then takes ownership; it asks again until each neighbour says it
  has sent all, and only then does it crawl. The same runs after a stall (``stall``).
* ``Welcome`` (a neighbour): it answers "ask again later" while it has not admitted the
  newcomer, while the newcomer is younger than the minimum owner age, or while a handoff to
  it is under way; otherwise how many keys will follow, and it hands them over
  (``handoff.Handoff``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

from p2pcrawl.crawl import EventLog, Ledger
from p2pcrawl.network.handoff import Handoff
from p2pcrawl.network.ports import Ownership, Spawn, owner_id
from protocol import PeerRef, PeerTimeout, RefreshAnswer, RemoteError

__all__ = ["Join", "Newcomers", "Welcome"]

log = logging.getLogger(__name__)

# How soon a joiner asks again when we have not admitted it yet (a challenge is one ping
# round trip), and the least "later" we say (a timer due within milliseconds).
ADMISSION_RETRY_S = 0.1
MIN_RETRY_S = 0.02
HANDOFF_POLL_S = 0.2  # how often a joiner asks whether a handoff to it is complete
HISTORY_REQUESTERS = 64


class Join:
    """The newcomer's side: ask the neighbours for our keys and wait until all have come."""

    def __init__(
        self,
        ownership: Ownership,
        peers: Callable[[], list[PeerRef]],
        events: EventLog,
        *,
        ask: Callable[[PeerRef], Awaitable[RefreshAnswer]],
        take_ownership: Callable[[], bool],
        owners_changed: Callable[[], None],
        ksize: int,
        give_up_after: float,
    ) -> None:
        """``ask``: REFRESH_TASK (``CrawlNode.refresh_task``); ``take_ownership``: own our
        keys from now on (``CrawlNode.take_ownership``; True if that is a change);
        ``give_up_after``: the minimum owner age plus the handoff timeout."""
        self.ownership = ownership
        self._peers = peers
        self.events = events
        self._ask = ask
        self._take_ownership = take_ownership
        self._owners_changed = owners_changed
        self.ksize = ksize
        self.give_up_after = give_up_after
        self._asked: set[bytes] = set()  # neighbours we asked for our keys

    def expecting(self, sender: bytes) -> bool:
        """Whether we asked ``sender`` for our keys (join or re-sync) and wait for them."""
        return sender in self._asked

    def _own(self) -> None:
        if self._take_ownership():
            self._owners_changed()

    async def refresh(self) -> None:
        """Ask neighbours to send what is now closer to us, and wait (bounded) until they
        have sent it all.

        Each neighbour is asked until it answers 0 with no "later": "later" while it has
        not admitted us yet, while we are younger than the minimum owner age, or while its
        handoff to us is under way; a count when it starts one. Once every neighbour has
        answered with a count, this node takes ownership of its keys: from then on the
        others' handoffs and newly routed tasks are ours, though the engine stays paused
        until every neighbour has said it has nothing more -- so nothing is fetched before
        the history that would have deduplicated it.
        """
        me = self.ownership.me.id
        neighbours = [
            p for p in self.ownership.closest_local(me, self.ksize, with_self=False) if p.id != me
        ]
        self._asked = {p.id for p in neighbours}
        asked = time.monotonic()
        give_up = asked + self.give_up_after
        counted: set[bytes] = set()  # neighbours that answered with a count at least once
        promised = 0
        try:
            due = {p.id: asked for p in neighbours}  # when to ask each neighbour (again)
            by_id = {p.id: p for p in neighbours}
            while due:
                now = time.monotonic()
                ask = [by_id[i] for i, t in due.items() if t <= now]
                answers = await asyncio.gather(*(self._answer(p) for p in ask))
                for p, answer in zip(ask, answers, strict=True):
                    if answer is None and p.id not in {q.id for q in self._peers()}:
                        del due[p.id]  # declared dead meanwhile: nothing will come from it
                        continue
                    if answer is not None and not answer.retry_after:
                        counted.add(p.id)
                        promised += answer.keys
                        if not answer.keys:
                            del due[p.id]  # all it had for us has arrived
                            continue
                    if answer is None:  # a peer still in our table: after a stall it
                        wait = ADMISSION_RETRY_S  # may be the one that took our hosts
                    elif answer.retry_after:
                        wait = answer.retry_after
                    else:
                        wait = HANDOFF_POLL_S  # a handoff began: ask when it is through
                    due[p.id] = time.monotonic() + wait
                # Every neighbour still sending counts us as an owner: its keys are ours.
                if set(due) <= counted:
                    self._own()
                if due:
                    left = give_up - time.monotonic()
                    if left <= 0:
                        log.warning("join: %d neighbours never handed over all; going on", len(due))
                        break
                    await asyncio.sleep(max(0.0, min(min(due.values()) - time.monotonic(), left)))
            self._own()
        finally:
            self._asked = set()
        self.events.add(
            "refreshed",
            neighbours=len(counted),
            keys=promised,
            waited_s=round(time.monotonic() - asked, 2),
        )

    async def _answer(self, p: PeerRef) -> RefreshAnswer | None:
        """The neighbour's answer; None if it did not answer. One that answers with an
        error (a stock kademlia node has no REFRESH_TASK) has nothing for us."""
        try:
            return await self._ask(p)
        except RemoteError as exc:
            log.info("REFRESH_TASK to %s failed: %s", p, exc)
            return RefreshAnswer(0)
        except (PeerTimeout, OSError) as exc:
            log.info("REFRESH_TASK to %s unanswered: %s", p, exc)
            return None


class Newcomers(Protocol):
    """Whether a contact may own keys yet (``CrawlNode``; ``protocol.members``)."""

    def owner_wait(self, peer_id: bytes) -> float | None: ...

    def establish_early(self, peer_id: bytes) -> bool: ...


class Welcome:
    """A neighbour's side: answer REFRESH_TASK, and hand the newcomer its keys."""

    def __init__(
        self,
        ledger: Ledger,
        ownership: Ownership,
        newcomers: Newcomers,
        handoff: Handoff,
        events: EventLog,
        *,
        active: Callable[[], bool],
        spawn: Spawn,
    ) -> None:
        self.ledger = ledger
        self.ownership = ownership
        self.newcomers = newcomers
        self.handoff = handoff
        self.events = events
        self._active = active
        self._spawn = spawn
        self._handing_to: Counter[bytes] = Counter()  # requester -> handoffs under way
        # Done-only keys whose history went to a requester: a later REFRESH_TASK of the
        # same requester does not send it again (bounded: one entry per recent requester).
        self._history_sent: OrderedDict[bytes, set[bytes]] = OrderedDict()

    async def serve_refresh(self, sender: PeerRef) -> RefreshAnswer:
        """REFRESH_TASK: how many keys will follow, or when to ask again.

        The requester asks again until the answer is 0 with no "later": then everything has
        arrived. "Later" while a handoff to it is under way, while it is not in our routing
        table yet (its admission challenge is a round trip away: answering from a table
        without it would promise nothing and leave us crawling its hosts beside it), and
        while it is younger than the minimum age before a new ID takes over keys. A
        requester old enough counts as an owner from this answer on, so no key is handed to
        it that we would then still crawl.
        """
        if not self._active():
            return RefreshAnswer(0)
        if self._handing_to[sender.id]:
            return RefreshAnswer(0, retry_after=HANDOFF_POLL_S)
        wait = self.newcomers.owner_wait(sender.id)
        if wait is None:  # not admitted yet: the request itself set its challenge going
            return RefreshAnswer(0, retry_after=ADMISSION_RETRY_S)
        if not self.newcomers.establish_early(sender.id):  # too young: the seconds it lacks
            return RefreshAnswer(0, retry_after=max(wait, MIN_RETRY_S))
        queued = set(await self.ledger.tasks.key_counts())
        sent = self._history_sent.get(sender.id, set())
        keys = queued | (set(await self.ledger.done.keys()) - sent)
        moving = [k for k in keys if owner_id(self.ownership, k) == sender.id]
        if moving:
            self._handing_to[sender.id] += 1
            self._spawn(self._hand_over(sender, moving), "refresh-handoff")
        return RefreshAnswer(len(moving))

    async def _hand_over(self, requester: PeerRef, keys: list[bytes]) -> None:
        try:
            async with self.handoff.lock:
                sent = await self.handoff.hand_over(requester, keys)
            if sent is not None:
                history = self._history_sent.setdefault(requester.id, set())
                history.update(keys)
                self._history_sent.move_to_end(requester.id)
                while len(self._history_sent) > HISTORY_REQUESTERS:
                    self._history_sent.popitem(last=False)
            self.events.add("handoff", to=requester.id.hex()[:8], keys=len(keys), tasks=sent or 0)
        finally:
            self._handing_to[requester.id] -= 1
            if not self._handing_to[requester.id]:
                del self._handing_to[requester.id]

    def forget(self, peer_id: bytes, reason: str = "") -> None:
        """A peer left our table (dead, gone, replaced). Its keys may be crawled elsewhere
        now, so if it comes back and asks again, their history goes with them again."""
        self._history_sent.pop(peer_id, None)
