"""Seed 002's host-splitter cache on the test web: hit rate and messages saved per page.

Every link a page yields would otherwise cost a dedup probe at its owner and, for links to
hosts owned elsewhere, a URL in a STORE_TASK message. The cache of recently routed URL
fingerprints answers most repeats locally. Crawls the same test web once per cache size,
in one run, and prints the hit rate and the URL messages saved per page.

    python benchmarks/host_splitter.py
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
from pathlib import Path

from p2pcrawl.crawl import crawl
from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings
from p2pcrawl.testing import TestWeb, TestWebConfig


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--sizes", default="256,4096,65536,262144")
    args = ap.parse_args()
    cfg = TestWebConfig(
        hosts=args.hosts, pages_per_host=args.pages, slow_host_delay=0.0, large_page_bytes=100_000
    )
    print("cache size  pages  links/page  hit rate  URL messages saved/page  sent/page")
    async with TestWeb(cfg) as web:
        base = CrawlSettings(
            concurrency=16,
            warc=False,
            politeness=PolitenessSettings(delay=0, politeness_factor=0),
            scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        )
        for size in (int(s) for s in args.sizes.split(",")):
            settings = dataclasses.replace(base, seen_cache_size=size)
            with tempfile.TemporaryDirectory() as tmp:
                s = await crawl([web.hub_url], settings, Path(tmp))
            st = s.stats
            in_scope = st.seen_cache_hits + st.urls_discovered
            pages = max(st.html_parsed, 1)
            print(
                f"{size:>10}  {s.pages_fetched:5d}  {st.links_extracted / pages:10.1f}"
                f"  {st.seen_cache_hits / max(in_scope, 1):8.1%}"
                f"  {st.seen_cache_hits / pages:23.1f}  {st.urls_discovered / pages:9.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
