"""``NodeConfig``: what a ``CrawlNode`` is built with (its limits, timers and key).

The same defaults as the command line's (``p2pcrawl.settings.PeerSettings``), which builds
one with ``PeerSettings.node_config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.admission import AdmissionLimits
from protocol.endpoint import InboundLimits
from protocol.nodekey import DEFAULT_WORK_BITS, NodeKey
from protocol.valuestore import StoreLimits

__all__ = ["NodeConfig"]


@dataclass(frozen=True, slots=True)
class NodeConfig:
    ksize: int = 20
    alpha: int = 3
    rpc_timeout: float = 2.0
    # Liveness (``liveness``): a suspect is declared dead after this many failed probe
    # rounds *and* ``suspicion_timeout`` seconds (scaled as ``liveness`` says). The same
    # defaults as the command line's (``p2pcrawl.settings.PeerSettings``).
    failures_before_evict: int = 1
    suspicion_timeout: float = 3.0
    indirect_probes: int = 3
    secret: str = ""
    ping_interval: float = 1.0
    refresh_interval: float = 60.0
    min_owner_age: float = 0.0  # seconds a new contact must stay live before it owns keys
    # How long a node that said GOODBYE stays out unless it joins again (a lookup of its own
    # ID): at least as long as its handoff may take, so none of that traffic re-admits it.
    departed_ttl: float = 120.0
    store_limits: StoreLimits = field(default_factory=StoreLimits)
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    inbound: InboundLimits = field(default_factory=InboundLimits)
    # An open network's node key (``identities``): with it, this node signs its crawl RPCs
    # and counts as members only contacts that proved their IDs with at least
    # ``work_bits`` of work. Ignored with a secret.
    key: NodeKey | None = field(default=None, compare=False, repr=False)
    work_bits: int = DEFAULT_WORK_BITS
