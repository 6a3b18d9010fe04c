"""A member with a fairly drawn ID asks for loans and reports every page done without fetching
any, and says every page is done as a handoff, a takeover and an owner's news to its replicas
would (docs/security.md, "Forged work claims"). In an open network nothing is lent to it, and
its done claims are held until a sample of them is fetched again: the pages it names differ
from what it vouches for, so none of its claims is recorded, and no page is recorded done that
was not fetched. In a keyed network a key holder is trusted: it borrows as before, and its
claims are taken without a check. Real peers on loopback, a real test web crawled at full
speed, the WARC files read back, the default settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from p2pcrawl.crawl import urls
from p2pcrawl.settings import PeerSettings
from protocol import (
    QUIET,
    VOUCH,
    CrawlNode,
    GiveBack,
    KeyBatch,
    NoArgs,
    NodeConfig,
    NodeKey,
    PeerRef,
    PeerTimeout,
    QuietReply,
    RemoteError,
    Vouched,
    VouchReply,
    distance,
    key_for,
)
from tests.conftest import (
    TEST_MIN_PEER_AGE,
    TEST_SECRET,
    PeerFactory,
    WebFactory,
    crawl_settings_for,
)
from tests.p2pcrawl.test_strangers import _archived, _done_claims
from tests.protocol.conftest import MemoryHandler, eventually

pytestmark = pytest.mark.timeout(90)


async def _borrow_and_lie(liar: CrawlNode, owner: PeerRef) -> tuple[int, int]:
    """One LEND, and every task of its loans reported done at once: (leases, tasks)."""
    try:
        loan = await liar.lend(owner, 100, hosts=8)
    except (PeerTimeout, RemoteError):
        return 0, 0
    loans = [m for m in (loan, *loan.more) if m.lease and m.batch is not None]
    reports = [
        GiveBack(m.lease, [urls.fingerprint(t.url) for t in m.batch.tasks], [], True)  # type: ignore[union-attr]
        for m in loans
    ]
    if reports:
        with contextlib.suppress(PeerTimeout, RemoteError):
            await liar.give_back(owner, reports)
    return len(loans), sum(len(r.done) for r in reports)


async def _claim_all_done(liar: CrawlNode, owner: PeerRef, claims: dict[bytes, list[int]]) -> None:
    """Every page said done: as a handoff's or takeover's done range (STORE_TASK), as the
    owner's news to a replica, in its own name and in the owner's (STORE_BACKUP,
    DELETE_BACKUP)."""
    batches = [KeyBatch(k, [], fps) for k, fps in claims.items()]
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: liar.store_task(owner, batches),
        lambda: liar.store_backup(owner, liar.id, batches),
        lambda: liar.store_backup(owner, owner.id, batches),
        lambda: liar.delete_backup(owner, owner.id, claims),
    ]
    for call in calls:
        with contextlib.suppress(PeerTimeout, RemoteError):
            await call()


async def _owner_and_liar(
    keys: set[bytes], fair: bool
) -> tuple[tuple[NodeKey | None, bytes], tuple[NodeKey | None, bytes]]:
    """Two IDs, the owner's nearer every key than the liar's, so that the liar owns no host
    and acknowledges no task it would then not fetch (what a member that owns a key may do,
    docs/security.md): its only way to stop a page is a loan. ``fair``: both made from node
    keys, as an open network's IDs are (a dozen puzzles, about a second); the pair is picked
    among them, so neither ID was chosen."""
    bits = PeerSettings().id_work_bits
    made: list[tuple[NodeKey | None, bytes]] = []
    for _ in range(32):  # made one at a time until a pair fits: twelve were sometimes too few
        key = await asyncio.to_thread(NodeKey.generate, bits) if fair else None
        made.append((key, key.node_id() if key is not None else secrets.token_bytes(20)))
        for owner, liar in itertools.permutations(made, 2):
            if all(distance(owner[1], k) < distance(liar[1], k) for k in keys):
                return owner, liar
    raise AssertionError("no pair of the 32 IDs splits the hosts so")


def _give_identity(data_dir: Path, key: NodeKey | None, node_id: bytes) -> None:
    """The owner's data directory made beforehand with this ID (and key)."""
    data_dir.mkdir(parents=True)
    (data_dir / "node.json").write_text(json.dumps({"node_id": node_id.hex(), "version": 1}))
    if key is not None:
        doc = {"seed": key.seed.hex(), "nonce": key.nonce, "version": 1}
        fd = os.open(data_dir / "node.key", os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)


