"""Settings fields: a dataclass field that is also a command-line flag and a TOML key, with
its documented range, checked the same way however the settings were made.

:func:`option` writes a field's metadata (help, range, flag name, how it parses);
:func:`validate` checks every ranged field of a settings dataclass (its ``__post_init__``
calls it) and raises one clear :class:`SettingsError` naming the flag and the range;
:func:`bounds_text` is the range as ``join --help`` shows it. The settings themselves are in
:mod:`p2pcrawl.settings`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import field
from typing import Any

__all__ = [
    "DAY",
    "SettingsError",
    "bounds",
    "bounds_text",
    "flag_of",
    "option",
    "range_error",
    "validate",
]

DAY = 86400.0  # seconds: the upper bound of most intervals and timeouts


class SettingsError(ValueError):
    """A setting out of its range; the message names the flag and the range."""


def option(
    default: Any,
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    gt: float | None = None,
    flag: str | bool | None = None,
    size: bool = False,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    default_text: str | None = None,
    group: str | None = None,
    duration: bool | None = None,
) -> Any:
    """A settings field that is also a flag and a TOML key.

    ``flag`` defaults to the field name with dashes (``max_pages`` -> ``--max-pages``);
    ``default_text`` replaces the default shown in ``--help`` (an empty string shows none); a
    ``bool`` field is a switch (``flag="--no-warc"`` on a field that defaults to True makes the
    switch turn it off); a ``tuple[str, ...]`` field is a repeatable flag; ``flag=False``
    keeps a ranged field out of the command line; ``size`` takes ``500M``, ``2G`` as well as
    bytes; a ``duration`` (by default, a field whose metavar is ``S``) takes ``30s``, ``5m``,
    ``6h``, ``1d`` as well as seconds.
    """
    meta: dict[str, Any] = {"help": help}
    for key, value in (
        ("min", min),
        ("max", max),
        ("gt", gt),
        ("flag", flag),
        ("metavar", metavar),
        ("choices", choices),
        ("default_text", default_text),
        ("group", group),
    ):
        if value is not None:
            meta[key] = value
    if size:
        meta["size"] = True
    if duration or (duration is None and metavar == "S"):
        meta["duration"] = True
    return field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field[Any]) -> str:
    flag = f.metadata.get("flag")
    return flag if isinstance(flag, str) else "--" + f.name.replace("_", "-")


def range_error(f: dataclasses.Field[Any], value: object) -> str | None:
    """Why ``value`` is out of ``f``'s range (``None`` if it is in range or has none)."""
    lo, hi, gt = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("gt")
    if lo is None and hi is None and gt is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"not a number: {value!r}"
    whole = isinstance(f.default, int) and not isinstance(f.default, bool)
    if whole and not isinstance(value, int):
        return f"not a whole number: {value!r}"
    is_float = isinstance(value, float)
    if (
        (is_float and not math.isfinite(value))
        or (gt is not None and not value > gt)
        or (lo is not None and value < lo)
        or (hi is not None and value > hi)
    ):
        return _bound_text(f.metadata, is_float)
    return None


def _bound_text(meta: Mapping[str, Any], is_float: bool) -> str:
    """ "must be ..." for a field's range (one wording for flags, config keys and settings)."""
    lo, hi, gt = meta.get("min"), meta.get("max"), meta.get("gt")
    if gt is not None:
        rng = f"above {_n(gt)}" + (f" and at most {_n(hi)}" if hi is not None else "")
    elif lo is not None and hi is not None:
        rng = f"from {_n(lo)} to {_n(hi)}"
    elif lo is not None:
        rng = f"at least {_n(lo)}"
    else:  # only called for a field with a range
        rng = f"at most {_n(hi)}" if hi is not None else "in range"
    return f"must be a finite number {rng}" if is_float else f"must be {rng}"


def _n(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def bounds(cls: type, name: str) -> str:
    """The documented range of ``cls.name`` as text ("1 .. 4096"), "any" if it has none."""
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}[name]
    return bounds_text(meta)


def bounds_text(meta: Mapping[str, Any]) -> str:
    """A field's range as text ("1 .. 4096", "> 0 .. 300"), "any" if it has none."""
    lo, hi, gt = meta.get("min"), meta.get("max"), meta.get("gt")
    low = _n(lo) if lo is not None else (f"> {_n(gt)}" if gt is not None else None)
    high = _n(hi) if hi is not None else None
    if low and high:
        return f"{low} .. {high}"
    return low or (f"<= {high}" if high else "any")


def validate(obj: object) -> None:
    """Check every ranged field of a settings dataclass (called by ``__post_init__``)."""
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        why = range_error(f, getattr(obj, f.name))
        if why is not None:
            where = f"{type(obj).__name__}.{f.name}"
            raise SettingsError(f"{flag_of(f)}: {why}: {getattr(obj, f.name)!r} ({where})")
