"""Node IDs a stranger cannot place at will: an open network's IDs come from a public key.

After "S/Kademlia: A Practicable Approach Towards Secure Key-Based Routing" (Baumgart and
Mies, 2007, §4.1-4.2): each node holds an Ed25519 key pair, signs what it says with it, and
its node ID is derived from the public key through a crypto puzzle, so an ID costs work and
cannot be answered for by anyone without the private key.

S/Kademlia takes the whole ID from a hash of the key. p2pcrawl's joiner instead takes the ID
that halves the busiest peer's region (``balance``), which is a choice of its leading bits:
about log2(N) + 1 of them, as many as owning any chosen host needs in a network of N. So the
two are combined, and the rest is bounded:

* ``work = SHA-256(ID_DOMAIN | public key | nonce)`` must start with ``bits`` zero bits (the
  static puzzle: 2**bits hashes on average, paid once per key);
* the ID's leading ``free`` bits are the node's own choice, every bit after them is
  ``work``'s last 20 bytes (``material``): the region it joins is chosen, the rest is not;
* a verifier refuses an ID that chose more than ``max_free_bits`` of the network's size
  (``ceil(log2 N) + FREE_SLACK``): enough to split any region a balanced network has, and
  nowhere near the 159 bits that sit "next to" a host's key.

So an ID may land in the region of its choice, as every balance joiner does, but sitting
``b`` bits beyond its free ones from a chosen key costs ``2**b`` puzzles: each nonce that
solves the puzzle gives one draw of the remaining bits. ``benchmarks/identities.py`` measures
it. Pure functions and one small class; the exchange that proves an ID is ``identities``.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from protocol.ownership import ID_BYTES

__all__ = [
    "DEFAULT_WORK_BITS",
    "FREE_SLACK",
    "ID_BITS",
    "KEY_BYTES",
    "SIG_BYTES",
    "NodeKey",
    "Proof",
    "check_proof",
    "chosen_bits",
    "estimate_size",
    "free_bits",
    "joiner_depth",
    "load_public",
    "material",
    "max_free_bits",
    "place",
    "solve",
    "verify",
    "work_hash",
]

ID_BITS = 8 * ID_BYTES
KEY_BYTES = 32  # an Ed25519 public key, and the private key's seed
SIG_BYTES = 64
NONCE_BYTES = 8
# 2**16 hashes: 0.1-0.2 s once per key here, and the price of each extra bit an attacker
# wants beyond its free ones (``benchmarks/identities.py``).
DEFAULT_WORK_BITS = 16
# Free bits beyond ceil(log2 N): a balance join splits one bit below a region's prefix, the
# most loaded region may sit a few bits deeper than the average, and the joiner's view of N
# and the verifier's differ. A joiner keeps half of this in reserve (``joiner_depth``).
FREE_SLACK = 4
ID_DOMAIN = b"p2pcrawl/node-id/1"
UNCHOSEN_BITS = 32  # no split goes deeper (``balance.SPARE_BITS``)


def work_hash(public: bytes, nonce: int) -> bytes:
    return hashlib.sha256(ID_DOMAIN + public + nonce.to_bytes(NONCE_BYTES, "big")).digest()


def _leading_zeros(digest: bytes) -> int:
    value = int.from_bytes(digest, "big")
    return 8 * len(digest) - value.bit_length()


def solve(public: bytes, bits: int, start: int = 0) -> int:
    """The first nonce from ``start`` whose work hash starts with ``bits`` zero bits."""
    if not 0 <= bits <= 64:
        raise ValueError("work bits must be from 0 to 64")
    base = hashlib.sha256(ID_DOMAIN + public)
    limit = 1 << (64 - bits)  # the top 8 bytes, read as an int, must be below this
    nonce = start
    while True:
        h = base.copy()
        h.update(nonce.to_bytes(NONCE_BYTES, "big"))
        if int.from_bytes(h.digest()[:8], "big") < limit:
            return nonce
        nonce += 1


def material(public: bytes, nonce: int) -> bytes:
    """The bits of an ID its holder does not choose."""
    return work_hash(public, nonce)[-ID_BYTES:]


def free_bits(node_id: bytes, mat: bytes) -> int:
    """How many leading bits of ``node_id`` were chosen: all the bits after them must be the
    material's (0 when the ID is the material itself)."""
    diff = int.from_bytes(node_id, "big") ^ int.from_bytes(mat, "big")
    if not diff:
        return 0
    trailing = (diff & -diff).bit_length() - 1
    return ID_BITS - trailing


