"""The load-balance benchmark's reference plan: IDs chosen all at once, scored by the project's
own ownership code, beat one-at-a-time halving where one host is large."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy", reason="the plan search needs numpy (the bench extra)")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from _zipfweb import ZipfWeb  # noqa: E402
from load_balance import balance, grow, keyed_pages, loads_of, plan_ids  # noqa: E402

from protocol.ownership import closest  # noqa: E402


def test_the_plan_is_owned_as_planned_and_beats_halving() -> None:
    keyed = keyed_pages(ZipfWeb(300, 100, 1.0, 1), "host")
    ids = plan_ids(keyed, 8, random.Random(1))
    assert len(set(ids)) == 8
    loads = loads_of(ids, keyed)
    # Ownership's plain XOR scan agrees with the trie walk the benchmark scores with.
    scanned = dict.fromkeys(ids, 0.0)
    for key, pages in keyed:
        scanned[closest(key, ids, 1)[0]] += pages
    assert scanned == loads
    planned = balance(loads)[1]
    halving = grow("split+load", keyed, [8], random.Random(1))[8][1]
    assert planned < halving
    assert planned < 1.25
