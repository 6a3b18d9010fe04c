"""Every user-facing failure is one clear line on stderr and a non-zero exit, never a
traceback; ``--debug`` shows the traceback."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from tests.p2pcrawl.loopback import free_port

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "p2pcrawl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
    )


def _one_line(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    line = lines[0]
    assert line.startswith("p2pcrawl: error: ")
    for word in words:
        assert word.lower() in line.lower(), line
    return line


def _join(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "join",
        "--listen",
        "127.0.0.1:0",
        "--status",
        "127.0.0.1:0",
        "--data",
        str(tmp_path / "data"),
        *extra,
    ]


def test_status_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    args = _join(tmp_path)
    args[args.index("127.0.0.1:0", 3)] = "0.0.0.0:0"
    _one_line(_cli(*args), 2, "0.0.0.0:0", "--status-token")
    assert not (tmp_path / "data").exists()  # refused before anything was created


def test_a_seed_that_is_not_a_web_url(tmp_path: Path) -> None:
    _one_line(_cli(*_join(tmp_path, "--seed", "javascript:alert(1)")), 2, "javascript:", "--seed")


def test_a_config_value_of_the_wrong_type(tmp_path: Path) -> None:
    config = tmp_path / "p2pcrawl.toml"
    config.write_text("seed = {a=1}\n", encoding="utf-8")
    _one_line(_cli(*_join(tmp_path, "--config", str(config))), 2, "seed", "table")


def test_an_absurd_setting_is_refused_with_its_range(tmp_path: Path) -> None:
    line = _one_line(_cli(*_join(tmp_path, "--concurrency", "1000000000")), 2, "concurrency")
    assert "4096" in line
    _one_line(_cli(*_join(tmp_path, "--ping-interval", "0")), 2, "ping_interval")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = _cli("--debug", *_join(tmp_path, "--seed", "javascript:alert(1)"))
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("p2pcrawl: error: ")


async def test_status_pointed_at_a_web_server_that_is_not_a_peer() -> None:
    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/api/status", html)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        proc = await asyncio.to_thread(_cli, "status", "--peer", f"127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    _one_line(proc, 1, "not a p2pcrawl status server")


def test_status_pointed_at_nothing() -> None:
    _one_line(_cli("status", "--peer", f"127.0.0.1:{free_port()}"), 1, "cannot reach")


def _in_small_fs(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) in a mount namespace with a tmpfs at ``tmp_path/fs``."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private tmpfs")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("user and mount namespaces are not available here")
    fs = tmp_path / "fs"
    fs.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FS": str(fs), "PY": sys.executable}
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_disk_full_at_start(tmp_path: Path) -> None:
    proc = _in_small_fs(
        tmp_path,
        'mount -t tmpfs -o size=40k tmpfs "$FS" && exec "$PY" -m p2pcrawl join '
        '--listen 127.0.0.1:0 --status 127.0.0.1:0 --data "$FS/data"',
    )
    _one_line(proc, 1, "disk is full")


def test_read_only_data_directory(tmp_path: Path) -> None:
    proc = _in_small_fs(
        tmp_path,
        'mount -t tmpfs -o size=4m tmpfs "$FS" && mkdir -p "$FS/data" && '
        'mount -o remount,ro "$FS" && exec "$PY" -m p2pcrawl join '
        '--listen 127.0.0.1:0 --status 127.0.0.1:0 --data "$FS/data"',
    )
    _one_line(proc, 1, "read-only")
