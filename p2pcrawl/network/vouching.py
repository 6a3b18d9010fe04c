"""Checking a member's word that pages are done, in an open network (docs/security.md,
"Forged work claims").

A done claim (a handoff's or takeover's done range, a replica's news unless it comes from the
key's owner about its own tasks, a replica's answer that it knows pages as done) that passes
the claims rule (``claims``) is *held*, not recorded: nothing it names is marked done here
until a sample of it was checked. A round takes every claim a member made since its last
round, leaves out the pages done here already, draws ``MAX_VOUCH`` of the rest at random, asks
the member what they were (VOUCH: URL and body digest, from its done record's proofs) and
fetches one of them again (``refetch``, the crawler's own fetcher, paced as its fetches are).
The round then decides for all of them:

* **verified**: every drawn page answered, each URL is the page's (its fingerprint and key),
  and the page fetched again has the digest the member kept: the claims are recorded as
  they would have been without the check (``apply``);
* **mismatch**: a URL that is not the page's, or a body that differs: the claims are not
  recorded, and the member's later claims are refused without a check (``distrusted``, at
  most ``MAX_DISTRUSTED`` members). A page that changed between the two fetches lands here
  too; its cost is a re-fetch of what the claims named, never a page lost;
* **unverified**: no answer, a drawn page the member did not fetch itself (recorded done on
  another's word, or before proofs were kept) or finished without a body (robots.txt, a
  final error), or a re-fetch that failed: the claims are not recorded; the member is checked
  again next time.

A claim not recorded loses nothing: tasks it named stay queued here (or are fetched when their
links come back) and a replica keeps its copies. Holding rather than recording at once and
undoing later is what keeps that so: a claim recorded provisionally would drop the links that
arrive meanwhile as done, and undoing it could not bring them back. While anything is held or
being checked the peer is not quiet (``pending``), so the network is not finished.

Bounded: at most ``MAX_HELD`` fingerprints held in all and ``MAX_HELD_PER_PEER`` per member,
``MAX_PEERS`` members with claims held; beyond that a claim is not recorded (``overflow``).
While this peer has pages to fetch, a member's rounds are at least ``ROUND_GAP_S`` apart
(``URGENT_GAP_S`` for claims whose pages this peer would otherwise fetch meanwhile); once it
is idle, held claims are checked at once. Rounds start at most ``ROUNDS_PER_S`` a
second in all, one at a time: a liar costs a bounded number of requests to the web, and an
honest member's claims cost one re-fetch per round, whatever their size.
A keyed network checks nothing: its key admits only the operators' machines.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from p2pcrawl.crawl import FetchResult, page_digest, urls
from protocol import (
    MAX_VOUCH,
    VOUCH,
    PeerRef,
    PeerTimeout,
    Procedure,
    RemoteError,
    TaskSet,
    Vouched,
    VouchReply,
    Wanted,
)
from storage import DoneRecord

__all__ = ["Apply", "VouchServer", "Vouching", "asker", "refetcher"]

log = logging.getLogger(__name__)

MAX_HELD = 200_000
MAX_HELD_PER_PEER = 50_000
MAX_PEERS = 64
MAX_DISTRUSTED = 1024
ROUND_GAP_S = 10.0
URGENT_GAP_S = 1.0
# A leaver answers VOUCH until none came for LINGER_QUIET_S, at most LINGER_MAX_S: longer than
# URGENT_GAP_S, after which its new owners' rounds for its hand-off are due.
LINGER_QUIET_S = 2.0
LINGER_MAX_S = 6.0
IDLE_POLL_S = 0.25
# Draws of MAX_VOUCH pages a round may take while every page drawn is one robots.txt keeps
# out: a VOUCH request each.
MAX_TURNS = 4
ROUNDS_PER_S = 10.0

Call = Callable[[PeerRef, Procedure[Any, Any], Any], Awaitable[Any]]
# Records a claim that passed its check (fingerprints by host key).
Apply = Callable[[dict[bytes, list[int]]], Awaitable[object]]
Ask = Callable[[PeerRef, list[Wanted]], Awaitable[list[Vouched]]]
# A URL fetched again: its body's digest (``crawl.page_digest``), None if it failed.
Refetch = Callable[[str], Awaitable[bytes | None]]


@dataclass(slots=True)
class _Held:
    peer: PeerRef
    claims: list[tuple[dict[bytes, list[int]], Apply]] = field(default_factory=list)
    size: int = 0
    urgent: bool = False  # a claim whose tasks this peer would otherwise fetch


class RobotsCheck(Protocol):
    async def excludes(self, url: str) -> bool:
        """Whether ``url``'s robots.txt keeps it out (``crawl.RobotsGate.excludes``)."""
        ...


