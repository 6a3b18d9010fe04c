"""Typed wire messages: each RPC declared once, as a ``Procedure`` with its argument and reply
types, and checked against them on receipt.

An RPC request is ``[name, [sender_id, *args]]`` (rpcudp's framing, msgpack) and its reply a
map. Each procedure's ``Args`` is an ``msgspec.Struct`` laid out as that argument array
(``array_like``), and its ``Reply`` a Struct laid out as the map; their fields carry the bounds
(``Meta``: ranges, lengths), and a ``__post_init__`` the rules that tie fields together. So a
message's shape and limits are written once, and msgspec checks a received one in C:

* arguments (``parse_args``): a wrong type, a value out of bounds, a missing or an extra
  argument is a ``MessageError``: the endpoint answers "bad arguments" and counts the drop;
* replies (``Procedure.decode_reply``): decoded from the datagram straight into the reply
  type; a reply that breaks the rules becomes a ``Malformed`` the caller turns into a
  ``RemoteError`` (the peer is alive but odd), an error reply (``{"error": ...}``) stays the
  map it is. Unknown reply fields are ignored, so a later version may add some.

The bytes stay what they were: msgspec writes a Struct as msgpack writes the list or the map
it stands for (fields in declaration order, ints in their smallest form, str as str, bytes as
bin), and the responder's ID, which the server adds to every reply, comes last as it did.
Optional trailing arguments equal to their default are left off (``args_to_wire``), and reply
fields equal to theirs too (``omit_defaults``), as the hand-written codecs did, so peers of
either kind understand each other (``tests/protocol/test_procedures.py``). Measured against
the hand-written codecs: ``benchmarks/wire_messages.py``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeVar

import msgspec

from protocol import wire
from protocol.errors import MessageError
from protocol.model import PeerRef
from protocol.ownership import ID_BYTES

__all__ = [
    "U64",
    "Args",
    "Count",
    "CrawlServer",
    "Id",
    "Malformed",
    "NoArgs",
    "Procedure",
    "Reply",
    "attesting",
    "parse_args",
    "parse_reply",
    "reply_to_wire",
    "typed",
]

Id = Annotated[bytes, msgspec.Meta(min_length=ID_BYTES, max_length=ID_BYTES)]
# A u64: msgpack's ints end at 2**64 - 1, so "not negative" is the whole check (and msgspec
# cannot state bounds beyond an int64).
U64 = Annotated[int, msgspec.Meta(ge=0)]


class Args(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The arguments of a request after the sender's ID, in order."""


class Reply(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A reply map. ``id``: the responder's node ID, which the server sets (last on the wire:
    a base class's keyword-only field follows the subclass's fields)."""

    id: bytes | None = None


class NoArgs(Args):
    pass


class Count(Reply):
    """How many: copies stored, or dropped."""

    n: Annotated[int, msgspec.Meta(ge=0)]


@dataclass(frozen=True, slots=True)
class Malformed:
    """A reply that breaks its procedure's rules, and which rule."""

    error: str


def _no_ext(code: int, data: memoryview) -> Any:
    raise ValueError(f"msgpack extension type {code} is not part of the protocol")


# msgpack carries bytes as bin: to_builtins would make them base64 text, and convert would
# take base64 text for bytes.
_AS_IS = (bytes,)

_PLACE = re.compile(r"\$\[(\d+)\]")
_TOO_FEW = re.compile(r"of at least length \d+, got (\d+)")
_TOO_MANY = re.compile(r"of at most length \d+, got \d+")

A = TypeVar("A", bound=Args)
R = TypeVar("R", bound=Reply)


