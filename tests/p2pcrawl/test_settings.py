"""The settings dataclasses are the one source of flags, TOML keys, defaults and ranges."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from p2pcrawl.settings import (
    CrawlSettings,
    FetchLimits,
    PeerSettings,
    PolitenessSettings,
    RevisitSettings,
    ScopeSettings,
    SettingsError,
    option,
    range_error,
    validate,
)
from p2pcrawl.ui.options import build_parser, merge_config, setting_flags, settings_from

LISTEN = ["--listen", "127.0.0.1:0"]


def join_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return str(sub.choices["join"].format_help())


def test_every_setting_with_help_is_a_documented_flag() -> None:
    flags = setting_flags()
    assert {sf.flag for sf in flags} >= {
        "--concurrency",
        "--delay",
        "--max-body",
        "--allow-domain",
        "--no-warc",
        "--partition",
        "--republish-interval",
    }
    text = join_help()
    for sf in flags:
        assert sf.flag in text, sf.flag


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CrawlSettings(concurrency=0), "--concurrency: must be from 1 to 4096"),
        (
            lambda: PolitenessSettings(delay=-0.5),
            "--delay: must be a finite number from 0 to 86400",
        ),
        (lambda: PolitenessSettings(delay=float("nan")), "--delay: must be a finite"),
        (lambda: ScopeSettings(max_pages=-1), "--max-pages: must be from 0 to"),
        (lambda: FetchLimits(max_body_bytes=0), "--max-body: must be from 1 to"),
        (lambda: PeerSettings(failures_before_evict=0), "--failures-before-evict"),
        # RFC 9309: a cached robots.txt is used for a day at most, in continuous mode too.
        (lambda: PolitenessSettings(robots_ttl=86401), "--robots-ttl: .* at most 86400"),
    ],
)
def test_settings_built_in_code_are_range_checked(build: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        build()  # type: ignore[operator]


def test_every_flag_is_also_a_toml_key(tmp_path: Path) -> None:
    """Each generated flag, given through the config file, changes its setting."""
    values = {int: "7", float: "0.25", str: '"x"'}
    for sf in setting_flags():
        if sf.kind is bool:
            line = f"{sf.flag[2:]} = true"
        elif sf.kind is tuple:
            line = f'{sf.flag[2:]} = ["example.com"]'
        elif sf.choices:
            line = f'{sf.flag[2:]} = "{sf.choices[-1]}"'
        else:
            meta, default = sf.field.metadata, sf.field.default
            value = values[sf.kind]
            if range_error(sf.field, sf.kind(value)) is not None or sf.kind(value) == default:
                # Out of this flag's range: its lower bound, or its upper one if that is
                # the default, is a value it must take.
                edge = meta["min"] if meta.get("min") not in (None, default) else meta["max"]
                value = str(sf.kind(edge))
            line = f"{sf.flag[2:]} = {value}"
        if sf.owner is RevisitSettings:
            # Continuous mode's bounds need the mode on, and intervals of a second or more.
            line = f"{sf.flag[2:]} = 90" + ("" if sf.flag == "--revisit" else "\nrevisit = 60")
        path = tmp_path / "c.toml"
        path.write_text(line + "\n", encoding="utf-8")
        opts = merge_config(build_parser().parse_args(["join", "--config", str(path), *LISTEN]))
        crawl, peer = settings_from(opts)
        assert (crawl, peer) != (CrawlSettings(), PeerSettings()), line


@dataclass(frozen=True, slots=True)
class Extra:
    """What another module adds: a field with metadata is all a new flag takes."""

    burst: int = option(4, "requests per burst", min=1, max=64, metavar="N")
    quiet: bool = option(False, "say less")
    plain: int = 3  # no help: not a flag
    ranged: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})  # checked, no flag
    hidden: int = field(default=1, metadata={"min": 1, "help": "code only", "flag": False})

    def __post_init__(self) -> None:
        validate(self)


def test_a_field_with_metadata_is_a_flag_with_its_range() -> None:
    flags = setting_flags((Extra,))
    assert [(sf.flag, sf.dest, sf.kind) for sf in flags] == [
        ("--burst", "burst", int),
        ("--quiet", "quiet", bool),
    ]
    with pytest.raises(SettingsError, match="--burst: must be from 1 to 64"):
        Extra(burst=65)
    with pytest.raises(SettingsError, match=r"--ranged: must be a finite number from 0 to 1"):
        Extra(ranged=2.0)
    with pytest.raises(SettingsError, match="must be at least 1"):
        Extra(hidden=0)
