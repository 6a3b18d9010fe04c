"""One attempt at a task on a host slot: robots.txt, the fetch, and the retry policy.

The outcome says what the worker does next, after the host is handed back: archive and
parse a page, record the task finished, drop it as done elsewhere, or nothing (it waits on
the host's queue for a retry or behind robots.txt). Deciding here and acting after the
slot is released keeps the host busy only for the request itself.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from p2pcrawl.crawl import politeness, scheduling
from p2pcrawl.crawl.fetcher import FetchResult
from p2pcrawl.crawl.frontier import HostSlot, Task
from p2pcrawl.crawl.revisit import conditional_headers

if TYPE_CHECKING:
    from p2pcrawl.crawl.engine import Engine

__all__ = ["RETRYABLE_ERRORS", "Outcome", "attempt"]

RETRYABLE_ERRORS = frozenset({"timeout", "connect", "protocol", "disconnect"})
# A borrowed task held back (its loan is too far ahead of its lender's word) is tried again
# after this long: about half a report interval (network/borrower.py).
BORROWED_WAIT_S = 0.05


class Outcome(enum.Enum):
    PAGE = "page"  # a response to archive and parse
    FINISH = "finish"  # settled without a page (robots.txt, a final error): record it done
    DONE_ELSEWHERE = "done_elsewhere"  # finished meanwhile by an earlier owner
    WAITING = "waiting"  # back on the host's queue (retry, robots.txt first, max-pages)
    REFUSED = "refused"  # refused by this peer's own configuration: drop, do not record done


async def attempt(engine: Engine, slot: HostSlot, task: Task) -> tuple[Outcome, FetchResult | None]:
    ledger = engine.ledger
    gate = engine.may_fetch_borrowed
    if task.lease and gate is not None and not gate(task):
        slot.requeue(task)
        slot.after(0.0, BORROWED_WAIT_S)
        return Outcome.WAITING, None
    # A due revisit (continuous mode) is done by definition; it is fetched conditionally.
    visit = engine.revisits.visit_of(task) if engine.revisits is not None else None
    if visit is None and ledger.done.maybe_contains(task.fp) and (await ledger.is_done([task]))[0]:
        # Finished elsewhere meanwhile (history handed over after a restart or a move).
        return Outcome.DONE_ELSEWHERE, None
    policy = await engine.robots_gate.policy_for(slot, task)
    if policy is None:
        return Outcome.WAITING, None  # requeued behind the robots.txt request
    stats = engine.stats
    if policy.kind == "disallow_all":
        if engine.robots_gate.unreachable_too_long(task.url):
            # RFC 9309 §2.3.1.4 lets a crawler treat a robots.txt that stays unreachable as
            # unavailable; for a crawl that must end, its URLs end as errors rather than
            # wait for a host that does not answer.
            stats.errors["robots_unreachable"] += 1
            return Outcome.FINISH, None
        # robots.txt was unreachable (RFC 9309 §2.3.1.4): wait for it, keep the URL.
        slot.requeue(task)
        slot.after(0.0, max(0.0, policy.expires_at - time.monotonic()))
        return Outcome.WAITING, None
    if not policy.allowed(task.url, engine.fetcher.user_agent):
        stats.robots_disallowed += 1
        return Outcome.FINISH, None
    if engine.exhausted:
        # max-pages was reached while this URL waited: keep it queued for a later run.
        slot.requeue(task)
        return Outcome.WAITING, None
    if engine.over_host_budget(task.url):
        stats.budget["host_pages"] += 1
        return Outcome.FINISH, None
    # The host with the most found goes first when --max-rate makes requests wait.
    hq = slot.hq
    res = await engine.fetch_page(
        task.url,
        priority=scheduling.request_priority(
            len(hq.tasks),
            hq.taken,
            borrowed=task.lease != 0,
            leading=engine.frontier.leader is hq,
        ),
        headers=conditional_headers(visit) if visit is not None else None,
    )
    pset = engine.settings.politeness
    gap = politeness.next_gap(pset, hq.polite.robots_delay, res.elapsed)
    hq.est.observe(None, res.elapsed)
    stats.fetch_hist.observe(res.elapsed)
    stats.recent.append((time.time(), task.url, res.status, res.error or ""))
    if res.status == 0 or res.error == "disconnect":
        # A connection broken mid-body is an error like a refused one, not a page: retried
        # with backoff, and only after the last try archived as what arrived.
        stats.errors[res.error or "unknown"] += 1
        if res.error == "forbidden":
            # Refused by this peer's own configuration (the SSRF guard, --allow-private).
            # Recorded done, the URL would never be crawled once the operator allows it.
            slot.after(res.elapsed, gap)
            engine.note_refused(task.url)
            return Outcome.REFUSED, None
        if res.error in RETRYABLE_ERRORS and task.tries < pset.max_retries:
            task.tries += 1
            stats.retries += 1
            slot.requeue(task)
            slot.after(
                res.elapsed, max(gap, politeness.backoff_seconds(task.tries, 1.0, pset.max_delay))
            )
            return Outcome.WAITING, None
        if res.status == 0:
            slot.after(res.elapsed, gap)
            return Outcome.FINISH, None
    if res.status in (429, 503) and task.tries < pset.max_retries:
        wait = politeness.retry_after_seconds(
            res.retry_after, time.time(), pset.default_retry_after, pset.max_delay
        )
        task.tries += 1
        stats.retries += 1
        stats.status[res.status] += 1
        slot.requeue(task)
        slot.after(res.elapsed, max(gap, wait))
        return Outcome.WAITING, None
    slot.after(res.elapsed, gap)
    stats.pages_fetched += 1
    stats.bytes_fetched += len(res.body)
    stats.status[res.status] += 1
    engine.count_host_page(task.url)
    if res.truncated:
        stats.truncated += 1
        stats.truncated_by[res.truncated] += 1
    return Outcome.PAGE, res
