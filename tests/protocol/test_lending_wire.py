"""LEND and GIVE_BACK on the wire: what a loan may carry, and what a report may say.

A loan's tasks go through the same codec as STORE_TASK's; everything else is a handful of
ints checked on receipt, since they come from the network.
"""

from __future__ import annotations

from typing import Any

import pytest

from protocol import KeyBatch, MessageError, PeerRef, TaskItem, key_for, wire
from protocol.loans import (
    GIVE_BACK,
    LEND,
    MAX_FPS,
    MAX_LENT_ROBOTS,
    MAX_LOANS,
    MAX_REPORTS,
    MAX_WANT,
    GiveBack,
    GiveBackArgs,
    GiveBackReply,
    LentRobots,
    Loan,
    answers_of,
    loan_of,
    loan_reply,
    one_chunk,
    report_args,
    returns_reply,
)
from protocol.procedures import parse_args, parse_reply, reply_to_wire
from tests.protocol.conftest import NodeFactory

KEY = key_for("example.org")


def loan_to_wire(*args: Any) -> dict[str, Any]:
    return reply_to_wire(loan_reply(*args))


def loan_from_wire(raw: object) -> Loan:
    return loan_of(parse_reply(LEND, raw))


def check_lend_request(raw: list[Any]) -> tuple[int, int, int]:
    args = parse_args(LEND, raw)
    return args.want, args.have, args.hosts


def check_return_request(raw: list[Any]) -> list[GiveBack]:
    return parse_args(GIVE_BACK, raw).reports()


def returns_from_wire(raw: object, reports: int) -> list[tuple[bool, bool]]:
    return answers_of(parse_reply(GIVE_BACK, raw), reports)


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
    assert check_lend_request([16]) == (16, 0, 1)  # an idle asker: no backlog of its own
    assert check_lend_request([16, 300]) == (16, 300, 1)
    assert check_lend_request([16, 0, MAX_LOANS]) == (16, 0, MAX_LOANS)
    for bad in (
        [],
        [0],
        [MAX_WANT + 1],
        ["16"],
        [True, 1],
        [16, -1],
        [16, True],
        [16, 0, 0],
        [16, 0, MAX_LOANS + 1],
        [16, 0, 2.0],
        [16, 0, 2, 1],
    ):
        with pytest.raises(MessageError):
            check_lend_request(bad)


def test_give_back_requests_are_checked() -> None:
    (ok,) = check_return_request([9, [1, 2], [3], False])
    assert (ok.lease, ok.done, ok.back, ok.final) == (9, [1, 2], [3], False)
    for bad in (
        [0, [], [], True],  # lease 0 is "nothing lent"
        [9, [1], [], 1],  # final must be a bool
        [9, [-1], [], True],  # a fingerprint is a uint64
        [9, [1 << 64], [], True],
        [9, list(range(MAX_FPS + 1)), [], True],
        [9, [], "3", True],
        [9, [], []],
        [9, [], [], True, [[9, [], [], True]]],  # a lease reported on twice
        [9, [], [], True, [[10, [], [], "yes"]]],
        [9, [], [], True, [[10, [], []]]],
        [9, [], [], True, [[10 + i, [], [], True] for i in range(MAX_REPORTS)]],
        # MAX_FPS in all, not per report
        [9, list(range(MAX_FPS)), [], True, [[10, [1], [], True]]],
    ):
        with pytest.raises(MessageError):
            check_return_request(bad)


def test_reports_on_several_leases_share_a_request_and_its_answer() -> None:
    reports = [
        GiveBack(9, [1, 2], [], False),
        GiveBack(10, [], [3], True),
        GiveBack(11, [], [], True),
    ]
    args = wire.unpackb(wire.packb(GIVE_BACK.args_to_wire(report_args(reports))))
    assert args == [9, [1, 2], [], False, [[10, [], [3], True], [11, [], [], True]]]
    assert check_return_request(args) == reports
    assert GIVE_BACK.args_to_wire(report_args(reports[:1])) == [9, [1, 2], [], False]  # no more
    answers = [(True, False), (False, False), (True, True)]
    assert returns_from_wire(reply_to_wire(returns_reply(answers)), 3) == answers
    assert returns_from_wire({"known": True}, 1) == [(True, False)]  # a one-lease reply
    for bad in ({"known": True}, {"known": True, "more": [[True]]}, {"known": 1, "more": []}):
        with pytest.raises(ValueError):
            returns_from_wire(bad, 2)


def test_one_answer_lends_several_hosts() -> None:
    other = KeyBatch(key_for("example.net"), [TaskItem("http://example.net/", 1)])
    payload, held = one_chunk(batch(2))
    other_payload, other_held = one_chunk(other)
    robots = LentRobots("http://example.net", b"User-agent: *\nDisallow: /x\n", 60)
    loan = loan_from_wire(loan_to_wire(7, payload, 40, None, [(8, other_payload, robots)]))
    assert (loan.lease, loan.batch, loan.backlog, loan.robots) == (7, held, 40, None)
    (more,) = loan.more
    assert (more.lease, more.batch, more.robots) == (8, other_held, robots)
    for entries in (
        [[7, other_payload, None]],  # the first loan's lease again
        [[8, payload, None]],  # the first loan's host again
        [[0, other_payload, None]],
        [[8, other_payload]],
        [[8 + i, other_payload, None] for i in range(MAX_LOANS)],
        "not a list",
    ):
        with pytest.raises(ValueError):
            loan_from_wire({"lease": 7, "backlog": 0, "tasks": payload, "more": entries})
    with pytest.raises(ValueError):
        loan_from_wire({"lease": 0, "backlog": 0, "more": [[8, other_payload, None]]})


async def test_a_borrowers_reports_share_requests_within_the_bounds(make_node: NodeFactory) -> None:
    """Reports on many leases and many fingerprints reach the lender whole, in requests
    that each hold a lease at most once, MAX_REPORTS leases and MAX_FPS fingerprints at
    most; a report cut into parts is final only in its last; answers come back per lease."""
    lender, borrower = await make_node(), await make_node()
    requests: list[list[GiveBack]] = []

    async def serve(sender: PeerRef, args: GiveBackArgs) -> GiveBackReply:
        reports = args.reports()
        requests.append(reports)
        # Lease 3 is unknown here; lease 4 is recalled.
        return returns_reply([(r.lease != 3, r.lease == 4) for r in reports])

    lender.serve(GIVE_BACK, serve)
    reports = [GiveBack(i, [1000 * i + j for j in range(5)], [], True) for i in range(1, 21)]
    reports.append(GiveBack(99, list(range(1, 500)), list(range(500, 900)), False))
    answers = await borrower.give_back(lender.me, reports)

    assert answers == [(r.lease != 3, r.lease == 4) for r in reports]
    for req in requests:
        assert len(req) <= MAX_REPORTS
        assert len({r.lease for r in req}) == len(req)
        assert sum(len(r.done) + len(r.back) for r in req) <= MAX_FPS
    for report in reports:
        parts = [r for req in requests for r in req if r.lease == report.lease]
        assert [fp for p in parts for fp in p.done] == report.done
        assert [fp for p in parts for fp in p.back] == report.back
        assert [p.final for p in parts] == [False] * (len(parts) - 1) + [report.final]
    # 20 small reports and a long one, 999 fingerprints: 16 leases, then 4 and the long
    # one's first part, then its other two parts.
    assert len(requests) == 4
