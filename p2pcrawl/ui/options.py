"""The command line and the TOML config: flags, their checks, and the settings they build.

Every option can also come from a TOML file (``--config``); flags given on the command line
win over the file.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any, NoReturn

from p2pcrawl import __version__
from p2pcrawl.crawl import UrlPatterns
from p2pcrawl.settings import (
    CrawlSettings,
    FetchLimits,
    PeerSettings,
    PolitenessSettings,
    ScopeSettings,
)

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "merge_config",
    "parse_hostport",
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


def _number(kind: type[int] | type[float], minimum: float, what: str, bound: str) -> Any:
    """An argparse type: a finite number of ``kind`` that is at least ``minimum``."""

    def convert(v: str) -> int | float:
        try:
            n = kind(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {v!r}") from None
        if not minimum <= n < float("inf"):  # also false for NaN
            raise argparse.ArgumentTypeError(f"{bound}: {v!r}")
        return n

    return convert


_positive_int = _number(int, 1, "an integer", "must be at least 1")
_nonneg_int = _number(int, 0, "an integer", "must not be negative")
_nonneg_float = _number(float, 0.0, "a number", "must be a finite non-negative number")
_positive_float = _number(float, 0.1, "a number", "must be at least 0.1")


def _add_crawl_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("crawl options")
    g.add_argument("--seed", action="append", metavar="URL", help="URL to start from (repeatable)")
    g.add_argument(
        "--allow-domain",
        action="append",
        metavar="D",
        help="crawl this domain and its subdomains; an IP or host name matches that host on "
        "any port (repeatable; default: the seeds' hosts)",
    )
    g.add_argument(
        "--allow-private",
        action="store_true",
        default=None,
        help="allow URLs that resolve to loopback/private/link-local addresses",
    )
    g.add_argument("--concurrency", type=_positive_int, metavar="N", help="parallel fetches (32)")
    g.add_argument(
        "--delay",
        type=_nonneg_float,
        metavar="S",
        help="minimum gap between requests to a host (1)",
    )
    g.add_argument(
        "--politeness-factor",
        type=_nonneg_float,
        metavar="F",
        help="wait F times the host's last response time before the next request (5)",
    )
    g.add_argument(
        "--max-pages",
        type=_nonneg_int,
        metavar="N",
        help="this peer stops fetching after N pages; each peer counts its own, so a network "
        "of P peers fetches at most P x N (0: no limit)",
    )
    g.add_argument(
        "--max-network-pages",
        type=_nonneg_int,
        metavar="N",
        help="every peer stops fetching once the network view counts N pages fetched by all "
        "peers together; checked every few seconds, so it may overshoot by a few seconds of "
        "crawling (0: no limit)",
    )
    g.add_argument(
        "--include",
        action="append",
        metavar="REGEX",
        help="crawl only URLs matching one of these regular expressions (repeatable)",
    )
    g.add_argument(
        "--exclude",
        action="append",
        metavar="REGEX",
        help="never crawl URLs matching this regular expression; wins over --include (repeatable)",
    )
    g.add_argument("--max-depth", type=_nonneg_int, metavar="N", help="link depth limit (50)")
    g.add_argument(
        "--max-body", type=_positive_int, metavar="BYTES", help="truncate bodies past this (10 MiB)"
    )
    g.add_argument("--max-redirects", type=_nonneg_int, metavar="N", help="redirect hops (5)")
    g.add_argument(
        "--policy",
        choices=["breadth-first", "performance-first", "crawl-capability"],
        help="host scheduling policy (seed 004; breadth-first)",
    )
    g.add_argument(
        "--partition", choices=["host", "url"], help="DHT key: the URL's host or the URL (host)"
    )
    g.add_argument("--replicas", type=_nonneg_int, metavar="R", help="backup copies per task (2)")
    g.add_argument(
        "--secret",
        metavar="S",
        help="network key: datagrams without it are dropped. Required when --listen is not "
        "loopback; a founder without one generates it, stores it in DATA/network.key and "
        "prints the join command",
    )
    g.add_argument(
        "--open",
        action="store_true",
        default=None,
        help="run without a key off loopback: anyone who can reach the UDP port can join "
        "and steer the crawl (needs --allow-domain)",
    )
    g.add_argument("--user-agent", metavar="UA", help="User-Agent (default p2pcrawl/VERSION)")
    g.add_argument("--contact-url", metavar="URL", help="contact URL added to the User-Agent")
    g.add_argument("--no-warc", action="store_true", default=None, help="do not write WARC files")
    g.add_argument(
        "--warc-max-bytes", type=_positive_int, metavar="BYTES", help="rotate WARC files (1 GiB)"
    )
    a = p.add_argument_group("network tuning")
    a.add_argument("--rpc-timeout", type=_nonneg_float, metavar="S", help="RPC reply timeout (2)")
    a.add_argument(
        "--failures-before-evict",
        type=_positive_int,
        metavar="N",
        help="failed probe rounds (direct and indirect) before a peer may be declared dead (3)",
    )
    a.add_argument(
        "--suspicion-timeout",
        type=_nonneg_float,
        metavar="S",
        help="seconds a peer must stay unreachable before it is declared dead; stretched "
        "while this peer itself is overloaded (10)",
    )
    a.add_argument("--ping-interval", type=_nonneg_float, metavar="S", help="liveness pings (5)")
    a.add_argument(
        "--refresh-interval", type=_nonneg_float, metavar="S", help="routing-table refresh (60)"
    )
    a.add_argument(
        "--min-peer-age",
        type=_nonneg_float,
        metavar="S",
        help="seconds a new peer must stay live before others hand it hosts (0: off)",
    )
    a.add_argument(
        "--republish-interval",
        type=_nonneg_float,
        metavar="S",
        help="how often backups of vanished owners are re-published (30)",
    )


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


class _ConfigParser(argparse.ArgumentParser):
    """Reads a config file's options as flags, raising instead of exiting on a bad one."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _config_options(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config file's options, checked and converted exactly as the same flags would be.

    A config file may set every join option (not --config), plus logging. A list is the flag
    repeated; ``true`` is a switch given, ``false`` one left out.
    """
    parser = _ConfigParser(prog=str(path), add_help=False)
    _add_join_options(parser)
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    out: dict[str, Any] = {}
    argv: list[str] = []
    for key, value in doc.items():
        dest = key.replace("-", "_")
        if dest in ("log_level", "log_json"):
            out[dest] = value
            continue
        if dest not in flags or dest == "config":
            raise UsageError(f"{path}: unknown option {key!r}")
        for item in value if isinstance(value, list) else [value]:
            if item is True:
                argv.append(flags[dest])
            elif item is not False:
                argv.append(f"{flags[dest]}={item}")
    out.update({k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None})
    return out


_PEER_HELP = "the running peer's status server (its join --status)"


def _client_parser(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
    """A command that talks to a running peer's status server."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
    p.add_argument("--peer", required=True, metavar="STATUS_HOST:PORT", help=_PEER_HELP)
    p.add_argument("--token", metavar="T", help="the peer's --status-token")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2pcrawl",
        description="A peer-to-peer web crawler: every peer crawls the hosts it owns in an "
        "extended Kademlia DHT and hands every other link to its owner.",
    )
    parser.add_argument("--version", action="version", version=f"p2pcrawl {__version__}")
    parser.add_argument(
        "--log-level", default=None, choices=["debug", "info", "warning", "error"], help="(info)"
    )
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON log lines")
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
        "warc_file, warc_offset, warc_length) or 'cdxj' (a sorted CDXJ index for pywb and "
        "other wayback tools, written by cdxj-indexer).",
    )
    export.add_argument(
        "--format", choices=["urls", "jsonl", "cdxj"], default="urls", help="(urls)"
    )
    export.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write here instead of stdout"
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
    "log_json": False,
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


