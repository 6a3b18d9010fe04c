"""``python -m p2pcrawl.testing.serve``: the test web in a process of its own (benchmarks).

It prints one JSON line with the hub URL and the port, then serves until SIGTERM or SIGINT;
the other process computes the ground truth from the same config.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from p2pcrawl.testing.web import TestWeb, TestWebConfig

__all__ = ["main"]


def _parse_args(argv: list[str] | None) -> TestWebConfig:
    parser = argparse.ArgumentParser(
        prog="python -m p2pcrawl.testing.serve",
        description="Serve the deterministic test web until SIGTERM/SIGINT; prints one JSON line.",
    )
    d = TestWebConfig()
    parser.add_argument("--hosts", type=int, default=d.hosts)
    parser.add_argument("--pages", type=int, default=d.pages_per_host, help="pages per host")
    parser.add_argument("--page-bytes", type=int, default=d.page_bytes)
    parser.add_argument("--mean-links", type=float, default=d.mean_links)
    parser.add_argument("--cross-host-ratio", type=float, default=d.cross_host_ratio)
    parser.add_argument("--no-features", action="store_true", help="plain pages and links only")
    parser.add_argument("--slow-host-delay", type=float, default=d.slow_host_delay)
    parser.add_argument("--large-page-bytes", type=int, default=d.large_page_bytes)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--port", type=int, default=0, help="0 = choose")
    parser.add_argument("--first-ip", type=int, default=d.first_ip)
    parser.add_argument(
        "--hostile", action="store_true", help="also serve the hostile hosts (crawl_domains)"
    )
    parser.add_argument(
        "--signals", action="store_true", help="site signals: requisites, sitemaps, directives"
    )
    a = parser.parse_args(argv)
    return TestWebConfig(
        hosts=a.hosts,
        pages_per_host=a.pages,
        seed=a.seed,
        mean_links=a.mean_links,
        cross_host_ratio=a.cross_host_ratio,
        page_bytes=a.page_bytes,
        features=not a.no_features,
        slow_host_delay=a.slow_host_delay,
        large_page_bytes=a.large_page_bytes,
        port=a.port,
        first_ip=a.first_ip,
        hostile=a.hostile,
        signals=a.signals,
    )


async def _serve(config: TestWebConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with TestWeb(config) as testweb:
        line = {
            "hub": testweb.hub_url,
            "hosts": testweb.hosts,
            "allow_domains": testweb.allow_domains,
            "crawl_domains": testweb.crawl_domains,
            "port": testweb.port,
        }
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    asyncio.run(_serve(_parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
