"""Per-peer persistent stores: task store, backup store, done record, Bloom filters.

Nothing here knows about HTTP or the network; SQLite (WAL) files under the data directory.
"""

from __future__ import annotations
