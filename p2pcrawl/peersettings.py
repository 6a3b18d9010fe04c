"""The peer's place in the network: its DHT, membership and joining settings.

Part of :mod:`p2pcrawl.settings` (which re-exports :class:`PeerSettings`), kept apart as the
site-signal and revisit settings are; the same rules hold (:func:`p2pcrawl.fields.option`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from p2pcrawl.fields import DAY, option, validate
from protocol import DEFAULT_WORK_BITS, NodeConfig

__all__ = ["Partition", "PeerSettings"]

Partition = Literal["host", "url", "domain"]

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
    # A joiner's bootstrap peer may be restarting, paused or swamped for a moment, or started
    # a moment after it by the same script: it is asked again, after a pause that doubles
    # from 0.5 s to 5 s, for this long (as Consul's retry_join), before the joiner gives up.
    join_retry: float = option(
        30.0,
        "seconds a joiner keeps asking its --bootstrap peers before it gives up (0: ask once)",
        min=0,
        max=DAY,
        metavar="S",
        group=_NET,
    )
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
