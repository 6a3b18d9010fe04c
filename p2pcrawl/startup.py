"""The ``p2pcrawl`` command's entry point: the package imported with the cyclic garbage
collector paused, and what the imports made frozen out of its reach.

Every command imports some 550 modules, and none of what they make (modules, classes,
functions) is garbage; the collector's passes over it, during the imports and once more as
the interpreter exits, cost a short command about a fifth of its CPU: ``p2pcrawl --help``
took 0.53-0.60 s of CPU and takes 0.42-0.48 s (ten runs, twice each). A peer's CPU until it
is up is the same within noise (0.68-0.72 s for a joiner of a keyed network, either way);
frozen, those objects are not walked again by each full collection while it crawls.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    gc.disable()
    try:
        from p2pcrawl.ui import main as run
    finally:
        gc.freeze()
        gc.enable()
    return run(argv)
