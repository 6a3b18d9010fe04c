"""p2pcrawl: a peer-to-peer web crawler on an extended Kademlia DHT."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