class CheckingCrawl(Protocol):
    """What a check asks of our crawler (``crawl.Engine``)."""

    async def fetch_page(self, url: str) -> FetchResult: ...

    def key_of(self, url: str) -> bytes: ...

    @property
    def robots_gate(self) -> RobotsCheck: ...

    @property
    def idle(self) -> bool: ...


class DoneHere(Protocol):
    """Our done record (``storage.DoneRecord``)."""

    async def contains(self, items: Sequence[tuple[bytes, int]]) -> list[bool]: ...


class Vouching:
    def __init__(
        self,
        call: Call,
        crawl: Callable[[], CheckingCrawl],
        done: DoneHere,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``call``: a crawl RPC (``CrawlNode.call``), for VOUCH; ``crawl``: our crawler
        (built after this), which fetches a page again and says whether it is idle;
        ``done``: our done record (a claim says nothing new of pages done here already)."""
        self._done = done
        self._ask = asker(call)
        self._crawl = crawl
        self._refetch = refetcher(self._fetch_page)
        self._rng = rng or random.Random()
        self._clock = clock
        self._held: dict[bytes, _Held] = {}
        self._held_size = 0
        self._last_round: dict[bytes, float] = {}  # member -> when its last round ended
        self._last_start = float("-inf")
        self._distrusted: OrderedDict[bytes, None] = OrderedDict()
        self._one_round = asyncio.Lock()
        self._rounds = TaskSet("vouching")
        self._checking: set[bytes] = set()
        # Fingerprints, by what became of them (``p2pcrawl_claims_...``).
        self.verified = 0
        self.mismatched = 0
        self.unverified = 0
        self.unverified_why: Counter[str] = Counter()  # rounds, by why nothing was decided
        self.overflow = 0
        self.distrusted_refused = 0
        self.refetches = 0  # requests to the web the checks cost
        self.rounds = 0

    async def _fetch_page(self, url: str) -> FetchResult:
        return await self._crawl().fetch_page(url)

    async def _robots_excludes(self, url: str) -> bool:
        try:
            return await self._crawl().robots_gate.excludes(url)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # as a failed re-fetch: decides nothing
            log.info("reading robots.txt for %s to check a claim failed: %r", url, exc)
            return False

    @property
    def pending(self) -> int:
        """Fingerprints held or being checked (the peer is not quiet while any are)."""
        return self._held_size + len(self._checking)

    def status(self) -> dict[str, int | dict[str, int]]:
        """The counters, for ``/api/status`` (``claims``)."""
        return {
            "verified": self.verified,
            "mismatch": self.mismatched,
            "unverified": self.unverified,
            "overflow": self.overflow,
            "distrusted": self.distrusted_refused,
            "held": self.pending,
            "rounds": self.rounds,
            "refetches": self.refetches,
            "unverified_rounds": dict(self.unverified_why),
        }

    def distrusts(self, peer_id: bytes) -> bool:
        return peer_id in self._distrusted

    def hold(
        self,
        peer: PeerRef,
        done: Mapping[bytes, list[int]],
        apply: Apply,
        *,
        urgent: bool,
    ) -> None:
        """Hold a claim of ``peer``'s until a round checked it; ``apply`` records it then.
        ``urgent``: while it is held, this peer may fetch what it names (a handoff's done
        range, a replica's answer about tasks being queued here), so its round comes after
        ``URGENT_GAP_S``; a replica's news waits for ``ROUND_GAP_S``."""
        claim = {k: list(v) for k, v in done.items() if v}
        n = sum(len(v) for v in claim.values())
        if not n:
            return
        if peer.id in self._distrusted:
            self.distrusted_refused += n
            return
        held = self._held.get(peer.id)
        if (
            self._held_size + n > MAX_HELD
            or (held is None and len(self._held) >= MAX_PEERS)
            or (held.size if held is not None else 0) + n > MAX_HELD_PER_PEER
        ):
            self.overflow += n
            return
        if held is None:
            held = self._held[peer.id] = _Held(peer)
        held.claims.append((claim, apply))
        held.urgent |= urgent
        held.size += n
        self._held_size += n
        if peer.id not in self._checking:
            self._checking.add(peer.id)
            if self._rounds.spawn(self._member_rounds(peer.id), "vouching-round") is None:
                self._checking.discard(peer.id)  # closing: the claim is simply not recorded

    async def aclose(self) -> None:
        await self._rounds.aclose()

    async def _member_rounds(self, peer_id: bytes) -> None:
        try:
            while peer_id in self._held:
                # The gap spares the web while we crawl; an idle peer checks at once, so
                # that a check holds the finish back no longer than it takes.
                while (wait := self._due(peer_id) - self._clock()) > 0:
                    if self._crawl().idle:
                        break
                    await asyncio.sleep(min(wait, IDLE_POLL_S))
                async with self._one_round:
                    gap = self._last_start + 1.0 / ROUNDS_PER_S - self._clock()
                    if gap > 0:
                        await asyncio.sleep(gap)
                    self._last_start = self._clock()
                    held = self._held.pop(peer_id)
                    self._held_size -= held.size
                    if peer_id in self._distrusted:  # caught while these waited
                        self.distrusted_refused += held.size
                        continue
                    await self._round(held)
                    self._last_round[peer_id] = self._clock()
        finally:
            self._checking.discard(peer_id)
            left = self._held.pop(peer_id, None)  # cancelled: not recorded, nothing lost
            if left is not None:
                self._held_size -= left.size
            if len(self._last_round) > 4 * MAX_PEERS:
                since = self._clock() - ROUND_GAP_S
                self._last_round = {p: t for p, t in self._last_round.items() if t > since}

    def _due(self, peer_id: bytes) -> float:
        held = self._held.get(peer_id)
        gap = URGENT_GAP_S if held is None or held.urgent else ROUND_GAP_S
        return self._last_round.get(peer_id, float("-inf")) + gap

    async def _round(self, held: _Held) -> None:
        self.rounds += 1
        pairs = [(k, fp) for claim, _ in held.claims for k, fps in claim.items() for fp in fps]
        # Pages done here already are no news (a done range handed back to the peer that
        # fetched them): only the rest is drawn, and a claim with no rest needs no check.
        known = await self._done.contains(pairs)
        news = [p for p, k in zip(pairs, known, strict=True) if not k]
        drawn_all = self._rng.sample(news, min(MAX_TURNS * MAX_VOUCH, len(news)))
        verdict = "verified"
        # Drawn in turns of MAX_VOUCH: a turn whose pages robots.txt keeps out says nothing
        # of the pages with a body (a claim padded with such pages must not pass unchecked),
        # so the next turn draws again, up to MAX_TURNS; every page of the claim drawn and
        # found consistent is a check of all of it.
        for turn in range(MAX_TURNS):
            drawn = drawn_all[turn * MAX_VOUCH : (turn + 1) * MAX_VOUCH]
            if not drawn:
                break
            verdict = await self._check(held.peer, drawn)
            if verdict != "excluded":
                break
        if verdict == "excluded":
            verdict = (
                "verified" if len(news) <= MAX_TURNS * MAX_VOUCH else self._unverified("excluded")
            )
        if verdict == "verified":
            self.verified += held.size
            for claim, apply in held.claims:
                await apply(claim)
            return
        if verdict == "mismatch":
            self.mismatched += held.size
            self._distrusted[held.peer.id] = None
            while len(self._distrusted) > MAX_DISTRUSTED:
                self._distrusted.popitem(last=False)
            log.warning("%s lied about finished pages: its claims are refused", held.peer)
        else:
            self.unverified += held.size

    def _unverified(self, why: str) -> str:
        self.unverified_why[why] += 1
        return "unverified"

    async def _check(self, peer: PeerRef, drawn: list[tuple[bytes, int]]) -> str:
        try:
            pages = await self._ask(peer, [Wanted(k, fp) for k, fp in drawn])
        except (PeerTimeout, RemoteError, OSError):
            return self._unverified("no answer")
        by_pair = {(p.key, p.fp): p for p in pages}
        answered: list[Vouched] = []
        for k, fp in drawn:
            page = by_pair.get((k, fp))
            if page is None:
                return self._unverified("not vouched")
            url = page.url
            if (
                urls.canonicalize(url) != url
                or urls.fingerprint(url) != fp
                or self._crawl().key_of(url) != k
            ):
                return "mismatch"
            answered.append(page)
        bodied = [p for p in answered if p.digest]
        for p in answered:
            if p.digest or await self._robots_excludes(p.url):
                continue
            # A page finished without a body for another reason (a final error, no answer)
            # cannot be checked by fetching it: were it let through, a liar would say so of
            # every page it did not fetch, and vouch for the one it did. One robots.txt
            # keeps out, we would never fetch either: its claim costs nothing if false.
            return self._unverified("no body")
        if not bodied:
            return "excluded"
        page = bodied[0]  # drawn at random
        self.refetches += 1
        digest = await self._refetch(page.url)
        if digest is None:
            return self._unverified("refetch failed")
        return "verified" if digest == page.digest else "mismatch"


def asker(call: Call) -> Ask:
    """VOUCH through ``CrawlNode.call``."""

    async def ask(peer: PeerRef, wanted: list[Wanted]) -> list[Vouched]:
        reply: VouchReply = await call(peer, VOUCH, VOUCH.args(wanted))
        return reply.pages

    return ask


def refetcher(fetch: Callable[[str], Awaitable[FetchResult]]) -> Refetch:
    """A page fetched again through ``Engine.fetch_page`` (paced by ``--max-rate`` as every
    fetch is), and its digest."""

    async def refetch(url: str) -> bytes | None:
        try:
            res = await fetch(url)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the web's errors are many; a failed check decides nothing
            log.info("re-fetching %s to check a claim failed: %r", url, exc)
            return None
        return page_digest(res.body)

    return refetch


class VouchServer:
    """VOUCH as this peer answers it: what the asked pages it fetched itself were. A leaver
    answers on for a while after its hand-off (``linger``): its new owners check the done
    ranges it handed them, and a claimant that is gone leaves them unrecorded."""

    def __init__(self, done: DoneRecord, clock: Callable[[], float] = time.monotonic) -> None:
        self._done = done
        self._clock = clock
        self.served = 0
        self._last = float("-inf")

    async def serve(self, sender: PeerRef, args: Any) -> VouchReply:
        self.served += 1
        self._last = self._clock()
        proofs = await self._done.proofs([(w.key, w.fp) for w in args.wanted])
        return VouchReply([Vouched(k, fp, url, digest) for k, fp, url, digest in proofs])

    async def linger(self, quiet: float = LINGER_QUIET_S, most: float = LINGER_MAX_S) -> None:
        """Until no VOUCH came for ``quiet`` seconds since the call (at most ``most``)."""
        start = self._clock()
        end = start + most
        while (now := self._clock()) < end:
            wait = max(self._last, start) + quiet - now
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, end - now))
