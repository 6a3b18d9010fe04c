"""Durations on the command line and in the config (s/m/h/d), and continuous mode's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pcrawl.settings import CrawlSettings, PeerSettings, RevisitSettings, SettingsError
from p2pcrawl.ui.changes import parse_since
from p2pcrawl.ui.durations import parse_duration
from p2pcrawl.ui.export import ExportError
from p2pcrawl.ui.options import UsageError, build_parser, merge_config, settings_from

LISTEN = ["--listen", "127.0.0.1:0"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30), ("30s", 30), ("1.5m", 90), ("6h", 21600), ("1d", 86400), (" 2H ", 7200),
     ("0.5", 0.5), ("1e3", 1000)],
)  # fmt: skip
def test_durations_take_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "5x", "1 h 2", "-5s", "1w", "inf", "1e999d"])
def test_bad_durations_say_what_a_duration_is(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def build(
    *argv: str, config: str | None = None, tmp_path: Path | None = None
) -> tuple[CrawlSettings, PeerSettings]:
    args = list(argv)
    if config is not None:
        assert tmp_path is not None
        path = tmp_path / "c.toml"
        path.write_text(config, encoding="utf-8")
        args += ["--config", str(path)]
    return settings_from(merge_config(build_parser().parse_args(["join", *LISTEN, *args])))


def test_every_seconds_flag_takes_units(tmp_path: Path) -> None:
    crawl, peer = build("--delay", "2m", "--ping-interval", "1h", "--revisit", "1d")
    assert crawl.politeness.delay == 120
    assert peer.ping_interval == 3600
    assert crawl.revisit.every == 86400
    assert (crawl.revisit.low, crawl.revisit.high) == (21600, 16 * 86400)
    crawl, _ = build(
        config='revisit = "6h"\nrevisit-min = "30m"\nrevisit-max = 864000\ndelay = 1.5\n',
        tmp_path=tmp_path,
    )
    assert (crawl.revisit.every, crawl.revisit.low, crawl.revisit.high) == (21600, 1800, 864000)
    assert crawl.politeness.delay == 1.5
    # Off by default: the one-pass crawl.
    crawl, _ = build()
    assert not crawl.revisit.enabled
    assert build_parser().parse_args(["join", "--progress-interval", "1m"]).progress_interval == 60


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--revisit", "0.5s"], "--revisit: must be 0 (off) or at least 1s"),
        (["--revisit", "soon"], "not a duration: 'soon'"),
        (["--revisit-min", "1m"], "need --revisit"),
        (["--revisit", "1h", "--revisit-min", "2h", "--revisit-max", "1h"], "shorter than"),
        (["--revisit", "1h", "--revisit-min", "0.2"], "--revisit-min: must be 0 (off) or at least"),
        (["--delay=-1m"], "not a duration"),
        (["--revisit", "400d"], "--revisit"),
    ],
)
def test_bad_continuous_flags_are_refused_clearly(argv: list[str], message: str) -> None:
    with pytest.raises((UsageError, SettingsError, SystemExit)) as info:
        build(*argv)
    assert message in str(info.value)


def test_revisit_settings_bounds() -> None:
    s = RevisitSettings(every=4)
    assert (s.low, s.high) == (1.0, 64.0)  # a quarter of --revisit, but at least 1 s
    assert RevisitSettings(every=60, max_interval=10).high == 15  # never below the shortest


def test_changed_since_times() -> None:
    now = 1_700_000_000.0
    assert parse_since("1700000000", now) == 1_700_000_000
    assert parse_since("6h", now) == now - 6 * 3600
    assert parse_since("2023-11-14T22:13:20Z", now) == 1_700_000_000
    assert parse_since("2023-11-14T23:13:20+01:00", now) == 1_700_000_000
    assert parse_since("2023-11-14", now) == 1_699_920_000
    with pytest.raises(ExportError, match="not a time"):
        parse_since("last tuesday", now)