@pytest.mark.parametrize("mode", ["open", "keyed"])
async def test_a_member_that_lies_about_finished_work_keeps_no_page_from_an_open_network(
    make_web: WebFactory, make_peer: PeerFactory, mode: str, tmp_path: Path
) -> None:
    web = await make_web(hosts=2, pages_per_host=40)
    truth = web.ground_truth()
    # The open network at the defaults (the guarantee); the keyed one, which only shows the
    # rule unchanged there, waits less for the liar to be established.
    keyed = PeerSettings(secret=TEST_SECRET, min_peer_age=TEST_MIN_PEER_AGE)
    settings = keyed if mode == "keyed" else PeerSettings()
    hosts = {key_for(urls.host_of(u)) for u in truth}
    (owner_key, owner_id), (key, liar_id) = await _owner_and_liar(hosts, mode == "open")
    _give_identity(tmp_path / "peer0", owner_key, owner_id)  # make_peer's first directory
    owner = await make_peer(crawl=crawl_settings_for(web), peer=settings)
    assert owner.engine is not None and owner.node is not None
    owner.engine.pause("test")  # the liar is a member before the first page
    await owner.seed([web.hub_url])
    assert owner.node_id == owner_id
    secret = TEST_SECRET if mode == "keyed" else ""
    liar = CrawlNode(liar_id, MemoryHandler(), NodeConfig(rpc_timeout=0.5, key=key, secret=secret))

    async def quiet(sender: PeerRef, args: NoArgs) -> QuietReply:
        return QuietReply(quiet=True, done=0)  # it holds nothing: it fetches nothing

    by_fp = {urls.fingerprint(u): u for u in truth}
    asked: list[int] = []

    async def vouch(sender: PeerRef, args: Any) -> VouchReply:
        # Each URL is the page's; the digest is made up, as it must be for a page not fetched.
        asked.extend(w.fp for w in args.wanted)
        pages = [Vouched(w.key, w.fp, by_fp[w.fp], bytes(8)) for w in args.wanted]
        return VouchReply(pages)

    liar.serve(QUIET, quiet)
    liar.serve(VOUCH, vouch)
    await liar.listen_on("127.0.0.1", 0)
    try:
        await liar.join([owner.me.addr])
        # An established member: its claims would be believed where it is near a key.
        await eventually(lambda: owner.node.established_before(liar_id), 15)  # type: ignore[union-attr]
        assert owner.parts.roster.is_member(liar_id)
        leases = tasks = 0
        claims = _done_claims(web)
        owner.engine.resume("test")
        for i in range(300):  # bounded: about a minute, longer than the crawl
            if owner.finished.is_set():
                break
            got = await _borrow_and_lie(liar, owner.me)
            if i < 60 and i % 4 == 0:  # while the crawl runs; then they would only keep it busy
                await _claim_all_done(liar, owner.me, claims)
            leases, tasks = leases + got[0], tasks + got[1]
            await asyncio.sleep(0.05)
        await asyncio.wait_for(owner.finished.wait(), 60)
    finally:
        await liar.aclose()
    archived = _archived([owner])
    vouching = owner.parts.vouching
    # What the owner fetched is kept with its URL and digest only where a member may be
    # asked to show it: an open network's (a keyed one's data directory stays as small).
    fetched = [(key_for(urls.host_of(u)), urls.fingerprint(u)) for u in archived]
    assert owner.ledger is not None
    proofs = await owner.ledger.done.proofs(fetched)
    assert len(proofs) == (len(fetched) if mode == "open" else 0)
    if mode == "open":
        assert set(archived) == truth and max(archived.values()) == 1
        assert (leases, tasks, owner.parts.lender.lends_answered) == (0, 0, 0)
        # Its claims were held, one sample fetched again, and the member is believed no more.
        assert vouching.mismatched > 0 and vouching.verified == 0 and asked
        assert vouching.distrusts(liar_id) and vouching.distrusted_refused > 0
        assert 0 < vouching.refetches <= vouching.rounds
    else:
        # A keyed network takes a key holder's word, unchecked: what it said was done the
        # owner did not fetch (nor the pages only those linked to).
        assert set(archived) < truth
        assert (vouching.rounds, vouching.refetches, asked) == (0, 0, [])


async def test_an_honest_handoff_in_an_open_network_passes_its_check(
    make_web: WebFactory, make_peer: PeerFactory
) -> None:
    """Two honest peers of an open network at the defaults: the first crawls part of the web,
    the second joins and takes its keys with their done ranges. Those claims are checked and
    taken: no page is fetched twice but the few fetched again to check them, and none is
    lost."""
    web = await make_web(hosts=4, pages_per_host=30)
    truth = web.ground_truth()
    a = await make_peer(crawl=crawl_settings_for(web), peer=PeerSettings())
    assert a.engine is not None and a.ledger is not None
    await a.seed([web.hub_url])
    await eventually(lambda: a.ledger.done_count >= 20, 30)  # type: ignore[union-attr]
    a.engine.pause("test")  # what it did is handed over: done ranges, not queues alone
    b = await make_peer(crawl=crawl_settings_for(web), peer=PeerSettings(), bootstrap=(a.me.addr,))
    assert b.ledger is not None
    await eventually(lambda: b.parts.vouching.verified > 0, 30)
    a.engine.resume("test")
    await asyncio.wait_for(asyncio.gather(a.finished.wait(), b.finished.wait()), 60)
    checks = [a.parts.vouching, b.parts.vouching]
    assert sum(v.mismatched for v in checks) == 0
    assert set(_archived([a, b])) == truth
    refetches = sum(v.refetches for v in checks)
    duplicates = sum(n - 1 for u, n in web.request_counts.items() if u in truth)
    assert refetches > 0 and duplicates <= refetches
