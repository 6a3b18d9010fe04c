"""What a user touches: the ``p2pcrawl`` command, the status server and its metrics, the demo."""

from __future__ import annotations

from p2pcrawl.ui.cli import main
from p2pcrawl.ui.metrics import PeerMetrics
from p2pcrawl.ui.status import StatusServer

__all__ = ["PeerMetrics", "StatusServer", "main"]
