"""Small fakes of the ports the peer's collaborators are built with (``p2pcrawl.network``).

A collaborator under test gets real stores (SQLite in ``tmp_path``), a real crawl engine
where it drives one (not started: no fetch, no socket), and these in place of the node: a
fake network that answers ownership as the node does (XOR-closest member, this peer
included), and records every RPC sent while a test decides how each is answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from p2pcrawl.crawl import Engine, Ledger, Task, urls
from p2pcrawl.settings import CrawlSettings, ScopeSettings
from protocol import Held, KeyBatch, PeerRef, RefreshAnswer, StoreResult, closest, key_for
from storage import BackupStore

__all__ = ["FakeCrawl", "Net", "open_stores", "peer", "tasks_of"]


def peer(node_id: bytes, port: int = 1) -> PeerRef:
    return PeerRef(node_id, "127.0.0.1", port)


def tasks_of(host: str, pages: Iterable[int] | int, depth: int = 1) -> list[Task]:
    numbers = range(pages) if isinstance(pages, int) else pages
    out = []
    for i in numbers:
        url = f"http://{host}/p{i}"
        out.append(Task(url, urls.fingerprint(url), key_for(host), depth))
    return out


async def open_stores(tmp_path: Path) -> tuple[Ledger, BackupStore]:
    ledger = await Ledger.open(tmp_path / "stores")
    backups = await BackupStore.open(tmp_path / "stores" / "backups.sqlite3")
    return ledger, backups


def engine_for(ledger: Ledger, *hosts: str, **kwargs: object) -> Engine:
    """A real engine over ``ledger`` whose scope is ``hosts``, never started."""
    settings = CrawlSettings(scope=ScopeSettings(allow_domains=hosts))
    return Engine(settings, ledger, warc=None, **kwargs)  # type: ignore[arg-type]


StoreTaskAnswer = Callable[[PeerRef, list[KeyBatch]], Awaitable[StoreResult]]


class Net:
    """The network as one peer sees it: ``me`` and the members it knows, ownership by XOR
    distance as ``CrawlNode.closest_local`` answers it, and the RPCs it sends. Every call is
    recorded in ``calls`` as (rpc, peer, arguments); ``store_task_answer`` and the like decide
    the answers (by default every task is taken, every backup held)."""

    def __init__(self, me: bytes, members: Iterable[bytes] = ()) -> None:
        self.me = peer(me, 1)
        self.members: dict[bytes, PeerRef] = {}
        for m in members:
            self.add(m)
        self.owner_ready = True  # False while "joining": this peer owns nothing
        # Contacts in the table too young to own keys: they may hold copies.
        self.young: dict[bytes, PeerRef] = {}
        self.calls: list[tuple[str, PeerRef, object]] = []
        self.store_task_answer: StoreTaskAnswer = _take_all
        self.refresh_answer: Callable[[PeerRef], Awaitable[RefreshAnswer]] = _nothing_more
        self.took_ownership = 0

    def add(self, member: bytes) -> PeerRef:
        ref = self.members[member] = peer(member, 2 + len(self.members))
        return ref

    def sent(self, rpc: str) -> list[tuple[PeerRef, object]]:
        return [(p, a) for name, p, a in self.calls if name == rpc]

    # -- the answers the node gives -----------------------------------------------------------

    def peers(self) -> list[PeerRef]:
        return list(self.members.values())

    def neighbours(self, n: int) -> list[PeerRef]:
        return [*self.members.values(), *self.young.values()][:n]

    def is_member(self, peer_id: bytes) -> bool:
        return peer_id in self.members

    def in_table(self, peer_id: bytes) -> bool:
        return peer_id in self.members or peer_id in self.young

    def member(self, peer_id: bytes) -> PeerRef | None:
        return self.members.get(peer_id)

    def suspects(self) -> list[bytes]:
        return []

    def closest_local(self, key: bytes, n: int, *, with_self: bool | None = None) -> list[PeerRef]:
        mine = self.owner_ready if with_self is None else with_self
        pool = {**self.members, **({self.me.id: self.me} if mine else {})}
        return [pool[i] for i in closest(key, pool, n)]

    def closest_contacts(self, key: bytes, n: int) -> list[PeerRef]:
        pool = {**self.members, **self.young, self.me.id: self.me}
        return [pool[i] for i in closest(key, pool, n)]

    def take_ownership(self) -> bool:
        self.took_ownership += 1
        changed, self.owner_ready = not self.owner_ready, True
        return changed

    # -- the RPCs it sends ---------------------------------------------------------------------

    async def store_task(self, to: PeerRef, batches: Sequence[KeyBatch]) -> StoreResult:
        self.calls.append(("store_task", to, list(batches)))
        return await self.store_task_answer(to, list(batches))

    async def store_backup(self, to: PeerRef, owner: bytes, batches: Sequence[KeyBatch]) -> Held:
        self.calls.append(("store_backup", to, (owner, list(batches))))
        return Held(sum(len(b.tasks) for b in batches))

    async def delete_backup(
        self, to: PeerRef, owner: bytes, done: Mapping[bytes, Sequence[int]]
    ) -> int:
        self.calls.append(("delete_backup", to, (owner, dict(done))))
        return 0

    async def refresh_task(self, to: PeerRef) -> RefreshAnswer:
        self.calls.append(("refresh_task", to, None))
        return await self.refresh_answer(to)

    async def goodbye(self, to: PeerRef) -> None:
        self.calls.append(("goodbye", to, None))

    def depart(self) -> None:
        """From now on this peer sends only its handoff (``CrawlNode.depart``)."""
        self.calls.append(("depart", self.me, None))


async def _take_all(to: PeerRef, batches: list[KeyBatch]) -> StoreResult:
    return StoreResult(sum(len(b.tasks) for b in batches), 0, [])


async def _nothing_more(to: PeerRef) -> RefreshAnswer:
    return RefreshAnswer(0)


class FakeCrawl:
    """The crawl side of a handoff (``handoff.HandoffCrawl``): which keys are excluded from
    our fetchers, and the fetches under way."""

    def __init__(self) -> None:
        self.keep_proofs = False  # a keyed network: every done page is handed
        self.excluded: set[bytes] = set()
        self.in_flight: dict[int, Task] = {}
        self.woken = 0
        self.ever_included: set[bytes] = set()

    def exclude_keys(self, keys: Iterable[bytes]) -> list[Task]:
        self.excluded |= set(keys)
        return []

    def include_keys(self, keys: Iterable[bytes]) -> None:
        keys = set(keys)
        self.excluded -= keys
        self.ever_included |= keys

    def wake(self) -> None:
        self.woken += 1

    async def wait_progress(self, timeout: float) -> None:
        await asyncio.sleep(min(timeout, 0.01))


@contextmanager
def no_patience() -> Iterator[None]:
    yield
