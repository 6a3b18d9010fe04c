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
            await asyncio.sleep(1.2)  # one more poll, so every panel shows the idle state
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

            # The panels besides: HTTP statuses, last fetches, output, two charts.
            chips = await page.locator("#status_codes .chip").all_text_contents()
            assert chips == [f"{code}: {n:,}" for code, n in st["status_codes"].items()]
            assert "404" in st["status_codes"]  # the test web has missing pages
            recent = await page.locator("#recent tr td.url").all_text_contents()
            assert recent and recent[0] == st["recent"][0]["url"]
            await page.wait_for_function(
                "n => document.getElementById('out_files').textContent === String(n)",
                arg=st["output"]["files"] if st["output"] else 0,
                timeout=10_000,
            )
            assert await page.text_content("#out_dir") == str(peer.config.data_dir / "warc")
            pages_top = float(await page.get_attribute("#chart", "data-top") or 0)
            disc_top = float(await page.get_attribute("#chart_disc", "data-top") or 0)
            assert await page.get_attribute("#chart_discovered", "d")
            assert pages_top > 0 and disc_top > 0  # each chart has its own axis

            shot = tmp_path / "status-page.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        finally:
            await browser.close()
    assert problems == []


async def test_network_page_lists_every_peer_with_links_to_their_pages(
    tmp_path: Path,
    chromium: str,
    make_web: WebFactory,
    make_peer: PeerFactory,
    make_status: StatusFactory,
) -> None:
    from playwright.async_api import async_playwright

    web = await make_web()
    crawl = crawl_settings_for(web)
    founder = await make_peer(crawl=crawl)
    joiner = await make_peer(crawl=crawl, bootstrap=((founder.me.host, founder.me.port),))
    servers = [await make_status(p, token=TOKEN) for p in (founder, joiner)]
    await founder.add_seeds([web.hub_url])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    problems: list[str] = []
    async with aiohttp.ClientSession(headers=auth) as api, async_playwright() as pw:
        # One of the two may own no host at all, so wait on the total, not on each peer.
        truth = len(web.ground_truth())
        async with asyncio.timeout(30):
            while True:
                fetched = [p.status()["pages_fetched"] for p in (founder, joiner)]
                if sum(int(n) for n in fetched) >= truth:  # type: ignore[call-overload]
                    break
                await asyncio.sleep(0.2)
        browser = await pw.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            await page.goto(f"{servers[0].url}network?token={TOKEN}")
            await page.wait_for_function(
                "() => document.querySelectorAll('#peers tr[data-node] a').length === 2",
                timeout=30_000,
            )
            async with api.get(servers[0].url + "api/network") as resp:
                view = await resp.json()
            await asyncio.sleep(2.5)  # one more poll past the view's cache
            rows = page.locator("#peers tr[data-node]")
            assert await rows.count() == 2
            ids = [await rows.nth(i).get_attribute("data-node") for i in range(2)]
            assert ids == [founder.node_id.hex(), joiner.node_id.hex()]
            links = await page.locator("#peers tr[data-node] a").evaluate_all(
                "els => els.map(a => a.href)"
            )
            assert links == [f"{s.url}?token={TOKEN}" for s in servers]
            total = view["totals"]["pages_fetched"]
            assert total == len(web.ground_truth())
            shown_total = _number(await page.text_content("#t_pages_fetched"))
            assert shown_total == total
            assert await page.text_content("#t_peers") == "2 / 2"
            # Following a link opens the other peer's own page, which shows that peer.
            await page.locator("#peers tr[data-node] a").nth(1).click()
            await page.wait_for_function(
                "id => document.getElementById('node_id').textContent === id",
                arg=joiner.node_id.hex(),
                timeout=10_000,
            )
            await page.screenshot(path=str(tmp_path / "peer-page.png"), full_page=True)
            await page.goto(f"{servers[0].url}network?token={TOKEN}")
            await page.wait_for_selector("#peers tr[data-node] a")
            await page.screenshot(path=str(tmp_path / "network-page.png"), full_page=True)
        finally:
            await browser.close()
    assert problems == []
