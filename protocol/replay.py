"""Requests seen before: refusing replays of signed ones, answering copies of any.

An HMAC proves a datagram came from a key holder, not that it is new: a captured STORE_BACKUP
re-sent later resurrects a deleted backup. Every signed datagram carries the sender's clock
and a random 20-byte id (``auth``), so a receiver keeps each id it accepted for as long as a
datagram with that stamp could still be accepted, and refuses:

* ``stale`` -- a stamp outside ``now ± window`` (clocks of the peers must agree to within the
  window, which NTP gives with a wide margin), or not newer than the *horizon* (below);
* ``replay`` -- an id already in the cache.

The cache holds at most ``capacity`` ids. When it is full the oldest entry is forgotten and the
horizon rises to that entry's stamp, so the id that was forgotten is still refused, as stale:
under a request rate the cache cannot cover, the window shrinks instead of the protection
failing (the cost is that a sender whose clock lags the others by more than the shrunken window
gets ``stale`` and retries with a fresh stamp). Only datagrams whose HMAC verified reach the
guard, so only key holders can fill it.

Replies need no entry: the caller accepts one reply per outstanding request id, from the
address it sent to, and forgets the id at once (``endpoint``).

A sender resends a request it got no reply to (``endpoint.RESEND_AT``), byte for byte, so a
copy from the request's own address within ``ANSWERED_S`` is a resend, not a replay:
``Answered`` keeps each request served lately with its reply, and the copy gets that reply
again without reaching the guard or the handler. Keyed or open, a request is served once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = [
    "ANSWERED_BYTES",
    "ANSWERED_MAX",
    "ANSWERED_S",
    "DEFAULT_CAPACITY",
    "DEFAULT_WINDOW_MS",
    "Answered",
    "ReplayGuard",
    "Served",
]

DEFAULT_WINDOW_MS = 60_000
DEFAULT_CAPACITY = 1 << 16  # ~10 MB when full; covers ~1,000 requests/s for the whole window
# Requests remembered by id with their reply, so a copy is answered without running it twice:
# a sender resends within its timeout, so a few seconds cover every copy worth answering.
ANSWERED_S = 10.0
ANSWERED_MAX = 8192
ANSWERED_BYTES = 4 << 20


class ReplayGuard:
    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS, capacity: int = DEFAULT_CAPACITY):
        if window_ms <= 0 or capacity <= 0:
            raise ValueError("window and capacity must be positive")
        self.window_ms = window_ms
        self.capacity = capacity
        self.horizon_ms = 0
        # id prefix -> stamp, in arrival order. Eight random bytes of the id suffice: a false
        # "replay" needs two of 2**16 ids to share 64 bits (odds around 1e-10).
        self._seen: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, msg_id: bytes, stamp_ms: int, now_ms: int) -> str | None:
        """None if the request is fresh (and remember it), else the reason to refuse it."""
        if abs(now_ms - stamp_ms) > self.window_ms or stamp_ms <= self.horizon_ms:
            return "stale"
        key = int.from_bytes(msg_id[:8], "big")
        if key in self._seen:
            return "replay"
        self._expire(now_ms)
        if len(self._seen) >= self.capacity:
            _, stamp = self._seen.popitem(last=False)
            self.horizon_ms = max(self.horizon_ms, stamp)
            if stamp_ms <= self.horizon_ms:
                return "stale"
        self._seen[key] = stamp_ms
        return None

    def _expire(self, now_ms: int) -> None:
        """Forget ids whose stamps the window refuses anyway (arrival order approximates
        stamp order; an expired entry behind a newer one just waits for its turn)."""
        cutoff = now_ms - self.window_ms
        seen = self._seen
        while seen:
            key, stamp = next(iter(seen.items()))
            if stamp >= cutoff:
                break
            del seen[key]


@dataclass(slots=True)
class Served:
    """A request served or being served: who asked, when, and the reply datagram once sent."""

    addr: tuple[str, int]
    at: float
    reply: bytes | None = None


class Answered:
    """Requests by id for ``ANSWERED_S``, at most ``ANSWERED_MAX`` of them holding at most
    ``ANSWERED_BYTES`` of replies; the oldest go first."""

    def __init__(self) -> None:
        self._by_id: dict[bytes, Served] = {}  # insertion order is age order
        self._bytes = 0

    def get(self, msg_id: bytes, addr: tuple[str, int], now: float) -> Served | None:
        served = self._by_id.get(msg_id)
        if served is None or served.addr != addr or served.at < now - ANSWERED_S:
            return None
        return served

    def add(self, msg_id: bytes, addr: tuple[str, int], now: float) -> None:
        self._expire(now)
        self._by_id[msg_id] = Served(addr, now)

    def replied(self, msg_id: bytes, datagram: bytes) -> None:
        served = self._by_id.get(msg_id)
        if served is None or served.reply is not None:
            return
        served.reply = datagram
        self._bytes += len(datagram)
        while self._bytes > ANSWERED_BYTES and self._by_id:
            self._forget_oldest()

    def _expire(self, now: float) -> None:
        while self._by_id and (
            len(self._by_id) >= ANSWERED_MAX
            or next(iter(self._by_id.values())).at < now - ANSWERED_S
        ):
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        served = self._by_id.pop(next(iter(self._by_id)))
        if served.reply is not None:
            self._bytes -= len(served.reply)
