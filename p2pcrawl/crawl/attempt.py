"""One attempt at a task on a host slot: robots.txt, the fetch, and the retry policy.

The outcome says what the worker does next, after the host is handed back: archive and
parse a page, record the task finished, drop it as done elsewhere, or nothing (it waits on
the host's queue for a retry or behind robots.txt). Deciding here and acting after the
slot is released keeps the host busy only for the request itself.
"""

from __future__ import annotations

import enum
import logging
import time
from typing import TYPE_CHECKING

from p2pcrawl.aio import backoff_delay
from p2pcrawl.crawl import hops, politeness, scheduling, urls
from p2pcrawl.crawl.conditional import conditional_headers
from p2pcrawl.crawl.domains import politeness_for
from p2pcrawl.crawl.fetcher import FetchResult
from p2pcrawl.crawl.frontier import Task
from p2pcrawl.crawl.hostslot import HostSlot
from p2pcrawl.crawl.unreachable import UNREACHABLE_ERRORS

if TYPE_CHECKING:
    from p2pcrawl.crawl.engine import Engine

__all__ = ["RETRYABLE_ERRORS", "Outcome", "RefusedHosts", "attempt"]

log = logging.getLogger(__name__)

RETRYABLE_ERRORS = frozenset({"timeout", "connect", "protocol", "disconnect"})
# A borrowed task held back (its loan is too far ahead of its lender's word) is tried again
# after this long: about half a report interval (network/reporting.py).
BORROWED_WAIT_S = 0.05


class Outcome(enum.Enum):
    PAGE = "page"  # a response to archive and parse
    FINISH = "finish"  # settled without a page (robots.txt, a final error): record it done
    DONE_ELSEWHERE = "done_elsewhere"  # finished meanwhile by an earlier owner
    WAITING = "waiting"  # back on the host's queue (retry, robots.txt first, max-pages)
    REFUSED = "refused"  # refused by this peer's own configuration: drop, do not record done


