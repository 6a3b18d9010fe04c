"""The status page in a real headless browser (Debian's Chromium driven by Playwright).

It opens a live peer's page while the peer crawls a slowed-down test web and checks what a
person would see: the numbers match ``/api/status``, the chart moves while the crawl runs,
and the page raises no script error or CSP violation. A screenshot is left in tmp_path.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import PeerFactory, StatusFactory, WebFactory, crawl_settings_for, wait_idle

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]
TOKEN = "page-token"
# 3 hosts at one fetch per 0.15 s each: the crawl lasts about five seconds.
CRAWL_DELAY = 0.15


def _unavailable(reason: str) -> None:
    """CI must run this test (.ci/run installs chromium); elsewhere a missing browser skips."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{reason}, and CI is set")
    pytest.skip(reason)


@pytest.fixture
def chromium() -> str:
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _unavailable("the playwright package is missing (pip install -e '.[test]')")
    return str(CHROMIUM)


def _number(text: str | None) -> int:
    assert text is not None
    return int(text.replace(",", ""))


async def test_status_page_matches_the_api_and_charts_a_live_crawl(
    tmp_path: Path,
    chromium: str,
    make_web: WebFactory,
    make_peer: PeerFactory,
    make_status: StatusFactory,
) -> None:
    from playwright.async_api import ConsoleMessage, async_playwright

    web = await make_web()
    peer = await make_peer(crawl=crawl_settings_for(web, delay=CRAWL_DELAY))
    # With a token the page must pass it on to every API call it makes.
    server = await make_status(peer, token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":  # CSP violations and failed fetches are reported here
            problems.append(msg.text)

    async with (
        aiohttp.ClientSession(headers=auth) as api,
        async_playwright() as pw,
    ):

        async def api_status() -> dict[str, Any]:
            async with api.get(server.url + "api/status") as resp:
                assert resp.status == 200
                doc: dict[str, Any] = await resp.json()
                return doc

        browser = await pw.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            await page.goto(f"{server.url}?token={TOKEN}")
            await page.wait_for_function(
                "() => document.getElementById('state').textContent === 'active'", timeout=10_000
            )
            st = await api_status()
            assert await page.text_content("#node_id") == st["node_id"] == peer.node_id.hex()
            assert await page.text_content("#listen") == st["listen"]
            assert _number(await page.text_content("#pages_fetched")) == 0

            async with api.post(server.url + "api/seed", json={"urls": [web.hub_url]}) as resp:
                assert resp.status == 200

            # The chart moves while the crawl runs: two reads two seconds apart differ.
            await page.wait_for_function(
                "() => Number(document.getElementById('chart').dataset.points || 0) >= 2",
                timeout=10_000,
            )
            first_path = await page.get_attribute("#chart_pages", "d")
            first_pages = _number(await page.text_content("#pages_fetched"))
            await asyncio.sleep(2.0)
            second_path = await page.get_attribute("#chart_pages", "d")
            second_pages = _number(await page.text_content("#pages_fetched"))
            running = await api_status()
            assert running["tasks_queued"] + running["tasks_in_flight"] > 0, (
                "the crawl ended too soon to watch the chart move; slow the test web down"
            )
            assert first_path and second_path and first_path != second_path
            assert second_pages > first_pages

            # Once the crawl is idle the numbers stop moving and must match the API exactly.
            idle = await wait_idle(api, server.url, quiet=1.0, timeout=30.0)
            await page.wait_for_function(
                # Predicates are functions: the page's CSP forbids evaluating strings.
                "n => document.getElementById('pages_fetched').textContent"
                ".replaceAll(',', '') === String(n)",
                arg=idle["pages_fetched"],
                timeout=5_000,
            )
            # Every panel shows the idle state once the page has polled after it.
            await page.wait_for_function(
                "s => Object.entries(s).every(([id, n]) =>"
                " document.getElementById(id).textContent.replaceAll(',', '') === String(n))",
                arg={"tasks_queued": idle["tasks_queued"], "done": idle["done"]},
                timeout=5_000,
            )
            shown = {
                "pages_fetched": _number(await page.text_content("#pages_fetched")),
                "tasks_queued": _number(await page.text_content("#tasks_queued")),
                "done": _number(await page.text_content("#done")),
                "state": await page.text_content("#state"),
                "node_id": await page.text_content("#node_id"),
            }
            st = await api_status()
            assert shown == {k: st[k] for k in shown}
            assert st["tasks_queued"] == 0 and st["pages_fetched"] > 0
            assert "disconnected" not in (await page.text_content("#conn") or "")

            shot = tmp_path / "status-page.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        finally:
            await browser.close()
    assert problems == []
