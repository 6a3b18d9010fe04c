"""The ``p2pcrawl`` command: help, flag validation, config files, and a peer run as a user would.

The user-level tests start ``p2pcrawl join`` as a subprocess against a test web served by this
process, drive it only through its status server and the ``status``/``seed``/``leave``
subcommands, and stop it by its own PID with bounded waits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from p2pcrawl import __version__
from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import Scope
from p2pcrawl.network import join_command, new_key
from p2pcrawl.settings import CrawlSettings, PeerSettings
from p2pcrawl.testing import TestWeb, TestWebConfig
from p2pcrawl.ui import main
from p2pcrawl.ui.options import UsageError, build_parser, merge_config, settings_from
from tests.p2pcrawl.loopback import free_port

_SCRIPT = Path(sys.executable).with_name("p2pcrawl")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "p2pcrawl"]

JOIN_FLAGS = [
    "--bootstrap",
    "--listen",
    "--status",
    "--data",
    "--seed",
    "--config",
    "--allow-domain",
    "--allow-private",
    "--concurrency",
    "--delay",
    "--politeness-factor",
    "--max-pages",
    "--max-depth",
    "--partition",
    "--replicas",
    "--secret",
    "--user-agent",
]
STATUS_FIELDS = {
    "node_id",
    "listen",
    "state",
    "peers",
    "tasks_queued",
    "tasks_in_flight",
    "backups_held",
    "done",
    "pages_fetched",
    "urls_discovered",
    "errors",
    "uptime_s",
}
WEB = TestWebConfig(hosts=3, pages_per_host=20, slow_host_delay=0.01, large_page_bytes=50_000)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """main() configures the root logger for the process; put it back after each test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# --- help and version ------------------------------------------------------------------------


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0
    for command in ("join", "seed", "leave", "status", "demo", "--version"):
        assert command in out


def test_join_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["join", "--help"], capsys)
    assert code == 0
    for flag in JOIN_FLAGS:
        assert flag in out, flag
    # Each ranged setting shows its range beside its default, as the README says.
    flat = " ".join(out.split())
    for shown in ("(32; range 1 .. 4096)", "(2; range > 0 .. 300)", "(1; range 0 .. 86400)"):
        assert shown in flat, shown
    # Every option carries a help text, not just a name.
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("seed", ["--peer", "URL"]),
        ("leave", ["--peer"]),
        ("status", ["--peer", "--json"]),
        ("demo", ["--peers"]),
    ],
)
def test_subcommand_help(
    capsys: pytest.CaptureFixture[str], command: str, flags: list[str]
) -> None:
    code, out, _ = run_main([command, "--help"], capsys)
    assert code == 0
    for flag in flags:
        assert flag in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"p2pcrawl {__version__}"


async def test_console_script_version() -> None:
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert out.decode().strip() == f"p2pcrawl {__version__}"


# --- bad flags -----------------------------------------------------------------------------------

