"""The command line and the TOML config: flags, their checks, and the settings they build.

The settings flags are generated from the settings dataclasses (p2pcrawl/settings.py): a
field with ``help`` metadata is a flag with its range check, and the TOML key of the same
name. Flags that are not settings (``--listen``, ``--bootstrap``, ``--status``, ``--data``,
``--config``, ``--seed``, ``--log-level``) are written here by hand. Every option can also
come from a TOML file (``--config``); flags given on the command line win over the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
import typing
from pathlib import Path
from typing import Any, NoReturn

from p2pcrawl import __version__
from p2pcrawl.crawl import UrlPatterns, parse_domain_tables
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
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "merge_config",
    "parse_hostport",
    "setting_flags",
    "settings_from",
]

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UsageError(Exception):
    pass


def parse_hostport(value: str, *, default_host: str | None = None) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port), with a clear error."""
    v = value.strip()
    if v.startswith("["):
        host, sep, rest = v[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise argparse.ArgumentTypeError(f"malformed address {value!r}: use [v6addr]:PORT")
        port_s = rest[1:]
    else:
        host, sep, port_s = v.rpartition(":")
        if not sep:
            if default_host is None:
                raise argparse.ArgumentTypeError(f"malformed address {value!r}: use HOST:PORT")
            host, port_s = default_host, v
    if not host:
        if default_host is None:
            raise argparse.ArgumentTypeError(f"malformed address {value!r}: missing host")
        host = default_host
    try:
        port = int(port_s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"malformed address {value!r}: bad port") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range in {value!r}")
    return host, port


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


def _positive_int(v: str) -> int:
    """An argparse type for flags that are not settings: an integer of at least 1."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {v!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {v!r}")
    return n


def _positive_float(v: str) -> float:
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
_CRAWL_GROUP = "crawl options"


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


def _add_setting(g: argparse._ArgumentGroup, sf: SettingFlag) -> None:
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


def _add_crawl_options(p: argparse.ArgumentParser) -> None:
    groups = {_CRAWL_GROUP: p.add_argument_group(_CRAWL_GROUP)}
    groups[_CRAWL_GROUP].add_argument(
        "--open",
        action="store_true",
        default=None,
        help="run without a key off loopback: anyone who can reach the UDP port can join "
        "and steer the crawl (needs --allow-domain)",
    )
    groups[_CRAWL_GROUP].add_argument(
        "--seed", action="append", metavar="URL", help="URL to start from (repeatable)"
    )
    groups[_CRAWL_GROUP].add_argument(
        "--recrawl",
        action="store_true",
        default=None,
        help="fetch the --seed URLs again even if this data directory crawled them before",
    )
    for sf in setting_flags():
        name = str(sf.field.metadata.get("group", _CRAWL_GROUP))
        if name not in groups:
            groups[name] = p.add_argument_group(name)
        _add_setting(groups[name], sf)


def _add_join_options(join: argparse.ArgumentParser) -> None:
    join.add_argument("--config", type=Path, metavar="FILE", help="TOML file with these options")
    join.add_argument(
        "--bootstrap", action="append", metavar="HOST:PORT", help="a running peer (repeatable)"
    )
    join.add_argument("--listen", metavar="HOST:PORT", help="UDP address for the DHT (required)")
    join.add_argument("--status", metavar="HOST:PORT", help="status server (127.0.0.1:8080)")
    join.add_argument("--status-token", metavar="T", help="required when --status is not loopback")
    join.add_argument("--data", type=Path, metavar="DIR", help="data directory (./p2pcrawl-data)")
    join.add_argument(
        "--exit-when-finished",
        action="store_true",
        default=None,
        help="exit 0 with a summary once the whole network reports finished (batch crawls)",
    )
    join.add_argument(
        "--progress-interval",
        type=_positive_float,
        metavar="S",
        help="seconds between progress lines (2 on a terminal; 30 as log lines otherwise)",
    )
    _add_crawl_options(join)


class _Parser(argparse.ArgumentParser):
    """The command's parser: a bad flag is one line (what is wrong, where the help is), not
    the usage block, like every other failure of the command."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


class _ConfigParser(argparse.ArgumentParser):
    """Reads a config file's options as flags, raising instead of exiting on a bad one."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


_LOG_CHOICES = {"log_level": ("debug", "info", "warning", "error"), "log_format": ("text", "json")}


def _config_options(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config file's options, checked and converted exactly as the same flags would be.

    A config file may set every join option (not --config), plus logging. A list is the flag
    repeated; ``true`` is a switch given, ``false`` one left out.
    """
    parser = _ConfigParser(prog=str(path), add_help=False)
    _add_join_options(parser)
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    flags = {dest: a.option_strings[0] for dest, a in actions.items()}
    out: dict[str, Any] = {}
    argv: list[str] = []
    for key, value in doc.items():
        dest = key.replace("-", "_")
        if dest == "log_json":  # the older spelling of log-format = "json"
            if value is True:
                out["log_format"] = "json"
            continue
        if dest in _LOG_CHOICES:
            if value not in _LOG_CHOICES[dest]:
                allowed = ", ".join(_LOG_CHOICES[dest])
                raise UsageError(f"{path}: {key} must be one of {allowed}, not {value!r}")
            out[dest] = value
            continue
        if dest == "domains":
            try:
                out["domains"] = parse_domain_tables(value)
            except ValueError as exc:
                raise UsageError(f"{path}: {exc}") from None
            continue
        if dest not in flags or dest == "config":
            raise UsageError(f"{path}: unknown option {key!r}")
        action = actions[dest]
        if isinstance(value, list) and isinstance(action, argparse._AppendAction):
            # A long list (300,000 --allow-domain entries) is taken as it is: argparse
            # re-scans the whole argument list for each repeated flag, which took minutes.
            out[dest] = [_config_item(path, key, item, action) for item in value]
            continue
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, str | int | float | bool):
                kind = "table" if isinstance(item, dict) else type(item).__name__
                raise UsageError(
                    f"{path}: {key} must be a string, number, true/false or a list of them, "
                    f"not a {kind}"
                )
            if item is True:
                argv.append(flags[dest])
            elif item is not False:
                argv.append(f"{flags[dest]}={item}")
    out.update({k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None})
    return out


