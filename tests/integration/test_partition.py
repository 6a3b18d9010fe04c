"""A short partition, Jepsen-style: peers in their own network namespaces, the links between
two halves cut for 5 s both ways during a crawl at full speed, then healed; every timer at
its default (``benchmarks/partition.py --quick``; the longer and one-way cuts are that
benchmark's).

Needs root and working ``ip netns``; skipped with the reason otherwise. Checks, from the
web server's own counts and the peers' status APIs: every page of the web fetched, the
halves merged within the documented bound, ``finished`` never reported while the halves
could not hear each other nor while a page was unfetched, every peer finished in the end;
and that no namespace was left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "partition.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from _netns import netns_available  # noqa: E402

pytestmark = pytest.mark.slow


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("p2pcrawl-part-")}


@pytest.mark.timeout(300)
def test_a_short_cut_both_ways_loses_nothing_and_the_halves_merge() -> None:
    why = netns_available()
    if why:
        pytest.skip(f"partitions need network namespaces: {why}")
    before = _namespaces()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        check=False,
    )
    assert _namespaces() == before, "namespaces left behind"
    print(proc.stdout[-3000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    (run,) = result["runs"]
    assert run["lost"] == 0, run
    assert run["merge_s"] is not None and run["merge_s"] <= 36.0, run
    assert run["finished_during_cut"] == [] and run["finished_early"] == [], run
    assert run["finished"], run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
