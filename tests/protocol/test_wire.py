"""The wire's msgpack (``protocol.wire``) writes what rpcudp's u-msgpack wrote, reads what it
read, and refuses what a peer never sends."""

from __future__ import annotations

from typing import Any

import pytest
import umsgpack

from protocol import wire

# Shapes the protocol sends: an RPC call ([name, args]), a reply map, a FIND_NODE contact
# list, a task chunk's columns, integers at every width boundary.
MESSAGES: list[Any] = [
    ["store_task", [b"\x01" * 20, [b"x\x9c" + bytes(range(256))]]],
    {"quiet": True, "done": 4609},
    {"error": "too large"},
    [[b"\xaa" * 20, "198.18.0.1", 7000], [b"\xbb" * 20, "127.0.0.1", 65535]],
    [1, b"k" * 40, b"\x00\x00\x00\x02" * 2, b"", "http://a.test/\nhttp://a.test/b", b"", b""],
    [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1],
    [-1, -32, -33, -128, -129, -(2**31), -(2**63)],
    ["", "é" * 40, "x" * 300, b"y" * 70_000],
    [None, False, True, 0.5, [], {}],
]


@pytest.mark.parametrize("obj", MESSAGES, ids=range(len(MESSAGES)))
def test_the_same_bytes_as_u_msgpack_both_ways(obj: Any) -> None:
    data = wire.packb(obj)
    assert data == umsgpack.packb(obj)
    assert wire.unpackb(data) == umsgpack.unpackb(data) == obj


@pytest.mark.parametrize(
    "data",
    [
        b"\x01\x02",  # an object, then bytes left over
        b"\xc1",  # a reserved code
        b"\xd4\x05\x00",  # an extension type (fixext 1)
        b"\x92\x01",  # an array cut short
        b"\xa2\xff\xfe",  # a str that is not UTF-8
        b"\x91" * 5000 + b"\xc0",  # nested too deep
    ],
)
def test_what_no_peer_sends_raises(data: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the endpoint counts any as "malformed"
        wire.unpackb(data)


def test_the_timestamp_extension_is_no_field_s_type() -> None:
    """msgpack decodes its own extension (-1) whatever the hook says, as u-msgpack did (to a
    datetime): to an object that every field's type check refuses."""
    obj = wire.unpackb(b"\xd6\xff\x00\x00\x00\x00")
    assert not isinstance(obj, int | float | str | bytes | list | dict | type(None))


def test_unpackable_values_raise() -> None:
    for value in (object(), 2**64):
        with pytest.raises((TypeError, OverflowError)):
            wire.packb(value)
