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
  newcomer, while the newcomer is younger than the minimum owner age, while a handoff to
  it is under way, or while it holds copies of a peer it suspects that is nearer the
  newcomer (if that peer died, its keys reach the newcomer from us once we declare it);
  otherwise how many keys will follow, and it hands them over (``handoff.Handoff``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from p2pcrawl.crawl import EventLog, Ledger
from p2pcrawl.network.handoff import Handoff
from p2pcrawl.network.ports import Ownership, Spawn, owner_id
from protocol import PeerRef, PeerTimeout, RefreshAnswer, RemoteError, TaskSet, closest, distance

__all__ = ["Join", "Newcomers", "Welcome"]

log = logging.getLogger(__name__)

# How soon a joiner asks again when we have not admitted it yet (a challenge is one ping
# round trip), and the least "later" we say (a timer due within milliseconds).
ADMISSION_RETRY_S = 0.1
MIN_RETRY_S = 0.02
# How often a joiner asks whether a handoff to it is complete. The joiner crawls nothing
# until every neighbour says so, and the host handed over stands still meanwhile: at 0.2 s
# a 194-task handoff of the Crawl-delay host took 32 ms and the joiner learnt of its end
# 170 ms later, half the host's stand-still at a join (traced, 0.34 s). A poll is one small
# RPC to a neighbour whose handoff is under way.
HANDOFF_POLL_S = 0.05
# How soon a joiner asks again a replica that holds copies of a peer it suspects.
SUSPECT_POLL_S = 0.2
# A neighbour that died during our join left its keys with its replicas, which take them
# over once they declare it dead too: the ones among our neighbours are asked again after
# this, for what of those keys is ours. A replica that still suspects the dead one answers
# "later" until it has declared it (``Welcome``), so this only gives one that has not
# noticed the silence yet a moment to (asked after 1 s, every host of a network whose
# founder died in its first seconds stood still that long beyond the detection).
REASK_S = 0.25
# A replica answers a joiner "later" while it suspects a peer nearer the joiner whose copies
# it holds, for at most this long into that peer's silence: a dead peer is declared within
# about 3-4 s of it at the defaults, and one silent for longer is more likely slow (flooded,
# stopped) than dead, and then the joiner's join would wait on our suspicion for nothing.
SUSPECT_LATER_S = 5.0
HISTORY_REQUESTERS = 64


@dataclass(slots=True)
class _Tally:
    """What a join's neighbours answered so far."""

    counted: set[bytes] = field(default_factory=set)  # answered with a count at least once
    promised: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


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
        replicas: int = 2,
    ) -> None:
        """``ask``: REFRESH_TASK (``CrawlNode.refresh_task``); ``take_ownership``: own our
        keys from now on (``CrawlNode.take_ownership``; True if that is a change);
        ``give_up_after``: the minimum owner age plus the handoff timeout; ``replicas``: r,
        how many neighbours hold copies of a neighbour that dies during the join."""
        self.ownership = ownership
        self._peers = peers
        self.events = events
        self._ask = ask
        self._take_ownership = take_ownership
        self._owners_changed = owners_changed
        self.ksize = ksize
        self.give_up_after = give_up_after
        self._replicas = replicas
        self._asked: set[bytes] = set()  # neighbours we asked for our keys
        self._asked_of: dict[bytes, PeerRef] = {}
        self._asking: dict[bytes, asyncio.Task[Any]] = {}  # neighbours not through yet
        self._again: Callable[[PeerRef], None] | None = None  # ask a neighbour once more

    def expecting(self, sender: bytes) -> bool:
        """Whether we asked ``sender`` for our keys (join or re-sync) and wait for them."""
        return sender in self._asked

    def _own(self) -> None:
        if self._take_ownership():
            self._owners_changed()

    def neighbour_gone(self, peer_id: bytes, reason: str = "") -> None:
        """A peer left our table (``Roster.on_departure``). If a join waits for it, it waits
        no more: nothing will come from it. Its keys are on its replicas, which take them
        over; those among our neighbours are asked once more, after ``REASK_S``, for what
        is ours of them."""
        asking = self._asking.pop(peer_id, None)
        if asking is None:
            return
        asking.cancel()
        if self._again is None:
            return
        dead = self._asked_of.get(peer_id)
        if dead is None:
            return
        left = [p for i, p in self._asked_of.items() if i != peer_id and i not in self._asking]
        for rep in closest(dead.id, {p.id: p for p in left}, self._replicas):
            self._again(self._asked_of[rep])

    async def refresh(self) -> None:
        """Ask neighbours to send what is now closer to us, and wait (bounded) until they
        have sent it all.

        Each neighbour is asked until it answers 0 with no "later": "later" while it has
        not admitted us yet, while we are younger than the minimum owner age, or while its
        handoff to us is under way; a count when it starts one. Once every neighbour has
        answered with a count, this node takes ownership of its keys: from then on the
        others' handoffs and newly routed tasks are ours, though the engine stays paused
        until every neighbour has said it has nothing more -- so nothing is fetched before
        the history that would have deduplicated it. A neighbour that dies meanwhile is
        waited for no longer than its declaration (``neighbour_gone``).
        """
        me = self.ownership.me.id
        neighbours = [
            p for p in self.ownership.closest_local(me, self.ksize, with_self=False) if p.id != me
        ]
        self._asked = {p.id for p in neighbours}
        self._asked_of = {p.id: p for p in neighbours}
        asked = time.monotonic()
        tally = _Tally()
        owned = TaskSet("join")

        def ask(p: PeerRef, after: float = 0.0) -> None:
            if p.id not in self._asking and time.monotonic() - asked < self.give_up_after:
                task = owned.spawn(self._until_all(p, tally, after), "refresh-ask")
                if task is not None:
                    self._asking[p.id] = task

        self._again = lambda p: ask(p, REASK_S)
        try:
            for p in neighbours:
                ask(p)
            while self._asking:
                tally.changed.clear()
                # Every neighbour still sending counts us as an owner: its keys are ours.
                if set(self._asking) <= tally.counted:
                    self._own()
                left = asked + self.give_up_after - time.monotonic()
                if left <= 0:
                    log.warning(
                        "join: %d neighbours never handed over all; going on", len(self._asking)
                    )
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await tally.changed.wait()
            self._own()
        finally:
            self._asked, self._asked_of, self._asking, self._again = set(), {}, {}, None
            await owned.aclose()
        self.events.add(
            "refreshed",
            neighbours=len(tally.counted),
            keys=tally.promised,
            waited_s=round(time.monotonic() - asked, 2),
        )

    async def _until_all(self, p: PeerRef, tally: _Tally, after: float) -> None:
        """Ask ``p`` until it has sent all it has for us, or is no longer in our table."""
        try:
            await asyncio.sleep(after)
            while True:
                answer = await self._answer(p)
                if answer is None and p.id not in {q.id for q in self._peers()}:
                    return  # declared dead meanwhile: nothing will come from it
                if answer is not None and not answer.retry_after:
                    tally.counted.add(p.id)
                    tally.promised += answer.keys
                    if not answer.keys:
                        return  # all it had for us has arrived
                tally.changed.set()
                if answer is None:  # a peer still in our table: after a stall it
                    wait = ADMISSION_RETRY_S  # may be the one that took our hosts
                elif answer.retry_after:
                    wait = answer.retry_after
                else:
                    wait = HANDOFF_POLL_S  # a handoff began: ask when it is through
                await asyncio.sleep(wait)
        finally:
            if self._asking.get(p.id) is asyncio.current_task():
                del self._asking[p.id]
            tally.changed.set()

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
    """Whether a contact may own keys yet (``CrawlNode``; ``protocol.members``), and which
    contacts the failure detector suspects, silent for how many seconds."""

    def owner_wait(self, peer_id: bytes) -> float | None: ...

    def establish_early(self, peer_id: bytes) -> bool: ...

    def silences(self) -> Mapping[bytes, float]: ...


