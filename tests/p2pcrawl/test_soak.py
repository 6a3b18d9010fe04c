"""The soak benchmark, short: it runs, samples every second, and finds no descriptor leak."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_samples_every_second_and_leaks_no_descriptor(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "soak.py"),
            "--duration",
            "8",
            "--hosts",
            "3",
            "--pages",
            "300",
            "--no-plot",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    doc = json.loads(out.read_text())
    assert doc["summary"] == last
    samples = doc["samples"]
    assert len(samples) >= 7
    assert all(b["t"] - a["t"] < 2.0 for a, b in itertools.pairwise(samples))
    assert last["pages"] > 0
    assert last["checks"]["no_fd_leak"], last["fds"]
    assert set(last["checks"]) == {"rss_growth_le_10pct", "no_fd_leak", "lag_p99_lt_100ms"}
