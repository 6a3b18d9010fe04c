"""The check of a member's done claims (``network.vouching``) through its ports: VOUCH answered
by a small fake of the claimant, pages "fetched again" from a dict. What each answer makes of
the claims: recorded, refused with the member distrusted, or left unrecorded. The real peers'
case is ``test_lying_borrower.py``."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from p2pcrawl.crawl import FetchResult, page_digest, urls
from p2pcrawl.network.vouching import MAX_HELD_PER_PEER, Vouching
from protocol import VOUCH, PeerRef, PeerTimeout, Vouched, VouchReply, Wanted, key_for

PEER = PeerRef(b"\x07" * 20, "127.0.0.1", 9)
PAGES = {f"http://h.example/{i}": f"page {i}".encode() for i in range(6)}


def key_of(url: str) -> bytes:
    return key_for(urls.host_of(url))


def claim(*names: str) -> dict[bytes, list[int]]:
    return {key_of(next(iter(PAGES))): [urls.fingerprint(u) for u in names]}


class Claimant:
    """Answers VOUCH for the pages it says it fetched: ``bodies`` (None: no body)."""

    def __init__(self, bodies: dict[str, bytes | None], *, silent: bool = False) -> None:
        self.by_fp = {urls.fingerprint(u): (u, b) for u, b in bodies.items()}
        self.silent = silent
        self.asked = 0

    async def call(self, peer: PeerRef, proc: Any, args: Any) -> VouchReply:
        self.asked += 1
        if self.silent:
            raise PeerTimeout(peer, peer.addr, proc.name)
        out = []
        for w in args.wanted:
            if w.fp in self.by_fp:
                url, body = self.by_fp[w.fp]
                out.append(Vouched(w.key, w.fp, url, b"" if body is None else page_digest(body)))
        return VouchReply(out)


class Done:
    """Our done record: ``here`` are done already."""

    def __init__(self, here: set[int] | None = None) -> None:
        self.here = here or set()

    async def contains(self, items: Any) -> list[bool]:
        return [fp in self.here for _, fp in items]


class Crawl:
    """Pages fetched again from ``PAGES``; busy unless told otherwise; robots.txt keeps out
    ``excluded``."""

    idle = False

    def __init__(self, excluded: set[str] | None = None) -> None:
        self.excluded = excluded or set()

    async def fetch_page(self, url: str) -> FetchResult:
        return FetchResult(url, 200, body=PAGES[url])

    def key_of(self, url: str) -> bytes:
        return key_of(url)

    @property
    def robots_gate(self) -> Crawl:
        return self  # answers ``excludes`` itself

    async def excludes(self, url: str) -> bool:
        return url in self.excluded


async def settle(v: Vouching) -> None:
    for _ in range(200):
        if not v.pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the check did not end")


def checker(
    claimant: Claimant, excluded: set[str] | None = None, seed: int = 1
) -> tuple[Vouching, list[dict[bytes, list[int]]]]:
    """The check, and what it recorded (``held``)."""
    crawl = Crawl(excluded)
    return Vouching(claimant.call, lambda: crawl, Done(), rng=random.Random(seed)), []


async def held(v: Vouching, recorded: list[dict[bytes, list[int]]], done: Any) -> None:
    async def apply(d: dict[bytes, list[int]]) -> None:
        recorded.append(d)

    v.hold(PEER, done, apply, urgent=True)
    await settle(v)


async def test_an_honest_claim_is_recorded_after_one_refetch() -> None:
    names = list(PAGES)
    v, recorded = checker(Claimant({u: PAGES[u] for u in names}))
    await held(v, recorded, claim(*names))
    assert recorded == [claim(*names)]
    assert (v.verified, v.refetches, v.rounds, v.mismatched) == (len(names), 1, 1, 0)
    await v.aclose()


async def test_a_made_up_digest_refuses_the_claim_and_every_later_one() -> None:
    names = list(PAGES)
    v, recorded = checker(Claimant(dict.fromkeys(names, b"not the page")))
    await held(v, recorded, claim(*names))
    assert recorded == [] and v.mismatched == len(names) and v.distrusts(PEER.id)
    await held(v, recorded, claim(names[0]))
    assert recorded == [] and v.distrusted_refused == 1 and v.rounds == 1


async def test_a_url_that_is_not_the_page_is_a_lie() -> None:
    url = next(iter(PAGES))
    claimant = Claimant({url: PAGES[url]})
    claimant.by_fp[urls.fingerprint(url)] = ("http://h.example/other", PAGES[url])
    v, recorded = checker(claimant)
    await held(v, recorded, claim(url))
    assert recorded == [] and v.distrusts(PEER.id) and v.refetches == 0


@pytest.mark.parametrize("case", ["silent", "not vouched", "no body"])
async def test_what_cannot_be_checked_is_not_recorded_and_the_member_is_asked_again(
    case: str,
) -> None:
    """A body-less answer included: a liar would give it for every page it did not fetch,
    beside the one it did."""
    real, fake = list(PAGES)[:2]
    bodies: dict[str, bytes | None] = {real: PAGES[real]}
    if case == "no body":
        bodies[fake] = None
    v, recorded = checker(Claimant(bodies, silent=case == "silent"))
    await held(v, recorded, claim(real, fake))
    assert recorded == [] and v.unverified == 2 and not v.distrusts(PEER.id)
    assert v.refetches == 0


async def test_a_page_robots_txt_keeps_out_is_done_without_a_body() -> None:
    """Finished without a body because robots.txt keeps it out, here too: we would never
    fetch it, so the claim is checked on the page with a body (a joiner handed hosts with
    a Disallow rule drew such a page in 1-4 of its 20-30 rounds, each time leaving a whole
    range unrecorded, and its pages were fetched again when their links came back)."""
    real, private = list(PAGES)[:2]
    v, recorded = checker(Claimant({real: PAGES[real], private: None}), excluded={private})
    await held(v, recorded, claim(real, private))
    assert recorded == [claim(real, private)] and v.refetches == 1
    # A claim of such pages alone, every one of them drawn: nothing to fetch.
    privates = list(PAGES)[2:5]
    v, recorded = checker(Claimant(dict.fromkeys(privates)), excluded=set(privates))
    await held(v, recorded, claim(*privates))
    assert recorded == [claim(*privates)] and v.refetches == 0
    await v.aclose()


@pytest.mark.parametrize("seed", range(6))
async def test_a_claim_padded_with_pages_robots_txt_keeps_out_is_still_checked(seed: int) -> None:
    """A liar pads a made-up page with many that robots.txt keeps out: the rounds draw on
    until a page with a body comes up, and then catch it, or run out and record nothing."""
    excluded = {f"http://h.example/private/{i}" for i in range(40)}
    fake = next(iter(PAGES))
    bodies: dict[str, bytes | None] = {u: None for u in excluded}
    bodies[fake] = b"not the page"
    v, recorded = checker(Claimant(bodies), excluded=excluded, seed=seed)
    await held(v, recorded, {key_of(fake): [urls.fingerprint(u) for u in bodies]})
    assert recorded == []
    assert v.mismatched or v.unverified_why["excluded"] == 1
    await v.aclose()


async def test_held_claims_are_bounded_per_member() -> None:
    v, recorded = checker(Claimant({}, silent=True))
    fps = list(range(MAX_HELD_PER_PEER + 1))

    async def apply(d: dict[bytes, list[int]]) -> None:
        recorded.append(d)

    v.hold(PEER, {key_of(next(iter(PAGES))): fps}, apply, urgent=False)
    assert v.overflow == len(fps) and v.pending == 0
    await v.aclose()


async def test_news_waits_for_its_gap_while_the_peer_crawls_and_not_once_it_is_idle() -> None:
    names = list(PAGES)
    crawl = Crawl()
    v = Vouching(Claimant({u: PAGES[u] for u in names}).call, lambda: crawl, Done())
    recorded: list[dict[bytes, list[int]]] = []

    async def apply(d: dict[bytes, list[int]]) -> None:
        recorded.append(d)

    v.hold(PEER, claim(names[0]), apply, urgent=False)
    await settle(v)  # a member's first round comes at once
    v.hold(PEER, claim(names[1]), apply, urgent=False)
    await asyncio.sleep(0.5)
    assert len(recorded) == 1 and v.pending  # a replica's news waits while we crawl
    crawl.idle = True
    await settle(v)  # and is checked once we are idle: the finish waits for no gap
    assert recorded == [claim(names[0]), claim(names[1])] and v.rounds == 2
    await v.aclose()


async def test_a_leaver_answers_vouch_until_the_checks_are_done(tmp_path: Any) -> None:
    from p2pcrawl.network.vouching import VouchServer
    from storage import DoneRecord

    done = await DoneRecord.open(tmp_path / "done.sqlite3", expected=1_000)
    url = next(iter(PAGES))
    fp = urls.fingerprint(url)
    await done.add([(key_of(url), fp)], [(key_of(url), fp, url, page_digest(PAGES[url]))])
    server = VouchServer(done)
    lingering = asyncio.create_task(server.linger(quiet=1.0, most=10.0))
    await asyncio.sleep(0.2)
    assert not lingering.done()  # it waits for checks even before the first
    reply = await server.serve(PEER, VOUCH.args([Wanted(key_of(url), fp), Wanted(key_of(url), 1)]))
    assert reply.pages == [Vouched(key_of(url), fp, url, page_digest(PAGES[url]))]
    await lingering  # and stops once none came for a while
    assert server.served == 1
    await done.aclose()


async def test_pages_done_here_already_are_not_drawn_and_need_no_check() -> None:
    names = list(PAGES)
    mine = {urls.fingerprint(u) for u in names[:4]}
    crawl = Crawl()
    # The claimant cannot vouch for our own pages (it was handed them): only its own are drawn.
    claimant = Claimant({u: PAGES[u] for u in names[4:]})
    v = Vouching(claimant.call, lambda: crawl, Done(mine), rng=random.Random(3))
    recorded: list[dict[bytes, list[int]]] = []

    async def apply(d: dict[bytes, list[int]]) -> None:
        recorded.append(d)

    for _ in range(3):
        v.hold(PEER, claim(*names), apply, urgent=True)
        crawl.idle = True
        await settle(v)
    assert len(recorded) == 3 and v.unverified == 0 and v.refetches == 3
    v.hold(PEER, claim(*names[:4]), apply, urgent=True)
    await settle(v)
    assert len(recorded) == 4 and claimant.asked == 3  # nothing new: not even asked
    await v.aclose()
