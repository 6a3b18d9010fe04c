"""LEND and GIVE_BACK: a peer with idle fetchers crawls part of a busy owner's queue for it.

Ownership decides who *records* a URL (the owner's done record is where its duplicates die);
it need not decide who *fetches* it. With whole hosts as keys, the owners' loads are as uneven
as the hosts' sizes, and the crawl lasts as long as the busiest owner needs. So an owner with
a backlog lends one host's queued tasks at a time to a peer that asks for work, and stops
fetching that host itself while the lease runs (one server is still fetched by one peer at a
time). The borrower fetches and archives the pages and routes their links as usual; it tells
the owner which tasks it finished, and the owner records them done and drops its replicas'
copies, as for its own pages. A lent task never leaves the owner's task store, so a borrower
that dies costs at most the pages it fetched since its last report: the owner takes the lease
back (on the failure detector's word, or when the lease lapses) and crawls the rest itself.

Wire format (crawl RPCs: the first argument is the sender's ID)::

    request  ["lend", [sender_id, want, have?, hosts?]]
                                                    want: 1..MAX_WANT tasks at most;
                                                    have (optional): the asker's own backlog.
                                                    0 or absent: the asker is idle; more:
                                                    the asker is behind, and a host is lent
                                                    only if moving it narrows the gap;
                                                    hosts (optional, 1..MAX_LOANS, default
                                                    1): loans an idle asker takes at once
    reply    {"id": responder_id,
              "lease": int,                         0: nothing lent
              "tasks": bytes,                       with lease > 0: one codec chunk holding
                                                    one KeyBatch (one host key), no done list
              "backlog": int,                       tasks the owner still has queued
              "robots": [origin, body, ttl]}        optional, with lease > 0: the owner's
                                                    robots.txt policy for the first task's
                                                    origin: body nil for "no rules" (a 4xx
                                                    robots.txt), else the file (at most
                                                    MAX_LENT_ROBOTS bytes); valid ttl more
                                                    seconds
              "more": [[lease, tasks, robots|nil]]  optional: further loans, each of another
                                                    host, as above (at most MAX_LOANS - 1)

    request  ["give_back", [sender_id, lease, done, back, final, more?]]
                                                    done: fingerprints finished (fetched and
                                                    archived, or recorded failed); back:
                                                    fingerprints returned unfetched; final:
                                                    the borrower holds nothing more of it
    reply    {"id": responder_id, "known": bool,    known False: the lease had lapsed or was
              "recall": bool}                       taken back; the borrower drops what is
                                                    left. recall (optional): the owner is
                                                    leaving; the borrower gives back what it
                                                    has not started and reports the rest
              more: [[lease, done, back, final]]    optional, in the request: reports on
                                                    further leases of the same lender (at
                                                    most MAX_REPORTS - 1; MAX_FPS
                                                    fingerprints in all); the reply's
              "more": [[known, recall]]             answers them in the same order

Why several loans to one answer and several reports to one request. At a crawl's end a busy
owner's queue is mostly hosts of a page or two, and an idle peer borrowed them one LEND and one
GIVE_BACK each: two RPCs for a page that costs its owner none.

Why the robots policy. Each borrower would otherwise fetch the host's robots.txt again: the
site sees one more request per loan, and the loan's first page waits a round trip for it. A
borrower takes it only from a peer it trusts as much as its own scope (a keyed network, or one
confined to loopback); otherwise it fetches the file itself.

A lease also lapses when no GIVE_BACK arrives for ``LEASE_S``; a borrower with a lease
outstanding reports at least every ``KEEPALIVE_S``, so a recall is heard that soon.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.codec import PAYLOAD_LIMIT, decode_batches, encode_chunks
from protocol.errors import MessageError
from protocol.model import FP_LIMIT, KeyBatch, check_fingerprint

__all__ = [
    "KEEPALIVE_S",
    "LEASE_S",
    "LEND_RPC",
    "MAX_FPS",
    "MAX_LENT_ROBOTS",
    "MAX_LOANS",
    "MAX_REPORTS",
    "MAX_WANT",
    "RETURN_RPC",
    "GiveBack",
    "LentRobots",
    "Loan",
    "check_lend_request",
    "check_return_request",
    "loan_from_wire",
    "loan_to_wire",
    "one_chunk",
    "report_to_wire",
    "returns_from_wire",
    "returns_to_wire",
]

LEND_RPC = "lend"
RETURN_RPC = "give_back"
MAX_WANT = 4096
MAX_FPS = 400  # fingerprints per GIVE_BACK: 9 bytes each in msgpack, well inside a datagram
MAX_LOANS = 8  # loans in one LEND answer
MAX_REPORTS = 16  # leases reported on in one GIVE_BACK
LEASE_S = 30.0
KEEPALIVE_S = 2.0
MAX_LEASE = FP_LIMIT
MAX_BACKLOG = 2**53
# A robots.txt a loan may carry; a longer one the borrower fetches itself. Almost every site's
# fits (the median robots.txt is a few hundred bytes), and the reply stays one datagram of
# about 12 KB at most (a task chunk is at most 8 KB).
MAX_LENT_ROBOTS = 4096
MAX_ORIGIN = 512
MAX_ROBOTS_TTL = 7 * 86_400
# A further loan joins an answer only while the largest one could (a task chunk and a
# robots.txt body) would keep the tasks and robots.txt bodies of all within this: the reply
# stays one datagram of at most about 24 KB (one loan: about 12 KB), and of a few hundred
# bytes for the hosts of a page or two it is meant for.
LEND_REPLY_BUDGET = 24_576
LOAN_BYTES_MOST = PAYLOAD_LIMIT + MAX_LENT_ROBOTS


@dataclass(frozen=True, slots=True)
class LentRobots:
    """The owner's robots.txt policy for ``origin``: ``body`` None for "no rules", else the
    file; it holds ``ttl`` more seconds."""

    origin: str
    body: bytes | None
    ttl: int


@dataclass(frozen=True, slots=True)
class Loan:
    """A LEND answer: ``lease`` 0 means nothing lent (``batch`` is then None)."""

    lease: int
    batch: KeyBatch | None
    backlog: int
    robots: LentRobots | None = None
    more: tuple[Loan, ...] = ()  # further loans of the same answer, each of another host


@dataclass(frozen=True, slots=True)
class GiveBack:
    lease: int
    done: list[int]
    back: list[int]
    final: bool


def one_chunk(batch: KeyBatch) -> tuple[bytes, KeyBatch]:
    """The first wire chunk of ``batch`` and exactly what it holds: a lease is one reply, so
    tasks that do not fit it are not lent."""
    payload, _keys = encode_chunks([KeyBatch(batch.key, batch.tasks)])[0]
    (held,) = decode_batches(payload)
    return payload, held


def loan_to_wire(
    lease: int,
    payload: bytes | None,
    backlog: int,
    robots: LentRobots | None = None,
    more: Sequence[tuple[int, bytes, LentRobots | None]] = (),
) -> dict[str, Any]:
    """A LEND answer: lease 0 with nothing else for "nothing lent"; ``more``: further
    (lease, tasks, robots) loans of the same answer."""
    out: dict[str, Any] = {"lease": lease, "backlog": min(backlog, MAX_BACKLOG)}
    if lease:
        if payload is None:
            raise ValueError("a lease carries tasks")
        out["tasks"] = payload
        if robots is not None:
            out["robots"] = _robots_to_wire(robots)
        if more:
            if len(more) >= MAX_LOANS:
                raise ValueError(f"an answer holds at most {MAX_LOANS} loans")
            out["more"] = [
                [m_lease, m_payload, None if m_robots is None else _robots_to_wire(m_robots)]
                for m_lease, m_payload, m_robots in more
            ]
    elif more:
        raise ValueError("further loans need a first one")
    return out


def _robots_to_wire(robots: LentRobots) -> list[Any]:
    _check_robots(robots)
    return [robots.origin, robots.body, robots.ttl]


def _check_robots(robots: LentRobots) -> None:
    if type(robots.origin) is not str or not 0 < len(robots.origin) <= MAX_ORIGIN:
        raise ValueError(f"a robots origin is a string of 1 to {MAX_ORIGIN} characters")
    body = robots.body
    if body is not None and (type(body) is not bytes or len(body) > MAX_LENT_ROBOTS):
        raise ValueError(f"a lent robots.txt is nil or at most {MAX_LENT_ROBOTS} bytes")
    if type(robots.ttl) is not int or not 0 < robots.ttl <= MAX_ROBOTS_TTL:
        raise ValueError(f"a robots ttl is an int in [1, {MAX_ROBOTS_TTL}]")


def _uint(value: object, limit: int, what: str) -> int:
    if type(value) is not int or not 0 <= value < limit:
        raise ValueError(f"{what} must be an int in [0, {limit})")
    return value


def loan_from_wire(reply: Any) -> Loan:
    """The loans in a LEND reply; ValueError names the first field that breaks the rules."""
    if not isinstance(reply, dict):
        raise ValueError("not a map")
    lease = _uint(reply.get("lease"), MAX_LEASE, "lease")
    backlog = _uint(reply.get("backlog"), MAX_BACKLOG + 1, "backlog")
    if not lease:
        if "more" in reply:
            raise ValueError("further loans need a first one")
        return Loan(0, None, backlog)
    first = _loan(lease, reply.get("tasks"), reply.get("robots"), backlog)
    entries = reply.get("more", [])
    if not isinstance(entries, list) or len(entries) >= MAX_LOANS:
        raise ValueError(f"more is a list of at most {MAX_LOANS - 1} loans")
    more: list[Loan] = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 3:
            raise ValueError("a further loan is [lease, tasks, robots]")
        m_lease = _uint(entry[0], MAX_LEASE, "lease")
        if not m_lease:
            raise ValueError("a further loan has a lease")
        more.append(_loan(m_lease, entry[1], entry[2], backlog))
    leases = {first.lease, *(m.lease for m in more)}
    keys = {m.batch.key for m in (first, *more) if m.batch is not None}
    if len(leases) != len(more) + 1 or len(keys) != len(more) + 1:
        raise ValueError("the loans of one answer are of distinct leases and hosts")
    return Loan(lease, first.batch, backlog, first.robots, tuple(more))


def _loan(lease: int, payload: Any, robots_entry: Any, backlog: int) -> Loan:
    if type(payload) is not bytes:
        raise ValueError("a lease carries its tasks as bytes")
    try:
        batches = decode_batches(payload)
    except MessageError as exc:
        raise ValueError(str(exc)) from None
    if len(batches) != 1 or batches[0].done or not batches[0].tasks:
        raise ValueError("a lease is one key's tasks, with no done list")
    robots: LentRobots | None = None
    if robots_entry is not None:
        if not isinstance(robots_entry, list) or len(robots_entry) != 3:
            raise ValueError("robots is [origin, body, ttl]")
        robots = LentRobots(*robots_entry)
        _check_robots(robots)
    return Loan(lease, batches[0], backlog, robots)


def check_lend_request(args: Sequence[Any]) -> tuple[int, int, int]:
    """(want, have, hosts): ``have`` is 0 for an idle asker (a request without it), and
    ``hosts`` 1 unless the asker takes several loans at once."""
    if len(args) not in (1, 2, 3):
        raise MessageError("lend takes 1 to 3 arguments after the sender id (want, have, hosts)")
    want = args[0]
    have = args[1] if len(args) >= 2 else 0
    hosts = args[2] if len(args) == 3 else 1
    if type(want) is not int or not 1 <= want <= MAX_WANT:
        raise MessageError(f"want must be an int in [1, {MAX_WANT}]")
    if type(have) is not int or not 0 <= have <= MAX_BACKLOG:
        raise MessageError(f"have must be an int in [0, {MAX_BACKLOG}]")
    if type(hosts) is not int or not 1 <= hosts <= MAX_LOANS:
        raise MessageError(f"hosts must be an int in [1, {MAX_LOANS}]")
    return want, have, hosts


def report_to_wire(reports: Sequence[GiveBack]) -> list[Any]:
    """A GIVE_BACK request's arguments for ``reports`` on leases of one lender."""
    if not 1 <= len(reports) <= MAX_REPORTS:
        raise ValueError(f"a GIVE_BACK reports on 1 to {MAX_REPORTS} leases")
    if sum(len(r.done) + len(r.back) for r in reports) > MAX_FPS:
        raise ValueError(f"a GIVE_BACK carries at most {MAX_FPS} fingerprints")
    first, *more = reports
    args: list[Any] = [first.lease, first.done, first.back, first.final]
    if more:
        args.append([[r.lease, r.done, r.back, r.final] for r in more])
    return args