def place(mat: bytes, target: bytes, free: int) -> bytes:
    """The ID with ``target``'s leading ``free`` bits and the material's after them."""
    if not 0 <= free <= ID_BITS:
        raise ValueError(f"free bits must be from 0 to {ID_BITS}")
    low = (1 << (ID_BITS - free)) - 1
    value = (int.from_bytes(target, "big") & ~low) | (int.from_bytes(mat, "big") & low)
    return value.to_bytes(ID_BYTES, "big")


def chosen_bits(node_id: bytes, others: Iterable[bytes]) -> int:
    """How many leading bits decide which keys ``node_id`` owns among ``others``: one past
    the longest prefix it shares with any of them (what a joiner must choose)."""
    mine = int.from_bytes(node_id, "big")
    shared = [ID_BITS - (mine ^ int.from_bytes(o, "big")).bit_length() for o in others]
    return min(ID_BITS, max(shared, default=-1) + 1)


def max_free_bits(network_size: int) -> int:
    """The most leading bits an ID may choose in a network of about ``network_size`` nodes."""
    return math.ceil(math.log2(max(1, network_size))) + FREE_SLACK


def joiner_depth(network_size: int) -> int:
    """The deepest split a joiner proposes (it keeps half the slack for the verifiers' views
    of the network, which may be smaller than its own)."""
    return max_free_bits(network_size) - FREE_SLACK // 2 - 1


def estimate_size(me: bytes, others: Iterable[bytes], k: int) -> int:
    """The network's size as a node sees it: everyone it knows while that is fewer than a
    k-bucket, else from how close its ``k`` nearest contacts are (``k`` IDs in a share ``d /
    2**160`` of the space around it: about ``k * 2**160 / d`` nodes in all), but never more
    than ``k * 2**(known / k)``. A routing table holds about ``k`` contacts for each bit of
    log2(N / k), so that bound is about twice the size of an honest network, while IDs
    placed next to this node, which make the distance estimate as large as they like, raise
    it by one bit for every ``k`` of them."""
    mine = int.from_bytes(me, "big")
    distances = sorted(int.from_bytes(o, "big") ^ mine for o in others if o != me)
    known = len(distances) + 1
    if len(distances) < k or k < 1:
        return known
    kth = max(1, distances[k - 1])
    by_count = k << min(ID_BITS, known // k)
    return max(known, min((k << ID_BITS) // kth, by_count))


@dataclass(frozen=True, slots=True)
class Proof:
    """What shows that a node may answer for its ID: its public key and its puzzle's nonce."""

    public: bytes
    nonce: int


def check_proof(node_id: bytes, proof: Proof, *, bits: int, max_free: int) -> str | None:
    """Why ``proof`` does not prove ``node_id`` (None: it does)."""
    if len(proof.public) != KEY_BYTES or not 0 <= proof.nonce < 1 << (8 * NONCE_BYTES):
        return "malformed"
    digest = work_hash(proof.public, proof.nonce)
    if _leading_zeros(digest) < bits:
        return "too little work"
    if free_bits(node_id, digest[-ID_BYTES:]) > max_free:
        return "too many chosen bits"
    return None


def load_public(public: bytes) -> Ed25519PublicKey | None:
    try:
        return Ed25519PublicKey.from_public_bytes(public)
    except ValueError:
        return None


def verify(key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


class NodeKey:
    """This node's key pair, with the nonce that solves its puzzle."""

    def __init__(self, seed: bytes, nonce: int) -> None:
        if len(seed) != KEY_BYTES:
            raise ValueError(f"a key seed is {KEY_BYTES} bytes")
        self.seed = seed
        self.nonce = nonce
        self._private = Ed25519PrivateKey.from_private_bytes(seed)
        self.public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.material = material(self.public, nonce)

    @classmethod
    def generate(cls, bits: int = DEFAULT_WORK_BITS) -> NodeKey:
        """A new key and its puzzle solved: CPU-bound, about ``2**bits`` hashes (run it in a
        thread)."""
        seed = secrets.token_bytes(KEY_BYTES)
        public = Ed25519PrivateKey.from_private_bytes(seed).public_key()
        raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
        return cls(seed, solve(raw, bits))

    @property
    def proof(self) -> Proof:
        return Proof(self.public, self.nonce)

    @property
    def work_bits(self) -> int:
        return _leading_zeros(work_hash(self.public, self.nonce))

    def node_id(self, target: bytes | None = None, free: int = 0) -> bytes:
        """Our ID: the material, with ``target``'s leading ``free`` bits if given."""
        return self.material if target is None else place(self.material, target, free)

    def answers_for(self, node_id: bytes) -> bool:
        """Whether ``node_id`` is one of this key's IDs: its last ``UNCHOSEN_BITS`` bits at
        least are the material's (an ID made for another key matches by chance once in
        2**32)."""
        return free_bits(node_id, self.material) <= ID_BITS - UNCHOSEN_BITS

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)
