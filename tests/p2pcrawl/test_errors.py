"""One-line errors for the mistakes a new user makes, each naming the flag to fix."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from p2pcrawl.testing import TestWeb, TestWebConfig
from tests.p2pcrawl.loopback import free_port
from tests.p2pcrawl.test_cli import CLI, run_cli

pytestmark = pytest.mark.timeout(90)


def _one_line(err: str) -> str:
    # The WARC writer child started with -m prints a RuntimeWarning of its own (left to the
    # archive package); everything else must be one line.
    lines = [line for line in err.strip().splitlines() if line and "<frozen runpy>" not in line]
    assert len(lines) == 1, err
    return lines[0]


async def test_a_busy_udp_port_names_the_address_and_the_flag(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        code, out, err = await run_cli(
            "join",
            "--listen",
            f"127.0.0.1:{port}",
            "--status",
            "127.0.0.1:0",
            "--data",
            str(tmp_path / "d"),
        )
    assert code == 1 and out == ""
    line = _one_line(err)
    assert f"cannot listen on UDP 127.0.0.1:{port} (--listen)" in line
    assert "in use" in line and "port 0" in line


async def test_a_busy_status_port_names_the_address_and_the_flag(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = await run_cli(
            "join",
            "--listen",
            "127.0.0.1:0",
            "--status",
            f"127.0.0.1:{port}",
            "--data",
            str(tmp_path / "d"),
        )
    assert code == 1
    assert f"cannot listen on TCP 127.0.0.1:{port} (--status)" in _one_line(err)


async def test_peer_given_the_udp_port_says_which_address_to_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        code, _, err = await run_cli("status", "--peer", f"127.0.0.1:{port}")
    assert code == 1
    line = _one_line(err)
    assert line.startswith(f"p2pcrawl: error: cannot reach 127.0.0.1:{port}: connection refused")
    assert "status server address" in line and "not its UDP --listen address" in line


async def test_a_seed_without_a_scheme_is_refused_before_start(tmp_path: Path) -> None:
    code, _, err = await run_cli(
        "join",
        "--listen",
        "127.0.0.1:0",
        "--status",
        "127.0.0.1:0",
        "--data",
        str(tmp_path / "d"),
        "--seed",
        "example.org",
    )
    assert code == 2
    assert _one_line(err) == (
        "p2pcrawl: error: --seed 'example.org' is not a crawlable URL: "
        "no scheme: did you mean https://example.org?"
    )


@pytest.fixture
async def small_web() -> AsyncIterator[TestWeb]:
    async with TestWeb(TestWebConfig(hosts=1, pages_per_host=5)) as web:
        yield web


async def test_a_founder_logs_no_dht_warning(small_web: TestWeb, tmp_path: Path) -> None:
    """kademlia's "There are no known neighbors to get key p2pcrawl/scope/v1" is gone."""
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "join",
        "--listen",
        "127.0.0.1:0",
        "--status",
        f"127.0.0.1:{free_port()}",
        "--data",
        str(tmp_path / "d"),
        "--allow-private",
        "--delay",
        "0",
        "--seed",
        small_web.hub_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 30)
        await asyncio.sleep(6.5)  # past one refresh of the default scope (every 5 s)
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    assert "summary:" in text  # it ran and left
    assert "WARNING" not in text and "no known neighbors" not in text, text
