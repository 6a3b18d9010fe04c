"""The msgpack used on the wire, in one place.

rpcudp frames its datagrams with u-msgpack-python, which is pure Python: with it a one-URL
STORE_TASK cost about 240 us of CPU at both ends together, 160 with the C extension
``msgpack`` (``benchmarks/dispatch.py``; docs/benchmarks.md, section 3, "Where a page's extra
CPU goes at 8 peers"). ``msgpack`` reads and writes the same bytes for everything the
protocol sends (str as str, bytes as bin, ints in their smallest form, floats as doubles), so
peers of either kind understand each other (``tests/protocol/test_wire.py``).

Decoding is as strict as the callers expect of untrusted input: any hashable map key is
accepted (as before), extension types are refused, and every failure -- bad framing, invalid
UTF-8, nesting too deep, bytes left over after the object -- raises an ``Exception`` the caller
counts as a malformed datagram. (u-msgpack-python ignored trailing bytes; a signed datagram
never has any.) msgpack's own timestamp extension still decodes, to an object no field's
type check accepts, as u-msgpack's datetime did.
"""

from __future__ import annotations

from typing import Any

import msgpack

__all__ = ["packb", "unpackb"]


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not part of the protocol")


def packb(obj: Any) -> bytes:
    """Encode ``obj``; raises ``TypeError`` (or ``OverflowError``) for what msgpack cannot
    carry."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def unpackb(data: bytes) -> Any:
    """Decode exactly one msgpack object filling ``data``; raises on anything else."""
    return msgpack.unpackb(
        data, raw=False, strict_map_key=False, use_list=True, ext_hook=_no_ext, timestamp=0
    )
