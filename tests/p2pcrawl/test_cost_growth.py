"""The cost-growth benchmark, small: its JSON shape, and a queue that lives on disk, not in RAM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cost_growth_reports_each_size_and_the_queue_spills_to_disk(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "cost_growth.py"),
            "--queue",
            "10000",
            "200000",
            "--done",
            "20000",
            "--rounds",
            "2",
            "--pages",
            "300",
            "--probes",
            "5000",
            "--exact",
            "2000",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "cost_growth"
    assert result["queue_skipped"] == []
    assert [row["queue"] for row in result["queue"]] == [10_000, 200_000]
    small, large = result["queue"]
    assert small["cpu_ratio"] == 1.0
    for row in result["queue"]:
        cpu = row["cpu_us_per_page"]
        assert 0 < cpu["min"] <= cpu["median"] <= cpu["max"]
        assert row["disk_bytes_per_url"] >= row["task_store_bytes_per_url"] > 0
    # The 200,000 queued tasks are on disk: the fill grew RSS by far less than the same
    # tasks held as Python objects did in this very process.
    assert large["queue_in_ram_mib"] > 0
    assert large["rss_growth_share_of_in_ram"] < 0.5, large
    [done] = result["done"]
    assert done["fingerprints"] == 20_000
    assert done["unseen_check_ns"] > 0 and done["seen_check_us"] > 0
    # The benchmark removes its stores when it ends.
    assert list(tmp_path.iterdir()) == []
