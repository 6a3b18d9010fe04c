"""One peer per data directory, as a user meets it: a second ``join --data`` on a live peer's
directory exits 1 naming the holder, and the first peer runs on unharmed."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from p2pcrawl.network import DataDirError, Peer, PeerConfig
from p2pcrawl.testing import TestWeb
from tests.p2pcrawl.loopback import free_port
from tests.p2pcrawl.test_cli import WEB, exit_code, peer_process, ready_line, run_cli


@pytest.fixture
async def web() -> AsyncIterator[TestWeb]:
    async with TestWeb(WEB) as w:
        yield w


async def test_a_second_peer_on_a_live_data_dir_exits_naming_the_holder(
    web: TestWeb, tmp_path: Path
) -> None:
    data, port = tmp_path / "data", free_port()
    async with peer_process(web, data, port) as first:
        ready = await ready_line(first)
        code, out, err = await run_cli(
            "join", "--listen", "127.0.0.1:0", "--status", "127.0.0.1:0", "--data", str(data)
        )
        assert code == 1
        assert f"in use by process {first.pid}" in err
        assert "ready" not in out
        # The first peer is untouched: same node, still answering, and it leaves cleanly.
        code, out, _ = await run_cli("status", "--peer", f"127.0.0.1:{port}", "--json")
        assert code == 0 and ready["node_id"] in out
        os.kill(first.pid, signal.SIGTERM)
        assert await exit_code(first) == 0
    # Released on exit: the directory can be used again.
    code, _, err = await run_cli(
        "join",
        "--listen",
        "127.0.0.1:0",
        "--status",
        "127.0.0.1:0",
        "--data",
        str(data),
        "--bootstrap",
        "127.0.0.1:9",  # nobody answers: exits 1, but after taking the lock
        timeout=60,
    )
    assert "in use by" not in err


async def test_the_lock_is_held_in_process_until_aclose(make_peer: Any, tmp_path: Path) -> None:
    peer = await make_peer()
    with pytest.raises(DataDirError, match=f"in use by process {os.getpid()}"):
        Peer(PeerConfig(data_dir=peer.config.data_dir))
    await peer.aclose()
    again = Peer(PeerConfig(data_dir=peer.config.data_dir))
    await again.aclose()
