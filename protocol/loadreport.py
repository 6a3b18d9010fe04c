"""LOAD: a node tells a joiner how much work it owns, so the joiner can split the busiest.

``balance.choose_join_id`` splits the most loaded node's region on the bit that divides that
node's load most evenly (Byers, Considine and Mitzenmacher, 2003). The joiner learns the loads
here: one request per node asked, one small reply each.

Wire format (a crawl RPC: the first argument is the sender's ID)::

    request  ["load", [sender_id, pad]]        pad: 0..PAD_MAX bytes, content ignored
    reply    {"id": responder_id,
              "load": int,                     the node's load (the crawler: pages queued + done)
              "ones": bytes,                   optional, only when load > 0: PROFILE_BYTES,
                                               for each of the 160 bit positions the share of
                                               the load on keys with a 1 there, as a big-endian
                                               uint16 fraction of ``load`` (65535 = all of it)
              "peers": [[id, host, port], ...]} up to MAX_PEERS contacts of its routing table,
                                               XOR-closest to the responder first: what the
                                               size of its region depends on, and, in a
                                               network smaller than a k-bucket, everyone

Why the contacts. A stranger's FIND_NODE answers are cut to fit the amplification bound (a few
contacts each), so a probe's lookups alone leave gaps; one LOAD reply lists a whole small
network.

Why the pad. A caller not in the responder's routing table (a joiner's short-lived probe never
is) gets replies no larger than ``endpoint.AMPLIFICATION`` times its request; a full reply is
at most about 1.4 KB (16 IPv6 contacts; 1 KB with IPv4), so such a caller pads its request
with ``PAD_BYTES`` (as QUIC pads its first packet): the reply costs the responder no more than
the request cost the caller. A member of the table gets the full reply whatever it sends.

Every field is checked on receipt (``LOAD``, declared once: ``procedures``); unknown fields
are ignored, so a later version may add some. The fractions lose at most 1/65535 of the load
per bit position, far below ``balance.SPLIT_TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

import msgspec
from msgspec import Meta

from protocol.balance import ID_BITS
from protocol.endpoint import sendable
from protocol.errors import MessageError
from protocol.model import PeerRef
from protocol.procedures import Args, Id, Procedure, Reply

__all__ = [
    "LOAD",
    "LOAD_RPC",
    "MAX_PEERS",
    "PAD_BYTES",
    "PAD_MAX",
    "LoadArgs",
    "LoadReply",
    "LoadReport",
    "load_reply",
    "report_of",
    "serve_load",
]

LOAD_RPC = "load"
MAX_PEERS = 16
PAD_BYTES = 1024  # what a stranger sends so that the full reply fits the amplification bound
PAD_MAX = 2048
MAX_LOAD = 2**53  # exact in a float, which is what the balance maths uses
PROFILE_BYTES = 2 * ID_BITS
_SCALE = 65535


class LoadArgs(Args):
    pad: Annotated[bytes, Meta(max_length=PAD_MAX)]


class Contact(msgspec.Struct, array_like=True, forbid_unknown_fields=True, frozen=True):
    id: Id
    host: str
    port: int


class LoadReply(Reply):
    load: Annotated[int, Meta(ge=0, le=MAX_LOAD)]
    peers: Annotated[list[Contact], Meta(max_length=MAX_PEERS)] = []  # none: left off
    ones: Annotated[bytes, Meta(min_length=PROFILE_BYTES, max_length=PROFILE_BYTES)] | None = None

    def __post_init__(self) -> None:
        if self.ones is not None and self.load == 0:
            raise ValueError("ones without a load")


LOAD = Procedure(LOAD_RPC, LoadArgs, LoadReply)


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One node's answer: its load, how that load falls on each bit (``balance.bit_loads``,
    or None when it has no load or did not say), and contacts, nearest its own ID first."""

    load: int
    ones: tuple[float, ...] | None = None
    peers: tuple[PeerRef, ...] = ()

    @property
    def profile(self) -> tuple[float, list[float]] | None:
        """What ``balance.split_id`` takes as ``profile``."""
        return None if self.ones is None else (float(self.load), list(self.ones))


def load_reply(report: LoadReport) -> LoadReply:
    if type(report.load) is not int or not 0 <= report.load <= MAX_LOAD:
        raise ValueError(f"load must be an int in [0, 2^53], not {report.load!r}")
    peers = [Contact(p.id, p.host, p.port) for p in report.peers[:MAX_PEERS]]
    ones: bytes | None = None
    if report.ones is not None and report.load > 0:
        if len(report.ones) != ID_BITS:
            raise ValueError(f"a load profile has {ID_BITS} entries, got {len(report.ones)}")
        scaled = (min(_SCALE, max(0, round(_SCALE * v / report.load))) for v in report.ones)
        ones = b"".join(q.to_bytes(2, "big") for q in scaled)
    return LoadReply(report.load, peers, ones)


def report_of(reply: LoadReply) -> LoadReport:
    """The report in a LOAD reply; MessageError names a contact that cannot be one."""
    peers: dict[bytes, PeerRef] = {}
    for c in reply.peers:
        addr = sendable(c.host, c.port)
        if addr is None:
            raise MessageError("peers need an IP address and a port")
        peers.setdefault(c.id, PeerRef(c.id, *addr))
    ones: tuple[float, ...] | None = None
    if reply.ones is not None:
        raw, load = reply.ones, reply.load
        ones = tuple(
            load * int.from_bytes(raw[i : i + 2], "big") / _SCALE
            for i in range(0, PROFILE_BYTES, 2)
        )
    return LoadReport(reply.load, ones, tuple(peers.values()))


def serve_load(
    report: Callable[[], Awaitable[LoadReport]],
) -> Callable[[PeerRef, LoadArgs], Awaitable[LoadReply]]:
    """The server of ``LOAD`` (register it with ``CrawlNode.serve(LOAD, ...)``); ``report``
    must answer within the caller's RPC timeout."""

    async def server(sender: PeerRef, args: LoadArgs) -> LoadReply:
        return load_reply(await report())

    return server