class Welcome:
    """A neighbour's side: answer REFRESH_TASK, and hand the newcomer its keys."""

    def __init__(
        self,
        ledger: Ledger,
        ownership: Ownership,
        newcomers: Newcomers,
        handoff: Handoff,
        events: EventLog,
        backup_owners: Callable[[], Awaitable[Mapping[bytes, int]]],
        *,
        active: Callable[[], bool],
        spawn: Spawn,
    ) -> None:
        """``backup_owners``: the peers whose copies we hold, and how many of each
        (``BackupStore.owner_counts``)."""
        self.ledger = ledger
        self._backup_owners = backup_owners
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
        if await self._replicating_a_suspect(sender):
            return RefreshAnswer(0, retry_after=SUSPECT_POLL_S)
        queued = set(await self.ledger.tasks.key_counts())
        sent = self._history_sent.get(sender.id, set())
        keys = queued | (set(await self.ledger.done.keys()) - sent)
        moving = [k for k in keys if owner_id(self.ownership, k) == sender.id]
        if moving:
            self._handing_to[sender.id] += 1
            self._spawn(self._hand_over(sender, moving), "refresh-handoff")
        return RefreshAnswer(len(moving))

    async def _replicating_a_suspect(self, sender: PeerRef) -> bool:
        """Whether we hold copies of a peer we suspect (silent for less than
        ``SUSPECT_LATER_S``) that is nearer the sender than we are. If that peer is dead, we
        take its keys over once we declare it, and those now nearest the sender go to it
        then: a joiner that declared it first (and asks us again, ``Join.neighbour_gone``)
        waits for them rather than crawl without their history."""
        mine = distance(self.ownership.me.id, sender.id)
        near = {
            i
            for i, silent in self.newcomers.silences().items()
            if silent < SUSPECT_LATER_S and distance(i, sender.id) < mine
        }
        return bool(near) and not near.isdisjoint(await self._backup_owners())

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
