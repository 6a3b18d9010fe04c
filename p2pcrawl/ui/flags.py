"""The settings as flags: each settings field with ``help`` metadata becomes a flag.

p2pcrawl/settings.py declares every setting once (its flag, help, range and check, through
``p2pcrawl.fields.option``); this module turns those declarations into argparse flags with
their converters and range checks (``setting_flags``, ``add_setting``), and turns parsed
options back into the settings dataclasses (``settings_from``). The command line that holds
them, and the TOML file that can stand in for it, are ``p2pcrawl.ui.options``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from typing import Any

from p2pcrawl.crawl import UrlPatterns
from p2pcrawl.settings import (
    CrawlSettings,
    PeerSettings,
    SettingsError,
    bounds_text,
    flag_of,
    range_error,
)
from p2pcrawl.ui.durations import parse_duration

__all__ = [
    "SettingFlag",
    "UsageError",
    "add_setting",
    "positive_float",
    "positive_int",
    "setting_flags",
    "settings_from",
]


class UsageError(Exception):
    """A bad flag, config entry or setting: the command prints it as one line and exits 2."""


def _number(kind: type[int] | type[float], f: dataclasses.Field[Any]) -> Any:
    """An argparse type: a finite number of ``kind`` within ``f``'s range, if it has one."""
    what = "an integer" if kind is int else "a number"
    duration = bool(f.metadata.get("duration"))

    def convert(v: str) -> int | float:
        try:
            n = kind(v)
        except ValueError:
            try:
                if not duration:
                    raise
                n = parse_duration(v)
            except ValueError as exc:
                text = str(exc) if duration else f"not {what}: {v!r}"
                raise argparse.ArgumentTypeError(text) from None
        why = range_error(f, n)
        if why is not None:
            raise argparse.ArgumentTypeError(f"{why}: {v!r}")
        return n

    return convert


def positive_int(v: str) -> int:
    """An argparse type for flags that are not settings: an integer of at least 1."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {v!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {v!r}")
    return n


def positive_float(v: str) -> float:
    """An argparse type for flags that are not settings: a finite duration above 0."""
    try:
        n = parse_duration(v)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not (0 < n < math.inf):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0: {v!r}")
    return n


def _size(f: dataclasses.Field[Any]) -> Any:
    """An argparse type: bytes, with an optional K, M, G or T suffix (powers of 1024)."""

    def convert(v: str) -> int:
        text = v.strip().upper().removesuffix("B").removesuffix("I")
        scale = 1
        if text[-1:] in _SIZE_SUFFIXES:
            scale = _SIZE_SUFFIXES[text[-1]]
            text = text[:-1]
        try:
            n = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a size: {v!r} (bytes, or 500M, 2G...)") from None
        if not 0 <= n < math.inf:
            raise argparse.ArgumentTypeError(f"must be a non-negative size: {v!r}")
        why = range_error(f, int(n * scale))
        if why is not None:
            raise argparse.ArgumentTypeError(f"{why}: {v!r}")
        return int(n * scale)

    return convert


_SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


# -- flags generated from the settings dataclasses --------------------------------------------

# The settings the join command builds; a field with ``help`` metadata is a flag and a TOML
# key (p2pcrawl/settings.py, ``option``). Nested settings dataclasses are walked into.
SETTINGS_ROOTS: tuple[type, ...] = (CrawlSettings, PeerSettings)


@dataclasses.dataclass(frozen=True, slots=True)
class SettingFlag:
    """One settings field exposed as a flag: where it lives and how it parses."""

    owner: type  # the dataclass that holds the field
    field: dataclasses.Field[Any]
    kind: Any  # int, float, str, bool or tuple
    choices: tuple[str, ...] | None

    @property
    def flag(self) -> str:
        return flag_of(self.field)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _kind(hint: Any) -> tuple[Any, tuple[str, ...] | None]:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return str, tuple(str(a) for a in typing.get_args(hint))
    if origin is tuple:
        return tuple, None
    if hint in (int, float, str, bool):
        return hint, None
    raise TypeError(f"no flag for a setting of type {hint!r}")


def setting_flags(roots: tuple[type, ...] = SETTINGS_ROOTS) -> list[SettingFlag]:
    """Every settings field that is a flag, in declaration order, nested ones in place."""
    out: list[SettingFlag] = []

    def walk(cls: type) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint)  # type: ignore[arg-type]
            elif "help" in f.metadata and f.metadata.get("flag") is not False:
                kind, choices = _kind(hint)
                out.append(SettingFlag(cls, f, kind, f.metadata.get("choices") or choices))

    for root in roots:
        walk(root)
    return out


def _help(sf: SettingFlag) -> str:
    f = sf.field
    if sf.kind is bool:
        return str(f.metadata["help"])
    shown = f.metadata.get("default_text")
    if shown is None:
        d = f.default
        shown = f"{d:g}" if isinstance(d, float) else str(d)
    parts = [shown] if shown else []
    rng = bounds_text(f.metadata)
    if rng != "any" and not f.metadata.get("size"):
        parts.append(f"range {rng}")
    return f"{f.metadata['help']} ({'; '.join(parts)})" if parts else str(f.metadata["help"])


def add_setting(g: argparse._ArgumentGroup, sf: SettingFlag) -> None:
    f, meta = sf.field, sf.field.metadata
    kw: dict[str, Any] = {"dest": sf.dest, "help": _help(sf)}
    if sf.kind is bool:
        kw.update(action="store_true", default=None)
    else:
        if sf.kind is tuple:
            kw["action"] = "append"
        elif meta.get("size"):
            kw["type"] = _size(f)
        elif sf.kind in (int, float):
            kw["type"] = _number(sf.kind, f)
        if sf.choices:
            kw["choices"] = list(sf.choices)
        else:
            kw["metavar"] = meta.get("metavar", f.name.upper())
    g.add_argument(sf.flag, **kw)


def _build(cls: type, opts: dict[str, Any], flags: dict[str, SettingFlag]) -> Any:
    """``cls`` with every flagged field taken from ``opts`` (when given), nested ones too."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], opts, flags)
            continue
        sf = flags.get(f"{cls.__qualname__}.{f.name}")
        if sf is None or opts.get(sf.dest) is None:
            continue
        value = opts[sf.dest]
        if sf.kind is bool:
            if value:  # the switch was given: the opposite of the default
                kwargs[f.name] = not f.default
        elif sf.kind is tuple:
            kwargs[f.name] = tuple(value)
        else:
            kwargs[f.name] = sf.kind(value)
    return cls(**kwargs)


def settings_from(opts: dict[str, Any]) -> tuple[CrawlSettings, PeerSettings]:
    """The settings the options describe; what they leave out keeps its default."""
    flags = {f"{sf.owner.__qualname__}.{sf.field.name}": sf for sf in setting_flags()}
    try:
        crawl = _build(CrawlSettings, opts, flags)
        peer = _build(PeerSettings, opts, flags)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    assert isinstance(crawl, CrawlSettings) and isinstance(peer, PeerSettings)
    if opts.get("domains"):
        crawl = dataclasses.replace(crawl, domains=tuple(opts["domains"]))
    try:
        UrlPatterns(crawl.scope.include, crawl.scope.exclude)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return crawl, peer
