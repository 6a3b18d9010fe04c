"""Exponential backoff: the one rule for how long to wait before trying again.

Deterministic, without jitter: every retry loop of a peer waits for one other party (a host
fetched by one connection, a peer that did not answer, a network that is not there yet), so
there is no crowd of clients whose retries need spreading out.
"""

from __future__ import annotations

__all__ = ["Backoff", "backoff_delay"]

# 2.0 ** 1024 overflows a float, and anything past 2 ** 62 times a base is above any cap.
_MAX_EXPONENT = 62


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """The wait before retry number ``attempt`` (1, 2, ...): ``base``, ``2 * base``,
    ``4 * base``... at most ``cap``; 0 before the first retry (``attempt`` < 1)."""
    if attempt < 1:
        return 0.0
    return max(0.0, min(base * 2.0 ** min(attempt - 1, _MAX_EXPONENT), cap))


class Backoff:
    """The waits of one retry loop: each ``next()`` doubles the last, up to ``cap``;
    ``reset()`` after a success starts again from ``base``."""

    __slots__ = ("attempt", "base", "cap")

    def __init__(self, base: float, cap: float) -> None:
        if base < 0 or cap < base:
            raise ValueError("a backoff needs 0 <= base <= cap")
        self.base = base
        self.cap = cap
        self.attempt = 0  # failures since the last reset

    def next(self) -> float:
        """Count one more failure; the wait before the retry it calls for."""
        self.attempt += 1
        return backoff_delay(self.attempt, self.base, self.cap)

    def reset(self) -> None:
        self.attempt = 0
