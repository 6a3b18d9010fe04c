"""Every limit, timeout and default of the crawler, in one place.

The CLI builds these from flags; tests build them directly. All are frozen so a running
component can never see a limit change under it.

A field is also a command-line flag and a TOML key when its metadata has a ``help`` (and no
``"flag": False``); :func:`option` writes that metadata, and a plain ``field(metadata={"min":
..., "max": ..., "help": ...})`` does the same: ``p2pcrawl/ui/options.py`` generates the
argparse options and the config loader from these dataclasses, so adding a flag is adding a
field. Ranges (``min``/``max``) in the metadata are checked by ``__post_init__``
(:func:`validate`), for settings built in code as much as for flags.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from protocol import MAX_URL_LENGTH, NodeConfig

__all__ = [
    "DEFAULT_USER_AGENT_NAME",
    "CrawlSettings",
    "FetchLimits",
    "Partition",
    "PeerSettings",
    "Policy",
    "PolitenessSettings",
    "ScopeSettings",
    "SettingsError",
    "option",
    "validate",
]

Policy = Literal["breadth-first", "performance-first", "crawl-capability"]
Partition = Literal["host", "url"]

DEFAULT_USER_AGENT_NAME = "p2pcrawl"


class SettingsError(ValueError):
    """A setting out of its range; the message names the flag and the range."""


def option(
    default: Any,
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    default_text: str | None = None,
    group: str | None = None,
) -> Any:
    """A settings field that is also a flag and a TOML key.

    ``flag`` defaults to the field name with dashes (``max_pages`` -> ``--max-pages``);
    ``default_text`` replaces the default shown in ``--help`` (an empty string shows none); a
    ``bool`` field is a switch (``flag="--no-warc"`` on a field that defaults to True makes the
    switch turn it off); a ``tuple[str, ...]`` field is a repeatable flag.
    """
    meta: dict[str, Any] = {"help": help}
    for key, value in (
        ("min", min),
        ("max", max),
        ("flag", flag),
        ("metavar", metavar),
        ("choices", choices),
        ("default_text", default_text),
        ("group", group),
    ):
        if value is not None:
            meta[key] = value
    return field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def range_error(f: dataclasses.Field[Any], value: object) -> str | None:
    """Why ``value`` is out of ``f``'s range (``None`` if it is in range or has none)."""
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is None and hi is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"not a number: {value!r}"
    is_float = isinstance(value, float)
    if is_float and not math.isfinite(value):
        return _bound_text(lo, hi, is_float)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return _bound_text(lo, hi, is_float)
    return None


def _bound_text(lo: float | None, hi: float | None, is_float: bool) -> str:
    if is_float:
        if hi is None:
            return (
                "must be a finite non-negative number"
                if lo == 0
                else f"must be a finite number of at least {lo:g}"
            )
        return f"must be a finite number from {lo if lo is not None else '-inf'} to {hi:g}"
    if hi is None:
        return "must not be negative" if lo == 0 else f"must be at least {lo}"
    if lo is None:
        return f"must be at most {hi}"
    return f"must be from {lo} to {hi}"


def validate(obj: object) -> None:
    """Check every ranged field of a settings dataclass (called by ``__post_init__``)."""
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        why = range_error(f, getattr(obj, f.name))
        if why is not None:
            raise SettingsError(f"{flag_of(f)}: {why}: {getattr(obj, f.name)!r}")


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """HTTP client limits (High-performance crawl scheduling: one persistent connection per
    server)."""

    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    total_timeout: float = 60.0
    max_body_bytes: int = option(
        10 * 1024 * 1024,
        "truncate bodies past this",
        min=1,
        flag="--max-body",
        metavar="BYTES",
        default_text="10 MiB",
    )
    max_redirects: int = option(5, "redirect hops", min=0, metavar="N")
    max_url_length: int = MAX_URL_LENGTH
    max_links_per_page: int = 5000
    max_header_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True, slots=True)
