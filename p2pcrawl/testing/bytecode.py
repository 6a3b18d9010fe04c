"""Peer processes started by tests and benchmarks load cached bytecode, as a user's do.

An installed package comes with its bytecode compiled, and a checkout run by hand writes it
on first import. With ``PYTHONDONTWRITEBYTECODE`` set (as in some containers and CI images)
and an editable install, nothing ever writes it, and every process a test or a benchmark
starts compiles the whole crawler from source again: 0.2 s of CPU each, of 0.65 s to import
it, and a chaos run of ``benchmarks/churn.py`` starts a dozen joiners on two cores. Compiling
once, here, makes each start cost what it costs a user.
"""

from __future__ import annotations

import compileall
import functools
import importlib.util
from pathlib import Path

__all__ = ["cache_bytecode"]

PACKAGES = ("p2pcrawl", "protocol", "storage")


@functools.cache
def cache_bytecode() -> bool:
    """Write the bytecode of the crawler's packages where imports look for it (once per
    process; a file already up to date is left alone). False if some could not be written
    (a read-only install: then it came with its bytecode)."""
    ok = True
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for where in spec.submodule_search_locations:
            ok = compileall.compile_dir(Path(where), quiet=2, workers=1) and ok
    return ok
