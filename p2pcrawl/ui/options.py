"""The command line and the TOML config: flags, their checks, and the settings they build.

The settings flags are generated from the settings dataclasses (``p2pcrawl.ui.flags``): a
field with ``help`` metadata is a flag with its range check, and the TOML key of the same
name. Flags that are not settings (``--listen``, ``--bootstrap``, ``--status``, ``--data``,
``--config``, ``--seed``, ``--log-level``) are written here by hand. Every option can also
come from a TOML file (``--config``); flags given on the command line win over the file.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any, NoReturn

from p2pcrawl import __version__
from p2pcrawl.crawl import parse_domain_tables
from p2pcrawl.ui.flags import (
    UsageError,
    add_setting,
    positive_float,
    positive_int,
    setting_flags,
    settings_from,
)

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
_CRAWL_GROUP = "crawl options"


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
        add_setting(groups[name], sf)


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
        type=positive_float,
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
    demo.add_argument("--peers", type=positive_int, default=3, help="number of peers (3)")
    demo.add_argument("--hosts", type=positive_int, default=8, help="test-web hosts (8)")
    demo.add_argument("--pages", type=positive_int, default=150, help="pages per host (150)")
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