def check_return_request(args: Sequence[Any]) -> list[GiveBack]:
    """The reports in a GIVE_BACK request, first one first."""
    if len(args) not in (4, 5):
        raise MessageError("give_back takes 4 or 5 arguments after the sender id")
    entries: list[Any] = [list(args[:4])]
    if len(args) == 5:
        more = args[4]
        if not isinstance(more, list) or not 0 < len(more) < MAX_REPORTS:
            raise MessageError(f"more is a list of 1 to {MAX_REPORTS - 1} reports")
        entries += more
    reports: list[GiveBack] = []
    fps_in_all = 0
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 4:
            raise MessageError("a report is [lease, done, back, final]")
        lease, done, back, final = entry
        if type(lease) is not int or not 0 < lease < MAX_LEASE:
            raise MessageError("lease must be a positive int")
        if type(final) is not bool:
            raise MessageError("final must be a bool")
        for name, fps in (("done", done), ("back", back)):
            if not isinstance(fps, list) or len(fps) > MAX_FPS:
                raise MessageError(f"{name} must be a list of at most {MAX_FPS} fingerprints")
            for fp in fps:
                check_fingerprint(fp)
            fps_in_all += len(fps)
        reports.append(GiveBack(lease, done, back, final))
    if fps_in_all > MAX_FPS:
        raise MessageError(f"a GIVE_BACK carries at most {MAX_FPS} fingerprints")
    if len({r.lease for r in reports}) != len(reports):
        raise MessageError("a GIVE_BACK reports on each lease once")
    return reports


def returns_to_wire(answers: Sequence[tuple[bool, bool]]) -> dict[str, Any]:
    """A GIVE_BACK reply: (known, recall) per report, in the request's order."""
    (known, recall), *more = answers
    out: dict[str, Any] = {"known": known, "recall": recall}
    if more:
        out["more"] = [[k, r] for k, r in more]
    return out


def returns_from_wire(reply: Any, reports: int) -> list[tuple[bool, bool]]:
    """(known, recall) for each of the ``reports`` of a GIVE_BACK; ValueError if the reply
    does not answer them all."""
    if not isinstance(reply, dict) or type(reply.get("known")) is not bool:
        raise ValueError("no 'known' flag")
    answers = [(reply["known"], reply.get("recall") is True)]
    more = reply.get("more", [])
    if not isinstance(more, list) or len(more) != reports - 1:
        raise ValueError(f"answers to {reports} reports expected")
    for entry in more:
        if not isinstance(entry, list) or len(entry) != 2 or type(entry[0]) is not bool:
            raise ValueError("an answer is [known, recall]")
        answers.append((entry[0], entry[1] is True))
    return answers
