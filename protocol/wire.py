"""The msgpack used on the wire, in one place.

rpcudp frames its datagrams with u-msgpack-python, which is pure Python: at eight peers the
packing and unpacking of every datagram was a measurable part of a peer's CPU per page
(docs/benchmarks.md, section 3, "The wire's msgpack"). The C extension ``msgpack`` reads and
writes the same bytes for everything the protocol sends (str as str, bytes as bin, ints in
their smallest form, floats as doubles), so peers of either kind understand each other.

Decoding is as strict as the callers expect of untrusted input: any hashable map key is
accepted (as before), extension types are refused, and every failure -- bad framing, invalid
UTF-8, nesting too deep, bytes left over after the object -- raises an ``Exception`` the caller
counts as a malformed datagram. (u-msgpack-python ignored trailing bytes; a signed datagram
never has any.)
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
