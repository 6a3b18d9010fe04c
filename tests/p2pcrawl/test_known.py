"""Owners tell the peers that send them links what they hold; those links are not sent again."""

from __future__ import annotations

import pytest

from p2pcrawl.crawl import Task
from p2pcrawl.network.known import Advertised, KnownAtOwners
from p2pcrawl.settings import PeerSettings
from protocol import KeyBatch, key_for
from protocol.model import MAX_KNOWN
from tests.conftest import PeerFactory
from tests.p2pcrawl.test_dispatch import CRAWL, queued_urls, tasks_for
from tests.p2pcrawl.test_hostile_peers import stranger_store_task

pytestmark = pytest.mark.timeout(60)


def test_each_sender_hears_each_fingerprint_once_in_order_and_within_the_bound() -> None:
    ring = Advertised(capacity=1000)
    ring.add(range(1, 601))
    a, b = b"a" * 20, b"b" * 20
    assert ring.since(a) == list(range(1, MAX_KNOWN + 1))
    assert ring.since(a) == list(range(MAX_KNOWN + 1, 601))
    assert ring.since(a) == []
    ring.add([700, 701])
    assert ring.since(a) == [700, 701]
    assert ring.since(b, most=3) == [1, 2, 3]  # b has its own place
    # A sender behind by more than the ring hears the newest ``capacity``, wrapping around.
    ring.add(range(2000, 3000))
    assert ring.since(b, most=5000) == list(range(2000, 3000))
    assert ring.since(a, most=5000) == list(range(2000, 3000)) and ring.since(b) == []
    # Ownership moved, and every sender wiped what it heard: each hears the ring again,
    # from its oldest entry, and then only what is new.
    ring.retell()
    assert len(ring) == 1000
    assert ring.since(a, most=5000) == list(range(2000, 3000))
    assert ring.since(b, most=3) == [2000, 2001, 2002]
    ring.add([9])
    assert ring.since(a) == [9] and ring.since(b, most=5000)[-1] == 9


def test_what_an_owner_said_counts_for_that_owner_only() -> None:
    known = KnownAtOwners(slots=1024)
    owner, other = b"o" * 20, b"x" * 20
    known.learn(owner, [11, 12])
    assert known.holds(owner, 11) and known.holds(owner, 12)
    assert not known.holds(other, 11)  # another owner's links are not suppressed
    assert not known.holds(owner, 13)
    known.forget()
    assert not known.holds(owner, 11)
    # Salted per process: one instance's entries say nothing of another's.
    assert KnownAtOwners(slots=1024)._entry(owner, 11) != known._entry(owner, 11)


async def test_links_an_owner_holds_are_not_sent_to_it_again(make_peer: PeerFactory) -> None:
    owner = await make_peer(crawl=CRAWL, peer=PeerSettings())
    assert owner.engine is not None
    owner.engine.pause("test")  # every accepted task stays queued
    b = await make_peer(crawl=CRAWL, bootstrap=(owner.me.addr,))
    c = await make_peer(crawl=CRAWL, bootstrap=(owner.me.addr,))
    assert b.node is not None and c.node is not None
    hosts = [f"h{i}.busy.test" for i in range(400)]
    nodes = (b.node, c.node)
    host = next(
        h
        for h in hosts
        if all(n.closest_local(key_for(h), 1)[0].id == owner.node_id for n in nodes)
    )
    found = tasks_for(host, range(10))
    await b.parts.dispatcher.route(found, found=True)  # new to the owner: it tells the others
    # c sends the owner a link of its own, and the answer says what the owner holds.
    await c.parts.dispatcher.route(tasks_for(host, range(10, 11)), found=True)
    assert c.parts.dispatcher.known.learned >= 10
    sent = c.parts.dispatcher.sent_rpcs
    await c.parts.dispatcher.route(found, found=True)
    assert c.parts.dispatcher.sent_rpcs == sent  # no STORE_TASK for links the owner holds
    assert c.parts.dispatcher.known.skipped == 10
    # Only links found on pages are skipped: a take-over or a seed is always sent.
    await c.parts.dispatcher.route(found[:1])
    assert c.parts.dispatcher.sent_rpcs == sent + 1
    # After a membership change nothing the owners said counts until they say it again.
    c.parts.dispatcher.owners_changed()
    await c.parts.dispatcher.route(found[1:2], found=True)
    assert c.parts.dispatcher.sent_rpcs == sent + 2
    # The owner saw the change too and tells what it held again: the next answer teaches
    # c every link the owner held before it (a new owner of a host would otherwise send
    # each of them once and wait for the answer), and none of them is sent after it.
    c.parts.dispatcher.owners_changed()
    owner.parts.advertised.retell()
    await c.parts.dispatcher.route(tasks_for(host, range(11, 12)), found=True)
    assert c.parts.dispatcher.sent_rpcs == sent + 3
    await c.parts.dispatcher.route(found, found=True)
    assert c.parts.dispatcher.sent_rpcs == sent + 3
    assert await queued_urls(owner) == {t.url for t in tasks_for(host, range(12))}
    assert c.status()["dispatch"]["skipped_known"] == 20  # type: ignore[index]


async def test_an_owner_does_not_tell_what_it_holds_because_it_found_it_itself(
    make_peer: PeerFactory,
) -> None:
    """Only links other peers routed here are told: an owner's own finds are its hosts'
    pages, which nobody else comes across."""
    owner = await make_peer(crawl=CRAWL)
    assert owner.engine is not None
    owner.engine.pause("test")
    own: list[Task] = tasks_for("mine.busy.test", range(5))
    await owner.intake(own)
    assert len(owner.parts.advertised) == 0
    await owner.intake(tasks_for("mine.busy.test", range(5, 8)), routed=True)
    assert len(owner.parts.advertised) == 3


async def test_a_stranger_is_not_told_what_an_owner_holds(make_peer: PeerFactory) -> None:
    """Only members hear it: a stranger's reply stays as small as its request allows."""
    owner = await make_peer(crawl=CRAWL)
    owner.parts.advertised.add(range(1, 100))
    replies = await stranger_store_task(owner.me.addr, [KeyBatch(key_for("h1.busy.test"), [])])
    assert replies and all("error" not in r and "known" not in r for r in replies)
    assert owner.parts.advertised.told == 0
