"""What a new user meets in the first hour, each run as the user runs it: ``p2pcrawl join``
as a subprocess against a test web served by this process, ending by itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from p2pcrawl.testing import TestWeb, TestWebConfig
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
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r.get("node") == node and "network is finished" in r["message"] for r in records)
    # The summary is for people and is written after the logs: those are the only other lines.
    others = [line for line in err.splitlines() if not line.startswith("{")]
    assert others and others[0].startswith("summary:")
