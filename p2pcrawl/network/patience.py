"""Whether our RPC lanes may wait longer now: links to owners that had them all, and the
news of finished pages (``dispatch.STALE_AFTER``, ``replication.PATIENT_COPY_SPACING_S``).

They may while more is queued than two rounds of our fetchers (so the crawl's end waits on
nothing here), no hand-off or leave waits for our pages, a quarter of the page tails' room
is free (their slots, or the pipeline's tickets where those are fewer: ``crawl.pipeline``),
and no fetch waits for a ticket: a new owner, whose pages' links are all new to it, had its
fetches wait for tickets while each tail waited out a stretched spacing, and crawled at a
third of its pace for seconds. A tail holds both while it waits, and the fetchers stop when
none is free; as they fill, batches leave at their usual spacing again, so a fast link is
never held to slots-per-wait pages a second (docs/architecture.md, "Async plumbing").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from p2pcrawl.crawl import Pipeline
from p2pcrawl.settings import CrawlSettings

__all__ = ["Backlog", "Patience"]


class Backlog(Protocol):
    """How much our crawler has before it (``crawl.Engine``)."""

    @property
    def settings(self) -> CrawlSettings: ...

    @property
    def tasks_queued(self) -> int: ...

    @property
    def tails(self) -> int: ...

    @property
    def tail_slots(self) -> int: ...

    @property
    def pipeline(self) -> Pipeline: ...


class Patience:
    def __init__(
        self, crawl: Backlog, *, active: Callable[[], bool], hurry: Callable[[], None]
    ) -> None:
        """``hurry``: every RPC lane waiting out its spacing sends now."""
        self.crawl = crawl
        self._active = active
        self.hurry = hurry
        self.handing_off = 0  # hand-offs waiting for their keys' pages to finish here
        # A lane that began a stretched wait before the tails filled sends now.
        crawl.pipeline.on_gating = hurry

    def __call__(self) -> bool:
        crawl = self.crawl
        if not self._active() or self.handing_off:
            return False
        conc = crawl.settings.concurrency
        pipeline = crawl.pipeline
        if pipeline.gating:
            # Fetches wait for tails to end: every tail's wait is a page not fetched.
            return False
        room = min(crawl.tail_slots, pipeline.pages or crawl.tail_slots)
        return crawl.tasks_queued > 2 * conc and 4 * crawl.tails < 3 * room

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A hand-off waits for our pages' tails, and they wait on our lanes: the lanes send
        now, and are not patient until it is over."""
        self.handing_off += 1
        try:
            self.hurry()
            yield
        finally:
            self.handing_off -= 1
