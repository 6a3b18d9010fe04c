"""Crawl from Python with one peer: the engine without the network.

    python examples/embedded_crawl.py

Starts the generated test web on loopback, crawls it, and checks the WARC output against the
test web's ground truth. Replace the seeds and scope with your own to crawl the web (and keep
the default politeness: one request per host per second at most).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import crawl
from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings
from p2pcrawl.testing import TestWeb, TestWebConfig


async def main() -> None:
    async with TestWeb(TestWebConfig(hosts=3, pages_per_host=30, slow_host_delay=0.01)) as web:
        settings = CrawlSettings(
            concurrency=8,
            # Our own loopback servers: no politeness gap needed.
            politeness=PolitenessSettings(delay=0, politeness_factor=0),
            scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        )
        with tempfile.TemporaryDirectory() as tmp:
            summary = await crawl([web.hub_url], settings, Path(tmp))
            fetched = set(read_warc_urls(Path(tmp) / "warc"))
        print(f"{summary.pages_fetched} pages in {summary.elapsed_s:.1f} s")
        print("matches the ground truth:", fetched == web.ground_truth())


if __name__ == "__main__":
    asyncio.run(main())
