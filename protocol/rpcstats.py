"""Counters for the status page and for tests: RPCs by name and direction, latency, drops.

Drop reasons: ``short``, ``bad_kind``, ``bad_hmac``, ``bad_source`` (a signed datagram sent
from another address than the one it names), ``replay`` and ``stale`` (a signed request seen
before, or stamped outside the window: ``replay``), ``oversize``, ``malformed`` (not msgpack or
not ``[name, args]``), ``unknown_rpc``, ``bad_args``, ``handler_error``, ``busy`` (too many
requests in progress), ``rate_limited`` (a source over its request rate: ``ratelimit``),
``unexpected_reply`` (no caller waits for that id, or it came from the wrong address),
``bad_signature`` (an open network's signed request whose signature fails its signer's key).
Each dropped datagram is counted once. ``unattested`` counts requests served as a stranger's
although they named a member as their sender (unsigned, or signed by someone else): what
they said about finished work was not taken (``rpc.Rpc.serve_deferred``). ``replies_trimmed``
counts replies to strangers cut down to an error because they would have outgrown the request
(no amplification).
"""

from __future__ import annotations

from collections import Counter

__all__ = ["RpcStats"]


class RpcStats:
    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()  # no reply in time
        self.errors: Counter[str] = Counter()  # error replies we received
        self.dropped: Counter[str] = Counter()
        self._latency_sum: dict[str, float] = {}
        self._latency_n: Counter[str] = Counter()
        self.datagrams_in = 0
        self.datagrams_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.replies_trimmed = 0
        self.unattested: Counter[str] = Counter()
        # Retransmission (``endpoint.RESEND_AT``): our requests sent again for want of a
        # reply; copies of requests we received again (answered once, from the first);
        # second replies to our resent requests.
        self.requests_resent = 0
        self.duplicate_requests = 0
        self.duplicate_replies = 0
        self.late_replies = 0  # replies to calls that had timed out: slow peers, not dead

    def latency(self, rpc: str, seconds: float) -> None:
        self._latency_sum[rpc] = self._latency_sum.get(rpc, 0.0) + seconds
        self._latency_n[rpc] += 1

    def snapshot(self) -> dict[str, object]:
        return {
            "rpc_sent": dict(self.sent),
            "rpc_received": dict(self.received),
            "rpc_failed": dict(self.failed),
            "rpc_errors": dict(self.errors),
            "latency_ms": {
                k: round(1000 * self._latency_sum[k] / n, 3) for k, n in self._latency_n.items()
            },
            "dropped": dict(self.dropped),
            "datagrams_in": self.datagrams_in,
            "datagrams_out": self.datagrams_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "replies_trimmed": self.replies_trimmed,
            "unattested": dict(self.unattested),
            "requests_resent": self.requests_resent,
            "duplicate_requests": self.duplicate_requests,
            "duplicate_replies": self.duplicate_replies,
            "late_replies": self.late_replies,
        }
