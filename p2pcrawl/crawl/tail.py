"""A fetched page's tail: archive it, extract and route its links, record it finished.

The page is parsed first (its robots directives and canonical URL go into its WARC record),
then the record is written while the page's links are routed; the page counts as done only
once its record is on disk (a crash before that leaves the URL queued). A requisite's links
are never followed: only a stylesheet's references are, as requisites of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2pcrawl.archive import FetchRecord
from p2pcrawl.crawl import hops, urls
from p2pcrawl.crawl.css import css_references, decode_css
from p2pcrawl.crawl.directives import Directives
from p2pcrawl.crawl.fetcher import FetchResult
from p2pcrawl.crawl.frontier import Task
from p2pcrawl.crawl.parse import ParsedPage, extract_links
from p2pcrawl.crawl.parseproc import needs_worker
from p2pcrawl.crawl.signals import header_signals, warc_fields

if TYPE_CHECKING:
    from p2pcrawl.crawl.engine import Engine

__all__ = ["page_tail", "to_record"]


async def page_tail(engine: Engine, task: Task, res: FetchResult) -> None:
    links = engine.links
    stats = engine.stats
    sig = engine.settings.signals
    embeds = hops.embeds(task.hops)
    said = header_signals(res.headers, task.url, links.page_rules.agent)
    directives, canonical = said.directives, said.canonical
    found: list[str] = []
    needs: list[str] = []
    ok = 200 <= res.status < 300
    # Continuous mode: a revisit record for an unchanged page, whose links were routed
    # before (it is not parsed again); a new or changed page goes on as below.
    plan = await engine.revisits.plan(task, res) if engine.revisits else None
    follow = plan is None or plan.follow
    # A truncated HTML body is parsed too: lexbor closes what was left open, and the links
    # that arrived are as real as those of a whole page.
    if res.is_html and ok and follow:
        page = await _parse(engine, task, res)
        directives |= page.directives
        canonical = canonical or page.canonical
        if not embeds:  # a requisite's links are never followed
            found, needs = page.links, page.requisites
    elif ok and follow and res.content_type == "text/css" and embeds < hops.MAX_EMBEDS:
        needs = css_references(
            decode_css(res.body, res.charset),
            task.url,
            links.page_rules.max_requisites,
            engine.settings.fetch.max_url_length,
        )
    elif ok and follow:
        stats.non_html += 1
    _count(engine, directives)
    if said.directives.nofollow and sig.robots_meta:
        found = []  # the header said nofollow; the meta tag's was obeyed by the parser
    keep_body = not (directives.noarchive and sig.obey_noarchive)
    if not keep_body:
        stats.headers_only += 1
    warc = engine.warc
    record = to_record(res, warc_fields(directives, canonical), keep_body=keep_body)
    if plan is not None:
        record = plan.archive(record)
    archived = await warc.submit(record) if warc is not None else None
    fresh = _redirect_target(engine, task, res) if follow else []
    if found:
        fresh += links.tasks(found, task.depth + 1, 0)
    if canonical is not None and canonical != task.url and not embeds and follow:
        # The page's preferred URL is the same document: it keeps the page's depth.
        canon = links.tasks([canonical], task.depth, 0)
        stats.canonical_links += len(canon)
        fresh += canon
    if needs:
        fresh += links.requisite_tasks(needs, task.depth, hops.embedded(task.hops))
    if fresh:
        stats.urls_discovered += len(fresh)
        # A page fetched on loan: its host's owner is another peer, and the host's next
        # pages wait for these links to reach it.
        await engine.router.route(fresh, urgent=task.key if task.lease else None, found=True)
    if archived is not None:
        await archived
    if plan is not None:
        assert engine.revisits is not None
        await engine.revisits.settle_page(task, plan, res)
    else:
        await engine.finish([task], body=res.body)


def _count(engine: Engine, directives: Directives) -> None:
    stats = engine.stats
    if directives.nofollow:
        stats.nofollow_pages += 1
    if directives.noindex:
        stats.noindex_pages += 1
    if directives.noarchive:
        stats.noarchive_pages += 1


def _redirect_target(engine: Engine, task: Task, res: FetchResult) -> list[Task]:
    """The redirect's target: the same document moved, so it keeps the source's depth (and,
    for a requisite, its embed hops and scope rule)."""
    if not res.is_redirect or res.location is None:
        return []
    engine.stats.redirects += 1
    fetch = engine.settings.fetch
    target = urls.resolve(task.url, res.location, max_length=fetch.max_url_length)
    if target is None:
        engine.stats.errors["bad_redirect"] += 1
        return []
    if hops.redirects(task.hops) + 1 > fetch.max_redirects:
        engine.stats.redirect_limit += 1
        return []
    moved = hops.redirected(task.hops)
    if hops.embeds(task.hops):
        return engine.links.requisite_tasks([target], task.depth, moved)
    return engine.links.tasks([target], task.depth, moved)


async def _parse(engine: Engine, task: Task, res: FetchResult) -> ParsedPage:
    limits = engine.settings.fetch
    stats = engine.stats
    rules = engine.links.page_rules
    if needs_worker(res.body):
        # Large or tag-heavy: parsed in a process, nesting capped, under a deadline.
        bounded = await engine.parsers.parse(
            res.body,
            task.url,
            encoding=res.charset,
            max_links=limits.max_links_per_page,
            max_url_length=limits.max_url_length,
            rules=rules,
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
            rules=rules,
        )
    stats.html_parsed += 1
    stats.links_extracted += len(page.links)
    return page


def to_record(
    res: FetchResult, fields: tuple[tuple[str, str], ...] = (), *, keep_body: bool = True
) -> FetchRecord:
    """The capture of ``res``; without ``keep_body`` only its headers (``noarchive``
    obeyed: the stored Content-Length says 0, the original length is kept beside it)."""
    return FetchRecord(
        url=res.url,
        status=res.status,
        reason=res.reason,
        http_version="1.1",
        request_headers=res.request_headers,
        response_headers=res.headers,
        body=res.body if keep_body else b"",
        truncated=res.truncated if keep_body else "",
        ip=res.ip,
        fetched_at=res.fetched_at,
        warc_fields=fields,
    )
