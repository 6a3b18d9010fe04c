"""Our requests waiting for their replies: one timer each, resends, and the timeout.

Each call has its own timer (whichever comes next: a resend or the timeout), and a caller
that gives up removes its entry at once (``asyncio.wait_for`` around an rpcudp future left it
in rpcudp's ``_outstanding`` until the timeout). A request to a proven contact still
unanswered after ``RESEND_AT`` fractions of its timeout is sent again, the same datagram
(``endpoint`` explains why); a reply is accepted once, from the address the request went to.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol import wire
from protocol.rpcstats import RpcStats

__all__ = ["MAX_PENDING", "RESEND_AT", "Outstanding"]

MAX_PENDING = 16_384  # our own calls awaiting a reply; beyond this a call fails at once
# An unanswered request goes again at these fractions of its timeout. A reply normally takes
# milliseconds, and about 0.2 s through a link queued full at its cap: the first copy waits
# well beyond both, so a slow answer seldom costs a needless one.
RESEND_AT = (0.25, 0.5)
SETTLED_MAX = 1024  # ids of our resent calls already answered: a late copy of the reply

Addr = tuple[str, int]


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[tuple[bool, Any]]
    addr: Addr
    rpc: str
    sent_at: float  # loop time the request left: the latency, resends and timeout count from it
    wait: float  # its timeout
    decode: Callable[[bytes], Any]  # reads the reply's body
    timer: asyncio.TimerHandle | None = None  # the next resend, or the timeout after the last
    resends_left: int = 0
    datagram: bytes = b""
    resent: bool = False

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class Outstanding:
    def __init__(self, stats: RpcStats, resend: Callable[[bytes, Addr], None]) -> None:
        """``resend(datagram, addr)`` sends a request again."""
        self._stats = stats
        self._resend_datagram = resend
        self._pending: dict[bytes, _Pending] = {}
        self._settled_resent: dict[bytes, None] = {}

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def full(self) -> bool:
        return len(self._pending) >= MAX_PENDING

    def add(
        self,
        msg_id: bytes,
        addr: Addr,
        rpc: str,
        wait: float,
        decode: Callable[[bytes], Any],
        *,
        resends: bool,
    ) -> asyncio.Future[tuple[bool, Any]]:
        """Wait ``wait`` seconds for the reply to request ``msg_id``; ``resends``: send it
        again meanwhile (``sent`` says what). The future gives (True, reply) or, on timeout,
        (False, None)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        pending = _Pending(future, addr, rpc, loop.time(), wait, decode)
        if resends:
            pending.resends_left = len(RESEND_AT)
        self._arm(pending, msg_id)
        self._pending[msg_id] = pending
        future.add_done_callback(functools.partial(self._settled, msg_id))
        return future

    def sent(self, msg_id: bytes, datagram: bytes) -> None:
        """The datagram that carried request ``msg_id`` (what a resend sends again)."""
        pending = self._pending.get(msg_id)
        if pending is not None:
            pending.datagram = datagram

    def answer(self, msg_id: bytes, body: bytes, addr: Addr) -> str | None:
        """Settle the call ``msg_id`` with the reply in ``body``; or the reason to drop it:
        "malformed" (not msgpack: the call waits on), "unexpected_reply" (no call waits for
        it, or not from that address). A second reply to a resent request is counted, not
        refused."""
        pending = self._pending.get(msg_id)
        if pending is None or pending.addr != addr:
            if msg_id in self._settled_resent:
                self._stats.duplicate_replies += 1  # both copies of our request were answered
                return None
            try:
                wire.unpackb(body)
            except Exception:
                return "malformed"
            return "unexpected_reply"
        try:
            obj = pending.decode(body)
        except Exception:  # the decoder raises many types: DecodeError, RecursionError...
            return "malformed"
        del self._pending[msg_id]
        pending.stop()
        if pending.resent:
            self._settled_resent[msg_id] = None
            while len(self._settled_resent) > SETTLED_MAX:
                del self._settled_resent[next(iter(self._settled_resent))]
        self._stats.latency(pending.rpc, asyncio.get_running_loop().time() - pending.sent_at)
        if not pending.future.done():
            pending.future.set_result((True, obj))
        return None

    def fail_all(self) -> None:
        """Every call still waiting fails now (closing)."""
        for pending in self._pending.values():
            pending.stop()
            if not pending.future.done():
                pending.future.set_result((False, None))
        self._pending.clear()

    def _arm(self, pending: _Pending, msg_id: bytes) -> None:
        """One timer per call, for whichever comes next: a resend, or the timeout. Three
        timers armed and two cancelled on every call cost 8.6 us against 2.4 (timeit)."""
        loop = asyncio.get_running_loop()
        if pending.resends_left:
            step = RESEND_AT[len(RESEND_AT) - pending.resends_left]
            at = pending.sent_at + pending.wait * step
            pending.timer = loop.call_at(at, self._resend, msg_id)
        else:
            pending.timer = loop.call_at(pending.sent_at + pending.wait, self._expire, msg_id)

    def _resend(self, msg_id: bytes) -> None:
        pending = self._pending.get(msg_id)
        if pending is None:
            return
        pending.resends_left -= 1
        self._arm(pending, msg_id)
        if not pending.datagram:
            return
        pending.resent = True
        self._stats.requests_resent += 1
        self._resend_datagram(pending.datagram, pending.addr)

    def _settled(self, msg_id: bytes, future: asyncio.Future[Any]) -> None:
        if future.cancelled():  # the caller gave up: forget the call now, not at the timeout
            pending = self._pending.pop(msg_id, None)
            if pending is not None:
                pending.stop()

    def _expire(self, msg_id: bytes) -> None:
        pending = self._pending.pop(msg_id, None)
        if pending is None:
            return
        pending.stop()
        self._stats.failed[pending.rpc] += 1
        if not pending.future.done():
            pending.future.set_result((False, None))
