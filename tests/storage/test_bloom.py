"""The DSBF (dynamic splittable Bloom filter) and the Bloom maths, tested as pure code."""

from __future__ import annotations

import math
import random
import threading

import pytest

from storage.bloom import MAX_HEIGHT, SplittableBloom, false_positive_rate, optimal_k


def fingerprints(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(64) for _ in range(n)]


def measured_fp_rate(bloom: SplittableBloom, probes: list[int]) -> float:
    return sum(bloom.contains_many(probes)) / len(probes)


# -- maths ---------------------------------------------------------------------------------


def test_optimal_k_is_m_over_n_ln2() -> None:
    assert optimal_k(16_000, 1_000) == 11  # 16 ln 2 = 11.09
    assert optimal_k(10_000, 1_000) == 7  # 10 ln 2 = 6.93
    assert optimal_k(1, 1_000) == 1  # never zero hash functions


def test_optimal_k_minimises_the_false_positive_rate() -> None:
    m, n = 14_378, 1_000
    k = optimal_k(m, n)
    assert false_positive_rate(m, n, k) < false_positive_rate(m, n, k - 1)
    assert false_positive_rate(m, n, k) < false_positive_rate(m, n, k + 1)


def test_false_positive_rate_formula() -> None:
    # 16 bits per item with k = 11: about 0.05% (the README's RAM budget).
    assert false_positive_rate(16_000, 1_000, 11) == pytest.approx(4.59e-4, rel=0.01)
    assert false_positive_rate(1_000, 0, 5) == 0.0
    assert false_positive_rate(100, 10, 3) == pytest.approx((1 - math.exp(-0.3)) ** 3)
    # More items, more false positives.
    assert false_positive_rate(10_000, 500, 7) < false_positive_rate(10_000, 1_000, 7)


@pytest.mark.parametrize(("m", "n", "k"), [(0, 1, 1), (-5, 1, 1), (10, 1, 0)])
def test_false_positive_rate_rejects_nonsense(m: int, n: int, k: int) -> None:
    with pytest.raises(ValueError):
        false_positive_rate(m, n, k)


def test_optimal_k_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        optimal_k(0, 10)
    with pytest.raises(ValueError):
        optimal_k(10, 0)


# -- the filter ----------------------------------------------------------------------------


def test_a_fresh_filter_is_one_level_of_leaves() -> None:
    bloom = SplittableBloom(1000, 0.01, 3)
    assert (bloom.height, bloom.leaves, len(bloom)) == (1, 3, 0)
    assert SplittableBloom(1000, 0.01, 3, root_fanout=5).leaves == 5
    assert 0 not in bloom and (1 << 64) - 1 not in bloom


def test_constructor_checks() -> None:
    for kwargs in (
        {"leaf_capacity": 0},
        {"fp_rate": 0.0},
        {"fp_rate": 1.0},
        {"fanout": 1},
        {"root_fanout": 0},
    ):
        with pytest.raises(ValueError):
            SplittableBloom(**kwargs)


def test_add_rejects_values_outside_unsigned_64_bits() -> None:
    bloom = SplittableBloom(100, 0.01)
    with pytest.raises(ValueError):
        bloom.add(-1)
    with pytest.raises(ValueError):
        bloom.add(1 << 64)


def test_false_positive_rate_of_a_full_leaf_is_near_f_max() -> None:
    capacity, f_max = 20_000, 0.01
    bloom = SplittableBloom(capacity, f_max, root_fanout=1)
    bloom.add_many(fingerprints(capacity - 1, seed=1))
    assert bloom.height == 1  # just below the split point
    rate = measured_fp_rate(bloom, fingerprints(100_000, seed=2))
    assert 0.5 * f_max < rate < 1.5 * f_max