@dataclass(frozen=True, slots=True)
class Procedure(Generic[A, R]):
    """One RPC: its wire name and its two messages."""

    name: str
    args: type[A]
    reply: type[R]
    _decoder: msgspec.msgpack.Decoder[R] = field(init=False, repr=False, compare=False)
    _defaults: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        decoder = msgspec.msgpack.Decoder(self.reply, ext_hook=_no_ext)
        object.__setattr__(self, "_decoder", decoder)
        defaults = tuple(_default(f) for f in msgspec.structs.fields(self.args))
        object.__setattr__(self, "_defaults", defaults)

    def decode_reply(self, body: bytes) -> R | Malformed | Any:
        """The reply in a datagram's body: the reply type, or a ``Malformed``, or (an error
        reply) the map as it came. Raises on a body that is not msgpack at all (the endpoint
        drops it as it drops any malformed datagram)."""
        try:
            return self._decoder.decode(body)
        except msgspec.ValidationError as exc:
            raw = wire.unpackb(body)
            if isinstance(raw, dict) and "error" in raw:
                return raw
            return Malformed(f"{self.name} reply: {exc}")

    def args_to_wire(self, args: A) -> list[Any]:
        """The request's argument array (msgspec encodes a Struct inside as its array),
        trailing arguments that equal their defaults left off."""
        values = list(msgspec.structs.astuple(args))
        defaults = self._defaults
        while values and values[-1] == defaults[len(values) - 1]:
            values.pop()
        return values


def _default(f: msgspec.structs.FieldInfo) -> Any:
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return f.default  # NODEFAULT (a required argument) equals no value


def parse_args(proc: Procedure[A, R], raw: list[Any]) -> A:
    try:
        return msgspec.convert(raw, proc.args, builtin_types=_AS_IS)
    except msgspec.ValidationError as exc:
        raise MessageError(f"{proc.name}: {_named(proc.args, str(exc))}") from None


def _named(args: type[Args], error: str) -> str:
    """msgspec's message, short (a stranger's error reply must stay within twice its request's
    size) and naming the argument, not its place (``$[1]``)."""
    names = [f.name for f in msgspec.structs.fields(args)]
    missing = _TOO_FEW.search(error)
    if missing is not None:
        return f"no {_name(names, int(missing[1]))}"
    if _TOO_MANY.search(error) is not None:
        return f"at most {len(names)} arguments"
    place = _PLACE.search(error)
    if place is None:
        return error
    where = _name(names, int(place[1]))
    return f"{where}: {error[: error.rfind(' - at ')] if ' - at ' in error else error}"


def _name(names: list[str], at: int) -> str:
    return names[at] if at < len(names) else "an extra argument"


def parse_reply(proc: Procedure[A, R], raw: object) -> R:
    """A reply already decoded to plain values, checked (tests; the wire's own replies come
    through ``Procedure.decode_reply``)."""
    try:
        return msgspec.convert(raw, proc.reply, builtin_types=_AS_IS)
    except msgspec.ValidationError as exc:
        raise MessageError(f"{proc.name} reply: {exc}") from None


def reply_to_wire(reply: Reply) -> dict[str, Any]:
    """The reply map a peer reads (what ``wire.packb(reply)`` writes, as plain values)."""
    out: dict[str, Any] = msgspec.to_builtins(reply, builtin_types=_AS_IS)
    return out


# Serves one crawl RPC on the wire: (sender, args after the sender id, whether the request
# speaks for its sender: ``rpc.Rpc.serve_deferred``) -> its reply.
CrawlServer = Callable[[PeerRef, list[Any], bool], Awaitable[Reply]]


def typed(proc: Procedure[A, R], handler: Callable[[PeerRef, A], Awaitable[R]]) -> CrawlServer:
    """The server of ``proc``: its arguments checked (``MessageError``: "bad arguments"),
    then ``handler`` called with them (the same whoever it speaks for)."""

    async def server(sender: PeerRef, raw: list[Any], attested: bool = True) -> Reply:
        return await handler(sender, parse_args(proc, raw))

    return server


def attesting(
    proc: Procedure[A, R], handler: Callable[[PeerRef, A, bool], Awaitable[R]]
) -> CrawlServer:
    """The server of a ``proc`` whose request says which work is finished: as ``typed``, and
    ``handler`` is told whether the request speaks for its sender (a claim that does not is
    nobody's)."""

    async def server(sender: PeerRef, raw: list[Any], attested: bool = True) -> Reply:
        return await handler(sender, parse_args(proc, raw), attested)

    return server
