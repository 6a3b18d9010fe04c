"""Proving node IDs in an open network: which ID a contact may speak for, and how it shows it.

On a keyed wire only key holders speak, and any of them may claim any ID. On an open wire
anyone may, so a node with a key (``nodekey``) counts a contact as a member only once it has
proven its ID (``members``): asked IDENTIFY with a fresh random challenge, the contact answers
with its public key, its puzzle's nonce and its signature over the challenge and both IDs.
The answer must show an ID derived from that key with enough work and no more chosen bits
than the network's size allows (``nodekey.check_proof``), and it comes from the contact's own
address to a request id nobody else saw. From then on the node knows the contact's key: the
contact's signed requests speak for it (``endpoint``), and anything else that names it as
the sender speaks for nobody (``rpc.Rpc.serve_deferred``).

Checks are bounded like admission challenges: one per ID at a time, at most
``MAX_CHECKS`` in flight, and each contact is asked at most ``1 + len(RETRY_S)`` times. A
contact that answers with an error (a stock kademlia node, a peer without a key) stays a
contact: the Kademlia RPCs still work with it, but it owns no key and does no crawl work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Annotated

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from msgspec import Meta

from protocol.errors import MessageError, PeerTimeout, RemoteError
from protocol.model import PeerRef
from protocol.nodekey import (
    DEFAULT_WORK_BITS,
    KEY_BYTES,
    SIG_BYTES,
    NodeKey,
    Proof,
    check_proof,
    load_public,
    max_free_bits,
    verify,
)
from protocol.procedures import U64, Args, Procedure, Reply
from protocol.taskset import TaskSet

__all__ = ["IDENTIFY", "IdentifyArgs", "IdentifyReply", "Identities"]

log = logging.getLogger(__name__)

CHALLENGE_BYTES = 16
# A stranger's reply may be at most twice its request (``endpoint.AMPLIFICATION``): the
# padding makes room for the key, the nonce and the signature.
PAD_BYTES = 64
MAX_CHECKS = 32
RETRY_S = (0.5, 1.0, 2.0, 4.0)  # waits before asking a silent contact again
KNOWN_KEYS = 4096  # proven IDs whose keys are kept (an attacker's IDs are new ones)
_STATEMENT = b"p2pcrawl/identify/1"


class IdentifyArgs(Args):
    challenge: Annotated[bytes, Meta(min_length=CHALLENGE_BYTES, max_length=CHALLENGE_BYTES)]
    pad: Annotated[bytes, Meta(max_length=4 * PAD_BYTES)] = b""


class IdentifyReply(Reply):
    key: Annotated[bytes, Meta(min_length=KEY_BYTES, max_length=KEY_BYTES)]
    nonce: U64
    sig: Annotated[bytes, Meta(min_length=SIG_BYTES, max_length=SIG_BYTES)]


IDENTIFY = Procedure("identify", IdentifyArgs, IdentifyReply)

Ask = Callable[[PeerRef, IdentifyArgs], Awaitable[IdentifyReply]]


def _statement(challenge: bytes, responder: bytes, requester: bytes) -> bytes:
    return _STATEMENT + challenge + responder + requester


class Identities:
    def __init__(
        self,
        own: NodeKey | None,
        my_id: bytes,
        *,
        ask: Ask,
        size: Callable[[], int],
        present: Callable[[bytes], bool],
        tasks: TaskSet,
        work_bits: int = DEFAULT_WORK_BITS,
    ) -> None:
        """``own``: our key (None: this node neither proves nor asks for proof); ``ask``:
        IDENTIFY to a contact; ``size``: the network's size as we see it; ``present``: the
        contact is still in our routing table; ``work_bits``: the least work an ID needs."""
        self.own = own
        self._my_id = my_id
        self._ask = ask
        self._size = size
        self._present = present
        self._tasks = tasks
        self.work_bits = work_bits
        self._keys: OrderedDict[bytes, Ed25519PublicKey] = OrderedDict()
        self._checking: set[bytes] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.counts: Counter[str] = Counter()
        # Told when a contact has proven its ID (``members.Members.identity_proven``).
        self.on_proven: Callable[[bytes], None] = lambda _: None

    @property
    def required(self) -> bool:
        """Whether contacts must prove their IDs to count (an open network, with a key)."""
        return self.own is not None

    def key_of(self, node_id: bytes) -> Ed25519PublicKey | None:
        return self._keys.get(node_id)

    def proven(self, node_id: bytes) -> bool:
        return node_id in self._keys

    def attests(self, sender: bytes, signer: bytes | None) -> bool:
        """Whether a request that names ``sender`` (and carries ``signer``'s signature, if
        any) speaks for it: always on a wire where nobody proves IDs, else only signed by
        that very node."""
        return not self.required or signer == sender

    def sign(self, data: bytes) -> bytes:
        if self.own is None:
            raise RuntimeError("this node has no key")
        return self.own.sign(data)

    def verify(self, node_id: bytes, signature: bytes, data: bytes) -> bool:
        """Whether ``signature`` over ``data`` is by the proven ``node_id``'s key."""
        key = self._keys.get(node_id)
        return key is not None and verify(key, signature, data)

    # -- proving ours ------------------------------------------------------------------------

    async def serve(self, sender: PeerRef, args: IdentifyArgs) -> IdentifyReply:
        own = self.own
        if own is None:
            raise MessageError("this node has no key to prove its ID with")
        sig = own.sign(_statement(args.challenge, self._my_id, sender.id))
        return IdentifyReply(key=own.public, nonce=own.nonce, sig=sig)

    # -- checking theirs ---------------------------------------------------------------------

    def check(self, peer: PeerRef) -> None:
        """Ask ``peer`` to prove its ID, unless it has or is being asked; ``on_proven`` is
        called once it has."""
        if not self.required or peer.id in self._keys or peer.id in self._checking:
            return
        if len(self._checking) >= MAX_CHECKS:
            self.counts["limited"] += 1
            return
        self._checking.add(peer.id)
        self._idle.clear()
        self._tasks.spawn(self._check(peer), "identify")

    async def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until no check is under way."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)

    async def _check(self, peer: PeerRef) -> None:
        try:
            for wait in (0.0, *RETRY_S):
                if wait:
                    await asyncio.sleep(wait)
                if not self._present(peer.id):
                    return
                challenge = secrets.token_bytes(CHALLENGE_BYTES)
                try:
                    reply = await self._ask(peer, IdentifyArgs(challenge, bytes(PAD_BYTES)))
                except PeerTimeout:
                    continue
                except RemoteError as exc:
                    self.counts["unprovable"] += 1
                    log.debug("%s cannot prove its ID: %s", peer, exc)
                    return
                why = self._judge(peer.id, challenge, reply)
                if why is not None:
                    self.counts[why] += 1
                    log.info("%s did not prove its ID: %s", peer, why)
                    return
                self.counts["proven"] += 1
                self.on_proven(peer.id)
                return
            self.counts["silent"] += 1
        finally:
            self._checking.discard(peer.id)
            if not self._checking:
                self._idle.set()

    def _judge(self, node_id: bytes, challenge: bytes, reply: IdentifyReply) -> str | None:
        """Why ``reply`` does not prove ``node_id`` (None: it does; its key is kept)."""
        max_free = max_free_bits(self._size())
        why = check_proof(
            node_id, Proof(reply.key, reply.nonce), bits=self.work_bits, max_free=max_free
        )
        if why is not None:
            return why
        key = load_public(reply.key)
        if key is None or not verify(key, reply.sig, _statement(challenge, node_id, self._my_id)):
            return "bad signature"
        self._keys[node_id] = key
        self._keys.move_to_end(node_id)
        while len(self._keys) > KNOWN_KEYS:
            self._keys.popitem(last=False)
        return None
