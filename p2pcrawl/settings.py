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
:mod:`p2pcrawl.signalsettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from p2pcrawl.fields import (
    SettingsError,
    bounds,
    bounds_text,
    flag_of,
    option,
    range_error,
    validate,
)
from p2pcrawl.revisitsettings import RevisitSettings
from p2pcrawl.signalsettings import Requisites, SignalSettings
from protocol import DEFAULT_WORK_BITS, MAX_URL_LENGTH, NodeConfig

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
Partition = Literal["host", "url", "domain"]
PolitenessBy = Literal["host", "ip"]

DEFAULT_USER_AGENT_NAME = "p2pcrawl"

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
DAY = 86400.0


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


_NET = "network tuning"


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """The peer's place in the DHT."""

    partition: Partition = option(
        "host",
        "DHT key: the URL's host, the URL, or the host's registrable domain (a.example.org "
        "and b.example.org on one peer, fetched one request at a time)",
        choices=("host", "url", "domain"),
        group="crawl options",
    )
    replicas: int = option(
        2, "backup copies per task", min=0, max=16, metavar="R", group="crawl options"
    )
    # Host partition: an owner with a backlog lends one host at a time to a peer whose
    # fetchers are idle (network/lending.py), so the crawl does not last as long as the
    # busiest owner alone would need.
    lend: bool = option(
        True,
        "do not lend hosts to idle peers nor borrow from busy ones",
        flag="--no-lend",
        group="crawl options",
    )
    ksize: int = option(20, "Kademlia bucket size", min=2, max=1000, flag=False)
    alpha: int = option(3, "parallel lookups", min=1, max=64, flag=False)
    secret: str = option(
        "",
        "network key: datagrams without it are dropped. Required when --listen is not "
        "loopback; a founder without one generates it, stores it in DATA/network.key and "
        "prints the join command",
        metavar="S",
        group="crawl options",
    )
    rpc_timeout: float = option(2.0, "RPC reply timeout", gt=0, max=300, metavar="S", group=_NET)
    failures_before_evict: int = option(
        1,
        "failed probe rounds (direct and indirect) before a peer may be declared dead",
        min=1,
        max=1000,
        metavar="N",
        group=_NET,
    )
    # memberlist's defaults, anchored at a 1 s probe interval (protocol/liveness.py): a dead
    # peer is declared dead about 3-5 s after it died in networks of up to 16 peers.
    suspicion_timeout: float = option(
        3.0,
        "seconds a peer must stay unreachable before it is declared dead, in a network of "
        "up to 10 peers (x log10 N beyond); stretched while no other peer confirms it and "
        "while this peer itself is overloaded",
        gt=0,
        max=DAY,
        metavar="S",
        group=_NET,
    )
    # Helpers asked to probe a suspect (SWIM's PING-REQ).
    indirect_probes: int = option(3, "helpers probing a suspect", min=0, max=32, flag=False)
    # Intervals have floors: 0 would make an idle peer spin a core.
    ping_interval: float = option(1.0, "liveness pings", min=0.05, max=DAY, metavar="S", group=_NET)
    refresh_interval: float = option(
        60.0, "routing-table refresh", min=0.5, max=DAY, metavar="S", group=_NET
    )
    republish_interval: float = option(
        30.0,
        "how often backups of vanished owners are re-published",
        min=0.5,
        max=DAY,
        metavar="S",
        group=_NET,
    )
    dispatch_batch: int = option(256, "tasks per routed batch", min=1, max=1_000_000, flag=False)
    dispatch_flush_s: float = option(0.2, "seconds a batch may wait", gt=0, max=60, flag=False)
    handoff_timeout: float = option(30.0, "seconds for a hand-off", gt=0, max=DAY, flag=False)
    # A new ID takes over hosts only after it has been live this long (docs/security.md):
    # about one liveness round, so a node that shows up next to a busy key and vanishes
    # again catches nothing. The newcomer applies it to itself too: it owns no key until
    # its neighbours count it as an owner and have handed over its keys (it crawls nothing
    # meanwhile), so the old owner and the newcomer never crawl one host at once.
    min_peer_age: float = option(
        5.0,
        "seconds a new peer must stay live before it takes over hosts (0: at once)",
        min=0,
        max=DAY,
        metavar="S",
        group=_NET,
    )
    # STORE_TASK intake per sender (tasks/s, burst) before it is answered "busy" and retries.
    sender_tasks_per_s: float = option(
        5_000.0, "tasks/s a sender may add before busy", gt=0, max=10**9, flag=False
    )
    sender_tasks_burst: float = option(
        200_000.0, "tasks a sender may add at once", min=1, max=10**12, flag=False
    )
    heal_interval: float = option(
        5.0, "how often a shrunken routing table is checked", gt=0, max=DAY, flag=False
    )
    heal_max_backoff: float = option(
        30.0, "the longest wait between rejoin attempts", gt=0, max=DAY, flag=False
    )
    finish_settle: float = option(
        3.0,
        "quiet this long, everywhere, before the network is finished",
        gt=0,
        max=DAY,
        flag=False,
    )
    # A half cut off by a partition looks dead: a peer declared dead keeps the network from
    # finishing this long, the merge bound (heal_interval + heal_max_backoff + a join), so
    # a half is never reported finished while the other may still come back with work
    # (docs/membership.md, "A network that knows it is done").
    partition_hold: float = option(
        36.0,
        "seconds a peer declared dead keeps the network from finishing (a partition "
        "longer than that is taken for a crash)",
        min=0,
        max=DAY,
        metavar="S",
        group=_NET,
    )
    # A brand-new joiner's probe (protocol.survey); past it, a random ID and a log line.
    id_survey_timeout: float = option(
        10.0, "seconds a new joiner may spend learning the network", gt=0, max=300, flag=False
    )
    # An open network's node IDs cost 2**bits hashes each (protocol.nodekey), and a peer
    # counts only IDs with that much work: every peer of a network must agree on it.
    id_work_bits: int = option(
        DEFAULT_WORK_BITS, "leading zero bits of an ID's puzzle", min=0, max=40, flag=False
    )

    def __post_init__(self) -> None:
        validate(self)

    def node_config(self) -> NodeConfig:
        return NodeConfig(
            ksize=self.ksize,
            alpha=self.alpha,
            rpc_timeout=self.rpc_timeout,
            failures_before_evict=self.failures_before_evict,
            suspicion_timeout=self.suspicion_timeout,
            indirect_probes=self.indirect_probes,
            secret=self.secret,
            ping_interval=self.ping_interval,
            refresh_interval=self.refresh_interval,
            min_owner_age=self.min_peer_age,
            # A leave stops fetching, settles loans, then hands off key by key: each
            # handoff is bounded by ``handoff_timeout``, the whole by a few of them.
            departed_ttl=max(120.0, self.refresh_interval, 4 * self.handoff_timeout),
            work_bits=self.id_work_bits,
        )
