"""``p2pcrawl demo`` as a user runs it: a subprocess that ends in the ground truth."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_crawls_its_test_web_exactly(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "p2pcrawl", "demo", "--hosts", "4", "--pages", "40"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    truth = int(re.search(r"test web: \d+ hosts, (\d+) URLs", out).group(1))  # type: ignore[union-attr]
    pages = int(re.search(r"s: (\d+) pages", out).group(1))  # type: ignore[union-attr]
    assert pages == truth
    assert "-> MATCH" in out
    assert len(re.findall(r"^  peer \d: ", out, re.M)) == 3
    assert re.search(r"status http://127\.0\.0\.1:\d+/", out)
    assert ".warc.gz" in out
