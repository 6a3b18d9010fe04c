"""Instructions per page of one peer's crawl, counted by valgrind: a figure the load cannot move.

``single_peer.py`` reads CPU seconds, and on a shared 2-core machine those move by 5-25%
between two runs of one build, more than a change to the hot path does. This script runs the
engine's crawl (WARC on, the same test web and settings as ``single_peer.py``'s engine row)
under ``valgrind --tool=cachegrind`` and counts the instructions each process executed: the
crawler, and the WARC writer it starts. The served web runs natively and is not counted.

A crawl pays once for imports and set-up, so each checkout crawls two webs, ``--pages`` and
``--pages-large`` pages per host, and the figure is the difference over the difference in
pages: the instructions one more page costs. Give ``--against DIR`` (a checkout of another
build with its own ``.venv``) to count both builds on the same webs; instruction counts of one
build repeat within about 0.1%, so a difference of 1% is a difference.

Usage: python benchmarks/instructions.py [--against DIR] [--hosts N] [--pages N]
       [--pages-large N]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

# Run inside the checkout measured, with that checkout's interpreter: the crawl of
# ``single_peer.py``'s engine row, without its read-back of the WARC files.
DRIVER = textwrap.dedent(
    """
    import asyncio, sys, tempfile
    from pathlib import Path
    sys.path.insert(0, "benchmarks")
    import single_peer
    from _common import TestWebParams, serve_test_web
    from p2pcrawl.crawl import crawl
    from p2pcrawl.settings import CrawlSettings, PolitenessSettings, ScopeSettings
    a = single_peer.parse_args([])
    hosts, pages = int(sys.argv[1]), int(sys.argv[2])
    with serve_test_web(TestWebParams(hosts, pages, a.page_bytes, a.mean_links, a.seed)) as web:
        settings = CrawlSettings(
            concurrency=a.concurrency,
            politeness=PolitenessSettings(delay=0, politeness_factor=0),
            scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        )
        with tempfile.TemporaryDirectory() as tmp:
            summary = asyncio.run(crawl([web.hub], settings, Path(tmp)))
    print("PAGES", summary.pages_fetched)
    """
)
_SUMMARY = re.compile(r"^summary:\s+(\d+)", re.M)
_CMD = re.compile(r"^cmd:\s+(.*)$", re.M)


@dataclass
class Count:
    pages: int
    crawler: int  # instructions of the crawling process (and any parse process)
    writer: int  # instructions of the WARC writer process


def count(checkout: Path, hosts: int, pages: int) -> Count:
    """Crawl ``hosts`` x ``pages`` with ``checkout``'s build under cachegrind."""
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{checkout}: no .venv/bin/python (install the checkout first)")
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-instructions-") as tmp:
        out = Path(tmp)
        cmd = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--trace-children=yes",
            # The served web is the same program for both builds and is not the crawler.
            "--trace-children-skip-by-arg=*p2pcrawl.testing.serve*",
            f"--cachegrind-out-file={out}/cg.%p",
            str(python),
            "-c",
            DRIVER,
            str(hosts),
            str(pages),
        ]
        proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False)
        found = re.search(r"^PAGES (\d+)$", proc.stdout, re.M)
        if proc.returncode != 0 or found is None:
            raise SystemExit(f"the crawl under valgrind failed:\n{proc.stderr[-2000:]}")
        crawler = writer = 0
        for f in out.glob("cg.*"):
            text = f.read_text(errors="replace")
            total = _SUMMARY.search(text)
            command = _CMD.search(text)
            if total is None or command is None:
                continue
            # Anything else the crawl started (a parse process) is the crawler's work.
            if "p2pcrawl.archive" in command.group(1):
                writer += int(total.group(1))
            else:
                crawler += int(total.group(1))
        return Count(int(found.group(1)), crawler, writer)


def per_page(checkout: Path, hosts: int, small: int, large: int) -> tuple[float, float, int]:
    """(crawler, writer) instructions one more page costs, and the large web's pages."""
    a = count(checkout, hosts, small)
    b = count(checkout, hosts, large)
    extra = b.pages - a.pages
    if extra <= 0:
        raise SystemExit(f"{checkout}: the larger web crawled no more pages ({a} / {b})")
    return (b.crawler - a.crawler) / extra, (b.writer - a.writer) / extra, b.pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--against", type=Path, help="another checkout to count on the same webs")
    p.add_argument("--hosts", type=int, default=10)
    p.add_argument("--pages", type=int, default=100, help="pages per host, the smaller web")
    p.add_argument("--pages-large", type=int, default=300, help="pages per host, the larger")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    if args.pages_large <= args.pages:
        p.error("--pages-large must exceed --pages")
    here = Path(__file__).resolve().parents[1]
    builds = [("this build", here)]
    if args.against is not None:
        builds.append(("against", args.against.resolve()))
    print(
        f"{args.hosts} hosts x {args.pages} and x {args.pages_large} pages; "
        "instructions per page (millions), crawler + WARC writer"
    )
    rows = {}
    for name, checkout in builds:
        crawler, writer, pages = per_page(checkout, args.hosts, args.pages, args.pages_large)
        rows[name] = crawler + writer
        print(
            f"  {name:10s} {checkout}: crawler {crawler / 1e6:.3f}M, writer {writer / 1e6:.3f}M, "
            f"total {(crawler + writer) / 1e6:.3f}M  ({pages} pages in the larger web)"
        )
    if len(rows) == 2:
        print(f"  this build / against: {rows['this build'] / rows['against']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
