"""Prometheus exposition of a peer's counters, read at scrape time.

A custom collector on a private registry reads the live counters when scraped, so the hot
path only bumps plain integers and never touches prometheus-client objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from p2pcrawl.peer import Peer

__all__ = ["PeerMetrics"]


class _Collector:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def collect(self) -> Iterator[Metric]:
        peer = self.peer
        eng = peer.engine
        st = peer.status()
        for name, help_, key in (
            ("p2pcrawl_tasks_queued", "URLs queued on this peer", "tasks_queued"),
            ("p2pcrawl_tasks_in_flight", "URLs being fetched", "tasks_in_flight"),
            ("p2pcrawl_backups_held", "Backup copies held for neighbours", "backups_held"),
            ("p2pcrawl_done", "URLs recorded as done", "done"),
            ("p2pcrawl_peers", "Peers in the routing table", "peers"),
            ("p2pcrawl_uptime_seconds", "Seconds since start", "uptime_s"),
        ):
            g = GaugeMetricFamily(name, help_)
            g.add_metric([], float(st[key]))  # type: ignore[arg-type]
            yield g
        if eng is None:
            return
        s = eng.stats
        for name, help_, value in (
            ("p2pcrawl_pages_fetched", "HTTP responses received", s.pages_fetched),
            ("p2pcrawl_bytes_fetched", "Payload bytes received", s.bytes_fetched),
            ("p2pcrawl_urls_discovered", "New URLs routed to owners", s.urls_discovered),
            ("p2pcrawl_links_extracted", "Links extracted from pages", s.links_extracted),
            ("p2pcrawl_robots_disallowed", "URLs refused by robots.txt", s.robots_disallowed),
            ("p2pcrawl_out_of_scope", "Links outside the crawl scope", s.out_of_scope),
            ("p2pcrawl_seen_cache_hits", "Links dropped by the seen cache", s.seen_cache_hits),
        ):
            c = CounterMetricFamily(name, help_)
            c.add_metric([], float(value))
            yield c
        errors = CounterMetricFamily("p2pcrawl_fetch_errors", "Fetch errors", labels=["kind"])
        for kind, n in sorted(s.errors.items()):
            errors.add_metric([kind], float(n))
        yield errors
        status = CounterMetricFamily("p2pcrawl_http_responses", "Responses", labels=["code"])
        for code, n in sorted(s.status.items()):
            status.add_metric([str(code)], float(n))
        yield status
        h = HistogramMetricFamily("p2pcrawl_fetch_seconds", "Fetch duration")
        h.add_metric([], s.fetch_hist.buckets_cumulative(), sum_value=s.fetch_hist.total)
        yield h
        node = peer.node
        if node is not None:
            rpc = node.stats()
            sent = CounterMetricFamily("p2pcrawl_rpc_sent", "RPCs sent", labels=["method"])
            for method, v in sorted(_as_counts(rpc.get("rpc_sent")).items()):
                sent.add_metric([method], v)
            yield sent
            recv = CounterMetricFamily("p2pcrawl_rpc_received", "RPCs received", labels=["method"])
            for method, v in sorted(_as_counts(rpc.get("rpc_received")).items()):
                recv.add_metric([method], v)
            yield recv
            dropped = CounterMetricFamily(
                "p2pcrawl_datagrams_dropped", "Datagrams dropped", labels=["reason"]
            )
            for reason, v in sorted(_as_counts(rpc.get("dropped")).items()):
                dropped.add_metric([reason], v)
            yield dropped


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
