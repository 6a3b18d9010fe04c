"""Every limit, timeout and default of the crawler, in one place.

The CLI builds these from flags; tests build them directly. All are frozen so a running
component can never see a limit change under it.

A field is also a command-line flag and a TOML key when its metadata has a ``help`` (and no
``"flag": False``); :func:`option` writes that metadata, and a plain ``field(metadata={"min":
..., "max": ..., "help": ...})`` does the same: ``p2pcrawl/ui/options.py`` generates the
argparse options and the config loader from these dataclasses, so adding a flag is adding a
field. Every numeric setting has a range (``min``/``max``, ``gt`` for a strict lower
bound), checked by ``__post_init__`` (:func:`validate`) whichever way the settings were made
(flags, TOML, code): an absurd value (``concurrency = 10**9``, an interval of 0 that would
spin a core) is refused with one clear :class:`SettingsError`. A ranged field that is not a
flag says ``flag=False``. The site-signal settings (``CrawlSettings.signals``) are in
:mod:`p2pcrawl.signalsettings`, the peer's place in the network (``PeerSettings``) in
:mod:`p2pcrawl.peersettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from p2pcrawl.fields import (
    DAY,
    SettingsError,
    bounds,
    bounds_text,
    flag_of,
    option,
    range_error,
    validate,
)
from p2pcrawl.peersettings import Partition, PeerSettings
from p2pcrawl.revisitsettings import RevisitSettings
from p2pcrawl.signalsettings import Requisites, SignalSettings
from protocol import MAX_URL_LENGTH

__all__ = [
    "DEFAULT_USER_AGENT_NAME",
    "CrawlSettings",
    "DomainRules",
    "FetchLimits",
    "Partition",
    "PeerSettings",
    "Policy",
    "PolitenessBy",
    "PolitenessSettings",
    "Requisites",
    "RevisitSettings",
    "ScopeSettings",
    "SettingsError",
    "SignalSettings",
    "bounds",
    "bounds_text",
    "flag_of",
    "option",
    "range_error",
    "validate",
]

Policy = Literal["breadth-first", "performance-first", "crawl-capability", "longest-first"]
PolitenessBy = Literal["host", "ip"]

DEFAULT_USER_AGENT_NAME = "p2pcrawl"

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """HTTP client limits (High-performance crawl scheduling: one persistent connection per
    server)."""

    connect_timeout: float = option(10.0, "seconds to connect", gt=0, max=600, flag=False)
    read_timeout: float = option(30.0, "seconds between body reads", gt=0, max=3600, flag=False)
    total_timeout: float = option(60.0, "seconds for a whole response", gt=0, max=DAY, flag=False)
    max_body_bytes: int = option(
        10 * MIB,
        "truncate bodies past this",
        min=1,
        max=GIB,
        flag="--max-body",
        metavar="BYTES",
        default_text="10 MiB",
        size=True,
    )
    max_redirects: int = option(5, "redirect hops", min=0, max=50, metavar="N")
    max_url_length: int = option(
        MAX_URL_LENGTH, "longest URL kept", min=64, max=64 * KIB, flag=False
    )
    max_links_per_page: int = option(5000, "links taken per page", min=0, max=1_000_000, flag=False)
    max_header_bytes: int = option(64 * KIB, "header line size", min=KIB, max=16 * MIB, flag=False)
    resolve: tuple[str, ...] = option(
        (),
        "connect to ADDRESS for host NAME, as curl --resolve does (a site before its DNS)",
        metavar="NAME:ADDRESS",
        default_text="repeatable",
    )

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True, slots=True)
class PolitenessSettings:
    """Per-host gap rules (Mercator: wait a multiple of the last response time)."""

    delay: float = option(
        1.0, "minimum gap between requests to a host", min=0.0, max=DAY, metavar="S"
    )
    politeness_factor: float = option(
        5.0,
        "wait F times the host's last response time before the next request",
        min=0.0,
        max=1000,
        metavar="F",
    )
    max_delay: float = option(120.0, "longest per-host wait", min=0, max=7 * DAY, flag=False)
    default_retry_after: float = option(60.0, "429/503 wait", min=0, max=7 * DAY, flag=False)
    # At most a day: RFC 9309 (2.4) asks crawlers not to use a cached robots.txt for longer.
    robots_ttl: float = option(DAY, "seconds robots.txt is kept", gt=0, max=DAY, flag=False)
    robots_error_ttl: float = option(
        600.0, "failed robots.txt wait", gt=0, max=30 * DAY, flag=False
    )
    max_retries: int = option(3, "retries of a failed fetch", min=0, max=100, flag=False)
    # BUbiNG's IP delay, Heritrix's IP queues: hosts on one server share its gap and its
    # connection slot on this peer (docs/signals.md says what holds across peers).
    politeness_by: PolitenessBy = option(
        "host",
        "politeness unit on this peer: each host, or each server address (hosts that resolve "
        "to one address share one gap and one connection)",
        choices=("host", "ip"),
    )

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
    # Loopback only (127.0.0.0/8, ::1): servers on this machine, while every other
    # non-global address stays refused.
    allow_loopback: bool = option(
        False,
        "allow this machine's loopback addresses only (127.0.0.0/8, ::1); every other "
        "non-global address stays refused",
    )
    max_pages: int = option(
        0,
        "this peer stops fetching after N pages; each peer counts its own, so a network of P "
        "peers fetches at most P x N",
        min=0,
        max=10**15,
        metavar="N",
        default_text="0: no limit",
    )
    max_network_pages: int = option(
        0,
        "every peer stops fetching once the network view counts N pages fetched by all peers "
        "together; checked every few seconds, so it may overshoot",
        min=0,
        max=10**15,
        metavar="N",
        default_text="0: no limit",
    )
    include: tuple[str, ...] = option(
        (),
        "crawl only URLs matching one of these regular expressions",
        metavar="REGEX",
        default_text="repeatable",
    )
    exclude: tuple[str, ...] = option(
        (),
        "never crawl URLs matching this regular expression; wins over --include",
        metavar="REGEX",
        default_text="repeatable",
    )
    max_depth: int = option(50, "link depth limit", min=0, max=100_000, metavar="N")
    # Per-host budgets (Heritrix's queue budgets, StormCrawler's max URLs per host): one
    # host, a trap or a huge site, cannot take the whole crawl or fill the disk.
    max_pages_per_host: int = option(
        100_000, "pages fetched from one host at most (0: no limit)", min=0, max=10**12, metavar="N"
    )
    max_urls_per_host: int = option(
        250_000,
        "URLs of one host this peer queues at most, so a trap cannot fill the disk (0: no limit)",
        min=0,
        max=10**12,
        metavar="N",
    )
    max_disk_bytes: int = option(
        0,
        "stop fetching once the data directory holds this much (500M, 20G)",
        min=0,
        max=1 << 60,
        flag="--max-disk",
        metavar="SIZE",
        default_text="0: no limit",
        size=True,
    )

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True, slots=True)
class DomainRules:
    """One domain's own settings, from a ``[domains."example.org"]`` table of the config
    (``p2pcrawl.crawl.domains`` reads them and says what each one does); None: as the rest."""

    delay: float | None = None
    concurrency: int | None = None
    max_pages: int | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    user_agent: str | None = None


@dataclass(frozen=True, slots=True)
class CrawlSettings:
    """Everything the crawl engine needs."""

    concurrency: int = option(32, "parallel fetches", min=1, max=4096, metavar="N")
    policy: Policy = option(
        "breadth-first",
        "host scheduling policy, after High-performance crawl scheduling §4",
        choices=("breadth-first", "performance-first", "crawl-capability", "longest-first"),
    )
    user_agent: str = option(
        "", "User-Agent", metavar="UA", default_text=f"{DEFAULT_USER_AGENT_NAME}/VERSION"
    )
    contact_url: str = option("", "contact URL added to the User-Agent", metavar="URL")
    max_rate: int = option(
        0,
        "download at most this many bytes a second (500K, 4M), requests of the hosts with "
        "the most queued pages first; set a little below the link's rate so no queue builds "
        "in front of this peer",
        min=0,
        max=1 << 40,
        metavar="BYTES",
        default_text="0: no limit",
        size=True,
    )
    fetch: FetchLimits = field(default_factory=FetchLimits)
    politeness: PolitenessSettings = field(default_factory=PolitenessSettings)
    scope: ScopeSettings = field(default_factory=ScopeSettings)
    revisit: RevisitSettings = field(default_factory=RevisitSettings)
    signals: SignalSettings = field(default_factory=SignalSettings)
    # URLs held in RAM; the rest wait in the task store.
    frontier_window: int = option(100_000, "URLs held in RAM", min=16, max=100_000_000, flag=False)
    host_queue_window: int = option(
        1_000, "URLs per host in RAM", min=1, max=10_000_000, flag=False
    )
    # Mercator: ~2^18 entries remove most repeats. Slots of a two-way set-associative table
    # (p2pcrawl.crawl.seen), 8 bytes each: 2^19 hit as often as a 2^18 LRU, in 4 MiB.
    seen_cache_size: int = option(1 << 19, "recently seen URLs", min=0, max=1 << 28, flag=False)
    warc: bool = option(True, "do not write WARC files", flag="--no-warc")
    warc_max_bytes: int = option(
        GIB,
        "rotate WARC files",
        min=MIB,
        max=1 << 40,
        metavar="BYTES",
        default_text="1 GiB",
        size=True,
    )
    # Pages that could hold the event loop are parsed in these processes, each page under
    # a deadline (p2pcrawl.crawl.parseproc).
    parse_workers: int = option(1, "parse processes", min=1, max=64, flag=False)
    parse_deadline: float = option(10.0, "seconds one parse may take", gt=0, max=3600, flag=False)
    # Per-domain rules (the config's [domains."…"] tables), most specific domain wins.
    domains: tuple[tuple[str, DomainRules], ...] = ()

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
