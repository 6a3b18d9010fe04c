"""LEND and GIVE_BACK on the wire: what a loan may carry, and what a report may say.

A loan's tasks go through the same codec as STORE_TASK's; everything else is a handful of
ints checked on receipt, since they come from the network.
"""

from __future__ import annotations

import pytest

from protocol import KeyBatch, MessageError, TaskItem, key_for
from protocol.lending import (
    MAX_FPS,
    MAX_LENT_ROBOTS,
    MAX_WANT,
    LentRobots,
    check_lend_request,
    check_return_request,
    loan_from_wire,
    loan_to_wire,
    one_chunk,
)

KEY = key_for("example.org")


def batch(n: int, path_len: int = 20) -> KeyBatch:
    return KeyBatch(
        KEY, [TaskItem(f"http://example.org/{i:0{path_len}d}", depth=2, hops=0) for i in range(n)]
    )


def test_a_loan_round_trips() -> None:
    payload, held = one_chunk(batch(50))
    loan = loan_from_wire(loan_to_wire(7, payload, 123))
    assert loan.lease == 7 and loan.backlog == 123
    assert loan.batch is not None and loan.batch.key == KEY
    assert loan.batch.tasks == held.tasks == batch(50).tasks


@pytest.mark.parametrize("body", [b"User-agent: *\nDisallow: /private/\n", None])
def test_a_loan_carries_its_hosts_robots_policy(body: bytes | None) -> None:
    payload, _ = one_chunk(batch(3))
    robots = LentRobots("http://example.org", body, 3600)
    loan = loan_from_wire(loan_to_wire(7, payload, 0, robots))
    assert loan.robots == robots
    assert loan_from_wire(loan_to_wire(7, payload, 0)).robots is None
    assert "robots" not in loan_to_wire(0, None, 0, robots)  # nothing lent, nothing sent


@pytest.mark.parametrize(
    "entry",
    [
        "http://example.org",
        ["http://example.org", None],
        ["", None, 60],
        ["http://" + "a" * 600, None, 60],
        [b"http://example.org", None, 60],
        ["http://example.org", "text, not bytes", 60],
        ["http://example.org", b"x" * (MAX_LENT_ROBOTS + 1), 60],
        ["http://example.org", None, 0],
        ["http://example.org", None, 60.0],
        ["http://example.org", None, 10**9],
    ],
)
def test_a_malformed_lent_robots_policy_is_refused(entry: object) -> None:
    payload, _ = one_chunk(batch(1))
    with pytest.raises(ValueError):
        loan_from_wire({"lease": 1, "backlog": 0, "tasks": payload, "robots": entry})


def test_nothing_to_lend_carries_no_tasks() -> None:
    wire = loan_to_wire(0, None, 5)
    assert "tasks" not in wire
    loan = loan_from_wire(wire)
    assert loan.lease == 0 and loan.batch is None and loan.backlog == 5


def test_a_loan_is_cut_to_one_reply() -> None:
    big = batch(3000, path_len=400)
    payload, held = one_chunk(big)
    assert 0 < len(held.tasks) < len(big.tasks)
    assert held.tasks == big.tasks[: len(held.tasks)]  # in order: the first ones go
    assert loan_from_wire(loan_to_wire(1, payload, 0)).batch == held


@pytest.mark.parametrize(
    "reply",
    [
        None,
        [],
        {"lease": -1, "backlog": 0},
        {"lease": 1.5, "backlog": 0},
        {"lease": 0},
        {"lease": 0, "backlog": "many"},
        {"lease": 3, "backlog": 0},  # a lease without tasks
        {"lease": 3, "backlog": 0, "tasks": "not bytes"},
        {"lease": 3, "backlog": 0, "tasks": b"\x00garbage"},
    ],
)
def test_a_malformed_loan_is_refused(reply: object) -> None:
    with pytest.raises(ValueError):
        loan_from_wire(reply)


def test_a_loan_of_two_keys_or_with_done_fingerprints_is_refused() -> None:
    from protocol.codec import encode_chunks

    other = KeyBatch(key_for("example.net"), [TaskItem("http://example.net/", 1)])
    two, _ = encode_chunks([batch(2), other])[0]
    with pytest.raises(ValueError):
        loan_from_wire({"lease": 1, "backlog": 0, "tasks": two})
    done, _ = encode_chunks([KeyBatch(KEY, batch(2).tasks, [1, 2])])[0]
    with pytest.raises(ValueError):
        loan_from_wire({"lease": 1, "backlog": 0, "tasks": done})


def test_lend_requests_are_checked() -> None:
    assert check_lend_request([16]) == (16, 0)  # an idle asker: no backlog of its own
    assert check_lend_request([16, 300]) == (16, 300)
    for bad in ([], [0], [MAX_WANT + 1], ["16"], [True, 1], [16, -1], [16, True], [16, 1, 2]):
        with pytest.raises(MessageError):
            check_lend_request(bad)


def test_give_back_requests_are_checked() -> None:
    ok = check_return_request([9, [1, 2], [3], False])
    assert (ok.lease, ok.done, ok.back, ok.final) == (9, [1, 2], [3], False)
    for bad in (
        [0, [], [], True],  # lease 0 is "nothing lent"
        [9, [1], [], 1],  # final must be a bool
        [9, [-1], [], True],  # a fingerprint is a uint64
        [9, [1 << 64], [], True],
        [9, list(range(MAX_FPS + 1)), [], True],
        [9, [], "3", True],
        [9, [], []],
    ):
        with pytest.raises(MessageError):
            check_return_request(bad)
