"""What a new user meets in the first hour, each run as the user runs it: ``p2pcrawl join``
as a subprocess against a test web served by this process, ending by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from p2pcrawl.testing import TestWeb, TestWebConfig
from p2pcrawl.ui.logs import say, setup_logging
from tests.p2pcrawl.loopback import free_port
from tests.p2pcrawl.test_cli import CLI, run_cli

pytestmark = pytest.mark.timeout(120)

WEB = TestWebConfig(hosts=3, pages_per_host=20, slow_host_delay=0.01, large_page_bytes=50_000)


@pytest.fixture
async def test_web() -> AsyncIterator[TestWeb]:
    async with TestWeb(WEB) as web:
        yield web


async def join_until_exit(
    web: TestWeb, data: Path, *extra: str, timeout: float = 60
) -> tuple[int, str, str]:
    """``join --exit-when-finished`` for ``web``; (exit status, stdout, stderr)."""
    domains = [arg for d in web.allow_domains for arg in ("--allow-domain", d)]
    argv = [
        *("join", "--listen", "127.0.0.1:0", "--status", "127.0.0.1:0"),
        *("--data", str(data), "--allow-private", *domains),
        *("--delay", "0", "--politeness-factor", "0", "--exit-when-finished", *extra),
    ]
    return await run_cli(*argv, timeout=timeout)


async def test_join_recrawl_fetches_done_seeds_again_from_a_reused_data_directory(
    test_web: TestWeb, tmp_path: Path
) -> None:
    data, hub = tmp_path / "data", test_web.hub_url
    code, _, err = await join_until_exit(test_web, data, "--seed", hub)
    assert code == 0, err
    first = sum(test_web.request_counts.values())
    assert test_web.request_counts[hub] == 1
    # The same directory again: the seed is done here, and the peer says how to fetch it.
    code, _, err = await join_until_exit(test_web, data, "--seed", hub)
    assert code == 0, err
    assert "already known" in err and "--recrawl fetches it again" in err
    assert sum(test_web.request_counts.values()) == first
    # With --recrawl the seed is fetched again; its links are still done, so nothing else.
    code, _, err = await join_until_exit(test_web, data, "--seed", hub, "--recrawl")
    assert code == 0, err
    assert "queued again (--recrawl)" in err
    assert test_web.request_counts[hub] == 2
    assert sum(test_web.request_counts.values()) == first + 1


async def test_join_recrawl_without_seeds_is_a_usage_error(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *("join", "--listen", "127.0.0.1:0", "--data", str(tmp_path / "d"), "--recrawl"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "--recrawl fetches the --seed URLs again" in err.decode()


async def test_a_peer_at_its_page_limit_counts_as_done_for_the_finish(
    test_web: TestWeb, tmp_path: Path
) -> None:
    # The limit leaves most of the web queued; the peer still sees the crawl finished and
    # exits, its queue kept for a later run.
    code, out, err = await join_until_exit(
        test_web, tmp_path / "data", "--seed", test_web.hub_url, "--max-pages", "10"
    )
    assert code == 0, err
    assert "--max-pages 10 reached" in err
    assert sum(test_web.request_counts.values()) == 10
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["pages_fetched"] == 10 and summary["tasks_queued"] > 0


async def test_unreachable_hosts_are_given_up_and_reported(
    test_web: TestWeb, tmp_path: Path
) -> None:
    # A closed port on this machine and a name that can never resolve (RFC 2606 .invalid),
    # seeded beside a real site: the crawl ends by itself and says what it gave up.
    closed = f"http://127.0.0.1:{free_port()}/"
    nowhere = "http://nowhere.invalid/"
    seeds = [test_web.hub_url, closed, nowhere]
    code, out, err = await join_until_exit(
        test_web,
        tmp_path / "data",
        *[a for s in seeds for a in ("--seed", s)],
        *("--allow-domain", "127.0.0.1", "--allow-domain", "nowhere.invalid"),
        timeout=100,
    )
    assert code == 0, err
    assert set(test_web.request_counts) == test_web.ground_truth()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["finished"] is True
    assert summary["hosts_unreachable"] == 2 and summary["urls_unreachable"] >= 2
    dead = {d["origin"]: d["error"] for d in summary["unreachable"]}
    assert dead == {closed.rstrip("/"): "connect", nowhere.rstrip("/"): "dns"}
    assert "unreachable hosts: 2, given up after their retries" in err


async def test_json_logs_carry_level_logger_message_and_node(
    test_web: TestWeb, tmp_path: Path
) -> None:
    # As a log shipper reads them: every line of stderr is one JSON object.
    data = tmp_path / "data"
    config = tmp_path / "peer.toml"
    config.write_text('log-format = "json"\n')
    code, out, err = await join_until_exit(
        test_web, data, "--seed", test_web.hub_url, "--config", str(config)
    )
    assert code == 0, err
    node = json.loads(out.splitlines()[0])["node_id"]
    # Nothing else on stderr: the key message and the exit summary are records too.
    records = [json.loads(line) for line in err.splitlines()]
    assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r.get("node") == node and "network is finished" in r["message"] for r in records)
    messages = [r["message"] for r in records]
    summary = [m for m in messages if m.startswith("summary:")]
    assert len(summary) == 1 and "pages" in summary[0]
    assert any(m.lstrip().startswith("WARC:") for m in messages)


async def test_json_logs_hold_for_a_failure_and_the_key_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A failure after the logs are set up (a data directory that is a file), with --debug.
    data = tmp_path / "data"
    data.write_text("not a directory")
    argv = ["join", "--listen", "127.0.0.1:0", "--status", "127.0.0.1:0", "--data", str(data)]
    code, _, err = await run_cli("--log-format", "json", "--debug", *argv)
    assert code != 0
    (record,) = [json.loads(line) for line in err.splitlines()]
    assert record["level"] == "error" and record["message"].startswith("p2pcrawl: error:")
    assert "Traceback" in record["exc"]
    # The founder's key message (printed only off loopback, so said here directly) spans
    # several lines for people; as a record it is one line.
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", "json")
        say("generated this network's key in D (keep it secret). Next:\n\n    p2pcrawl join\n")
    finally:
        setup_logging("info", "text")
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["message"].endswith("Next:\n\n    p2pcrawl join")
