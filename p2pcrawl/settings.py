"""Every limit, timeout and default of the crawler, in one place.

The CLI builds these from flags; tests build them directly. All are frozen so a running
component can never see a limit change under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from protocol import NodeConfig

Policy = Literal["breadth-first", "performance-first", "crawl-capability"]
Partition = Literal["host", "url"]

DEFAULT_USER_AGENT_NAME = "p2pcrawl"


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """HTTP client limits (seed 004: one persistent connection per server)."""

    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    total_timeout: float = 60.0
    max_body_bytes: int = 10 * 1024 * 1024
    max_redirects: int = 5
    max_url_length: int = 2048
    max_links_per_page: int = 5000
    max_header_bytes: int = 64 * 1024


@dataclass(frozen=True, slots=True)
class PolitenessSettings:
    """Per-host gap rules (Mercator: wait a multiple of the last response time)."""

    delay: float = 1.0
    politeness_factor: float = 5.0
    max_delay: float = 120.0
    default_retry_after: float = 60.0
    robots_ttl: float = 24 * 3600.0
    robots_error_ttl: float = 600.0
    max_retries: int = 3


@dataclass(frozen=True, slots=True)
class ScopeSettings:
    """What may be fetched at all."""

    allow_domains: tuple[str, ...] = ()
    allow_private: bool = False
    max_depth: int = 50
    max_pages: int = 0  # pages this peer fetches (each peer counts its own); 0 = unlimited
    max_network_pages: int = 0  # pages all peers fetch together (approximate); 0 = unlimited
    include: tuple[str, ...] = ()  # regular expressions; a URL must match one, if any given
    exclude: tuple[str, ...] = ()  # regular expressions; a URL matching one is left out


@dataclass(frozen=True, slots=True)
class CrawlSettings:
    """Everything the crawl engine needs."""

    concurrency: int = 32
    policy: Policy = "breadth-first"
    user_agent: str = ""
    contact_url: str = ""
    fetch: FetchLimits = field(default_factory=FetchLimits)
    politeness: PolitenessSettings = field(default_factory=PolitenessSettings)
    scope: ScopeSettings = field(default_factory=ScopeSettings)
    frontier_window: int = 100_000  # URLs held in RAM; the rest wait in the task store
    host_queue_window: int = 1_000  # URLs per host held in RAM
    seen_cache_size: int = 1 << 18  # seed 002: ~2^18 entries remove most repeats
    warc: bool = True
    warc_max_bytes: int = 1024 * 1024 * 1024

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
    replicas: int = 2
    ksize: int = 20
    alpha: int = 3
    secret: str = ""
    rpc_timeout: float = 2.0
    failures_before_evict: int = 3  # failed probe rounds before a suspect may be declared dead
    suspicion_timeout: float = 10.0  # and seconds of silence (stretched under local overload)
    indirect_probes: int = 3  # helpers asked to probe a suspect (SWIM's PING-REQ)
    ping_interval: float = 5.0
    refresh_interval: float = 60.0
    republish_interval: float = 30.0
    dispatch_batch: int = 256
    dispatch_flush_s: float = 0.05
    handoff_timeout: float = 30.0
    # A new ID takes over hosts only after others have seen it live this long
    # (docs/security.md). Off by default: the newcomer counts itself owner at once, and a
    # replica that already counts it established re-publishes the old owner's backups to
    # it, so it and the old owner crawl the same hosts during the wait (duplicate fetches).
    min_peer_age: float = 0.0
    # STORE_TASK intake per sender (tasks/s, burst) before it is answered "busy" and retries.
    sender_tasks_per_s: float = 5_000.0
    sender_tasks_burst: float = 200_000.0
    heal_interval: float = 5.0  # how often a shrunken routing table is checked
    heal_max_backoff: float = 30.0  # the longest wait between rejoin attempts
    finish_settle: float = 3.0  # quiet this long, everywhere, before the network is finished

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
        )
