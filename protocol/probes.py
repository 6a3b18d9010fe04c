"""SWIM's probes (Das, Gupta and Motivala, 2002) on the RPC layer: the direct ping that waits
the probe timeout, and PING-REQ, asked of a helper and served for others. What their
answers mean for a suspect is ``liveness``; when they are sent is ``upkeep``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from protocol.auth import ID_LEN
from protocol.contacts import peer_of
from protocol.kbucket import Node
from protocol.messages import PING_REQ, PingReqArgs, PingReqReply
from protocol.model import PeerRef

if TYPE_CHECKING:
    from protocol.rpc import Rpc

__all__ = ["PROBE_TIMEOUT", "Answer", "ping_req", "probe_ping", "serve_ping_req"]

# SWIM's probe timeout (memberlist: 500 ms): a liveness ping, and the ping a PING-REQ helper
# sends, wait this long. A slow answer costs a suspicion, not a verdict: the verdict waits on
# time and on other peers (``liveness``).
PROBE_TIMEOUT = 0.5


async def serve_ping_req(rpc: Rpc, sender: PeerRef, args: PingReqArgs) -> PingReqReply:
    """SWIM's PING-REQ: ping ``target`` for the sender and say whether it answered.

    Only a contact in our own table is pinged, at the address we know it by: a request
    cannot make us send datagrams to an arbitrary address (no reflection or amplification).
    The answer comes either way (SWIM's ack, Lifeguard's nack), so the sender learns that
    we are alive even when the target is not.
    """
    target = rpc.router.get(args.target)
    if target is None or target.id == sender.id or rpc.contacts.departing:
        gone = target is None and rpc.liveness.declared_lately(args.target)
        return PingReqReply(ok=False, known=False, gone=gone)
    # Our own ping, our own evidence: unanswered, the target is our suspect too. It
    # waits twice the probe timeout: the indirect path is the benefit of the doubt.
    alive = await probe_ping(rpc, target, 2 * PROBE_TIMEOUT)
    return PingReqReply(ok=alive, known=True)


class Answer(enum.Enum):
    """A helper's answer to PING-REQ."""

    ACK = "ack"  # the target acked
    NACK = "nack"  # the helper answered, but the target did not or the helper does not know it
    GONE = "gone"  # a nack from a helper that had declared the target dead itself
    SILENT = "silent"  # the helper stayed silent: Lifeguard's missed nack (likely *us*)


async def ping_req(rpc: Rpc, helper: Node, target: Node) -> Answer:
    """Ask ``helper`` to ping ``target``."""
    peer = peer_of(helper)
    timeout = 3 * PROBE_TIMEOUT + 0.5  # the helper's own ping must fit inside
    args = [rpc.my_id, *PING_REQ.args_to_wire(PingReqArgs(target.id))]
    call = rpc.endpoint.call(
        peer.addr, PING_REQ.name, args, timeout, PING_REQ.decode_reply, sign=True
    )
    ok, data = await call
    if not ok or isinstance(data, dict):  # silent, or an error reply
        return Answer.SILENT
    if not isinstance(data, PingReqReply):
        rpc.contacts.welcome_if_new(helper)
        return Answer.NACK  # it answered, but not that the target acked
    rpc.contacts.welcome_if_new(helper, proven=data.id == helper.id)
    if data.ok:
        return Answer.ACK
    return Answer.GONE if data.gone else Answer.NACK


async def probe_ping(rpc: Rpc, node: Node, timeout: float = PROBE_TIMEOUT) -> bool:
    """SWIM's direct probe: a ping that waits ``timeout``. Unanswered, the contact is a
    suspect whose silence began when the ping left (``liveness``); a reply that comes
    after all refutes it (``late_reply``)."""
    ok, data = await rpc.endpoint.call((node.ip, node.port), "ping", [rpc.my_id], timeout)
    if ok and data == node.id:
        rpc.contacts.welcome_if_new(node, proven=True)
        return True
    if ok and type(data) is bytes and len(data) == ID_LEN:
        rpc.contacts.replace(node, Node(data, node.ip, node.port))  # someone else lives there
        return False
    rpc.contacts.contact_failed(node, waited=timeout)
    return False
