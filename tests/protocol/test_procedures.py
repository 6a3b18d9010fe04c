"""Typed wire messages (``protocol.procedures``): the bytes peers of the hand-written codecs
wrote and read, every argument checked, and nothing but ``MessageError`` out of a check."""

from __future__ import annotations

from typing import Any

import pytest
import umsgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import MessageError, StoreResult, wire
from protocol.loadreport import LOAD, LoadArgs
from protocol.loans import GIVE_BACK, LEND, GiveBack, LendArgs, report_args, returns_reply
from protocol.messages import (
    DELETE_BACKUP,
    GOODBYE,
    PING_REQ,
    QUIET,
    REFRESH_TASK,
    STORE_BACKUP,
    STORE_TASK,
    VOUCH,
    BackupArgs,
    Held,
    PingReqArgs,
    QuietReply,
    RefreshReply,
    StoreTaskArgs,
    Vouched,
    VouchReply,
    Wanted,
    backup_reply,
    store_reply,
)
from protocol.procedures import Malformed, NoArgs, Procedure, parse_args

ME = b"\x01" * 20
OWNER = b"\x02" * 20
ALL: list[Procedure[Any, Any]] = [STORE_TASK, STORE_BACKUP, DELETE_BACKUP, REFRESH_TASK, QUIET]
ALL += [PING_REQ, GOODBYE, LEND, GIVE_BACK, LOAD, VOUCH]


def call_bytes(proc: Procedure[Any, Any], args: Any) -> bytes:
    return wire.packb([proc.name, [ME, *proc.args_to_wire(args)]])


@pytest.mark.parametrize(
    ("proc", "args", "as_before"),
    [
        (STORE_TASK, StoreTaskArgs(b"chunk"), [ME, b"chunk"]),
        (STORE_BACKUP, BackupArgs(OWNER, b"chunk"), [ME, OWNER, b"chunk"]),
        (REFRESH_TASK, NoArgs(), [ME]),
        (PING_REQ, PingReqArgs(OWNER), [ME, OWNER]),
        # LEND's optional arguments go only as far as one differs from its default.
        (LEND, LendArgs(16), [ME, 16]),
        (LEND, LendArgs(16, 300), [ME, 16, 300]),
        (LEND, LendArgs(16, 0, 4), [ME, 16, 0, 4]),
        (LOAD, LoadArgs(bytes(8)), [ME, bytes(8)]),
        (GIVE_BACK, report_args([GiveBack(9, [1, 2], [3], False)]), [ME, 9, [1, 2], [3], False]),
        (
            GIVE_BACK,
            report_args([GiveBack(9, [1], [], False), GiveBack(10, [], [2**64 - 1], True)]),
            [ME, 9, [1], [], False, [[10, [], [2**64 - 1], True]]],
        ),
    ],
)
def test_a_call_is_the_bytes_rpcudp_framed(
    proc: Procedure[Any, Any], args: Any, as_before: list[Any]
) -> None:
    data = call_bytes(proc, args)
    assert data == umsgpack.packb([proc.name, as_before])
    _name, raw = wire.unpackb(data)
    assert parse_args(proc, raw[1:]) == args


@pytest.mark.parametrize(
    ("proc", "reply", "as_before"),
    [
        (STORE_BACKUP, backup_reply(Held(3)), {"n": 3}),
        (STORE_BACKUP, backup_reply(Held(3, [7])), {"n": 3, "done": (7).to_bytes(8, "big")}),
        (
            STORE_TASK,
            store_reply(StoreResult(2, 1, [OWNER]), {OWNER}),
            {"new": 2, "dup": 1, "refused": [OWNER]},
        ),
        (REFRESH_TASK, RefreshReply(0, 2500), {"n": 0, "later_ms": 2500}),
        (QUIET, QuietReply(True, 4609), {"quiet": True, "done": 4609}),
        (GIVE_BACK, returns_reply([(True, True)]), {"known": True, "recall": True}),
    ],
)
def test_a_reply_is_the_map_it_was_with_the_responders_id_last(
    proc: Procedure[Any, Any], reply: Any, as_before: dict[str, Any]
) -> None:
    reply.id = OWNER
    data = wire.packb(reply)
    assert data == umsgpack.packb({**as_before, "id": OWNER})
    assert proc.decode_reply(data) == reply


