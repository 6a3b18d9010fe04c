"""``p2pcrawl demo`` as a user runs it: a subprocess that ends in the ground truth."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = [sys.executable, "-m", "p2pcrawl", "demo"]


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
    assert re.search(r"^WARC files: [1-9]\d* \(", out, re.M)


@pytest.mark.slow
def test_demo_out_keeps_its_output_and_explains_shares(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo-out"
    proc = subprocess.run(
        [*DEMO, "--hosts", "3", "--pages", "20", "--out", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "XOR-closest" in out and "a peer can own no host" in out
    line = re.search(
        r"^hosts with pages in each peer's WARC files: peer 0 (\d), peer 1 (\d), peer 2 (\d) "
        r"\(of 3 hosts(?:; (\d) fetched partly on loan count at each peer that fetched them)?\)$",
        out,
        re.M,
    )
    assert line is not None, out
    # The counts add up to the hosts, plus one for each other peer a lent host was fetched
    # by: at most all three peers per host.
    counted = sum(int(n) for n in line.groups()[:3])
    assert 3 <= counted <= 3 + 2 * int(line.group(4) or 0)
    kept = re.findall(r"^  (\S+\.warc\.gz)$", out, re.M)
    assert kept and all(Path(p).is_file() and Path(p).is_relative_to(out_dir) for p in kept)
    assert f"p2pcrawl export --format jsonl {out_dir / 'peer0'}" in out
    # What the demo points at works: export lists exactly the ground truth it matched.
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2pcrawl",
            "export",
            *(str(out_dir / f"peer{i}") for i in range(3)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    truth = int(re.search(r"test web: \d+ hosts, (\d+) URLs", out).group(1))  # type: ignore[union-attr]
    assert len(export.stdout.splitlines()) == truth


def test_demo_without_out_says_its_files_are_deleted() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "p2pcrawl", "demo", "--peers", "1", "--hosts", "1", "--pages", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "deleted now; run with --out DIR to keep them" in proc.stdout
    assert not re.search(r"^  \S+\.warc\.gz$", proc.stdout, re.M)