async def attempt(engine: Engine, slot: HostSlot, task: Task) -> tuple[Outcome, FetchResult | None]:
    ledger = engine.ledger
    polite = slot.hq.polite
    if task.lease and not engine.loans.may_fetch(
        task, engine.in_flight, polite.gap(engine.settings.politeness)
    ):
        slot.requeue(task)
        slot.after(0.0, BORROWED_WAIT_S)
        return Outcome.WAITING, None
    # A due revisit (continuous mode) is done by definition; it is fetched conditionally.
    visit = engine.revisits.visit_of(task) if engine.revisits is not None else None
    if visit is None and ledger.done.maybe_contains(task.fp) and (await ledger.is_done([task]))[0]:
        # Finished elsewhere meanwhile (history handed over after a restart or a move).
        return Outcome.DONE_ELSEWHERE, None
    dead = engine.unreachable
    if dead.tracking and dead.given_up(urls.origin_of(task.url)):
        # The origin stopped answering: its URLs end as errors without a request.
        dead.give_up_url(urls.origin_of(task.url))
        engine.stats.errors["host_unreachable"] += 1
        return Outcome.FINISH, None
    stats = engine.stats
    # The rules of the host's domain ([domains."…"] tables), if any cover it.
    ruled = engine.domains.for_host(urls.hostname_of(task.url)) if engine.domains else None
    domain, rules = ruled if ruled is not None else ("", None)
    if rules is not None and not engine.domains.patterns(domain, rules).allows(task.url):
        # Found by a peer that had not read the domain's rules yet, or seeded without the
        # check: refused by this peer's rules, not recorded done, as the address guard does.
        stats.budget["domain_patterns"] += 1
        return Outcome.REFUSED, None
    if engine.settings.politeness.politeness_by == "ip" and slot.hq.unit is None:
        # Before the host's first request (robots.txt included): which server it is.
        address = await engine.fetcher.address_of(urls.hostname_of(task.url))
        if address is not None and not slot.join_server(address):
            slot.requeue(task)  # the server is busy with another host's request
            return Outcome.WAITING, None
    agent = (rules.user_agent if rules is not None else None) or engine.fetcher.user_agent
    policy = await engine.robots_gate.policy_for(slot, task, agent)
    if policy is None:
        return Outcome.WAITING, None  # requeued behind the robots.txt request
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
    sitemaps = engine.robots_gate.sitemaps
    if sitemaps.pending(task, policy) and await sitemaps.step(engine, slot, task, policy, agent):
        return Outcome.WAITING, None  # a sitemap of the host was read first
    if not policy.allowed(task.url, agent):
        stats.robots_disallowed += 1
        return Outcome.FINISH, None
    if engine.held:
        # A limit was reached while this URL waited: keep it queued for a later run.
        slot.requeue(task)
        return Outcome.WAITING, None
    if engine.over_host_budget(task.url):
        stats.budget["host_pages"] += 1
        return Outcome.FINISH, None
    most = rules.max_pages if rules is not None else None
    if most is not None and engine.domains.pages[domain] >= most:
        stats.budget["domain_pages"] += 1
        return Outcome.FINISH, None
    # The host with the most found goes first when --max-rate makes requests wait.
    hq = slot.hq
    embedded = hops.embeds(task.hops) > 0
    res = await engine.fetch_page(
        task.url,
        priority=scheduling.request_priority(
            len(hq.tasks),
            hq.taken,
            borrowed=task.lease != 0,
            leading=engine.frontier.leader is hq,
        ),
        user_agent=rules.user_agent if rules is not None else None,
        max_body=engine.settings.signals.max_requisite_bytes if embedded else None,
        headers=conditional_headers(visit) if visit is not None else None,
    )
    pset = politeness_for(engine.settings.politeness, rules)
    gap = politeness.next_gap(pset, hq.polite.robots_delay, res.elapsed)
    hq.est.observe(None, res.elapsed)
    stats.fetch_hist.observe(res.elapsed)
    stats.recent.append((time.time(), task.url, res.status, res.error or ""))
    if res.status == 0 and res.error in UNREACHABLE_ERRORS:
        origin = urls.origin_of(task.url)
        if dead.failed(origin, res.error or "").failures > dead.retries:
            # Given up now: this URL and the rest of its origin's end as errors at once,
            # rather than each waiting out its own retries.
            stats.errors[res.error or "unknown"] += 1
            slot.after(res.elapsed, gap)
            return Outcome.FINISH, None
    elif dead.tracking and res.status:
        dead.answered(urls.origin_of(task.url))
    if res.status == 0 or res.error == "disconnect":
        # A connection broken mid-body is an error like a refused one, not a page: retried
        # with backoff, and only after the last try archived as what arrived.
        stats.errors[res.error or "unknown"] += 1
        if res.error == "forbidden":
            # Refused by this peer's own configuration (the SSRF guard, --allow-private).
            # Recorded done, the URL would never be crawled once the operator allows it.
            slot.after(res.elapsed, gap)
            engine.refused_hosts.note(task.url)
            return Outcome.REFUSED, None
        if res.error in RETRYABLE_ERRORS and task.tries < pset.max_retries:
            task.tries += 1
            stats.retries += 1
            slot.requeue(task)
            slot.after(res.elapsed, max(gap, backoff_delay(task.tries, 1.0, pset.max_delay)))
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
    stats.requisites_fetched += embedded
    stats.bytes_fetched += len(res.body)
    stats.status[res.status] += 1
    engine.count_host_page(task.url)
    if rules is not None and rules.max_pages is not None:
        engine.domains.pages[domain] += 1
    if res.truncated:
        stats.truncated += 1
        stats.truncated_by[res.truncated] += 1
    return Outcome.PAGE, res


class RefusedHosts:
    """Hosts the address guard refused: each is said once, with how to allow it."""

    LIMIT = 1000  # hosts remembered; past it the memory starts again

    def __init__(self) -> None:
        self.hosts: set[str] = set()

    def note(self, url: str) -> None:
        host = urls.hostname_of(url)
        if host in self.hosts:
            return
        if len(self.hosts) >= self.LIMIT:
            self.hosts.clear()
        self.hosts.add(host)
        log.warning(
            "refused %s: %s is a loopback, private or link-local address "
            "(start the peer with --allow-private to crawl it)",
            url,
            host,
        )
