"""The README's first example, run as a new user would run it: its code block as it is,
in a fresh directory, with only the ports changed to free ones."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.p2pcrawl.loopback import free_port

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- the suite runs this block as it is: tests/p2pcrawl/test_readme.py -->"

pytestmark = pytest.mark.timeout(120)


def local_site_block() -> str:
    text = README.read_text()
    after = text.split(MARKER, 1)[1]
    block = re.match(r"\s*```\n(.*?)```", after, re.DOTALL)
    assert block is not None, "the README's local-site example lost its code block"
    return block.group(1)


def test_the_readme_starts_with_the_two_set_up_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[2] == "```" and lines[5] == "```"
    assert lines[3].endswith("p2pcrawl demo") and lines[4].endswith("-m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert "-m pytest" in ci  # the README's test command is the one CI runs


def test_the_readme_local_site_example_crawls_the_site(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    script = local_site_block()
    for port in ("8000", "9000", "8080"):
        assert port in script
        script = script.replace(port, str(free_port()))
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    if not (Path(bindir) / "p2pcrawl").exists():
        pytest.skip("the p2pcrawl console script is not installed beside this interpreter")
    # The background web server is this shell's job: stopped by its own PID at the end.
    wrapped = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script
    proc = subprocess.run(
        ["bash", "-c", wrapped],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = [line for line in proc.stdout.splitlines() if line.startswith("http://")]
    assert len(exported) == 2, proc.stdout
    assert {u.rsplit("/", 1)[1] for u in exported} == {"", "about.html"}
    assert list((tmp_path / "crawl" / "warc").glob("*.warc.gz"))
