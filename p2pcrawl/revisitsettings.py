"""Continuous mode's settings (``--revisit``, ``--revisit-min``, ``--revisit-max``): how
often crawled pages are revisited (docs/freshness.md). Kept apart from
:mod:`p2pcrawl.settings`, which re-exports them, so that module stays one screenful of
limits per role.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pcrawl.fields import DAY, SettingsError, option, validate

__all__ = ["RevisitSettings"]


_CONTINUOUS = "continuous mode"


@dataclass(frozen=True, slots=True)
class RevisitSettings:
    """Continuous mode: crawled pages are revisited with conditional GETs, each at an
    interval adapted to how often it changes (docs/freshness.md)."""

    every: float = option(
        0.0,
        "continuous mode: revisit each crawled page, first after this long (30s, 6h, 1d), "
        "then as often as it changes, at most about once per this long",
        min=0,
        max=365 * DAY,
        flag="--revisit",
        metavar="DURATION",
        default_text="0: off, one pass",
        duration=True,
        group=_CONTINUOUS,
    )
    min_interval: float = option(
        0.0,
        "the shortest revisit interval",
        min=0,
        max=365 * DAY,
        flag="--revisit-min",
        metavar="DURATION",
        default_text="--revisit / 4, at least 1s",
        duration=True,
        group=_CONTINUOUS,
    )
    max_interval: float = option(
        0.0,
        "the longest revisit interval (of a page that does not change)",
        min=0,
        max=10 * 365 * DAY,
        flag="--revisit-max",
        metavar="DURATION",
        default_text="16 x --revisit",
        duration=True,
        group=_CONTINUOUS,
    )
    # A page answering 404/410 (or nothing usable) this many revisits in a row is retired.
    retire_after: int = option(3, "misses before a page is retired", min=1, max=100, flag=False)
    # Due revisits held in the frontier at once; the rest wait in the visit history.
    window: int = option(2_000, "due revisits in RAM", min=1, max=10_000_000, flag=False)

    def __post_init__(self) -> None:
        validate(self)
        for name, flag in (("every", "--revisit"), ("min_interval", "--revisit-min")):
            value = getattr(self, name)
            if 0 < value < 1:
                raise SettingsError(f"{flag}: must be 0 (off) or at least 1s: {value!r}")
        if not self.every and (self.min_interval or self.max_interval):
            raise SettingsError("--revisit-min and --revisit-max need --revisit (continuous mode)")
        if self.max_interval and self.max_interval < max(1.0, self.min_interval):
            raise SettingsError(
                f"--revisit-max ({self.max_interval:g}s) is shorter than --revisit-min "
                f"({self.low:g}s)"
            )

    @property
    def enabled(self) -> bool:
        return self.every > 0

    @property
    def low(self) -> float:
        """The shortest interval, seconds."""
        return self.min_interval or max(1.0, self.every / 4)

    @property
    def high(self) -> float:
        """The longest interval, seconds (never below the shortest)."""
        return max(self.max_interval or 16 * self.every, self.low)
