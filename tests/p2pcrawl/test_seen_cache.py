"""The recently-seen cache: what it remembers, what it evicts, and that its memory is fixed."""

from __future__ import annotations

import pytest

from p2pcrawl.crawl import urls
from p2pcrawl.crawl.seen import SeenCache


def fps(n: int, host: str = "a.test") -> list[int]:
    return [urls.fingerprint(f"http://{host}/page/{i}") for i in range(n)]


def test_a_repeat_is_reported_and_a_new_fingerprint_is_not() -> None:
    c = SeenCache(1 << 10)
    a, b = fps(2)
    assert c.check_and_add(a) is False
    assert c.check_and_add(a) is True
    assert c.check_and_add(b) is False
    assert a in c and b in c
    assert (c.hits, c.misses) == (1, 2)
    assert c.hit_rate == pytest.approx(1 / 3)


def test_capacity_rounds_up_to_whole_sets() -> None:
    assert SeenCache(1000).capacity == 1024
    assert SeenCache(1 << 19).capacity == 1 << 19
    # 0 is allowed by the settings: the smallest cache, one set.
    tiny = SeenCache(0)
    assert tiny.capacity == 2
    assert tiny.check_and_add(fps(1)[0]) is False
    with pytest.raises(ValueError):
        SeenCache(-1)


def test_a_set_keeps_its_two_most_recent_fingerprints() -> None:
    c = SeenCache(2)  # one set: every fingerprint competes for the same two slots
    a, b, d = fps(3)
    c.check_and_add(a)
    c.check_and_add(b)
    assert c.check_and_add(a) is True  # a becomes the most recent: b is next out
    assert c.check_and_add(d) is False
    assert a in c and d in c and b not in c
    assert len(c) == 2


def test_discard_forgets_one_fingerprint_and_keeps_its_neighbour() -> None:
    c = SeenCache(2)
    a, b = fps(2)
    c.check_and_add(a)
    c.check_and_add(b)
    c.discard(b)  # the most recent one: its older neighbour must stay findable
    assert b not in c and a in c
    assert c.check_and_add(a) is True
    c.discard(a)
    assert len(c) == 0
    assert c.check_and_add(a) is False


def test_fingerprint_zero_marks_an_empty_slot_so_it_is_never_a_repeat() -> None:
    c = SeenCache(1 << 4)
    assert c.check_and_add(0) is False
    assert c.check_and_add(0) is False
    assert 0 not in c


def test_memory_is_allocated_once_and_recent_urls_stay_cached_under_churn() -> None:
    c = SeenCache(1 << 12)
    size = c._slots.buffer_info()
    stream = fps(40_000)
    for fp in stream:
        assert c.check_and_add(fp) is False  # all distinct URLs: no false repeat
    assert c._slots.buffer_info() == size  # the same buffer, not regrown
    assert len(c) <= c.capacity
    # The most recent quarter of a capacity is almost all still there (two ways per set:
    # a few sets got three or more of them).
    recent = stream[-(c.capacity // 4) :]
    held = sum(fp in c for fp in recent)
    assert held >= 0.9 * len(recent)
    # The oldest are long gone.
    assert sum(fp in c for fp in stream[:1000]) == 0
