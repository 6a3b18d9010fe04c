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

Both are declared once (``LEND``, ``GIVE_BACK``: ``procedures``), and every field is checked
against its bounds on receipt. A reply field equal to its default is left off (``recall``
false), which a peer reads as before.

A lease also lapses when no GIVE_BACK arrives for ``LEASE_S``; a borrower with a lease
outstanding reports at least every ``KEEPALIVE_S``, so a recall is heard that soon.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec
from msgspec import Meta

from protocol.codec import PAYLOAD_LIMIT, decode_batches, encode_chunks
from protocol.errors import MessageError
from protocol.model import FP_LIMIT, KeyBatch
from protocol.procedures import U64, Args, Procedure, Reply

__all__ = [
    "GIVE_BACK",
    "KEEPALIVE_S",
    "LEASE_S",
    "LEND",
    "LEND_REPLY_BUDGET",
    "LEND_RPC",
    "LOAN_BYTES_MOST",
    "MAX_FPS",
    "MAX_LENT_ROBOTS",
    "MAX_LOANS",
    "MAX_REPORTS",
    "MAX_ROBOTS_TTL",
    "MAX_WANT",
    "RETURN_RPC",
    "GiveBack",
    "GiveBackArgs",
    "GiveBackReply",
    "LendArgs",
    "LendReply",
    "LentRobots",
    "Loan",
    "answers_of",
    "loan_of",
    "loan_reply",
    "one_chunk",
    "report_args",
    "returns_reply",
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

Lease = Annotated[int, Meta(ge=1)]  # below MAX_LEASE: msgpack has no wider int
Fingerprints = Annotated[list[U64], Meta(max_length=MAX_FPS)]


class LentRobots(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """The owner's robots.txt policy for ``origin``: ``body`` None for "no rules", else the
    file; it holds ``ttl`` more seconds. On the wire: ``[origin, body, ttl]``."""

    origin: Annotated[str, Meta(min_length=1, max_length=MAX_ORIGIN)]
    body: Annotated[bytes, Meta(max_length=MAX_LENT_ROBOTS)] | None
    ttl: Annotated[int, Meta(ge=1, le=MAX_ROBOTS_TTL)]


class LendArgs(Args):
    """``have`` 0: the asker is idle; ``hosts``: loans an idle asker takes at once."""

    want: Annotated[int, Meta(ge=1, le=MAX_WANT)]
    have: Annotated[int, Meta(ge=0, le=MAX_BACKLOG)] = 0
    hosts: Annotated[int, Meta(ge=1, le=MAX_LOANS)] = 1


class FurtherLoan(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    lease: Lease
    tasks: bytes
    robots: LentRobots | None


class LendReply(Reply):
    lease: Annotated[int, Meta(ge=0)]
    backlog: Annotated[int, Meta(ge=0, le=MAX_BACKLOG)]
    tasks: bytes | None = None
    robots: LentRobots | None = None
    more: Annotated[list[FurtherLoan], Meta(max_length=MAX_LOANS - 1)] = []

    def __post_init__(self) -> None:
        if _wide(self.lease, *(m.lease for m in self.more)):
            raise ValueError("leases are u64 values")
        if not self.lease and (self.more or self.tasks is not None or self.robots is not None):
            raise ValueError("lease 0 lends nothing")
        if self.lease and self.tasks is None:
            raise ValueError("a lease carries its tasks")


class GiveBack(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    """A report on one lease: fingerprints finished (``done``) or returned unfetched
    (``back``); ``final``: the borrower holds nothing more of it."""

    lease: Lease
    done: Fingerprints
    back: Fingerprints
    final: bool


class GiveBackArgs(Args):
    """The first report's fields, then the further ones (``more``, of other leases)."""

    lease: Lease
    done: Fingerprints
    back: Fingerprints
    final: bool
    more: Annotated[list[GiveBack], Meta(max_length=MAX_REPORTS - 1)] = []

    def __post_init__(self) -> None:
        reports = self.reports()
        # Beyond msgpack's ints, so never from the wire; but a value built here is checked too.
        if any(_wide(r.lease, *r.done, *r.back) for r in reports):
            raise ValueError("leases and fingerprints are u64 values")
        if sum(len(r.done) + len(r.back) for r in reports) > MAX_FPS:
            raise ValueError(f"a GIVE_BACK carries at most {MAX_FPS} fingerprints")
        if len({r.lease for r in reports}) != len(reports):
            raise ValueError("a GIVE_BACK reports on each lease once")

    def reports(self) -> list[GiveBack]:
        return [GiveBack(self.lease, self.done, self.back, self.final), *self.more]


class Answer(msgspec.Struct, array_like=True, frozen=True):
    known: bool
    recall: bool


class GiveBackReply(Reply):
    """Per report: ``known`` False if the lease had lapsed or was taken back; ``recall``: the
    owner wants the rest back (it is leaving)."""

    known: bool
    recall: bool = False
    more: Annotated[list[Answer], Meta(max_length=MAX_REPORTS - 1)] = []


def _wide(*values: int) -> bool:
    return bool(values) and max(values) >= MAX_LEASE


LEND = Procedure(LEND_RPC, LendArgs, LendReply)
GIVE_BACK = Procedure(RETURN_RPC, GiveBackArgs, GiveBackReply)


@dataclass(frozen=True, slots=True)
class Loan:
    """A LEND answer: ``lease`` 0 means nothing lent (``batch`` is then None)."""

    lease: int
    batch: KeyBatch | None
    backlog: int
    robots: LentRobots | None = None
    more: tuple[Loan, ...] = ()  # further loans of the same answer, each of another host


def one_chunk(batch: KeyBatch) -> tuple[bytes, KeyBatch]:
    """The first wire chunk of ``batch`` and exactly what it holds: a lease is one reply, so
    tasks that do not fit it are not lent."""
    payload, _keys = encode_chunks([KeyBatch(batch.key, batch.tasks)])[0]
    (held,) = decode_batches(payload)
    return payload, held


def loan_reply(
    lease: int,
    payload: bytes | None,
    backlog: int,
    robots: LentRobots | None = None,
    more: Sequence[tuple[int, bytes, LentRobots | None]] = (),
) -> LendReply:
    """A LEND answer: lease 0 with nothing else for "nothing lent"; ``more``: further
    (lease, tasks, robots) loans of the same answer."""
    if lease and payload is None:
        raise ValueError("a lease carries tasks")
    if len(more) >= MAX_LOANS:
        raise ValueError(f"an answer holds at most {MAX_LOANS} loans")
    if more and not lease:
        raise ValueError("further loans need a first one")
    return LendReply(
        lease,
        min(backlog, MAX_BACKLOG),
        payload if lease else None,
        robots if lease else None,
        [FurtherLoan(m_lease, m_payload, m_robots) for m_lease, m_payload, m_robots in more],
    )


def loan_of(reply: LendReply) -> Loan:
    """The loans of a LEND reply, their tasks decoded; MessageError if they break the rules."""
    if not reply.lease:
        return Loan(0, None, reply.backlog)
    assert reply.tasks is not None  # LendReply.__post_init__
    first = _loan(reply.lease, reply.tasks, reply.robots, reply.backlog)
    more = [_loan(m.lease, m.tasks, m.robots, reply.backlog) for m in reply.more]
    leases = {first.lease, *(m.lease for m in more)}
    keys = {m.batch.key for m in (first, *more) if m.batch is not None}
    if len(leases) != len(more) + 1 or len(keys) != len(more) + 1:
        raise MessageError("the loans of one answer are of distinct leases and hosts")
    return Loan(reply.lease, first.batch, reply.backlog, first.robots, tuple(more))


def _loan(lease: int, payload: bytes, robots: LentRobots | None, backlog: int) -> Loan:
    batches = decode_batches(payload)
    if len(batches) != 1 or batches[0].done or not batches[0].tasks:
        raise MessageError("a lease is one key's tasks, with no done list")
    return Loan(lease, batches[0], backlog, robots)


def report_args(reports: Sequence[GiveBack]) -> GiveBackArgs:
    """A GIVE_BACK request's arguments for ``reports`` on leases of one lender."""
    if not 1 <= len(reports) <= MAX_REPORTS:
        raise ValueError(f"a GIVE_BACK reports on 1 to {MAX_REPORTS} leases")
    if sum(len(r.done) + len(r.back) for r in reports) > MAX_FPS:
        raise ValueError(f"a GIVE_BACK carries at most {MAX_FPS} fingerprints")
    first, *more = reports
    return GiveBackArgs(first.lease, first.done, first.back, first.final, more)


def returns_reply(answers: Sequence[tuple[bool, bool]]) -> GiveBackReply:
    """A GIVE_BACK reply: (known, recall) per report, in the request's order."""
    (known, recall), *more = answers
    return GiveBackReply(known, recall, [Answer(k, r) for k, r in more])


def answers_of(reply: GiveBackReply, reports: int) -> list[tuple[bool, bool]]:
    """(known, recall) for each of the ``reports`` of a GIVE_BACK; MessageError if the reply
    does not answer them all."""
    if len(reply.more) != reports - 1:
        raise MessageError(f"answers to {reports} reports expected")
    return [(reply.known, reply.recall), *((a.known, a.recall) for a in reply.more)]
