"""Choosing a joiner's node ID so that every peer owns a fair share: pure math, no sockets.

Why IDs matter. Under Kademlia's XOR metric (§2.1) the owner of a key is found by walking the
binary trie of live node IDs from the top bit down: follow the key's bit where some ID continues
that way, else take the other branch. A node's share of the key space is therefore ``2**-b``,
where ``b`` is the number of branchings on its path: the number of distinct lengths of the
prefixes it shares with the other IDs. With IDs drawn at random, ``b`` varies from node to node
and the largest share is about ``ln N / N`` of the space, twice the mean already at 8 peers.

The fix (after Byers, Considine and Mitzenmacher, "Simple load balancing for distributed hash
tables", 2003: a few choices instead of one): a joiner does not draw its ID blindly. It picks
the known node whose region is the largest (or, when loads are known, the most loaded one) and
takes an ID that halves exactly that node's region: it copies that node's ID down to a bit below
the node's last branching and flips that bit. No other node's region changes. Joining
peers keep filling the largest holes, so with a power-of-two number of peers every share is
``1 / N``.

Which bit to flip is free: any bit below the last branching halves the key space. When the
split node reports how its load falls on each bit (``bit_loads``), the joiner flips the bit
that divides the load most evenly: a host partition's pages are heavy-tailed (a few hosts hold
most pages), and halving key space alone leaves those hosts where they fall.

The chosen ID is saved like any other (the data directory keeps it across restarts), so this
only changes how a brand-new peer picks it.
"""

from __future__ import annotations

import bisect
import contextlib
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from random import Random

from protocol.ownership import ID_BYTES

__all__ = [
    "ID_BITS",
    "IdSpace",
    "bit_loads",
    "choose_join_id",
    "common_prefix",
    "key_space_share",
    "split_id",
]

ID_BITS = 8 * ID_BYTES
SPARE_BITS = 32  # a split never goes deeper than this many bits above the end of the ID
SPLIT_TOLERANCE = 0.02  # share of the load by which a shallower split may be worse


def _int(i: bytes) -> int:
    if len(i) != ID_BYTES:
        raise ValueError(f"IDs are {ID_BYTES} bytes, got {len(i)}")
    return int.from_bytes(i, "big")


def _bytes(i: int) -> bytes:
    return i.to_bytes(ID_BYTES, "big")


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bits two IDs share (``ID_BITS`` if equal)."""
    return ID_BITS - (_int(a) ^ _int(b)).bit_length()


def _bit(i: int, depth: int) -> int:
    """Bit ``depth`` of an ID, counted from the most significant (bit 0)."""
    return (i >> (ID_BITS - 1 - depth)) & 1


def key_space_share(node: bytes, others: Iterable[bytes]) -> float:
    """The fraction of all keys ``node`` owns among ``others`` (itself excluded if present)."""
    lengths = {common_prefix(node, o) for o in others if o != node}
    return 2.0 ** -len(lengths)


class IdSpace:
    """A fixed set of node IDs: who owns a key, and what share of the key space each holds.

    ``owner`` walks the ID trie over a sorted list (one bisection per branching), so it costs
    O(log^2 N) rather than the O(N) of ``ownership.closest``; both name the same node.
    """

    def __init__(self, ids: Iterable[bytes]) -> None:
        self._ids = sorted({_int(i) for i in ids})
        if not self._ids:
            raise ValueError("an ID space needs at least one node")

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> list[bytes]:
        return [_bytes(i) for i in self._ids]

    def add(self, node: bytes) -> None:
        """Insert one more node (a join), keeping the order."""
        n = _int(node)
        at = bisect.bisect_left(self._ids, n)
        if at == len(self._ids) or self._ids[at] != n:
            self._ids.insert(at, n)

    def neighbours(self, node: bytes) -> list[bytes]:
        """The IDs next to ``node`` in numeric order: among them is every ID sharing the
        longest prefix with it, so ``split_id(node, neighbours(node))`` needs no more."""
        at = bisect.bisect_left(self._ids, _int(node))
        ids = self._ids
        found = (ids[j] for j in (at - 1, at, at + 1) if 0 <= j < len(ids))
        return [_bytes(i) for i in found if i != _int(node)]

    def owner(self, key: bytes) -> bytes:
        """The node XOR-closest to ``key`` (Kademlia §2.1)."""
        k = _int(key)
        ids = self._ids
        lo, hi, depth = 0, len(ids), 0
        while hi - lo > 1:
            # All of ids[lo:hi] share their first ``depth`` bits; split them on the next one.
            shift = ID_BITS - 1 - depth
            ones_from = ((ids[lo] >> (shift + 1)) << (shift + 1)) | (1 << shift)
            mid = bisect.bisect_left(ids, ones_from, lo, hi)
            if lo < mid < hi:  # a branching: follow the key's bit
                lo, hi = (mid, hi) if (k >> shift) & 1 else (lo, mid)
            depth += 1
        return _bytes(ids[lo])

    def shares(self) -> dict[bytes, float]:
        """Each node's fraction of the key space; they sum to 1."""
        out: dict[bytes, float] = {}
        stack = [(0, len(self._ids), 0, 1.0)]
        ids = self._ids
        while stack:
            lo, hi, depth, share = stack.pop()
            if hi - lo == 1:
                out[_bytes(ids[lo])] = share
                continue
            shift = ID_BITS - 1 - depth
            ones_from = ((ids[lo] >> (shift + 1)) << (shift + 1)) | (1 << shift)
            mid = bisect.bisect_left(ids, ones_from, lo, hi)
            if lo < mid < hi:
                stack.append((lo, mid, depth + 1, share / 2))
                stack.append((mid, hi, depth + 1, share / 2))
            else:
                stack.append((lo, hi, depth + 1, share))
        return out


