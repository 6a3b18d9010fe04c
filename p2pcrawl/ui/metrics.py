"""Prometheus exposition of a peer's counters, read at scrape time.

A custom collector on a private registry reads the live counters when scraped, so the hot
path only bumps plain integers and never touches prometheus-client objects, and two peers
in one process (tests, ``p2pcrawl demo``) never share the global registry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from p2pcrawl.network import Peer

__all__ = ["PeerMetrics"]

STATES = ("joining", "active", "waiting", "finished", "leaving", "stopped")

# (metric name, help, key in Peer.status())
_STATUS_GAUGES = (
    ("p2pcrawl_tasks_queued", "URLs queued on this peer, not yet fetched", "tasks_queued"),
    ("p2pcrawl_tasks_in_flight", "URLs being fetched now", "tasks_in_flight"),
    ("p2pcrawl_backups_held", "Backup copies held for other owners", "backups_held"),
    ("p2pcrawl_done", "URLs recorded as done", "done"),
    ("p2pcrawl_peers", "Peers in the routing table", "peers"),
    ("p2pcrawl_network_size", "Peers in the network, as this peer estimates it", "network_size"),
    ("p2pcrawl_rpc_in_transit", "Task batches sent and not yet acknowledged", "rpc_in_transit"),
    ("p2pcrawl_uptime_seconds", "Seconds since the peer started", "uptime_s"),
)

# (metric name, help, CrawlStats attribute); counters get the _total suffix on the wire
_CRAWL_COUNTERS = (
    ("p2pcrawl_pages_fetched", "HTTP responses received, robots.txt excluded", "pages_fetched"),
    ("p2pcrawl_bytes_fetched", "Payload bytes received", "bytes_fetched"),
    ("p2pcrawl_urls_discovered", "New URLs routed to their owners", "urls_discovered"),
    ("p2pcrawl_links_extracted", "Links extracted from pages", "links_extracted"),
    ("p2pcrawl_html_parsed", "HTML pages parsed", "html_parsed"),
    ("p2pcrawl_robots_fetched", "robots.txt fetches", "robots_fetched"),
    ("p2pcrawl_robots_disallowed", "URLs refused by robots.txt", "robots_disallowed"),
    ("p2pcrawl_out_of_scope", "Links outside the crawl scope", "out_of_scope"),
    ("p2pcrawl_too_deep", "Links beyond the maximum depth", "too_deep"),
    ("p2pcrawl_seen_cache_hits", "Links dropped by the seen cache", "seen_cache_hits"),
    ("p2pcrawl_redirects", "Redirects followed", "redirects"),
    ("p2pcrawl_retries", "Fetches retried", "retries"),
    ("p2pcrawl_truncated", "Pages archived with a cut body (WARC-Truncated)", "truncated"),
    ("p2pcrawl_parsed_in_worker", "Pages parsed in a parse process", "parsed_in_worker"),
    ("p2pcrawl_non_html", "Responses that were not HTML", "non_html"),
    ("p2pcrawl_sitemaps_read", "Sitemap files read", "sitemaps_read"),
    ("p2pcrawl_sitemap_urls", "Page URLs taken from sitemaps", "sitemap_urls"),
    ("p2pcrawl_requisites_fetched", "Page requisites fetched", "requisites_fetched"),
    ("p2pcrawl_nofollow_pages", "Responses marked nofollow for us", "nofollow_pages"),
    ("p2pcrawl_canonical_links", "Canonical URLs routed", "canonical_links"),
)

# (metric name, help, key in CrawlNode.stats()) for {method: count} maps
_RPC_COUNTERS = (
    ("p2pcrawl_rpc_sent", "RPC requests sent", "rpc_sent"),
    ("p2pcrawl_rpc_received", "RPC requests received", "rpc_received"),
    ("p2pcrawl_rpc_failed", "RPC requests that got no reply in time", "rpc_failed"),
    ("p2pcrawl_rpc_errors", "RPC error replies received", "rpc_errors"),
)


class _Collector:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def collect(self) -> Iterator[Metric]:
        peer = self.peer
        st = dict(peer.status())
        info = InfoMetricFamily("p2pcrawl_peer", "This peer's identity")
        info.add_metric([], {"node_id": peer.node_id.hex(), "version": str(st["version"])})
        yield info
        state = StateSetMetricFamily("p2pcrawl_state", "Lifecycle state")
        state.add_metric([], {s: s == st["state"] for s in STATES})
        yield state
        for name, help_, key in _STATUS_GAUGES:
            yield _gauge(name, help_, _number(st.get(key)))
        yield from self._crawl()
        yield from self._revisits(st.get("revisit"))
        yield from self._rpc()

    def _revisits(self, rev: Any) -> Iterator[Metric]:
        """Continuous mode (docs/freshness.md): what the revisits found."""
        if not rev:
            return
        yield _labelled_counter(
            "p2pcrawl_revisits",
            "Revisits of crawled pages, by what they found",
            "outcome",
            {k: rev[k] for k in ("not_modified", "unchanged", "gone", "failed", "postponed")}
            | {"changed": rev["changes_detected"]},
        )
        c = CounterMetricFamily("p2pcrawl_revisit_retired", "Pages retired (gone too often)")
        c.add_metric([], float(rev["retired"]))
        yield c
        yield _gauge("p2pcrawl_revisit_tracked", "Pages with a visit history", rev["tracked"])
        yield _gauge("p2pcrawl_revisit_due", "Pages due for a revisit now", rev["due_now"])
        yield _gauge(
            "p2pcrawl_revisit_next_due_timestamp_seconds",
            "When the next page is due (Unix time; 0: none)",
            _number(rev["next_due_at"]),
        )

    def _crawl(self) -> Iterator[Metric]:
        peer = self.peer
        parts = peer.running
        if parts is None:
            return
        s, handler = parts.engine.stats, parts.handler
        urls_, hosts = peer.frontier_size()
        yield _gauge("p2pcrawl_frontier_urls", "URLs in the in-memory frontier", urls_)
        yield _gauge("p2pcrawl_frontier_hosts", "Hosts in the in-memory frontier", hosts)
        for name, help_, attr in _CRAWL_COUNTERS:
            c = CounterMetricFamily(name, help_)
            c.add_metric([], float(getattr(s, attr)))
            yield c
        yield _labelled_counter("p2pcrawl_fetch_errors", "Fetch errors", "kind", s.errors)
        yield _labelled_counter(
            "p2pcrawl_truncated_by", "Pages archived truncated, by reason", "reason", s.truncated_by
        )
        yield _labelled_counter(
            "p2pcrawl_parse_bounded", "Parses that hit a bound, by bound", "bound", s.parse_bounded
        )
        yield _labelled_counter(
            "p2pcrawl_budget", "URLs held back by a budget or trap rule", "rule", s.budget
        )
        lag = parts.node.lag.snapshot()
        yield _gauge(
            "p2pcrawl_loop_lag_p99_seconds", "Event-loop lag, p99 of recent samples", lag.p99
        )
        yield _gauge(
            "p2pcrawl_loop_lag_max_seconds", "Event-loop lag, max of recent samples", lag.max
        )
        yield _labelled_counter(
            "p2pcrawl_http_responses",
            "HTTP responses by status code",
            "code",
            {str(code): n for code, n in s.status.items()},
        )
        h = HistogramMetricFamily("p2pcrawl_fetch_seconds", "Fetch duration in seconds")
        h.add_metric([], s.fetch_hist.buckets_cumulative(), sum_value=s.fetch_hist.total)
        yield h
        for name, help_, value in (
            (
                "p2pcrawl_malformed_tasks",
                "Tasks from peers that failed checks",
                handler.malformed,
            ),
            (
                "p2pcrawl_refused_keys",
                "Keys refused because another peer owns them",
                handler.refused,
            ),
            (
                "p2pcrawl_store_task_busy",
                "STORE_TASK requests answered busy (sender over its rate; it retries)",
                handler.busy,
            ),
            (
                "p2pcrawl_done_claims_refused",
                "Pages other peers said were done, not recorded: an open network takes that "
                "only from proven members near the key (docs/security.md)",
                handler.claims.refused,
            ),
            (
                "p2pcrawl_history_rows_refused",
                "Visit history rows other peers sent, not taken: from a sender whose word "
                "about their key is not taken (docs/security.md)",
                peer.parts.visit_history.refused_rows,
            ),
            ("p2pcrawl_handoff_tasks", "Tasks handed to other owners", peer.handoff.tasks),
            ("p2pcrawl_handoff_failed", "Tasks a handoff could not place", peer.handoff.failed),
        ):
            c = CounterMetricFamily(name, help_)
            c.add_metric([], float(value))
            yield c
        v = peer.parts.vouching
        yield _labelled_counter(
            "p2pcrawl_claims_checked",
            "Open network: pages members said were done, held for a sample re-fetch, by what "
            'became of them (docs/security.md, "Forged work claims")',
            "outcome",
            {
                "verified": v.verified,
                "mismatch": v.mismatched,
                "unverified": v.unverified,
                "overflow": v.overflow,
                "distrusted": v.distrusted_refused,
            },
        )
        c = CounterMetricFamily(
            "p2pcrawl_claims_refetches", "Open network: pages fetched again to check a claim"
        )
        c.add_metric([], float(v.refetches))
        yield c
        yield _labelled_counter(
            "p2pcrawl_tasks_rejected",
            "Tasks from peers outside this peer's own scope or depth limit, by reason",
            "reason",
            {r: handler.rejected.get(r, 0) for r in ("scope", "depth")},
        )
        links = peer.dispatch_status()
        yield _labelled_counter(
            "p2pcrawl_links_to_owners",
            "Links found here for other peers' keys: sent, or not sent because the owner "
            "said it holds them (docs/architecture.md)",
            "outcome",
            {"sent": links["urls_sent"], "owner_holds": links["skipped_known"]},
        )

    def _rpc(self) -> Iterator[Metric]:
        routing = self.peer.routing()
        if routing is None:
            return
        rpc = routing["rpc"]
        assert isinstance(rpc, dict)
        for name, help_, key in _RPC_COUNTERS:
            yield _labelled_counter(name, help_, "method", _as_counts(rpc.get(key)))
        yield _labelled_counter(
            "p2pcrawl_admission",
            "Routing-table admission checks, by outcome (docs/security.md)",
            "outcome",
            _as_counts(rpc.get("admission")),
        )
        yield _labelled_counter(
            "p2pcrawl_identities",
            "Open network: contacts' ID proofs, by outcome (docs/security.md)",
            "outcome",
            _as_counts(rpc.get("identities")),
        )
        yield _labelled_counter(
            "p2pcrawl_requests_unattested",
            "Open network: requests in a proven member's name without its signature, whose "
            "claims of finished work were dropped",
            "method",
            _as_counts(rpc.get("unattested")),
        )
        c = CounterMetricFamily(
            "p2pcrawl_goodbyes_refuted", "GOODBYEs not believed: the leaver still answered"
        )
        c.add_metric([], _number(rpc.get("goodbyes_refuted")))
        yield c
        yield _gauge(
            "p2pcrawl_dht_values", "Values in the DHT value store", _number(rpc.get("dht_values"))
        )
        yield _gauge(
            "p2pcrawl_dht_values_refused",
            "DHT STOREs refused by the value store's limits",
            _number(rpc.get("dht_refused")),
        )
        yield _labelled_counter(
            "p2pcrawl_datagrams_dropped",
            "Datagrams dropped, by reason",
            "reason",
            _as_counts(rpc.get("dropped")),
        )
        latency = GaugeMetricFamily(
            "p2pcrawl_rpc_latency_mean_seconds",
            "Mean RPC round trip since start",
            labels=["method"],
        )
        for method, ms in sorted(_as_counts(rpc.get("latency_ms")).items()):
            latency.add_metric([method], ms / 1000.0)
        yield latency
        for name, help_, key in (
            ("p2pcrawl_udp_datagrams_in", "UDP datagrams received", "datagrams_in"),
            ("p2pcrawl_udp_datagrams_out", "UDP datagrams sent", "datagrams_out"),
            ("p2pcrawl_udp_bytes_in", "UDP bytes received", "bytes_in"),
            ("p2pcrawl_udp_bytes_out", "UDP bytes sent", "bytes_out"),
            (
                "p2pcrawl_rpc_requests_resent",
                "RPC requests sent again for want of a reply",
                "requests_resent",
            ),
            (
                "p2pcrawl_rpc_duplicate_requests",
                "RPC requests received again, served once",
                "duplicate_requests",
            ),
        ):
            c = CounterMetricFamily(name, help_)
            c.add_metric([], _number(rpc.get(key)))
            yield c


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, help_)
    g.add_metric([], float(value))
    return g


def _labelled_counter(
    name: str, help_: str, label: str, counts: Mapping[str, float]
) -> CounterMetricFamily:
    c = CounterMetricFamily(name, help_, labels=[label])
    for key, n in sorted(counts.items()):
        c.add_metric([key], float(n))
    return c


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _as_counts(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}


class PeerMetrics:
    def __init__(self, peer: Peer) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(peer))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
