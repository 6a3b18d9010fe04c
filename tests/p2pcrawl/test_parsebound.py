"""Parse bounds: deep nesting flattened before lexbor, large pages parsed in a process."""

from __future__ import annotations

import time

import pytest
from selectolax.lexbor import LexborHTMLParser

from p2pcrawl.crawl import ParseWorkers, flatten_deep_nesting, needs_worker, parse_bounded


def _bomb(depth: int, tag: bytes = b"div") -> bytes:
    return b"".join(
        (
            b'<html><body><a href="/before">b</a>',
            (b"<" + tag + b">") * depth,
            b'<a href="/inside">i</a>',
            (b"</" + tag + b">") * depth,
            b'<a href="/after">a</a></body></html>',
        )
    )


def _links(body: bytes) -> list[str | None]:
    return [a.attributes.get("href") for a in LexborHTMLParser(body).tags("a")]


def test_an_ordinary_page_is_returned_as_it_is() -> None:
    body = b"<html><body>" + b'<ul><li><a href="/x">x</a></li></ul>' * 3000 + b"</body></html>"
    flat = flatten_deep_nesting(body, 64)
    assert flat.body is body
    assert flat.dropped == 0


def test_nesting_beyond_the_cap_is_flattened_and_every_link_kept() -> None:
    body = _bomb(5000)
    flat = flatten_deep_nesting(body, 100)
    assert flat.dropped == 4900
    assert flat.max_depth_seen == 5000
    assert _links(flat.body) == ["/before", "/inside", "/after"]
    # What is left nests 100 deep: the tree lexbor builds from it.
    node = LexborHTMLParser(flat.body).css_first("a[href='/inside']")
    depth = 0
    while node is not None:
        depth += node.tag == "div"
        node = node.parent
    assert depth == 100


def test_unclosed_paragraphs_and_list_items_never_count_as_nesting() -> None:
    body = b"<div>" + b"<p>text<li>item" * 5000 + b"</div>"
    assert flatten_deep_nesting(body, 10).dropped == 0


def test_uppercase_and_attribute_tags_count() -> None:
    body = b'<DIV class="x">' * 300 + b"</DIV>" * 300
    assert flatten_deep_nesting(body, 50).dropped == 250


def test_the_100k_bomb_parses_in_a_bounded_time() -> None:
    body = _bomb(100_000)
    assert needs_worker(body)
    started = time.process_time()
    result = parse_bounded(
        body, "http://a.test/", encoding=None, max_links=100, max_url_length=2048
    )
    # Unbounded, lexbor takes over a minute on this page; flattened, well under a second
    # even on a loaded machine (CPU time, not wall time).
    assert time.process_time() - started < 5.0
    assert result.bound == "depth"
    assert result.page.links == [
        "http://a.test/before",
        "http://a.test/inside",
        "http://a.test/after",
    ]


def test_small_pages_stay_on_the_loop() -> None:
    assert not needs_worker(b"<html>" + b"<p>x</p>" * 1000 + b"</html>")
    assert needs_worker(b"<div>" * 3000)
    assert needs_worker(b" " * ((1 << 20) + 1))


async def test_the_worker_parses_bounded_and_a_page_over_the_deadline_is_cut() -> None:
    # The capped parse takes 0.3 s on a quiet machine and 2.4 s on a loaded one; uncapped,
    # over a minute on either: a deadline between the two tells them apart on both.
    workers = ParseWorkers(1, deadline=5.0)
    try:
        body = _bomb(100_000)
        result = await workers.parse(
            body, "http://a.test/", encoding=None, max_links=10, max_url_length=2048
        )
        assert result.bound == "depth" and len(result.page.links) == 3
        first_pid = workers.pids
        # Without the depth cap, lexbor takes far longer than the deadline on this page.
        result = await workers.parse(
            body,
            "http://a.test/",
            encoding=None,
            max_links=10,
            max_url_length=2048,
            max_depth=10**9,
        )
        assert result.bound == "deadline" and result.page.links == []
        assert workers.killed == 1 and workers.pids == []
        # A fresh process takes the next page.
        result = await workers.parse(
            b'<a href="/x">x</a>',
            "http://a.test/",
            encoding=None,
            max_links=10,
            max_url_length=2048,
        )
        assert result.page.links == ["http://a.test/x"] and result.bound is None
        assert workers.pids and workers.pids != first_pid
    finally:
        await workers.aclose()
    assert workers.pids == []


async def test_a_cancelled_parse_does_not_leave_its_answer_for_the_next_page() -> None:
    import asyncio

    workers = ParseWorkers(1, deadline=30.0)
    try:
        slow = _bomb(60_000)
        task = asyncio.ensure_future(
            workers.parse(
                slow,
                "http://a.test/",
                encoding=None,
                max_links=10,
                max_url_length=2048,
                max_depth=10**9,
            )
        )
        await asyncio.sleep(1.0)  # the process is parsing
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        result = await workers.parse(
            b'<a href="/next">n</a>',
            "http://a.test/",
            encoding=None,
            max_links=10,
            max_url_length=2048,
        )
        assert result.page.links == ["http://a.test/next"]
    finally:
        await workers.aclose()
