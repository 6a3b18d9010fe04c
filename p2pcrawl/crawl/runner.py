"""A crawl by one peer, no network: until nothing is queued or max-pages is hit; in
continuous mode (``--revisit``), for ``run_for`` seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from p2pcrawl.archive import WarcWriter
from p2pcrawl.crawl.engine import Engine
from p2pcrawl.crawl.ledger import Ledger
from p2pcrawl.crawl.stats import CrawlStats
from p2pcrawl.settings import CrawlSettings, Partition

__all__ = ["CrawlSummary", "crawl"]


@dataclass(slots=True)
class CrawlSummary:
    pages_fetched: int
    elapsed_s: float
    cpu_s: float
    warc_files: list[Path]
    stats: CrawlStats
    done: int
    queued: int
    errors: dict[str, int] = field(default_factory=dict)


async def crawl(
    seeds: list[str],
    settings: CrawlSettings,
    data_dir: Path,
    *,
    partition: Partition = "host",
    node_prefix: str = "local",
    idle_grace: float = 0.0,
    run_for: float | None = None,
    on_engine: Callable[[Engine], None] | None = None,
) -> CrawlSummary:
    """Crawl from ``seeds`` with one peer until nothing is queued or max-pages is reached;
    a continuous crawl never runs out of work, so it stops after ``run_for`` seconds.
    ``on_engine`` is handed the engine once it runs (to watch it)."""
    if settings.revisit.enabled and run_for is None:
        raise ValueError("a continuous crawl (settings.revisit) needs run_for")
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    started, cpu0 = time.monotonic(), time.process_time()
    ledger = await Ledger.open(data_dir / "stores")
    warc: WarcWriter | None = None
    engine: Engine | None = None
    try:
        if settings.warc:
            warc = WarcWriter(
                data_dir / "warc", prefix=node_prefix, max_bytes=settings.warc_max_bytes
            )
            await warc.start()
        engine = Engine(settings, ledger, warc=warc, partition=partition, data_dir=data_dir)
        await engine.start()
        if on_engine is not None:
            on_engine(engine)
        await engine.add_seeds(seeds)
        until = None if run_for is None else time.monotonic() + run_for
        while (
            time.monotonic() < until
            if until is not None
            else not (engine.idle or (engine.exhausted and not engine.in_flight))
        ):
            if engine.failure is not None and not engine.in_flight:
                raise engine.failure
            left = 0.5 if until is None else min(0.5, until - time.monotonic())
            await engine.wait_progress(max(0.0, left))
        if idle_grace:
            await asyncio.sleep(idle_grace)
    finally:
        if engine is not None:
            await engine.aclose()
        if warc is not None:
            await warc.aclose()
        await ledger.aclose()
    assert engine is not None
    return CrawlSummary(
        pages_fetched=engine.stats.pages_fetched,
        elapsed_s=time.monotonic() - started,
        cpu_s=time.process_time() - cpu0,
        warc_files=list(warc.files) if warc else [],
        stats=engine.stats,
        done=ledger.done_count,
        queued=ledger.queued,
        errors=dict(engine.stats.errors),
    )