def bit_loads(keyed: Iterable[tuple[bytes, float]]) -> tuple[float, list[float]]:
    """A node's load profile for ``split_id``: its total load, and for every bit position the
    load of the keys whose bit is 1 there. 160 numbers describe every possible split."""
    total = 0.0
    ones = [0.0] * ID_BITS
    for key, load in keyed:
        k = _int(key)
        total += load
        for depth in range(ID_BITS):
            if (k >> (ID_BITS - 1 - depth)) & 1:
                ones[depth] += load
    return total, ones


def _random_bits(n: int, rng: Random | None) -> int:
    if n <= 0:
        return 0
    return rng.getrandbits(n) if rng is not None else secrets.randbits(n)


def split_id(
    node: bytes,
    others: Iterable[bytes],
    rng: Random | None = None,
    profile: tuple[float, Sequence[float]] | None = None,
    max_depth: int | None = None,
) -> bytes:
    """An ID that takes half of ``node``'s region and leaves every other region as it was.

    The new ID shares ``node``'s bits down to some depth ``c`` below the node's last branching,
    has bit ``c`` flipped, and random bits after it. With ``profile`` (``bit_loads`` of the
    node's keys) ``c`` is the shallowest depth that splits the node's load within
    ``SPLIT_TOLERANCE`` of the most even split; without it, the first free depth. ``c`` is at
    most ``max_depth`` (an open network's IDs may choose only so many bits: ``nodekey``).
    ``rng`` None draws from the OS CSPRNG.
    """
    n = _int(node)
    deepest = max((common_prefix(node, o) for o in others if o != node), default=-1)
    last = ID_BITS - SPARE_BITS if max_depth is None else min(ID_BITS - SPARE_BITS, max_depth + 1)
    free = range(deepest + 1, last)
    if not free:
        raise ValueError("this node's region cannot be split further")
    depth = free[0]
    if profile is not None:
        total, ones = profile
        if len(ones) != ID_BITS:
            raise ValueError(f"a load profile has {ID_BITS} entries, got {len(ones)}")

        def imbalance(c: int) -> float:
            # The joiner takes the keys whose bit c differs from the node's.
            taken = ones[c] if _bit(n, c) == 0 else total - ones[c]
            return abs(2 * taken - total)

        # The shallowest depth within the tolerance of the best: a deep split works as well
        # today but spends bits that later splits of these two regions need.
        best = min(imbalance(c) for c in free)
        depth = next(c for c in free if imbalance(c) <= best + SPLIT_TOLERANCE * total)
    shift = ID_BITS - 1 - depth
    prefix = (n >> (shift + 1)) << (shift + 1)
    flipped = (1 - _bit(n, depth)) << shift
    return _bytes(prefix | flipped | _random_bits(shift, rng))


def choose_join_id(
    known: Collection[bytes],
    rng: Random | None = None,
    *,
    candidates: Iterable[bytes] | None = None,
    loads: Mapping[bytes, float] | None = None,
    profile_of: Callable[[bytes], tuple[float, Sequence[float]] | None] | None = None,
    max_depth: int | None = None,
) -> bytes:
    """The ID a new peer should take, given the node IDs it has learned.

    ``candidates`` are the nodes whose regions the joiner may split (default: all of
    ``known``). In a network larger than a routing table, pass the owners of a few random probe
    keys, with everything those lookups returned in ``known``: a probe lands in a region with
    probability equal to its share, and the lookup's closest nodes are exactly the ones that
    determine that share. With ``loads`` the most loaded candidate is split (largest key-space
    share among equals); otherwise the one with the largest share. ``profile_of(node)`` (the
    chosen node's ``bit_loads``, asked for once; None if unknown) lets the split follow the
    load. A candidate whose region cannot be split is passed over for the next; no known
    node, or none that can be split: a random ID. ``max_depth``: as for ``split_id``.
    """
    pool = list(candidates) if candidates is not None else list(known)
    if not pool:
        return _bytes(_random_bits(ID_BITS, rng))
    everyone = set(known) | set(pool)

    def rank(node: bytes) -> tuple[float, float, bytes]:
        share = key_space_share(node, everyone)
        load = loads.get(node, 0.0) if loads is not None else 0.0
        return (load, share, node)

    # The best-ranked region that can still be split. One that cannot (another ID shares all
    # but its spare bits: a report may name any IDs) must not stop the join; the next best
    # region is split instead, and with none left the joiner takes a random ID.
    for target in sorted(pool, key=rank, reverse=True):
        profile = profile_of(target) if profile_of is not None else None
        with contextlib.suppress(ValueError):
            return split_id(target, everyone, rng, profile, max_depth)
    return _bytes(_random_bits(ID_BITS, rng))
