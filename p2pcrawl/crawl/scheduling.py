"""Two-level crawl scheduling: the order of servers, and of URLs inside a server.

Cao, Jiang and Singh, "High-performance crawl scheduling" (§3.2): URLs wait in per-server
queues, servers wait in a server queue, and both are priority queues. When one of a fixed number
of connections frees up, the crawler opens the best-ranked ready server and downloads up to P of
its best URLs over one persistent connection; an open connection is never pre-empted.

This module holds only the ranking: pure functions returning sort keys (smaller = served
sooner), so the frontier decides *when* to re-rank and tests check the order without sockets.
Three of the paper's policies are offered (§4.1, §4.2, §4.4); quality-first (§4.3) is left out
because, without PageRank, our only quality signal is link depth, which crawl-capability
already uses together with speed. A fourth, longest-first, is for a crawl that must finish
soon: the leading server (the explored one with the most URLs found, so that one long
chain keeps going while the roots are explored), then the servers already known to be long
(``LONG_FOUND`` URLs found or more), then a server never fetched from (one request tells its
size), then the server with the most URLs found so far, queued or taken (Graham's
longest-processing-time rule for makespan), since a server is fetched one request at a time
and the crawl ends no sooner than its longest queue. It pays off when the link,
not the servers, sets the pace, so that a request waits for its turn anyway
(``--max-rate``): under performance-first the largest server, ranked by its response time
like any other, waited behind the small ones and ended the crawl (cluster benchmark,
4 peers: 138 ms a request to it against a 28 ms latency).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_REQUESTS_PER_CONNECTION",
    "LONG_FOUND",
    "POLICIES",
    "UNEXPLORED_RANK",
    "ServerEstimate",
    "capability",
    "connection_time",
    "expected_pages",
    "found",
    "host_key",
    "pages_per_second",
    "rank_of",
    "request_priority",
    "url_key",
    "url_quality",
]

POLICIES: tuple[str, ...] = (
    "breadth-first",
    "performance-first",
    "crawl-capability",
    "longest-first",
)

# High-performance crawl scheduling §4.2: a server we know nothing about is assumed to serve
# 50 requests per connection.
DEFAULT_REQUESTS_PER_CONNECTION = 50

# Keeps T away from zero when a server has only ever answered instantly (loopback tests).
_MIN_TIME = 1e-3


@dataclass(slots=True)
class ServerEstimate:
    """Smoothed connect and per-request times of one server, in seconds (§4.2)."""

    connect_time: float = 0.05
    response_time: float = 0.1

    def observe(
        self,
        connect_time: float | None,
        response_time: float | None,
        weight: float = 0.8,
    ) -> None:
        """Fold in new measurements: ``new = weight * old + (1 - weight) * sample``.

        The paper smooths both estimates with weight 0.8. Pass None for a value that was not
        measured, e.g. the connect time of a request sent over an already open connection.
        """
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {weight}")
        if connect_time is not None:
            sample = max(connect_time, 0.0)
            self.connect_time = weight * self.connect_time + (1.0 - weight) * sample
        if response_time is not None:
            sample = max(response_time, 0.0)
            self.response_time = weight * self.response_time + (1.0 - weight) * sample


def expected_pages(requests_per_connection: int, queued: int) -> int:
    """P: pages one connection to the server will fetch, ``min(requests/conn, queued)``."""
    return max(0, min(requests_per_connection, queued))


def connection_time(est: ServerEstimate, p: int) -> float:
    """T: time one connection fetching ``p`` pages takes, ``2 * connect + p * response``.

    The connect time counts twice, for opening and closing the connection (§4.2). The
    paper also scales T for HTTP/1.1 servers by a reserved parameter (1.2 in its experiments),
    but the formula is lost from our copy of the text, so it is left out here.
    """
    return max(2.0 * est.connect_time + p * est.response_time, _MIN_TIME)


def pages_per_second(est: ServerEstimate, p: int) -> float:
    """R = P / T, the performance-first rank of a server (§4.2)."""
    if p <= 0:
        return 0.0
    return p / connection_time(est, p)


def url_quality(depth: int) -> float:
    """Quality of a URL found ``depth`` links from a seed: ``1 / (1 + depth)``.

    The paper assumes an external quality measure such as PageRank; we have none, and
    shallower pages are the usual stand-in (breadth-first order finds high-PageRank pages
    early, Najork and Wiener 2001).
    """
    return 1.0 / (1.0 + max(depth, 0))


def capability(est: ServerEstimate, next_qualities: Sequence[float]) -> float:
    """C = sum of the qualities of the next P URLs / T (§4.4).

    ``next_qualities`` are the qualities of the URLs the next connection will fetch, so
    P = ``len(next_qualities)``.
    """
    p = len(next_qualities)
    if p == 0:
        return 0.0
    return sum(next_qualities) / connection_time(est, p)


def found(queued: int, taken: int) -> float:
    """What has been found of a server so far: its queued URLs and those taken from it for
    good (fetched, or settled without a fetch); infinite for a server not yet fetched
    from, whose size one request will tell.

    Counting the queue alone, a long server's queue drains with each request until that
    page's links arrive, and ranked by it the server then waited behind every server with
    two URLs (1 peer: the 300-page host fetched over 30-145 s of the crawl). Ranked as its
    one URL, or as a typical server, a server not yet explored waited until the end, and a
    long one found there ended the crawl (4 peers: an 83-page host first fetched at 41 s
    of 47).
    """
    return queued + taken if taken else math.inf


# A server with this many URLs found is known to be long, and goes ahead of the servers not
# yet explored. A root shows at most its own links (the cluster benchmark's web: 6 of its
# host), so such a server has shown pages beyond its root's. With every explored server behind
# the roots, a peer's second long server waited until its ~125 roots were all fetched, 4-12 s
# into a 23 s crawl, and then ended it (cluster benchmark, 8 peers: the 172-page host, root at
# 2 s, next page at 12 s, last at 23-25 s). Ahead of them, it ended at 18-21 s, the 8-peer
# crawl's median time fell from 23.0 to 22.8 s over 5 interleaved runs, and the slowest
# from 25.5 to 23.5 s.
LONG_FOUND = 24
# A server not yet explored ranks after the leading one (and a borrowed one) and the long
# ones, and before every other: as one with just under ``LONG_FOUND`` found.
UNEXPLORED_RANK = -(LONG_FOUND - 0.5)


def rank_of(found_so_far: float) -> float:
    """``-found``, with a server not yet explored at :data:`UNEXPLORED_RANK`."""
    return UNEXPLORED_RANK if found_so_far == math.inf else -found_so_far


def request_priority(
    queued: int, taken: int, *, borrowed: bool = False, leading: bool = False
) -> float:
    """The ``--max-rate`` pacer's key for a page request (smallest first): the server with
    the most found first, a server not yet explored as one with just under ``LONG_FOUND``,
    as longest-first ranks servers, whatever the policy.

    ``queued`` and ``taken`` are read while the request is under way, so its own URL is in
    ``taken``: a server is not yet fetched from when it is the only one. Ranked by its
    queue alone, a server's first page (its queue then empty) waited behind every request
    of a server with one URL queued. With the link the bound there always is one, so the
    roots of a web's servers went out a few a second, in the order they were found, and
    a long server among the last ended the crawl (cluster benchmark, 4 peers: the 83-page
    host first fetched at 40 s of 47, under every policy).

    A ``borrowed`` server (lent by its owner, network/lending.py) goes first: its owner is
    the peer furthest behind, and here the borrower has seen only the part it was lent, so
    ranked by what it found it waited behind the borrower's own long servers (8 peers: the
    172-page host, lent back and forth, fetched over 1-24 s of a 25 s crawl).

    The ``leading`` server (the explored one with most found here, ``Frontier.leader``)
    goes first too, ahead of the servers not yet explored: while a peer explores the roots
    it was sent, one long server's chain keeps going. Behind every root, the 172-page host
    (43 ms a request at best) waited from 2 s to 11 s of a 25 s crawl at 8 peers, and
    ended it.
    """
    if borrowed or leading:
        return -math.inf
    return rank_of(found(queued + 1, taken - 1))


def host_key(
    policy: str,
    *,
    arrival_seq: int,
    est: ServerEstimate,
    queued: int,
    next_qualities: Sequence[float],
    requests_per_connection: int,
    taken: int = 0,
    leading: bool = False,
    borrowed: bool = False,
) -> tuple[float, int]:
    """Sort key of a server in the server queue; the smallest is connected to first.

    ``arrival_seq`` is when the server (re-)entered the server queue; it orders breadth-first
    and breaks ties in the others. ``next_qualities`` are the qualities of the server's best
    queued URLs in ``url_key`` order (only crawl-capability reads them, and only the first P).
    ``taken``: URLs of the server taken from its queue for good so far (see :func:`found`;
    only longest-first reads it), as ``leading`` (see :func:`request_priority`).

    A ``borrowed`` server (its queue lent by its owner, network/lending.py) goes first under
    every policy, as at the pacer: its owner is behind. Ranked as a server never fetched
    from, a host lent 3.6 s into a crawl waited 6 s behind the roots its borrower was
    exploring, while its owner could not fetch it (cluster benchmark, 8 peers: the 172-page
    host, which then ended the crawl).
    """
    if borrowed and policy in POLICIES:
        return (-math.inf, arrival_seq)
    if policy == "breadth-first":
        # §4.1: the server queue is FIFO.
        return (float(arrival_seq), arrival_seq)
    p = expected_pages(requests_per_connection, queued)
    if policy == "performance-first":
        # §4.2: the most pages per second first.
        return (-pages_per_second(est, p), arrival_seq)
    if policy == "crawl-capability":
        # §4.4: the most quality per second first.
        return (-capability(est, next_qualities[:p]), arrival_seq)
    if policy == "longest-first":
        return (-math.inf if leading else rank_of(found(queued, taken)), arrival_seq)
    raise ValueError(f"unknown scheduling policy {policy!r}; expected one of {POLICIES}")


def url_key(policy: str, *, depth: int, seq: int) -> tuple[float, int]:
    """Sort key of a URL inside its server's queue; the smallest is fetched first.

    ``seq`` is a counter of URL arrivals (FIFO order and the tie-break).
    """
    if policy in ("breadth-first", "performance-first", "longest-first"):
        # §4.1 and §4.2: URL queues are FIFO.
        return (float(seq), seq)
    if policy == "crawl-capability":
        # §4.4: URLs by quality, best first.
        return (-url_quality(depth), seq)
    raise ValueError(f"unknown scheduling policy {policy!r}; expected one of {POLICIES}")
