"""A foreground peer's progress lines, milestones and exit summary."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from p2pcrawl.testing import TestWeb, TestWebConfig
from p2pcrawl.ui.progress import Milestones, progress_line, summary, summary_lines, warc_output
from tests.p2pcrawl.loopback import free_port
from tests.p2pcrawl.test_cli import CLI, run_cli

pytestmark = pytest.mark.timeout(90)


def _st(**kw: Any) -> dict[str, Any]:
    base = {
        "state": "active",
        "pages_fetched": 1234,
        "pages_per_s": 9.25,
        "tasks_queued": 50,
        "tasks_in_flight": 3,
        "errors": 4,
        "backups_held": 7,
        "peers": 2,
        "bytes_fetched": 2_500_000,
        "errors_by_kind": {"timeout": 3, "dns": 1},
        "status_codes": {"200": 1200, "404": 34},
    }
    base.update(kw)
    return base


def test_progress_line_has_pages_rate_queue_and_errors() -> None:
    assert progress_line(_st()) == (
        "[active] 1,234 pages (9.2/s), queued 50, in flight 3, errors 4, backups 7, peers 2"
    )


def test_milestones_are_said_once_each() -> None:
    m = Milestones(max_pages=10)
    assert m.feed(_st(), exhausted=False) == []
    said = m.feed(_st(), exhausted=True)
    assert len(said) == 1 and said[0].startswith("--max-pages 10 reached")
    assert m.feed(_st(), exhausted=True) == []
    fin = m.feed(_st(state="finished"), exhausted=True)
    assert len(fin) == 1 and fin[0].startswith("crawl finished")
    assert m.feed(_st(state="finished"), exhausted=True) == []
    assert m.feed(_st(state="active"), exhausted=True) == ["crawl resumed: new work arrived"]
    # Without a page limit, an idle engine is not a milestone.
    assert Milestones(max_pages=0).feed(_st(), exhausted=True) == []


def test_summary_names_pages_bytes_errors_duration_and_warc_files(tmp_path: Path) -> None:
    (tmp_path / "a.warc.gz").write_bytes(b"x" * 1500)
    (tmp_path / "notes.txt").write_text("not a warc")
    warc = warc_output(tmp_path)
    assert warc["files"] == 1 and warc["bytes"] == 1500
    doc = summary(_st(), 133.0, warc)
    lines = summary_lines(doc, str(tmp_path))
    assert lines[0] == "summary: 1,234 pages, 2.5 MB in 2m 13s (9.3 pages/s)"
    assert lines[1] == "  errors: 4 (timeout 3, dns 1)"
    assert lines[2] == "  HTTP statuses: 200 1200, 404 34"
    assert lines[3].startswith("  WARC: 1 file(s), 1.5 KB in ")
    assert lines[4] == f"    {tmp_path / 'a.warc.gz'}"
    assert lines[5] == "  queued: 50 URLs kept in DATA_DIR for a later run"
    limited = summary_lines({**doc, "limit_reached": True}, str(tmp_path))
    assert limited[5].endswith("for a later run (a limit was reached)")
    assert warc_output(tmp_path, since=2**40)["files"] == 0


@pytest.fixture
async def small_web() -> AsyncIterator[TestWeb]:
    async with TestWeb(TestWebConfig(hosts=2, pages_per_host=30, slow_host_delay=0.0)) as web:
        yield web


async def test_join_logs_progress_the_page_limit_and_a_summary(
    small_web: TestWeb, tmp_path: Path
) -> None:
    data, port = tmp_path / "data", free_port()
    domains = [arg for d in small_web.allow_domains for arg in ("--allow-domain", d)]
    argv = [
        *CLI,
        "join",
        "--listen",
        "127.0.0.1:0",
        "--status",
        f"127.0.0.1:{port}",
        "--data",
        str(data),
        "--allow-private",
        *domains,
        "--delay",
        "0.05",
        "--politeness-factor",
        "0",
        "--max-pages",
        "5",
        "--progress-interval",
        "0.5",
        "--seed",
        small_web.hub_url,
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert ready["ready"] is True
        seen: list[str] = []
        async with asyncio.timeout(30):
            while not any("--max-pages 5 reached" in line for line in seen) or not any(
                "progress: " in line for line in seen
            ):
                seen.append((await proc.stderr.readline()).decode())
        code, out, _ = await run_cli("status", "--peer", f"127.0.0.1:{port}", "--json")
        assert code == 0
        st = json.loads(out)
        assert st["page_limit_reached"] is True and st["max_pages"] == 5
        assert st["recent"] and st["recent"][0]["url"].startswith("http://127.0.0.")
        proc.send_signal(signal.SIGTERM)
        rest_out, rest_err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    progress = [line for line in seen if "progress: " in line]
    assert "pages (" in progress[0] and "queued" in progress[0] and "errors" in progress[0]
    seeds = [line for line in seen if "seed " in line]
    assert seeds and "accepted" in seeds[0]
    err = rest_err.decode()
    assert "summary: 5 pages" in err and "  errors: " in err and "  WARC: 1 file(s)" in err
    left = json.loads(rest_out.decode().strip().splitlines()[-1])
    assert left["left"] is True and left["pages_fetched"] == 5
    assert [Path(p).parent for p in left["warc_files"]] == [data / "warc"]
    assert sum(left["status_codes"].values()) == 5
