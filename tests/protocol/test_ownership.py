"""Ownership math (Kademlia §2.1 XOR metric), pure functions."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kademlia.network import Server
from kademlia.utils import digest

from protocol import closest, distance, key_for, new_node_id, owner_and_replicas

ids = st.binary(min_size=20, max_size=20)


def n(i: int) -> bytes:
    return i.to_bytes(20, "big")


def test_distance_is_xor() -> None:
    assert distance(n(0b1010), n(0b0110)) == 0b1100
    assert distance(n(5), n(5)) == 0
    with pytest.raises(ValueError):
        distance(b"\x00" * 20, b"\x00" * 19)


@given(ids, ids, ids)
def test_distance_is_a_metric(a: bytes, b: bytes, c: bytes) -> None:
    assert distance(a, b) == distance(b, a)
    assert (distance(a, b) == 0) == (a == b)
    # XOR satisfies the triangle inequality (Kademlia §2.1).
    assert distance(a, c) <= distance(a, b) + distance(b, c)


def test_closest_sorted_unique_and_bounded() -> None:
    key = n(8)
    pool = [n(1), n(9), n(12), n(8), n(9)]
    assert closest(key, pool, 3) == [n(8), n(9), n(12)]
    assert closest(key, pool, 10) == [n(8), n(9), n(12), n(1)]
    assert closest(key, pool, 0) == []


def test_xor_closeness_is_not_numeric_closeness() -> None:
    # 7 is numerically next to 8 but shares no prefix with it; 15 shares the top bit.
    assert closest(n(8), [n(7), n(15)], 1) == [n(15)]


def test_owner_and_replicas() -> None:
    me = n(0b0001)
    others = [n(0b1000), n(0b0100), n(0b0010)]
    owner, replicas = owner_and_replicas(n(0b0101), [me, *others], 2)
    assert owner == n(0b0100)
    assert replicas == [n(0b0001), n(0b0010)]
    with pytest.raises(ValueError):
        owner_and_replicas(n(1), [], 2)


def test_owner_changes_when_a_closer_node_appears() -> None:
    key = key_for("example.com")
    pool = [new_node_id() for _ in range(10)]
    owner, _ = owner_and_replicas(key, pool, 2)
    closer = key[:-1] + bytes([key[-1] ^ 1])  # differs in the last bit only
    assert owner_and_replicas(key, [*pool, closer], 2)[0] == closer
    # The old owner becomes the first replica: its tasks' backups are already there.
    assert owner in owner_and_replicas(key, [*pool, closer], 2)[1]


@given(st.text())
def test_key_for_matches_kademlia_digest(s: str) -> None:
    assert key_for(s) == digest(s)
    assert len(key_for(s)) == 20


def test_node_ids_do_not_come_from_random() -> None:
    # Stock kademlia: digest(random.getrandbits(255)) -- reproducible from the seed.
    random.seed(7)
    stock_a = Server().node.id
    random.seed(7)
    stock_b = Server().node.id
    assert stock_a == stock_b
    random.seed(7)
    ours_a = new_node_id()
    random.seed(7)
    ours_b = new_node_id()
    assert ours_a != ours_b
    assert len(ours_a) == 20
