"""The exceptions the protocol raises, so callers never see rpcudp's ``(False, None)``.

Every failure of a remote call maps to exactly one of these: the peer said nothing
(``PeerTimeout``), the peer said "no" (``RemoteError``), a message was unusable
(``MessageError``), or nobody let us in (``BootstrapError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocol.model import PeerRef

__all__ = ["BootstrapError", "Busy", "MessageError", "PeerTimeout", "RemoteError"]


class PeerTimeout(Exception):
    """No reply within ``rpc_timeout`` (the datagram, or its reply, was lost or the peer is gone).

    ``peer`` is ``None`` when only an address was known (bootstrap pings).
    """

    def __init__(self, peer: PeerRef | None, addr: tuple[str, int], rpc: str) -> None:
        who = peer.short if peer is not None else "?"
        super().__init__(f"no reply to {rpc} from {who}@{addr[0]}:{addr[1]}")
        self.peer = peer
        self.addr = addr
        self.rpc = rpc


class RemoteError(Exception):
    """The peer answered, but with an error (its handler failed, it is busy, or it rejected
    our arguments). The peer is alive: this never counts towards eviction."""

    def __init__(self, peer: PeerRef | None, rpc: str, message: str) -> None:
        super().__init__(f"{rpc} failed remotely: {message}")
        self.peer = peer
        self.rpc = rpc
        self.message = message


class MessageError(ValueError):
    """A payload (ours before sending, or a peer's after receiving) breaks the wire rules."""


class BootstrapError(Exception):
    """No bootstrap address answered a ping: wrong address, peer down, or a different secret."""


class Busy(Exception):
    """Raised by a handler to answer "busy": the caller keeps its request and retries later
    (``RemoteError`` on its side), so nothing is lost; the sender is just slowed down."""
