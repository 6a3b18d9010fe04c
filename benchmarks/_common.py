"""Shared plumbing for the benchmarks: the test web subprocess, timing, and the result table.

The test web runs in its own process so it has its own core and its CPU never counts against
the crawler being measured. Every subprocess started here is stopped by its own PID.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class TestWebInfo:
    """What the test web CLI prints on its first line."""

    hub: str
    hosts: list[str]
    allow_domains: list[str]
    port: int
    pid: int


@dataclass(frozen=True, slots=True)
class TestWebParams:
    hosts: int
    pages: int
    page_bytes: int
    mean_links: int
    seed: int

    def cli_args(self) -> list[str]:
        return [
            "--hosts",
            str(self.hosts),
            "--pages",
            str(self.pages),
            "--page-bytes",
            str(self.page_bytes),
            "--mean-links",
            str(self.mean_links),
            "--no-features",
            "--seed",
            str(self.seed),
            "--port",
            "0",  # the test web picks a port free on all its host addresses and prints it
        ]


@dataclass(slots=True)
class Result:
    """One crawler's run. ``pages`` excludes robots.txt fetches."""

    name: str
    pages: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    available: bool = True
    note: str = ""
    server_cpu_s: float = 0.0
    urls: set[str] = field(default_factory=set)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def server_busy(self) -> float:
        """Share of one core the test web used: near 1.0, the server was the bottleneck."""
        return self.server_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_per_1000(self) -> float:
        return 1000.0 * self.cpu_s / self.pages if self.pages else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "available": self.available,
            "pages": self.pages,
            "wall_s": round(self.wall_s, 3),
            "pages_per_s": round(self.pages_per_s, 1),
            "cpu_s": round(self.cpu_s, 3),
            "cpu_s_per_1000_pages": round(self.cpu_per_1000, 3),
            "test_web_busy": round(self.server_busy, 2),
            "note": self.note,
        }


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM this one process, then SIGKILL it if it outlives ``timeout``."""
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def serve_test_web(params: TestWebParams) -> Iterator[TestWebInfo]:
    """Serve the test web in a subprocess for the duration of the block."""
    cmd = [sys.executable, "-m", "p2pcrawl.testing.serve", *params.cli_args()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"test web exited before printing its address: {cmd}")
        info = json.loads(line)
        yield TestWebInfo(
            hub=info["hub"],
            hosts=list(info["hosts"]),
            allow_domains=list(info["allow_domains"]),
            port=int(info["port"]),
            pid=proc.pid,
        )
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def ground_truth(params: TestWebParams, port: int) -> set[str]:
    """The URLs a complete crawl must fetch, computed without serving."""
    from p2pcrawl.testing import TestWeb, TestWebConfig

    config = TestWebConfig(
        hosts=params.hosts,
        pages_per_host=params.pages,
        seed=params.seed,
        mean_links=params.mean_links,
        page_bytes=params.page_bytes,
        features=False,
        port=port,
    )
    return {str(u) for u in TestWeb(config).ground_truth()}


def process_cpu_s(pid: int) -> float:
    """CPU seconds used so far by a running process (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds of every child that has exited and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def measure_children(result: Result) -> Iterator[None]:
    """Fill ``result.wall_s``/``cpu_s`` from the subprocesses run (and reaped) in the block."""
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    yield
    result.wall_s = time.perf_counter() - t0
    result.cpu_s = children_cpu_s() - cpu0


def is_site_file(url: str) -> bool:
    """A host's own file (robots.txt, a sitemap), not a page of the web being crawled."""
    path = url.split("?", 1)[0]
    return path.endswith("/robots.txt") or path.endswith("/sitemap.xml")


def compare(result: Result, truth: set[str] | None) -> str:
    """One line saying how ``result.urls`` matches the ground truth."""
    if truth is None:
        return "ground truth unavailable"
    got = result.urls
    missing, extra = len(truth - got), len(got - truth)
    verdict = "exact" if not missing and not extra else "DIFFERS"
    matched = len(got & truth)
    return f"{matched}/{len(truth)} of ground truth, {missing} missing, {extra} extra: {verdict}"


def format_table(results: Iterable[Result]) -> str:
    rows = [("crawler", "pages", "wall s", "pages/s", "CPU s/1k pages", "test web busy", "note")]
    for r in results:
        if not r.available:
            rows.append((r.name, "-", "-", "-", "-", "-", r.note))
            continue
        rows.append(
            (
                r.name,
                str(r.pages),
                f"{r.wall_s:.2f}",
                f"{r.pages_per_s:.0f}",
                f"{r.cpu_per_1000:.2f}",
                f"{100 * r.server_busy:.0f}%",
                r.note,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:-1], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells) + ("  " + row[-1] if row[-1] else ""))
    return "\n".join(lines)
