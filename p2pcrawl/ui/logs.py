"""Log output of the command: plain lines for people, one JSON object per line for machines.

Every line passes a rate limit per message template: a failure that repeats (a descriptor
limit hit on every accept, a dead neighbour on every RPC) logs its first few lines in each
window and then one line saying how many were held back, instead of flooding the log.
"""

from __future__ import annotations

import json
import logging
import sys

from p2pcrawl.aio import Throttle

__all__ = ["RateLimitFilter", "set_node_id", "setup_logging"]

LOG_FORMATS = ("text", "json")
# The node ID of the peer this process runs, for JSON lines: a log shipper collecting many
# peers' lines tells them apart by it (set once the ID is known, again once it is chosen).
_node_id = ""


def set_node_id(node_id: str) -> None:
    global _node_id
    _node_id = node_id


class RateLimitFilter(logging.Filter):
    """At most ``burst`` records per (logger, message template) every ``window`` seconds."""

    def __init__(self, burst: int = 10, window: float = 10.0, max_keys: int = 1000) -> None:
        super().__init__()
        self.throttle = Throttle(burst, window, max_keys)

    @property
    def suppressed_total(self) -> int:
        return self.throttle.held_total

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.throttle.admit((record.name, record.msg))
        if held is None:
            return False
        if held:
            # Told on the next line of its kind, so the count is never silently lost.
            record.msg = f"{record.msg} [{held} similar lines held back in the last window]"
        return True


def setup_logging(level: str, fmt: str = "text") -> None:
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
    handler.addFilter(RateLimitFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if _node_id:
            doc["node"] = _node_id
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)
