"""``p2pcrawl export --changed-since TIME``: the URLs whose content changed since then.

Read from the WARC files, like the rest of the export: every capture of a URL (a full
``response`` or a continuous-mode ``revisit``) carries the SHA-1 of its payload in
``WARC-Payload-Digest``, and a revisit carries its capture's. A URL changed since ``TIME``
when a capture from then on has a payload other than the one before it: the last before
``TIME``, or, for a URL first captured since, none at all (it is ``new``). Captures of one
URL may sit in several data directories (its host moved between peers); they are put in
time order first.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO

from p2pcrawl.ui.durations import parse_duration
from p2pcrawl.ui.export import Capture, ExportError, capture_doc

__all__ = ["Change", "changes_since", "parse_since", "write_changes"]

_UNIX = re.compile(r"\s*\d+(\.\d*)?\s*")


@dataclass(frozen=True, slots=True)
class Change:
    kind: str  # "new" (first captured since) or "changed"
    capture: Capture  # the first capture since with the new content


def parse_since(text: str, now: float | None = None) -> float:
    """``TIME`` as Unix seconds: an ISO 8601 date or time (UTC unless it says otherwise),
    Unix seconds, or a duration meaning that long ago (``6h``, ``2d``)."""
    now = time.time() if now is None else now
    if _UNIX.fullmatch(text):
        return float(text)
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ExportError(
            f"--changed-since {text!r}: not a time (2025-01-31, 2025-01-31T12:00:00Z, "
            "Unix seconds, or how long ago: 6h, 2d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _when(capture: Capture) -> float:
    try:
        return datetime.fromisoformat(capture.fetched_at).timestamp()
    except ValueError:
        return 0.0


def changes_since(captures: Iterable[Capture], since: float) -> list[Change]:
    """The first change since ``since`` of each URL that changed, oldest change first."""
    by_url: dict[str, list[tuple[float, int, Capture]]] = {}
    for i, c in enumerate(captures):
        by_url.setdefault(c.url, []).append((_when(c), i, c))
    out: list[tuple[float, int, Change]] = []
    for history in by_url.values():
        history.sort(key=lambda e: (e[0], e[1]))
        before = [c for t, _, c in history if t < since]
        digest = before[-1].digest if before else None
        for t, i, c in history:
            if t < since:
                continue
            if digest is None or c.digest != digest:
                out.append((t, i, Change("new" if not before else "changed", c)))
                break
    out.sort(key=lambda e: (e[0], e[1]))
    return [change for _, _, change in out]


def write_changes(captures: Iterable[Capture], since: float, fmt: str, out: IO[str]) -> int:
    """``urls``: each changed URL once; ``jsonl``: its first capture since, with ``change``."""
    if fmt not in ("urls", "jsonl"):
        raise ExportError("--changed-since lists URLs (--format urls) or captures (jsonl)")
    changes = changes_since(captures, since)
    for ch in changes:
        if fmt == "urls":
            out.write(ch.capture.url + "\n")
        else:
            doc = {**capture_doc(ch.capture), "change": ch.kind}
            out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return len(changes)
