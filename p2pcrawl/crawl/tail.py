"""A fetched page's tail: archive it, extract and route its links, record it finished.

The WARC record is written while the page is parsed and its links routed; the page counts
as done only once its record is on disk (a crash before that leaves the URL queued).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2pcrawl.archive import FetchRecord
from p2pcrawl.crawl import urls
from p2pcrawl.crawl.fetcher import FetchResult
from p2pcrawl.crawl.frontier import Task
from p2pcrawl.crawl.parse import extract_links
from p2pcrawl.crawl.parseproc import needs_worker

if TYPE_CHECKING:
    from p2pcrawl.crawl.engine import Engine

__all__ = ["page_tail", "to_record"]


async def page_tail(engine: Engine, task: Task, res: FetchResult) -> None:
    warc = engine.warc
    record = to_record(res)
    # Continuous mode: a revisit record for an unchanged page, links only from a new one.
    plan = await engine.revisits.plan(task, res, record) if engine.revisits else None
    archived = await warc.submit(plan.record if plan else record) if warc is not None else None
    links = engine.links
    # A redirect target is the same document moved: it keeps the source's depth.
    fresh = links.tasks(_redirect_target(engine, task, res), task.depth, task.hops + 1)
    # A truncated HTML body is parsed too: lexbor closes what was left open, and the links
    # that arrived are as real as those of a whole page.
    if res.is_html and 200 <= res.status < 300:
        if plan is None or plan.follow:  # an unchanged page's links were routed before
            fresh += links.tasks(await _parse(engine, task, res), task.depth + 1, 0)
    elif 200 <= res.status < 300:
        engine.stats.non_html += 1
    if fresh:
        engine.stats.urls_discovered += len(fresh)
        # A page fetched on loan: its host's owner is another peer, and the host's next
        # pages wait for these links to reach it.
        await engine.router.route(fresh, urgent=task.key if task.lease else None, found=True)
    if archived is not None:
        await archived
    if plan is not None:
        assert engine.revisits is not None
        await engine.revisits.settle_page(task, plan, res)
    else:
        await engine.finish([task])


def _redirect_target(engine: Engine, task: Task, res: FetchResult) -> list[str]:
    if not res.is_redirect or res.location is None:
        return []
    engine.stats.redirects += 1
    fetch = engine.settings.fetch
    target = urls.resolve(task.url, res.location, max_length=fetch.max_url_length)
    if target is None:
        engine.stats.errors["bad_redirect"] += 1
        return []
    if task.hops + 1 > fetch.max_redirects:
        engine.stats.redirect_limit += 1
        return []
    return [target]


async def _parse(engine: Engine, task: Task, res: FetchResult) -> list[str]:
    limits = engine.settings.fetch
    stats = engine.stats
    if needs_worker(res.body):
        # Large or tag-heavy: parsed in a process, nesting capped, under a deadline.
        bounded = await engine.parsers.parse(
            res.body,
            task.url,
            encoding=res.charset,
            max_links=limits.max_links_per_page,
            max_url_length=limits.max_url_length,
        )
        stats.parsed_in_worker += 1
        if bounded.bound is not None:
            stats.parse_bounded[bounded.bound] += 1
        page = bounded.page
    else:
        # Fewer start tags than the loop can afford to nest: parsed here, as fast as before.
        page = extract_links(
            res.body,
            task.url,
            encoding=res.charset,
            max_links=limits.max_links_per_page,
            max_url_length=limits.max_url_length,
        )
    stats.html_parsed += 1
    stats.links_extracted += len(page.links)
    if page.nofollow:
        stats.nofollow_pages += 1
    return page.links


def to_record(res: FetchResult) -> FetchRecord:
    return FetchRecord(
        url=res.url,
        status=res.status,
        reason=res.reason,
        http_version="1.1",
        request_headers=res.request_headers,
        response_headers=res.headers,
        body=res.body,
        truncated=res.truncated,
        ip=res.ip,
        fetched_at=res.fetched_at,
    )
