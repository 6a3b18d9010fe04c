"""Log output of the command: plain lines for people, one JSON object per line for machines.

Every line passes a rate limit per message template: a failure that repeats (a descriptor
limit hit on every accept, a dead neighbour on every RPC) logs its first few lines in each
window and then one line saying how many were held back, instead of flooding the log.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from p2pcrawl.aio import Throttle

__all__ = ["RateLimitFilter", "json_lines", "say", "set_node_id", "setup_logging"]

LOG_FORMATS = ("text", "json")
# The node ID of the peer this process runs, for JSON lines: a log shipper collecting many
# peers' lines tells them apart by it (set once the ID is known, again once it is chosen).
_node_id = ""
# Whether stderr carries JSON lines: then nothing else may be written there (see ``say``).
_json_lines = False


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


def say(text: str, level: int = logging.INFO, exc: BaseException | None = None) -> None:
    """A message for the operator (the exit summary, the join command, a failure), after
    the traceback of ``exc`` if given.

    Written to stderr as it is for people; with JSON logs it is a log record instead, so a
    log shipper reading stderr finds one JSON object on every line and loses none of it.
    """
    if _json_lines:
        # The text is the template (no arguments, so no %-formatting): the rate limit keys
        # on it, and the summary's lines are each their own.
        logging.getLogger("p2pcrawl").log(level, text.strip("\n"), exc_info=exc)
        return
    if exc is not None:
        traceback.print_exception(exc)
    print(text, file=sys.stderr, flush=True)


def json_lines() -> bool:
    """Whether stderr is JSON lines (no progress redraws, no plain text there)."""
    return _json_lines


def setup_logging(level: str, fmt: str = "text") -> None:
    global _json_lines
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    _json_lines = fmt == "json"
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
