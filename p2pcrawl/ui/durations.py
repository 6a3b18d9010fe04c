"""Durations as people write them: ``30``, ``30s``, ``5m``, ``6h``, ``1d``, ``1.5h``.

Every flag that takes seconds takes these (``--delay 500ms`` is not one: seconds are the
smallest unit, ``--delay 0.5`` says it), and so does the TOML config, where a number is
seconds and a string may carry the suffix.
"""

from __future__ import annotations

import math
import re

__all__ = ["DURATION_HELP", "parse_duration"]

DURATION_HELP = "seconds, or with a unit: 30s, 5m, 6h, 1d"
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([smhd]?)\s*", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in ``text``; ValueError saying what a duration looks like otherwise."""
    found = _DURATION.fullmatch(text)
    if found is None:
        raise ValueError(f"not a duration: {text!r} ({DURATION_HELP})")
    seconds = float(found.group(1)) * _UNITS[found.group(2).lower()]
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {text!r}")
    return seconds