def _config_item(path: Path, key: str, item: object, action: argparse.Action) -> Any:
    """One entry of a config file's list for a repeatable flag, converted as the flag's."""
    if not isinstance(item, str | int | float) or isinstance(item, bool):
        raise UsageError(f"{path}: {key} must be a list of strings, not of {type(item).__name__}")
    if action.type is None:
        return str(item)
    convert: Any = action.type
    try:
        return convert(str(item))
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise UsageError(f"{path}: {key}: {exc}") from None


_PEER_HELP = "the running peer's status server (its join --status)"


def _client_parser(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
    """A command that talks to a running peer's status server."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
    p.add_argument("--peer", required=True, metavar="STATUS_HOST:PORT", help=_PEER_HELP)
    p.add_argument("--token", metavar="T", help="the peer's --status-token")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="p2pcrawl",
        description="A peer-to-peer web crawler: every peer crawls the hosts it owns in an "
        "extended Kademlia DHT and hands every other link to its owner.",
    )
    parser.add_argument("--version", action="version", version=f"p2pcrawl {__version__}")
    parser.add_argument(
        "--log-level", default=None, choices=_LOG_CHOICES["log_level"], help="(info)"
    )
    parser.add_argument(
        "--log-format",
        choices=_LOG_CHOICES["log_format"],
        default=None,
        help="text lines for people (text), or one JSON object per line for log shippers: "
        "ts, level, logger, message and the peer's node ID",
    )
    parser.add_argument(
        "--log-json",
        dest="log_format",
        action="store_const",
        const="json",
        help="the same as --log-format json",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of a failure, not one line"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    join = sub.add_parser(
        "join",
        help="run a peer (no --bootstrap: found a new network)",
        description="Run a peer. Without --bootstrap it founds a new network.",
    )
    _add_join_options(join)

    seed = _client_parser(sub, "seed", "add seed URLs through a running peer")
    seed.add_argument("urls", nargs="+", metavar="URL", help="seed URLs to crawl")
    seed.add_argument(
        "--recrawl",
        action="store_true",
        help="fetch these URLs again even if they were crawled before (a URL another peer "
        "owns is re-seeded through that peer's status server)",
    )

    _client_parser(sub, "leave", "ask a running peer to hand off its work and exit")

    status = _client_parser(sub, "status", "show a running peer's state")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument(
        "--network",
        action="store_true",
        help="every peer of the network (found through the DHT) and the network's totals",
    )

    export = sub.add_parser(
        "export",
        help="list what was crawled, from the WARC files of data directories",
        description="Read the WARC files of one or more data directories (or WARC folders or "
        "files) and print what was crawled: 'urls' (each distinct URL once), 'jsonl' (one "
        "object per capture: url, status, content_type, length, fetched_at, truncated, "
        "robots, canonical, warc_file, warc_offset, warc_length) or 'cdxj' (a sorted CDXJ "
        "index for pywb and "
        "other wayback tools, written by cdxj-indexer).",
    )
    export.add_argument(
        "--format", choices=["urls", "jsonl", "cdxj"], default="urls", help="(urls)"
    )
    export.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write here instead of stdout"
    )
    export.add_argument(
        "--changed-since",
        metavar="TIME",
        help="only the URLs whose content changed since TIME (2025-01-31T12:00:00Z, Unix "
        "seconds, or how long ago: 6h, 2d); a URL first captured since counts as changed",
    )
    export.add_argument(
        "sources", nargs="+", type=Path, metavar="DATA_DIR", help="data directories or WARCs"
    )

    demo = sub.add_parser(
        "demo", help="crawl a local generated test web with 3 peers (no internet needed)"
    )
    demo.add_argument("--peers", type=_positive_int, default=3, help="number of peers (3)")
    demo.add_argument("--hosts", type=_positive_int, default=8, help="test-web hosts (8)")
    demo.add_argument("--pages", type=_positive_int, default=150, help="pages per host (150)")
    demo.add_argument(
        "--out",
        "--data",
        dest="data",
        type=Path,
        metavar="DIR",
        help="keep the peers' data directories (WARC files included) in DIR/peerN; "
        "without it they live in a temporary directory deleted at exit",
    )
    demo.add_argument(
        "--keep-running", action="store_true", help="leave everything up for a browser"
    )
    return parser


# -- options -> settings ---------------------------------------------------------------------

_JOIN_DEFAULTS: dict[str, Any] = {
    "listen": None,
    "status": "127.0.0.1:8080",
    "data": Path("p2pcrawl-data"),
    "log_level": "info",
    "log_format": "text",
}


def merge_config(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags over the TOML file over the defaults."""
    merged: dict[str, Any] = dict(_JOIN_DEFAULTS)
    path = getattr(args, "config", None)
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read config {path}: {exc}") from exc
        merged.update(_config_options(doc, path))
    for k, v in vars(args).items():
        if v is not None:
            merged[k] = v
    return merged


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
