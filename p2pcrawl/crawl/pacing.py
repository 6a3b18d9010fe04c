"""``--max-rate``: this peer downloads at most so many bytes a second, longest hosts first.

A crawler that fills its link fills the queue in front of it too: at the bottleneck, every
response (and every RPC reply) waits behind a few hundred milliseconds of other pages. A
host fetched one request at a time then moves at a few pages a second however idle the
server, and a crawl's last minutes are exactly such hosts. Pacing request starts a little
below the link's rate keeps that queue empty and moves the waiting into the crawler, where
it can choose who goes first: the leading host (the explored one with most pages found
here, so one long chain keeps going while the roots are explored), then a host's first page
(one request tells how long the host is), then the host with the most pages found, since a
crawl ends no sooner than its longest serial chain (Graham's longest-processing-time rule
for makespan; the key is ``scheduling.request_priority``).

A token bucket of bytes: a request starts once the bucket is not in debt, and takes the
mean page size out of it; when its body has arrived the difference to its real size is
settled. Waiting requests are granted in priority order, smallest key first.

The bucket counts what the link carries, not what the crawler reads: each TCP segment's
framing, and every byte that arrives outside a fetch (the peers' RPC datagrams, which at 8
peers are about 7% of a page's bytes again). Counted as pages only, a rate of 0.88 of the
link filled it all the same (cluster benchmark, 4 peers: the largest host at 136 ms a
request instead of 40).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Iterable

from p2pcrawl.aio import Rate, TokenBucket

__all__ = ["Pacer", "on_wire", "response_on_wire"]

# The bucket holds this much time at the rate: requests may start together up to it, so a
# short pause (a parse, a slow server) does not cost the link its share.
BURST_S = 0.25
MIN_BURST = 64 * 1024
# A first guess of a page's size, until pages have been seen; and the smoothing of the mean.
FIRST_GUESS = 32 * 1024
SMOOTHING = 0.9
# A TCP segment over Ethernet: 1,448 bytes of payload (a 1,500-byte MTU less IP, TCP and
# its timestamp option) and 66 of framing (Ethernet 14, IP 20, TCP 32).
SEGMENT = 1448
FRAMING = 66


def on_wire(payload: int) -> int:
    """The bytes a TCP payload of ``payload`` bytes takes on the link."""
    return payload + -(-payload // SEGMENT) * FRAMING


def response_on_wire(body: int, headers: Iterable[tuple[str, str]]) -> int:
    """The bytes an HTTP response of a ``body``-byte body and these headers took on the
    link: the status line and headers too, not only the body."""
    head = sum(len(k) + len(v) + 4 for k, v in headers) + 20
    return on_wire(body + head)


Counter = Callable[[], int]


class Pacer:
    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0:
            raise ValueError("rate must be >= 0 bytes/s")
        self.rate = float(rate)
        self._clock = clock
        self.burst = max(MIN_BURST, rate * BURST_S)
        self._bucket = TokenBucket(Rate(per_s=self.rate, burst=self.burst), clock())
        self.mean = float(FIRST_GUESS)
        self._waiting: list[tuple[float, int, asyncio.Future[float]]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self.waits = 0  # requests that had to wait for the bucket
        self._others: Counter | None = None
        self._others_seen = 0

    def count_also(self, arrived: Counter) -> None:
        """Take out of the bucket what ``arrived()`` (a running total of bytes on the link,
        outside the fetches) has grown by, each time the bucket is looked at."""
        self._others = arrived
        self._others_seen = arrived()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def _refill(self) -> float:
        """The bucket's level now, what arrived outside the fetches taken out."""
        now = self._clock()
        bucket = self._bucket
        bucket.refill(now)
        if self._others is not None:
            total = self._others()
            bucket.charge(now, total - self._others_seen)
            self._others_seen = total
        return bucket.tokens

    async def start(self, priority: float = 0.0) -> float:
        """Wait for this request's turn; returns the bytes taken out of the bucket, to be
        passed to :meth:`settle` with the response's real size."""
        if not self.enabled:
            return 0.0
        if not self._waiting and self._refill() >= 0:
            self._bucket.tokens -= self.mean
            return self.mean
        self.waits += 1
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._seq), fut))
        self._grant()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._bucket.tokens += fut.result()  # granted, then cancelled: give it back
                self._grant()
            raise

    def settle(self, taken: float, size: int) -> None:
        """A request that took ``taken`` bytes from the bucket moved ``size`` bytes."""
        if not self.enabled:
            return
        self._refill()
        self._bucket.tokens += taken - size
        if size > 0:
            self.mean = SMOOTHING * self.mean + (1 - SMOOTHING) * size
        self._grant()

    def count(self, size: int) -> None:
        """Take out of the bucket ``size`` bytes that arrived without waiting for their turn
        (robots.txt, fetched before a host's first page so as not to hold up a crawl's
        exploration); they leave the mean page size alone."""
        if not self.enabled:
            return
        self._refill()
        self._bucket.tokens -= size
        self._grant()

    def _grant(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        bucket = self._bucket
        self._refill()
        while self._waiting and bucket.tokens >= 0:
            _, _, fut = heapq.heappop(self._waiting)
            if fut.done():
                continue  # cancelled while waiting
            bucket.tokens -= self.mean
            fut.set_result(self.mean)
        while self._waiting and self._waiting[0][2].done():
            heapq.heappop(self._waiting)
        if self._waiting:
            delay = bucket.wait()
            self._timer = asyncio.get_running_loop().call_later(delay, self._grant)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, _, fut in self._waiting:
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