def test_split_grows_the_tree_and_loses_nothing() -> None:
    capacity = 1_000
    bloom = SplittableBloom(capacity, 0.01, fanout=3, root_fanout=1)
    before = fingerprints(capacity + 20, seed=3)  # a few collide with false positives
    bloom.add_many(before)
    assert bloom.height == 2 and bloom.leaves == 3  # the leaf split into 3
    assert bloom.pending_rehash == 1
    # Mid-split: the old leaf answers for what it held, the children for what comes next.
    after = fingerprints(2 * capacity, seed=4)
    bloom.add_many(after)
    assert all(bloom.contains_many(before)) and all(bloom.contains_many(after))
    frozen_bytes = bloom.nbytes

    bloom.rehash(before + after)
    assert all(bloom.contains_many(before)) and all(bloom.contains_many(after))
    assert all(fp in bloom for fp in before + after)
    # The old filter is gone once its items live in the children again.
    while bloom.pending_rehash:
        bloom.rehash(before + after)
    leaf_bytes = SplittableBloom(capacity, 0.01, root_fanout=1).nbytes
    assert bloom.nbytes == bloom.leaves * leaf_bytes < frozen_bytes + bloom.leaves * leaf_bytes
    assert len(bloom) <= len(before) + len(after)


def test_many_splits_no_false_negatives_and_fp_rate_held() -> None:
    capacity, f_max = 2_000, 0.01
    bloom = SplittableBloom(capacity, f_max, fanout=3, root_fanout=1)
    items = fingerprints(40_000, seed=5)
    # Rehash after every chunk, as the done record does in the background.
    for start in range(0, len(items), 1_000):
        bloom.add_many(items[start : start + 1_000])
        while bloom.pending_rehash:
            bloom.rehash(items[: start + 1_000])
        assert all(bloom.contains_many(items[: start + 1_000]))
    assert bloom.leaves >= len(items) // capacity
    # Different locating hashes per level keep the tree balanced: with the same hash at
    # every level, one branch would keep splitting and the height would run away.
    assert bloom.height <= 5
    rate = measured_fp_rate(bloom, fingerprints(100_000, seed=6))
    assert rate < 1.5 * f_max


def test_without_rehash_the_old_filters_stay_and_still_answer() -> None:
    bloom = SplittableBloom(500, 0.01, fanout=2, root_fanout=1)
    items = fingerprints(10_000, seed=7)
    bloom.add_many(items)
    assert bloom.height > 2 and bloom.pending_rehash > 0
    assert all(bloom.contains_many(items))


def test_leaves_at_max_height_stop_splitting() -> None:
    bloom = SplittableBloom(1, 0.01, fanout=2, root_fanout=1)
    items = fingerprints(2_000, seed=8)
    bloom.add_many(items)
    assert bloom.height == MAX_HEIGHT
    assert all(bloom.contains_many(items))


def test_contains_many_agrees_with_contains() -> None:
    bloom = SplittableBloom(300, 0.05, root_fanout=1)
    seen = fingerprints(2_000, seed=9)
    bloom.add_many(seen)
    probes = seen[:500] + fingerprints(5_000, seed=10)
    assert bloom.contains_many(probes) == [fp in bloom for fp in probes]


def test_duplicates_do_not_count() -> None:
    bloom = SplittableBloom(100, 0.01, root_fanout=1)
    for _ in range(3):
        bloom.add_many([1, 2, 3])
    assert len(bloom) == 3


def test_concurrent_lookups_never_miss_during_splits() -> None:
    # One thread inserts, splits and rehashes; another keeps probing what was inserted.
    bloom = SplittableBloom(200, 0.01, fanout=3, root_fanout=1)
    items = fingerprints(20_000, seed=11)
    published = 0
    stop = threading.Event()
    misses: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            upto = published
            misses.extend(fp for fp in items[:upto] if fp not in bloom)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i, fp in enumerate(items, 1):
            bloom.add(fp)
            published = i
            if i % 500 == 0:
                bloom.rehash(items[:i])
    finally:
        stop.set()
        thread.join()
    assert misses == []
    assert bloom.height > 2
