"""The extended Kademlia protocol: ownership math, crawl RPC messages and the node.

Nothing here knows about HTTP; it moves opaque URL tasks between peers.
"""

from __future__ import annotations
