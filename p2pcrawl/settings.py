"""Every limit, timeout and default of the crawler, in one place.

The CLI builds these from flags; tests build them directly. All are frozen so a running
component can never see a limit change under it.

Every numeric setting carries its range as field metadata (``min``/``max``, ``gt`` for a
strict lower bound, and ``help``), checked when the dataclass is built: an absurd value
(``concurrency = 10**9``, an interval of 0 that would spin a core) is refused with one clear
:class:`SettingsError`, whichever way the settings were made (flags, TOML, code).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from protocol import NodeConfig

Policy = Literal["breadth-first", "performance-first", "crawl-capability"]
Partition = Literal["host", "url"]

DEFAULT_USER_AGENT_NAME = "p2pcrawl"

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
DAY = 86400.0

__all__ = [
    "CrawlSettings",
    "FetchLimits",
    "Partition",
    "PeerSettings",
    "Policy",
    "PolitenessSettings",
    "ScopeSettings",
    "SettingsError",
    "bounds",
]


class SettingsError(ValueError):
    """A setting outside its documented range or of the wrong type."""


def bounded(
    default: Any,
    *,
    min: float | None = None,
    max: float | None = None,
    gt: float | None = None,
    help: str = "",
) -> Any:
    """A dataclass field with its range: ``min <= value <= max``, ``value > gt``."""
    return field(default=default, metadata={"min": min, "max": max, "gt": gt, "help": help})


def bounds(cls: type, name: str) -> str:
    """The documented range of ``cls.name``, as text for help and errors ("1..4096")."""
    meta = {f.name: f.metadata for f in fields(cls)}[name]
    return _range_text(meta)


def _range_text(meta: Any) -> str:
    low = f"> {meta['gt']:g}" if meta.get("gt") is not None else None
    if meta.get("min") is not None:
        low = f"{meta['min']:g}"
    high = f"{meta['max']:g}" if meta.get("max") is not None else None
    if low and high:
        return f"{low} .. {high}" if not low.startswith(">") else f"{low} and <= {high}"
    return low or (f"<= {high}" if high else "any")


def _validate(obj: Any) -> None:
    """Check every bounded field of ``obj`` (called from ``__post_init__``)."""
    for f in fields(obj):
        meta = f.metadata
        if "help" not in meta:
            continue
        value = getattr(obj, f.name)
        what = f"{type(obj).__name__}.{f.name}"
        want_int = isinstance(f.default, int) and not isinstance(f.default, bool)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingsError(f"{f.name} must be a number, not {value!r} ({what})")
        if want_int and not isinstance(value, int):
            raise SettingsError(f"{f.name} must be a whole number, not {value!r} ({what})")
        ok = math.isfinite(value)
        if meta["min"] is not None and value < meta["min"]:
            ok = False
        if meta["max"] is not None and value > meta["max"]:
            ok = False
        if meta["gt"] is not None and not value > meta["gt"]:
            ok = False
        if not ok:
            raise SettingsError(
                f"{f.name} must be {_range_text(meta)}, not {value!r} ({what}: {meta['help']})"
            )


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """HTTP client limits (seed 004: one persistent connection per server)."""

    connect_timeout: float = bounded(10.0, gt=0, max=600, help="seconds to connect")
    read_timeout: float = bounded(30.0, gt=0, max=3600, help="seconds between body reads")
    total_timeout: float = bounded(60.0, gt=0, max=DAY, help="seconds for a whole response")
    max_body_bytes: int = bounded(10 * MIB, min=KIB, max=GIB, help="body bytes kept")
    max_redirects: int = bounded(5, min=0, max=50, help="redirect hops followed")
    max_url_length: int = bounded(2048, min=64, max=64 * KIB, help="longest URL kept")
    max_links_per_page: int = bounded(5000, min=0, max=1_000_000, help="links taken per page")
    max_header_bytes: int = bounded(64 * KIB, min=KIB, max=16 * MIB, help="header line size")

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True, slots=True)
class PolitenessSettings:
    """Per-host gap rules (Mercator: wait a multiple of the last response time)."""

    delay: float = bounded(1.0, min=0, max=DAY, help="minimum seconds between requests to a host")
    politeness_factor: float = bounded(5.0, min=0, max=1000, help="multiple of response time")
    max_delay: float = bounded(120.0, min=0, max=7 * DAY, help="longest per-host wait")
    default_retry_after: float = bounded(60.0, min=0, max=7 * DAY, help="429/503 wait")
    robots_ttl: float = bounded(DAY, gt=0, max=30 * DAY, help="seconds robots.txt is kept")
    robots_error_ttl: float = bounded(600.0, gt=0, max=30 * DAY, help="failed robots.txt wait")
    max_retries: int = bounded(3, min=0, max=100, help="retries of a failed fetch")

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True, slots=True)
class ScopeSettings:
    """What may be fetched at all."""

    allow_domains: tuple[str, ...] = ()
    allow_private: bool = False
    # Loopback only (127.0.0.0/8, ::1): servers on this machine, while every other
    # non-global address stays refused.
    allow_loopback: bool = False
    max_depth: int = bounded(50, min=0, max=100_000, help="link depth from a seed")
    max_pages: int = bounded(
        0,
        min=0,
        max=10**15,
        help="pages this peer fetches (each peer counts its own); 0 = unlimited",
    )
    max_network_pages: int = bounded(
        0, min=0, max=10**15, help="pages all peers fetch together (approximate); 0 = unlimited"
    )
    include: tuple[str, ...] = ()  # regular expressions; a URL must match one, if any given
    exclude: tuple[str, ...] = ()  # regular expressions; a URL matching one is left out
    # Per-host budgets (Heritrix's queue budgets, StormCrawler's max URLs per host): one
    # host, a trap or a huge site, cannot take the whole crawl or fill the disk.
    max_pages_per_host: int = bounded(
        100_000, min=0, max=10**12, help="pages fetched per host; 0 = unlimited"
    )
    max_urls_per_host: int = bounded(
        250_000, min=0, max=10**12, help="URLs admitted per host by this peer; 0 = unlimited"
    )
    max_disk_bytes: int = bounded(
        0, min=0, max=1 << 60, help="data directory size at which fetching stops; 0 = no limit"
    )

    def __post_init__(self) -> None:
        _validate(self)


@dataclass(frozen=True, slots=True)
class CrawlSettings:
    """Everything the crawl engine needs."""

    concurrency: int = bounded(32, min=1, max=4096, help="fetches under way at once")
    policy: Policy = "breadth-first"
    user_agent: str = ""
    contact_url: str = ""
    fetch: FetchLimits = field(default_factory=FetchLimits)
    politeness: PolitenessSettings = field(default_factory=PolitenessSettings)
    scope: ScopeSettings = field(default_factory=ScopeSettings)
    # URLs held in RAM; the rest wait in the task store.
    frontier_window: int = bounded(100_000, min=16, max=100_000_000, help="URLs held in RAM")
    host_queue_window: int = bounded(1_000, min=1, max=10_000_000, help="URLs per host in RAM")
    # Seed 002: ~2^18 entries remove most repeats.
    seen_cache_size: int = bounded(1 << 18, min=0, max=1 << 28, help="recently seen URLs")
    warc: bool = True
    warc_max_bytes: int = bounded(GIB, min=MIB, max=1 << 40, help="bytes per WARC file")
    # Pages that could hold the event loop are parsed in these processes, each page under
    # a deadline (p2pcrawl.crawl.parseproc).
    parse_workers: int = bounded(1, min=1, max=64, help="parse processes")
    parse_deadline: float = bounded(10.0, gt=0, max=3600, help="seconds one parse may take")

    def __post_init__(self) -> None:
        _validate(self)

    def effective_user_agent(self) -> str:
        from p2pcrawl import __version__

        if self.user_agent:
            return self.user_agent
        ua = f"{DEFAULT_USER_AGENT_NAME}/{__version__}"
        if self.contact_url:
            ua += f" (+{self.contact_url})"
        return ua


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """The peer's place in the DHT."""

    partition: Partition = "host"
    replicas: int = bounded(2, min=0, max=16, help="backup copies per task")
    ksize: int = bounded(20, min=2, max=1000, help="Kademlia bucket size")
    alpha: int = bounded(3, min=1, max=64, help="parallel lookups")
    secret: str = ""
    rpc_timeout: float = bounded(2.0, gt=0, max=300, help="seconds to wait for an RPC reply")
    failures_before_evict: int = bounded(3, min=1, max=1000, help="failed RPCs before eviction")
    # Intervals have floors: 0 would make an idle peer spin a core.
    ping_interval: float = bounded(5.0, min=0.05, max=DAY, help="seconds between pings")
    refresh_interval: float = bounded(60.0, min=0.5, max=DAY, help="routing-table refresh")
    republish_interval: float = bounded(30.0, min=0.5, max=DAY, help="backup re-publishing")
    dispatch_batch: int = bounded(256, min=1, max=1_000_000, help="tasks per routed batch")
    dispatch_flush_s: float = bounded(0.05, gt=0, max=60, help="seconds a batch may wait")
    handoff_timeout: float = bounded(30.0, gt=0, max=DAY, help="seconds for a hand-off")
    # A new ID takes over hosts only after others have seen it live this long
    # (docs/security.md). Off by default: the newcomer counts itself owner at once, and a
    # replica that already counts it established re-publishes the old owner's backups to
    # it, so it and the old owner crawl the same hosts during the wait (duplicate fetches).
    min_peer_age: float = bounded(0.0, min=0, max=DAY, help="seconds before a new ID owns hosts")
    # STORE_TASK intake per sender (tasks/s, burst) before it is answered "busy" and retries.
    sender_tasks_per_s: float = bounded(
        5_000.0, gt=0, max=10**9, help="tasks/s a sender may add before busy"
    )
    sender_tasks_burst: float = bounded(
        200_000.0, min=1, max=10**12, help="tasks a sender may add at once"
    )

    def __post_init__(self) -> None:
        _validate(self)

    def node_config(self) -> NodeConfig:
        return NodeConfig(
            ksize=self.ksize,
            alpha=self.alpha,
            rpc_timeout=self.rpc_timeout,
            failures_before_evict=self.failures_before_evict,
            secret=self.secret,
            ping_interval=self.ping_interval,
            refresh_interval=self.refresh_interval,
            min_owner_age=self.min_peer_age,
        )