LISTEN = ["--listen", "127.0.0.1:0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["join", *LISTEN, "--concurrency", "0"], "--concurrency: must be from 1 to 4096"),
        (["join", *LISTEN, "--concurrency", "many"], "--concurrency: not an integer"),
        (["join", "--listen", "nonsense"], "malformed address 'nonsense'"),
        (["join", "--listen", "127.0.0.1:99999"], "port out of range"),
        (["join", *LISTEN, "--status", "127.0.0.1:x"], "bad port"),
        (["join", *LISTEN, "--delay", "-1"], "--delay: must be a finite number from 0 to 86400"),
        (["join", *LISTEN, "--delay", "nan"], "--delay: must be a finite number from 0 to 86400"),
        (
            ["join", *LISTEN, "--rpc-timeout", "inf"],
            "--rpc-timeout: must be a finite number above 0 and at most 300",
        ),
        (["join", *LISTEN, "--politeness-factor", "inf"], "--politeness-factor: must be"),
        (["join", *LISTEN, "--max-pages", "-3"], "--max-pages: must be from 0 to"),
        (["join", *LISTEN, "--partition", "shard"], "--partition: invalid choice"),
        (["join", *LISTEN, "--policy", "fastest"], "--policy: invalid choice"),
        (["join", *LISTEN, "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["join"], "join needs --listen HOST:PORT"),
        (["seed", "http://example.com/"], "the following arguments are required: --peer"),
        (["seed", "--peer", "127.0.0.1:1"], "the following arguments are required: URL"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run_main(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_unreachable_peer_is_a_clean_failure(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["status", "--peer", f"127.0.0.1:{free_port()}"], capsys)
    assert code == 1
    assert err.startswith("p2pcrawl: error:")
    assert "Traceback" not in err


# --- config files ------------------------------------------------------------------------------


def merged(argv: list[str]) -> dict[str, Any]:
    return merge_config(build_parser().parse_args(argv))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p2pcrawl.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_are_the_settings_defaults() -> None:
    crawl, peer = settings_from(merged(["join", *LISTEN]))
    assert crawl == CrawlSettings()
    assert peer == PeerSettings()


def test_flags_become_settings() -> None:
    crawl, peer = settings_from(
        merged(
            [
                "join",
                *LISTEN,
                "--allow-domain",
                "example.com",
                "--allow-domain",
                "example.org",
                "--allow-private",
                "--concurrency",
                "5",
                "--delay",
                "0",
                "--politeness-factor",
                "0",
                "--max-pages",
                "10",
                "--max-depth",
                "0",
                "--partition",
                "url",
                "--replicas",
                "0",
                "--secret",
                "s3cret",
                "--user-agent",
                "Bot/1.0",
            ]
        )
    )
    assert crawl.scope.allow_domains == ("example.com", "example.org")
    assert crawl.scope.allow_private
    assert crawl.concurrency == 5
    assert crawl.politeness.delay == 0 and crawl.politeness.politeness_factor == 0
    assert crawl.scope.max_pages == 10 and crawl.scope.max_depth == 0
    assert crawl.effective_user_agent() == "Bot/1.0"
    assert peer.partition == "url" and peer.replicas == 0 and peer.secret == "s3cret"


@pytest.mark.parametrize("key", ["-Ab3_x", "Ab3-x_", None])
def test_the_printed_join_command_parses_with_its_key(key: str | None) -> None:
    """The founder prints a command to paste on the next machine: it must parse, with the
    key intact, whatever the key looks like. A generated key (``None`` here) never starts
    with "-"; one that does is passed as ``--secret=KEY``."""
    assert not any(new_key().startswith("-") for _ in range(2000))
    secret = key if key is not None else new_key()
    argv = shlex.split(join_command("127.0.0.1", 9000, secret))[1:]
    _, peer = settings_from(merged(argv))
    assert peer.secret == secret


def test_config_file_sets_options_and_flags_override(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
concurrency = 4
delay = 0.5
politeness-factor = 2
max-pages = 100
allow-domain = ["example.com", "example.org"]
allow-private = true
partition = "url"
secret = "from-file"
user-agent = "FileBot/1"
data = "crawl-data"
""",
    )
    opts = merged(
        ["join", "--config", path, *LISTEN, "--concurrency", "16", "--allow-domain", "example.net"]
    )
    assert opts["data"] == Path("crawl-data")
    crawl, peer = settings_from(opts)
    assert crawl.concurrency == 16  # the flag wins
    assert crawl.scope.allow_domains == ("example.net",)  # a repeated flag replaces the list
    assert crawl.politeness.delay == 0.5  # the file fills in what the flags leave out
    assert crawl.politeness.politeness_factor == 2
    assert crawl.scope.max_pages == 100
    assert crawl.scope.allow_private
    assert crawl.user_agent == "FileBot/1"
    assert peer.partition == "url" and peer.secret == "from-file"
    # Underscores are accepted as well as dashes.
    alt = write(tmp_path, "max_depth = 3\n")
    assert settings_from(merged(["join", "--config", alt, *LISTEN]))[0].scope.max_depth == 3


def test_unknown_config_key_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "concurrency = 4\nturbo = true\n")
    with pytest.raises(UsageError, match="unknown option 'turbo'"):
        merged(["join", "--config", path, *LISTEN])
    code, _, err = run_main(["join", "--config", path, *LISTEN], capsys)
    assert code == 2 and "unknown option 'turbo'" in err


def test_unreadable_config_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = write(tmp_path, "concurrency = = 4\n")
    code, _, err = run_main(["join", "--config", broken, *LISTEN], capsys)
    assert code == 2 and "cannot read config" in err
    code, _, err = run_main(["join", "--config", str(tmp_path / "missing.toml"), *LISTEN], capsys)
    assert code == 2 and "cannot read config" in err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("concurrency = 0", "must be from 1 to 4096"),
        ('concurrency = "many"', "not an integer"),
        ("delay = -1", "must be a finite number from 0 to 86400"),
        ('partition = "shard"', "invalid choice"),
        ('policy = "fastest"', "invalid choice"),
        ('allow-private = "yes"', "allow-private"),
    ],
)
def test_config_values_are_checked_like_flags(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, line + "\n")
    with pytest.raises(UsageError, match=message):
        merged(["join", "--config", path, *LISTEN])


def test_config_single_domain_string(tmp_path: Path) -> None:
    path = write(tmp_path, 'allow-domain = "example.com"\nseed = "http://example.com/"\n')
    crawl, _ = settings_from(merged(["join", "--config", path, *LISTEN]))
    assert crawl.scope.allow_domains == ("example.com",)


def test_a_config_with_a_long_domain_list_is_read_and_matched(tmp_path: Path) -> None:
    # Each entry once: argparse took minutes over 300,000 repeated flags, and matching a
    # host walked the whole list.
    names = [f"d{i:06d}.example.org" for i in range(50_000)]
    path = write(tmp_path, "allow-domain = [" + ",".join(f'"{n}"' for n in names) + "]\n")
    crawl, _ = settings_from(merged(["join", "--config", path, *LISTEN]))
    assert crawl.scope.allow_domains == tuple(names)
    scope = Scope(crawl.scope.allow_domains)
    assert scope.allows_host("d049999.example.org")
    assert scope.allows_host("www.d000007.example.org")
    assert not scope.allows_host("example.org") and not scope.allows_host("xd000007.example.org")
    bad = write(tmp_path, "allow-domain = [1.5, true]\n")
    with pytest.raises(UsageError, match="allow-domain must be a list of strings, not of bool"):
        merged(["join", "--config", bad, *LISTEN])


# --- a peer, run as a user would ---------------------------------------------------------------


@pytest.fixture
async def test_web() -> AsyncIterator[TestWeb]:
    async with TestWeb(WEB) as web:
        yield web


async def run_cli(*args: str, timeout: float = 30) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def peer_process(
    web: TestWeb, data: Path, status_port: int, *extra: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``p2pcrawl join`` for ``web``; killed by its own PID if the test leaves it running."""
    domains = [arg for d in web.allow_domains for arg in ("--allow-domain", d)]
    argv = [
        "join",
        "--listen",
        "127.0.0.1:0",
        "--status",
        f"127.0.0.1:{status_port}",
        "--data",
        str(data),
        "--allow-private",
        *domains,
        "--delay",
        "0",
        "--politeness-factor",
        "0",
        *extra,
    ]
    log = (data.parent / "peer.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *CLI, *argv, stdout=asyncio.subprocess.PIPE, stderr=log
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
        log.close()


async def ready_line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    doc: dict[str, Any] = json.loads(line)
    assert doc["ready"] is True
    return doc


async def wait_drained(status_port: int, pages: int, timeout: float = 60) -> dict[str, Any]:
    """Poll /api/status until the crawl has fetched ``pages`` pages and nothing is left."""
    url = f"http://127.0.0.1:{status_port}/api/status"
    last: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session, asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    last = await resp.json()
            if (
                last
                and last["tasks_queued"] == 0
                and last["tasks_in_flight"] == 0
                and last["pages_fetched"] >= pages
            ):
                return last
            await asyncio.sleep(0.1)


async def exit_code(proc: asyncio.subprocess.Process, timeout: float = 20) -> int:
    return await asyncio.wait_for(proc.wait(), timeout)


def assert_warc_is_ground_truth(web: TestWeb, data: Path) -> None:
    archived = Counter(read_warc_urls(data / "warc"))
    assert set(archived) == web.ground_truth()
    assert max(archived.values()) == 1


async def test_join_crawls_the_test_web_and_stops_on_sigterm(
    test_web: TestWeb, tmp_path: Path
) -> None:
    data, port = tmp_path / "data", free_port()
    truth = test_web.ground_truth()
    async with peer_process(test_web, data, port, "--seed", test_web.hub_url) as proc:
        ready = await ready_line(proc)
        assert ready["status"] == f"127.0.0.1:{port}"
        status = await wait_drained(port, len(truth))
        assert set(status) >= STATUS_FIELDS
        assert status["pages_fetched"] == len(truth)
        assert status["state"] in ("active", "finished")
        assert status["errors"] == 0

        code, out, err = await run_cli("status", "--peer", f"127.0.0.1:{port}")
        assert code == 0, err
        rows = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
        assert rows["state"].strip() in ("active", "finished")
        assert rows["queued"].strip() == "0"
        assert "pages fetched" in out and f"{len(truth)} (" in out

        code, out, err = await run_cli("status", "--peer", f"127.0.0.1:{port}", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert set(doc) >= STATUS_FIELDS
        assert doc["pages_fetched"] == len(truth) and doc["node_id"] == ready["node_id"]

        os.kill(proc.pid, signal.SIGTERM)
        assert await exit_code(proc) == 0
        assert proc.stdout is not None
        left = json.loads(await proc.stdout.readline())
        assert left["left"] is True and left["failed"] == 0
    assert_warc_is_ground_truth(test_web, data)
    assert set(test_web.request_counts) == truth
    assert max(test_web.request_counts.values()) == 1


async def test_seed_through_a_running_peer_then_leave(test_web: TestWeb, tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    truth = test_web.ground_truth()
    async with peer_process(test_web, data, port) as proc:
        await ready_line(proc)
        # One bad URL among good ones: each gets its verdict, the good one is crawled, and
        # the exit status says that something was not accepted.
        bad = test_web.hub_url.replace("http://", "htp://")
        code, out, err = await run_cli(
            "seed", "--peer", f"127.0.0.1:{port}", bad, test_web.hub_url, "not a url"
        )
        assert code == 1, err
        lines = out.splitlines()
        assert lines[-1] == "accepted 1 of 3 seed(s)"
        assert lines[0].split()[:2] == ["invalid", bad]
        assert lines[1].split() == ["accepted", test_web.hub_url]
        assert lines[2].split()[:4] == ["invalid", "not", "a", "url"]
        await wait_drained(port, len(truth))
        code, out, err = await run_cli("leave", "--peer", f"127.0.0.1:{port}")
        assert code == 0, err
        assert "leaving" in out
        assert await exit_code(proc) == 0
    assert_warc_is_ground_truth(test_web, data)


def test_the_command_imports_with_the_collector_paused_and_its_imports_frozen() -> None:
    """``p2pcrawl.startup``: the collector runs again once the command's modules are in,
    and what they made is out of its reach (frozen), so a long crawl's full collections do
    not walk it again."""
    probe = (
        "import gc, sys\n"
        "from p2pcrawl import startup\n"
        "assert 'p2pcrawl.ui' not in sys.modules\n"
        "try:\n"
        "    startup.main(['--version'])\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, gc.isenabled(), gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[-3:-1] == ["0", "True"]  # after the version line
    assert int(out[-1]) > 50_000  # the package's and its dependencies' objects
