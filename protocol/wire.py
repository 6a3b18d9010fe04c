"""The msgpack used on the wire, in one place.

rpcudp frames its datagrams with u-msgpack-python, which is pure Python: with it a one-URL
STORE_TASK cost about 240 us of CPU at both ends together, 160 with the C extension
``msgpack`` (``benchmarks/dispatch.py``; docs/benchmarks.md, section 3, "Where a page's extra
CPU goes at 8 peers"). ``msgspec`` (also C) encodes about three times as fast as ``msgpack``
and decodes twice as fast, and it is what checks the typed messages (``procedures``)
(``benchmarks/wire_messages.py``). It reads and writes the same bytes for everything the
protocol sends (str as str, bytes as bin, ints in their smallest form, floats as doubles), so
peers of every kind understand each other (``tests/protocol/test_wire.py``).

Decoding is as strict as the callers expect of untrusted input: any hashable map key is
accepted (an array key becomes a tuple), extension types are refused, and every failure --
bad framing, invalid UTF-8, nesting too deep, bytes left over after the object -- raises an
``Exception`` the caller counts as a malformed datagram. (u-msgpack-python ignored trailing
bytes; a signed datagram never has any.) msgpack's own timestamp extension still decodes, to a
datetime, as u-msgpack's did: an object no field's type check accepts.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["packb", "unpackb"]


def _no_ext(code: int, data: memoryview) -> Any:
    raise ValueError(f"msgpack extension type {code} is not part of the protocol")


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ext_hook=_no_ext)

# Bound methods, not wrappers: every datagram goes through both.
# Encode an object; raises TypeError (or OverflowError) for what msgpack cannot carry.
packb = _encoder.encode
# Decode exactly one msgpack object filling the bytes given; raises on anything else.
unpackb = _decoder.decode
