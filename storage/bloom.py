"""Dynamic splittable Bloom filter (DSBF).

After Yuan, Yang and Liu, "Research on Detecting Duplicated URL in Dual-Structural Network", §3.

A tree: the root and every inner node hold a *locating hash* that picks one of their
children; leaves hold ordinary Bloom filters (``rbloom.Bloom``) of a fixed capacity. A
lookup walks H locating hashes and then asks one leaf, so it costs O(k + H) whatever the
total size, and capacity grows geometrically with the height.

Locating hashes. Items are already uniform 64-bit fingerprints, so a level's locating hash
is just a 16-bit slice of the fingerprint taken modulo the node's fan-out, with a different
slice per level (the DSBF paper: "the locating hashes of different levels must differ", otherwise
every item routed to child 3 would go on to child 3 again and the other children would stay
empty). Slicing costs two integer operations, which matters on the lookup hot path.

Splits. When a leaf's count reaches its capacity (the count at which rbloom's sizing puts
its false-positive rate at f_max) the next insert would push it past f_max, so the leaf
becomes an inner node with ``fanout`` fresh leaves. A Bloom filter cannot give its elements
back, so we keep the paper's in-progress state: the old filter stays attached to the new
inner node, read-only; inserts go to the children and lookups check both ("during a split,
inserts go to the children and lookups check both"). The split finishes when the owner of
the exact fingerprints re-hashes them into the children (:meth:`SplittableBloom.begin_rehash`,
driven by :class:`storage.done.DoneRecord` from its SQLite table); only then is the old
filter dropped. A filter nobody re-hashes stays correct (never a false negative) but keeps
the old filter's memory and adds its false-positive rate on that path.

Threads. One thread mutates (the done record's worker thread); any thread may look up.
Structural changes are single reference stores (a finished inner node replaces the leaf in
its parent's child list; a re-hashed node's old filter is dropped only after its children
hold everything), so a concurrent lookup sees either the old or the new shape and never
misses an item that was added before the lookup started.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rbloom import Bloom

__all__ = [
    "MAX_HEIGHT",
    "Rehash",
    "SplittableBloom",
    "false_positive_rate",
    "optimal_k",
]

# Bit offset of the 16-bit slice each level's locating hash reads (the root is level 0).
# The first four partition the 64 bits; the last three straddle those slices, so their
# residues mod the fan-out are still unrelated to the earlier levels'.
_SHIFTS = (48, 32, 16, 0, 40, 24, 8)
MAX_HEIGHT = len(_SHIFTS)  # leaves this deep no longer split; they only fill up
_SLICE = 0xFFFF
_TWO_64 = 1 << 64


def optimal_k(m_bits: int, n: int) -> int:
    """The number of hash functions that minimises the false-positive rate: (m/n) ln 2."""
    if m_bits <= 0 or n <= 0:
        raise ValueError("m_bits and n must be positive")
    return max(1, round(m_bits / n * math.log(2)))


def false_positive_rate(m_bits: int, n: int, k: int) -> float:
    """Expected false-positive rate of m bits holding n items with k hashes:
    (1 - e^(-kn/m))^k (the DSBF paper, eq. 1)."""
    if m_bits <= 0 or k <= 0:
        raise ValueError("m_bits and k must be positive")
    if n <= 0:
        return 0.0
    return float((1.0 - math.exp(-k * n / m_bits)) ** k)


# The filter held by nodes that have none (the root, re-hashed inner nodes): a lookup in it
# is always False, which lets the hot path test ``frozen`` without a None check first.
_NO_FILTER = Bloom(1, 0.5)


class _Node:
    """A leaf (``children is None``) or an inner node of the DSBF."""

    __slots__ = ("bloom", "children", "count", "depth", "fan", "frozen", "shift")

    def __init__(
        self,
        depth: int,
        bloom: Bloom,
        children: list[_Node] | None = None,
        *,
        frozen: bool = False,
        count: int = 0,
    ) -> None:
        self.depth = depth
        self.bloom = bloom  # a leaf's filter, or an inner node's read-only pre-split filter
        self.children = children
        self.fan = len(children) if children is not None else 0
        self.shift = _SHIFTS[depth] if depth < MAX_HEIGHT else 0
        self.frozen = frozen  # True while ``bloom`` still has to be consulted on lookups
        self.count = count  # items inserted into this leaf (inner nodes: at split time)


class SplittableBloom:
    """A DSBF over unsigned 64-bit fingerprints. Pure: no I/O, no threads of its own.

    ``root_fanout`` (default ``fanout``) is the paper's initial c: choose it as
    ``ceil(expected / leaf_capacity)`` so that the expected number of items fits without a
    split (the DSBF paper, eq. 5).
    """

    def __init__(
        self,
        leaf_capacity: int = 1 << 20,
        fp_rate: float = 0.001,
        fanout: int = 3,
        *,
        root_fanout: int | None = None,
    ) -> None:
        if leaf_capacity <= 0:
            raise ValueError("leaf_capacity must be positive")
        if not 0.0 < fp_rate < 1.0:
            raise ValueError("fp_rate must be between 0 and 1")
        if fanout < 2:
            raise ValueError("fanout must be at least 2 for a split to add capacity")
        first = fanout if root_fanout is None else root_fanout
        if first < 1:
            raise ValueError("root_fanout must be at least 1")
        self.leaf_capacity = leaf_capacity
        self.fp_rate = fp_rate
        self.fanout = fanout
        self._n = 0
        self._pending: list[_Node] = []  # split nodes no rehash pass has claimed yet
        self._root = _Node(0, _NO_FILTER, [self._leaf(1) for _ in range(first)])

    def _leaf(self, depth: int) -> _Node:
        return _Node(depth, Bloom(self.leaf_capacity, self.fp_rate))

    # -- lookups: the hot path, kept flat on purpose -------------------------------------

    def __contains__(self, fp: int) -> bool:
        node = self._root
        while (children := node.children) is not None:
            if node.frozen and fp in node.bloom:
                return True
            node = children[((fp >> node.shift) & _SLICE) % node.fan]
        return fp in node.bloom

    def contains_many(self, fps: Sequence[int]) -> list[bool]:
        root = self._root
        out: list[bool] = []
        append = out.append
        for fp in fps:
            node = root
            hit = False
            while (children := node.children) is not None:
                if node.frozen and fp in node.bloom:
                    hit = True
                    break
                node = children[((fp >> node.shift) & _SLICE) % node.fan]
            else:
                hit = fp in node.bloom
            append(hit)
        return out

    # -- inserts ---------------------------------------------------------------------------

    def add(self, fp: int) -> None:
        if not 0 <= fp < _TWO_64:
            raise ValueError(f"fp must be an unsigned 64-bit integer, got {fp}")
        self._insert(fp, True)

    def add_many(self, fps: Iterable[int]) -> None:
        # add() inlined: this is the loop that rebuilds a 10M filter on every open.
        root = self._root
        capacity = self.leaf_capacity
        for fp in fps:
            if not 0 <= fp < _TWO_64:
                raise ValueError(f"fp must be an unsigned 64-bit integer, got {fp}")
            parent = node = root
            index = 0
            while (children := node.children) is not None:
                parent = node
                index = ((fp >> node.shift) & _SLICE) % node.fan
                node = children[index]
            bloom = node.bloom
            if fp in bloom:
                continue
            bloom.add(fp)
            node.count += 1
            self._n += 1
            if node.count >= capacity and node.depth < MAX_HEIGHT:
                self._split(parent, index, node)

    def _insert(self, fp: int, counted: bool) -> None:
        parent = node = self._root
        index = 0
        while (children := node.children) is not None:
            parent = node
            index = ((fp >> node.shift) & _SLICE) % node.fan
            node = children[index]
        bloom = node.bloom
        # Counting only items the leaf does not already (seem to) hold keeps the split
        # trigger honest when the same fingerprint arrives twice, e.g. once from a normal
        # insert and once more from a rehash pass.
        if fp in bloom:
            return
        bloom.add(fp)
        node.count += 1
        if counted:
            self._n += 1
        if node.count >= self.leaf_capacity and node.depth < MAX_HEIGHT:
            self._split(parent, index, node)

    def _split(self, parent: _Node, index: int, leaf: _Node) -> None:
        children = [self._leaf(leaf.depth + 1) for _ in range(self.fanout)]
        inner = _Node(leaf.depth, leaf.bloom, children, frozen=True, count=leaf.count)
        assert parent.children is not None
        # One reference store: a concurrent lookup sees the old leaf or the new node, and
        # both still hold every item inserted so far.
        parent.children[index] = inner
        self._pending.append(inner)

    # -- finishing splits ----------------------------------------------------------------

    @property
    def pending_rehash(self) -> int:
        """Split nodes whose old filter no rehash pass has claimed yet."""
        return len(self._pending)

    def begin_rehash(self) -> Rehash | None:
        """Claim every unfinished split; feed the pass *all* fingerprints ever added (a
        superset is fine), then :meth:`Rehash.finish` drops the old filters.

        Fingerprints added after this call need not be fed again: inserts already go to
        the children. Returns None when no split is waiting."""
        if not self._pending:
            return None
        nodes, self._pending = self._pending, []
        return Rehash(self, nodes)

    def rehash(self, fps: Iterable[int]) -> None:
        """Finish every pending split from a full listing of the fingerprints."""
        rehash = self.begin_rehash()
        if rehash is not None:
            rehash.feed(fps)
            rehash.finish()

    # -- introspection -------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def _nodes(self) -> Iterable[_Node]:
        stack = [self._root]
        while stack:
            node = stack.pop()
            yield node
            if node.children is not None:
                stack.extend(node.children)

    @property
    def height(self) -> int:
        """Depth of the deepest leaf (a fresh filter has height 1)."""
        return max(n.depth for n in self._nodes() if n.children is None)

    @property
    def leaves(self) -> int:
        return sum(1 for n in self._nodes() if n.children is None)

    @property
    def nbytes(self) -> int:
        """Bytes of filter bits held, old read-only filters of unfinished splits included."""
        return sum(
            n.bloom.size_in_bits // 8 for n in self._nodes() if n.children is None or n.frozen
        )


class Rehash:
    """One pass that finishes the splits pending when it began (see the module docstring)."""

    def __init__(self, bloom: SplittableBloom, nodes: list[_Node]) -> None:
        self._bloom = bloom
        self._nodes = nodes  # keeps the nodes alive, so their id()s stay unique
        self._targets = frozenset(id(n) for n in nodes)
        self.fed = 0

    def feed(self, fps: Iterable[int]) -> None:
        """Re-insert those of ``fps`` that route through a split node of this pass."""
        targets = self._targets
        root = self._bloom._root
        insert = self._bloom._insert
        for fp in fps:
            node = root
            while (children := node.children) is not None:
                if id(node) in targets:
                    insert(fp, False)
                    self.fed += 1
                    break
                node = children[((fp >> node.shift) & _SLICE) % node.fan]

    def finish(self) -> None:
        """Drop the old filters: the children now hold everything they held."""
        for node in self._nodes:
            # ``frozen`` first: a lookup that still reads True then finds _NO_FILTER and
            # goes on to the children, which are complete by now.
            node.frozen = False
            node.bloom = _NO_FILTER
