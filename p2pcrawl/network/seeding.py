"""Seeding with a report: what became of each seed URL, by this peer and by its owner.

:func:`~p2pcrawl.crawl.seeds.check_seed` gives this peer's verdict (scheme, address guard,
scope, patterns); an accepted seed is then offered to its owner on its own, so the owner's
answer (new, or already queued or done there) is known per URL rather than summed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from p2pcrawl.crawl import Ledger, LinkFilter, SeedVerdict, SeenCache, Task, check_seed, urls
from p2pcrawl.network.intake import AcceptTasks
from p2pcrawl.network.ports import ScopeView, StoreTask, to_batches
from protocol import PeerRef, PeerTimeout, RemoteError

__all__ = ["Forward", "Seeder", "log_verdicts"]

log = logging.getLogger("p2pcrawl.seeds")

SEEDS_AT_ONCE = 16


# Asks the owner itself (through its status server) to seed one URL again: the owner's own
# verdict, or None when it cannot be asked. Given by the status server, which knows where
# the other peers' status servers are.
Forward = Callable[[bytes, str], Awaitable[dict[str, Any] | None]]


class SeedCrawl(ScopeView, Protocol):
    """What seeding asks of our crawler (``crawl.Engine``)."""

    @property
    def links(self) -> LinkFilter: ...

    @property
    def seen(self) -> SeenCache: ...

    def seed_tasks(self, seeds: Iterable[str]) -> list[Task]: ...

    async def add_seeds(self, seeds: Iterable[str]) -> int: ...


class Owners(Protocol):
    @property
    def me(self) -> PeerRef: ...

    async def owner(self, key: bytes, *, fresh: bool = False) -> PeerRef: ...


class Route(Protocol):
    """``Dispatcher.route``."""

    def __call__(self, tasks: list[Task], *, attempt: int = 0) -> Awaitable[None]: ...


class Seeder:
    def __init__(
        self,
        crawl: SeedCrawl,
        ledger: Ledger,
        owners: Owners,
        *,
        send: StoreTask,
        route: Route,
        accept: AcceptTasks,
        publish: Callable[[set[str]], Awaitable[None]],
    ) -> None:
        """``route``: to a seed's owner with retries (``Dispatcher.route``); ``accept``: a
        seed this peer owns (``Intake.accept``); ``publish``: the seeds' hosts into the
        network-wide default scope (``ScopeSync.publish``)."""
        self.crawl = crawl
        self.ledger = ledger
        self.owners = owners
        self._send = send
        self._route = route
        self._accept = accept
        self._publish = publish

    async def add(self, seeds: Iterable[str]) -> int:
        """Seed without a report: each URL routed to its owner."""
        crawl = self.crawl
        seeds = list(seeds)
        if crawl.scope_from_seeds:
            tasks = crawl.seed_tasks(seeds)  # validates; raises ValueError first
            # Published before the seeds travel, so an owner that refreshes its scope on
            # receiving a seed already finds every seed host there.
            await self._publish({urls.hostname_of(t.url) for t in tasks})
        return await crawl.add_seeds(seeds)

    async def seed(
        self, seeds: Iterable[str], *, recrawl: bool = False, forward: Forward | None = None
    ) -> list[SeedVerdict]:
        """Seed, and say per URL what became of it."""
        crawl = self.crawl
        settings = crawl.settings
        # Each seed may wait on DNS or on its owner's reply: a few at a time, so a request
        # of many seeds ends well within the client's timeout even when some owners are slow.
        gate = asyncio.Semaphore(SEEDS_AT_ONCE)

        async def verdict(raw: str) -> SeedVerdict:
            async with gate:
                return await check_seed(
                    raw,
                    scope=crawl.scope,
                    scope_from_seeds=crawl.scope_from_seeds,
                    patterns=crawl.links.patterns,
                    domains=crawl.links.domains,
                    max_url_length=settings.fetch.max_url_length,
                )

        verdicts = list(await asyncio.gather(*(verdict(raw) for raw in seeds)))
        ok = [v for v in verdicts if v.result == SeedVerdict.ACCEPTED and v.canonical is not None]
        if not ok:
            return verdicts
        tasks = crawl.seed_tasks([v.canonical for v in ok if v.canonical is not None])
        if crawl.scope_from_seeds:
            # Published before the seeds travel, so an owner that refreshes its scope on
            # receiving a seed already finds every seed host there.
            await self._publish({urls.hostname_of(t.url) for t in tasks})

        async def offer(v: SeedVerdict, t: Task) -> None:
            async with gate:
                await self._offer(v, t, recrawl, forward)

        for t in tasks:
            crawl.seen.check_and_add(t.fp)
        await asyncio.gather(*(offer(v, t) for v, t in zip(ok, tasks, strict=True)))
        return verdicts

    async def _offer(self, v: SeedVerdict, t: Task, recrawl: bool, forward: Forward | None) -> None:
        """Hand one accepted seed to its owner and write the owner's answer into ``v``."""
        owner = await self.owners.owner(t.key)
        if owner.id == self.owners.me.id:
            again = recrawl and await self.ledger.forget_done([t]) > 0
            new = await self._accept([t])
            if again and new:
                v.reason = "crawled before; queued again (--recrawl)"
            elif not new:
                v.result = SeedVerdict.ALREADY_KNOWN
                v.reason = "already queued or done here" + (
                    "" if recrawl else "; --recrawl fetches it again"
                )
            return
        try:
            result = await self._send(owner, to_batches([t]))
        except (PeerTimeout, RemoteError, OSError):
            # The dispatcher retries and re-resolves the owner; what it says is not known.
            await self._route([t])
            v.reason = f"routed; its owner {owner.id.hex()[:8]} did not answer yet"
            return
        if result.refused_keys:
            await self._route([t], attempt=1)  # ownership moved meanwhile: look it up afresh
            v.reason = "routed to its new owner"
        elif not result.new:
            short = owner.id.hex()[:8]
            answer = await forward(owner.id, t.url) if recrawl and forward is not None else None
            if answer is not None:
                v.result = str(answer.get("result", SeedVerdict.ALREADY_KNOWN))
                v.reason = f"{answer.get('reason') or 'accepted'}, at its owner {short}"
                return
            v.result = SeedVerdict.ALREADY_KNOWN
            v.reason = f"already queued or done at its owner {short}" + (
                " (its status server could not be asked to fetch it again: seed it there "
                "with --recrawl)"
                if recrawl
                else "; --recrawl fetches it again"
            )


def log_verdicts(verdicts: Iterable[SeedVerdict]) -> None:
    """One log line per seed: info when it will be crawled, a warning when it will not."""
    for v in verdicts:
        shown = v.canonical or v.url
        if v.result == SeedVerdict.ACCEPTED:
            log.info("seed %s accepted%s", shown, f" ({v.reason})" if v.reason else "")
        else:
            log.warning("seed %s %s: %s", shown, v.result.replace("_", " "), v.reason)
