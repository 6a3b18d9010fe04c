"""Test fixtures that ship with the package: a generated web with its ground truth, and a
harness that runs real peer processes on loopback. Tests, benchmarks, examples and
``p2pcrawl demo`` use them; the crawler itself never imports this package."""

from __future__ import annotations

from p2pcrawl.testing.bytecode import cache_bytecode
from p2pcrawl.testing.changing import ChangingConfig, ChangingWeb, Freshness
from p2pcrawl.testing.cluster import FAST_DETECTION, Cluster, PeerProc
from p2pcrawl.testing.hostile import HostileConfig, HostileWeb
from p2pcrawl.testing.spoof import raw_spoofing, send_spoofed
from p2pcrawl.testing.web import TestWeb, TestWebConfig, canonical_target

__all__ = [
    "FAST_DETECTION",
    "ChangingConfig",
    "ChangingWeb",
    "Cluster",
    "Freshness",
    "HostileConfig",
    "HostileWeb",
    "PeerProc",
    "TestWeb",
    "TestWebConfig",
    "cache_bytecode",
    "canonical_target",
    "raw_spoofing",
    "send_spoofed",
]
