"""The record every store keeps, and the one conversion every store needs.

Fingerprints are unsigned 64-bit integers everywhere in the API (that is what xxhash's
``xxh64_intdigest`` returns), but an SQLite INTEGER is a *signed* 64-bit value: storing
``2**63`` or more raises ``OverflowError``. The stores therefore keep ``fp - 2**64`` for the
upper half and convert back on every read; callers never see the signed form.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KEY_BYTES", "StoredTask", "from_sql_fp", "to_sql_fp"]

KEY_BYTES = 20  # a Kademlia key: 160 bits (Kademlia §2.1)

_TWO_63 = 1 << 63
_TWO_64 = 1 << 64


@dataclass(frozen=True, slots=True)
class StoredTask:
    """One URL to crawl, as the task and backup stores keep it."""

    url: str
    key: bytes  # 20-byte DHT key of the URL's partition unit (the host key by default)
    fp: int  # unsigned 64-bit fingerprint of the canonical URL
    depth: int
    hops: int = 0  # redirect hops so far

    def __post_init__(self) -> None:
        # Checked here, on the caller's side, so a bad record fails where it was made
        # instead of inside a store's worker thread halfway through a batch.
        if len(self.key) != KEY_BYTES:
            raise ValueError(f"key must be {KEY_BYTES} bytes, got {len(self.key)}")
        if not 0 <= self.fp < _TWO_64:
            raise ValueError(f"fp must be an unsigned 64-bit integer, got {self.fp}")


def to_sql_fp(fp: int) -> int:
    """Map an unsigned 64-bit fingerprint onto SQLite's signed INTEGER range."""
    if not 0 <= fp < _TWO_64:
        raise ValueError(f"fp must be an unsigned 64-bit integer, got {fp}")
    return fp - _TWO_64 if fp >= _TWO_63 else fp


def from_sql_fp(value: int) -> int:
    """Inverse of :func:`to_sql_fp`."""
    return value + _TWO_64 if value < 0 else value