def settings_from(opts: dict[str, Any]) -> tuple[CrawlSettings, PeerSettings]:
    pol = PolitenessSettings()
    pol = PolitenessSettings(
        delay=float(opts.get("delay", pol.delay) if opts.get("delay") is not None else pol.delay),
        politeness_factor=float(
            opts["politeness_factor"]
            if opts.get("politeness_factor") is not None
            else pol.politeness_factor
        ),
    )
    fl = FetchLimits()
    fetch = FetchLimits(
        max_body_bytes=int(opts.get("max_body") or fl.max_body_bytes),
        max_redirects=int(
            opts["max_redirects"] if opts.get("max_redirects") is not None else fl.max_redirects
        ),
    )
    sc = ScopeSettings()
    scope = ScopeSettings(
        allow_domains=tuple(opts.get("allow_domain") or ()),
        allow_private=bool(opts.get("allow_private") or False),
        max_depth=int(opts["max_depth"] if opts.get("max_depth") is not None else sc.max_depth),
        max_pages=int(opts.get("max_pages") or 0),
        max_network_pages=int(opts.get("max_network_pages") or 0),
        include=tuple(opts.get("include") or ()),
        exclude=tuple(opts.get("exclude") or ()),
    )
    try:
        UrlPatterns(scope.include, scope.exclude)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cs = CrawlSettings()
    crawl = CrawlSettings(
        concurrency=int(opts.get("concurrency") or cs.concurrency),
        policy=opts.get("policy") or cs.policy,
        user_agent=opts.get("user_agent") or "",
        contact_url=opts.get("contact_url") or "",
        fetch=fetch,
        politeness=pol,
        scope=scope,
        warc=not opts.get("no_warc"),
        warc_max_bytes=int(opts.get("warc_max_bytes") or cs.warc_max_bytes),
    )
    ps = PeerSettings()

    def pick(name: str, default: Any) -> Any:
        value = opts.get(name)
        return default if value is None else type(default)(value)

    peer = PeerSettings(
        partition=opts.get("partition") or ps.partition,
        replicas=pick("replicas", ps.replicas),
        secret=opts.get("secret") or "",
        rpc_timeout=pick("rpc_timeout", ps.rpc_timeout),
        failures_before_evict=pick("failures_before_evict", ps.failures_before_evict),
        suspicion_timeout=pick("suspicion_timeout", ps.suspicion_timeout),
        ping_interval=pick("ping_interval", ps.ping_interval),
        refresh_interval=pick("refresh_interval", ps.refresh_interval),
        republish_interval=pick("republish_interval", ps.republish_interval),
        min_peer_age=pick("min_peer_age", ps.min_peer_age),
    )
    return crawl, peer