def test_a_reply_reads_what_older_peers_write() -> None:
    # A false "recall" is left off now; a peer that writes it is read the same.
    sent = umsgpack.packb({"known": True, "recall": False})
    assert GIVE_BACK.decode_reply(sent) == returns_reply([(True, False)])
    assert umsgpack.unpackb(wire.packb(returns_reply([(True, False)]))) == {"known": True}
    # Fields a later version adds are ignored.
    assert QUIET.decode_reply(umsgpack.packb({"quiet": False, "done": 1, "new": [1]})) == (
        QuietReply(False, 1)
    )
    # An explicit idle "have" of 0 is what leaving it off means.
    assert parse_args(LEND, [16, 0]) == LendArgs(16)


def test_an_error_reply_stays_a_map_and_a_wrong_one_says_why() -> None:
    assert STORE_TASK.decode_reply(umsgpack.packb({"error": "busy"})) == {"error": "busy"}
    bad = STORE_TASK.decode_reply(umsgpack.packb({"new": -1, "dup": 0, "refused": []}))
    assert isinstance(bad, Malformed) and "$.new" in bad.error
    with pytest.raises(Exception):  # noqa: B017 - the endpoint drops it as malformed
        STORE_TASK.decode_reply(b"\xc1")


@pytest.mark.parametrize(
    ("proc", "raw", "says"),
    [
        (STORE_TASK, [], "payload"),
        (STORE_TASK, [b"x", b"y"], "at most 1"),
        (STORE_TASK, ["text"], "payload"),
        (STORE_BACKUP, [b"short", b"chunk"], "owner"),
        (LEND, [0], "want"),
        (LEND, [16, True], "have"),
        (LEND, [16, 0, 9], "hosts"),
        (GIVE_BACK, [9, [-1], [], True], "done"),
        (GIVE_BACK, [9, [], [], "yes"], "final"),
        (PING_REQ, [None], "target"),
        (REFRESH_TASK, [1], "at most 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    proc: Procedure[Any, Any], raw: list[Any], says: str
) -> None:
    with pytest.raises(MessageError, match=says):
        parse_args(proc, raw)


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.binary(max_size=24)
    | st.text(max_size=8)
    | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(_VALUES, max_size=6), reply=_VALUES)
def test_anything_a_peer_sends_is_checked_without_raising_anything_else(
    raw: list[Any], reply: Any
) -> None:
    data = wire.packb(reply)
    for proc in ALL:
        try:
            parse_args(proc, raw)
        except MessageError:
            pass
        decoded = proc.decode_reply(data)
        assert isinstance(decoded, proc.reply | Malformed | dict)


def test_vouch_is_bounded_and_its_largest_reply_fits_one_datagram() -> None:
    want = [OWNER, 2**64 - 1]
    assert parse_args(VOUCH, [[want, want]]).wanted[1].fp == 2**64 - 1
    bad: list[Any]
    for bad in ([[]], [[want] * 3], [[[b"short", 1]]], [[[OWNER, -1]]]):
        with pytest.raises(MessageError):
            parse_args(VOUCH, bad)
    long_url = "http://h/" + "x" * 2039
    page = Vouched(OWNER, 2**64 - 1, long_url, bytes(8))
    body = wire.packb(VouchReply([page, page], id=ME))
    assert len(body) < 8192
    assert isinstance(VOUCH.decode_reply(body), VouchReply)
    too_long = wire.packb(VouchReply([Vouched(OWNER, 1, long_url + "x", bytes(8))]))
    assert isinstance(VOUCH.decode_reply(too_long), Malformed)
    assert isinstance(
        VOUCH.decode_reply(wire.packb({"pages": [[OWNER, 1, "u", bytes(9)]]})), Malformed
    )
    assert Wanted(OWNER, 1) == parse_args(VOUCH, [[[OWNER, 1]]]).wanted[0]
