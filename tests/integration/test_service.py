"""Running a peer as a service: the systemd unit, the config it reads, and an upgrade done
the way docs/operations.md says (stop one peer, upgrade it, start it again on its data
directory) while the rest of the network keeps crawling.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from p2pcrawl.testing import Cluster, TestWeb, TestWebConfig
from p2pcrawl.ui.options import build_parser, merge_config, settings_from
from tests.integration.conftest import CONCURRENCY

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    script = Path(sys.executable).with_name("p2pcrawl")
    if not script.exists():
        pytest.skip("the p2pcrawl console script is not installed beside this interpreter")
    unit = (EXAMPLES / "p2pcrawl.service").read_text()
    assert "ExecStart=/opt/p2pcrawl/bin/p2pcrawl " in unit and "KillSignal=SIGTERM" in unit
    # The unit as installed, with this checkout's command in place of /opt/p2pcrawl.
    here = tmp_path / "p2pcrawl.service"
    here.write_text(unit.replace("/opt/p2pcrawl/bin/p2pcrawl", str(script)))
    proc = subprocess.run(
        [analyze, "verify", str(here)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "p2pcrawl.service" not in proc.stderr, proc.stderr  # no warning about the unit


def test_the_example_config_is_what_join_reads() -> None:
    args = build_parser().parse_args(["join", "--config", str(EXAMPLES / "peer.toml")])
    opts = merge_config(args)
    crawl, peer = settings_from(opts)
    assert opts["listen"] == "0.0.0.0:9000" and opts["log_format"] == "json"
    assert crawl.scope.allow_domains == ("example.org",)
    assert crawl.concurrency == 32 and peer.replicas == 2


@pytest.fixture
async def web() -> AsyncIterator[TestWeb]:
    async with TestWeb(
        TestWebConfig(hosts=8, pages_per_host=30, slow_host_delay=0.02, large_page_bytes=100_000)
    ) as w:
        yield w


@pytest.mark.slow
async def test_an_upgrade_stops_one_peer_and_starts_it_again_while_the_network_crawls(
    web: TestWeb, tmp_path: Path
) -> None:
    # Every timer at its default: what an operator runs. The delay keeps the crawl going
    # through the upgrade.
    common = ["--allow-private", "--concurrency", str(CONCURRENCY), "--delay", "0.2"]
    common += [a for d in web.allow_domains for a in ("--allow-domain", d)]
    async with Cluster(tmp_path, common) as cluster:
        founder = await cluster.start_peer("p0")
        peers = [founder] + [await cluster.start_peer(f"p{i}", bootstrap=founder) for i in (1, 2)]
        await cluster.wait_until(
            lambda ss: len(ss) == 3 and all(s["peers"] == 2 for s in ss), 30, "a full mesh"
        )
        await cluster.api(founder, "/api/seed", "POST", {"urls": [web.hub_url]})
        truth = web.ground_truth()
        await cluster.wait_until(
            lambda ss: sum(s["pages_fetched"] for s in ss) >= len(truth) // 4, 90, "a quarter"
        )
        # systemctl stop: SIGTERM, the graceful leave, exit 0.
        old = peers[2]
        cluster.terminate(old)
        assert await cluster.wait_exit(old, 120) == 0, cluster.log(old)
        during = sum(s["pages_fetched"] for s in await cluster.statuses())
        # systemctl start, on the upgraded code: the same data directory, the same node.
        again = await cluster.start_peer("p2-upgraded", bootstrap=founder, data=old.data)
        assert again.node_id == old.node_id
        states: list[dict[str, Any]] = await cluster.wait_network_finished(timeout=180)
        assert all(s["state"] == "finished" for s in states)
        assert sum(s["pages_fetched"] for s in states) > during  # the others went on
        counts = cluster.warc_counts()
        assert set(counts) == truth, f"lost {len(truth - set(counts))}"
        dups = sum(n - 1 for n in counts.values())
        print(f"upgrade: {dups} duplicate fetches of {len(truth)}")
        assert dups <= len(truth) * 0.005
