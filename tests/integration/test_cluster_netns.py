"""The cluster benchmark's 2-peer smoke run: real peers in their own network namespaces.

Needs root and working ``ip netns``; skipped with the reason otherwise. Runs the benchmark as
a user would (``benchmarks/cluster.py --smoke --loop-cpu``) and checks what it reports, and
that it left no namespace behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "cluster.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from _zipfweb import ZipfWeb  # noqa: E402


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "ip or tc not installed"
    name = f"p2sctest{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("p2sc-")}


@pytest.mark.timeout(300)
def test_two_peers_in_namespaces_crawl_the_whole_web_once() -> None:
    why = _netns_unavailable()
    if why:
        pytest.skip(f"cluster benchmark needs network namespaces: {why}")
    before = _namespaces()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--loop-cpu"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    total = ZipfWeb(40, 20, 0.8, 1).total_pages  # the --smoke web
    assert result["pages"] == total
    for n in ("1", "2"):
        assert result["pages_fetched"][n]["min"] == total, result
        assert result["duplicates"][n]["max"] == 0, result
    assert result["speedup"]["2"] > 0
    # Two peers exchange tasks over the bridge; one peer has nobody to send to.
    assert result["rpcs_per_page"]["2"]["median"] > 0
    assert result["rpcs_per_page"]["1"]["median"] == 0
    # --loop-cpu timed the peers' event loops: fetching was among the largest callbacks at
    # both sizes, RPC serving only where there was someone to serve, and no callback's time
    # exceeds the main threads' own.
    # A task is named by its coroutine and its owner's name for it ("task Engine._worker
    # [engine:worker]", "task Endpoint._run_deferred [protocol:store_task]").
    for n in ("1", "2"):
        loop = result["loop_cpu_ms_per_page"][n]
        assert loop["task Engine._worker [engine:worker]"]["median"] > 0, loop
        main = loop["main_thread"]["median"]
        assert all(v["median"] <= main for v in loop.values()), loop
    assert not any(
        name.startswith("task Endpoint._run_deferred")
        for name in result["loop_cpu_ms_per_page"]["1"]
    )
    # Each run timed the probe job, so CPU per page compares across runs in its units.
    for n in ("1", "2"):
        assert result["probe_us"][n]["min"] > 0, result
        assert result["cpu_probe_jobs_per_page"][n]["min"] > 0, result
    assert result["cpu_over_one_peer_in_probe_jobs"]["2"] > 0, result
    assert _namespaces() == before