class PolitenessSettings:
    """Per-host gap rules (Mercator: wait a multiple of the last response time)."""

    delay: float = option(1.0, "minimum gap between requests to a host", min=0.0, metavar="S")
    politeness_factor: float = option(
        5.0,
        "wait F times the host's last response time before the next request",
        min=0.0,
        metavar="F",
    )
    max_delay: float = 120.0
    default_retry_after: float = 60.0
    robots_ttl: float = 24 * 3600.0
    robots_error_ttl: float = 600.0
    max_retries: int = 3

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True, slots=True)
class ScopeSettings:
    """What may be fetched at all."""

    allow_domains: tuple[str, ...] = option(
        (),
        "crawl this domain and its subdomains; an IP or host name matches that host on any port",
        flag="--allow-domain",
        metavar="D",
        default_text="repeatable; default: the seeds' hosts",
    )
    allow_private: bool = option(
        False, "allow URLs that resolve to loopback/private/link-local addresses"
    )
    max_depth: int = option(50, "link depth limit", min=0, metavar="N")
    max_pages: int = option(0, "stop after N pages", min=0, metavar="N", default_text="0: no limit")

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True, slots=True)
class CrawlSettings:
    """Everything the crawl engine needs."""

    concurrency: int = option(32, "parallel fetches", min=1, metavar="N")
    policy: Policy = option(
        "breadth-first",
        "host scheduling policy, after High-performance crawl scheduling §4",
        choices=("breadth-first", "performance-first", "crawl-capability"),
    )
    user_agent: str = option(
        "", "User-Agent", metavar="UA", default_text=f"{DEFAULT_USER_AGENT_NAME}/VERSION"
    )
    contact_url: str = option("", "contact URL added to the User-Agent", metavar="URL")
    fetch: FetchLimits = field(default_factory=FetchLimits)
    politeness: PolitenessSettings = field(default_factory=PolitenessSettings)
    scope: ScopeSettings = field(default_factory=ScopeSettings)
    frontier_window: int = 100_000  # URLs held in RAM; the rest wait in the task store
    host_queue_window: int = 1_000  # URLs per host held in RAM
    seen_cache_size: int = 1 << 18  # ~2^18 entries remove most repeats (Mercator)
    warc: bool = option(True, "do not write WARC files", flag="--no-warc")
    warc_max_bytes: int = option(
        1024 * 1024 * 1024, "rotate WARC files", min=1, metavar="BYTES", default_text="1 GiB"
    )

    def __post_init__(self) -> None:
        validate(self)

    def effective_user_agent(self) -> str:
        from p2pcrawl import __version__

        if self.user_agent:
            return self.user_agent
        ua = f"{DEFAULT_USER_AGENT_NAME}/{__version__}"
        if self.contact_url:
            ua += f" (+{self.contact_url})"
        return ua


_NET = "network tuning"


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """The peer's place in the DHT."""

    partition: Partition = option(
        "host",
        "DHT key: the URL's host or the URL",
        choices=("host", "url"),
        group="crawl options",
    )
    replicas: int = option(2, "backup copies per task", min=0, metavar="R", group="crawl options")
    ksize: int = 20
    alpha: int = 3
    secret: str = option(
        "",
        "cluster key: RPCs without it are dropped",
        metavar="S",
        group="crawl options",
    )
    rpc_timeout: float = option(2.0, "RPC reply timeout", min=0.0, metavar="S", group=_NET)
    failures_before_evict: int = option(
        3,
        "consecutive failed RPCs before a peer is considered gone",
        min=1,
        metavar="N",
        group=_NET,
    )
    ping_interval: float = option(5.0, "liveness pings", min=0.0, metavar="S", group=_NET)
    refresh_interval: float = option(
        60.0, "routing-table refresh", min=0.0, metavar="S", group=_NET
    )
    republish_interval: float = option(
        30.0,
        "how often backups of vanished owners are re-published",
        min=0.0,
        metavar="S",
        group=_NET,
    )
    dispatch_batch: int = 256
    dispatch_flush_s: float = 0.05
    handoff_timeout: float = 30.0

    def __post_init__(self) -> None:
        validate(self)

    def node_config(self) -> NodeConfig:
        return NodeConfig(
            ksize=self.ksize,
            alpha=self.alpha,
            rpc_timeout=self.rpc_timeout,
            failures_before_evict=self.failures_before_evict,
            secret=self.secret,
            ping_interval=self.ping_interval,
            refresh_interval=self.refresh_interval,
        )
