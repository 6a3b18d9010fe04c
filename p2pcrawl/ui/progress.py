"""What a foreground peer says while it runs and when it exits.

On a terminal, a progress line redrawn in place; otherwise (a log file, a service manager)
a log line every ``--progress-interval`` seconds. Milestones are logged when they happen:
the network reports ``finished`` (or resumes), ``--max-pages`` is reached. At exit a
summary: pages, bytes, errors by kind, HTTP statuses, duration and the WARC files written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "Milestones",
    "extended_status",
    "progress_line",
    "summary",
    "summary_lines",
    "warc_output",
]

WARC_SUFFIX = ".warc.gz"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def _kinds(counts: Mapping[Any, Any]) -> str:
    items = sorted(counts.items(), key=lambda kv: (-int(kv[1]), str(kv[0])))
    return ", ".join(f"{k} {v}" for k, v in items) or "none"


def progress_line(st: Mapping[str, Any]) -> str:
    line = (
        f"[{st['state']}] {st['pages_fetched']:,} pages ({float(st['pages_per_s']):.1f}/s), "
        f"queued {st['tasks_queued']:,}, in flight {st['tasks_in_flight']}, "
        f"errors {st['errors']:,}, backups {st['backups_held']:,}, peers {st['peers']}"
    )
    rev = st.get("revisit")
    if rev:
        share = rev["not_modified_share"]
        line += (
            f", revisits {rev['revisits']:,} ({rev['revisits_per_hour']:,}/h, "
            f"304 {'-' if share is None else f'{share:.0%}'}, changed {rev['changes_detected']:,})"
        )
    return line


class Milestones:
    """Turns successive statuses into the messages worth a log line, each said once."""

    def __init__(self, max_pages: int) -> None:
        self.max_pages = max_pages
        self._state = ""
        self._limit_said = False

    def feed(self, st: Mapping[str, Any], exhausted: bool) -> list[str]:
        out: list[str] = []
        state = str(st["state"])
        if state == "finished" and self._state != "finished":
            out.append(
                f"crawl finished: the network is quiescent ({st['pages_fetched']:,} pages "
                "fetched by this peer); the peer stays up for more seeds, Ctrl-C to leave"
            )
        elif self._state == "finished" and state == "active":
            out.append("crawl resumed: new work arrived")
        self._state = state
        if exhausted and self.max_pages and not self._limit_said:
            self._limit_said = True
            out.append(
                f"--max-pages {self.max_pages} reached: this peer fetches no more pages; "
                "its queued URLs stay for a later run"
            )
        return out


def warc_output(directory: Path, since: float = 0.0) -> dict[str, Any]:
    """The WARC files in ``directory`` written to since ``since`` (unix time): a blocking
    directory scan, for a thread."""
    files = []
    try:
        entries = sorted(directory.glob(f"*{WARC_SUFFIX}"))
    except OSError:
        entries = []
    for path in entries:
        try:
            stat = path.stat()
        except OSError:
            continue
        if stat.st_mtime >= since:
            files.append({"path": str(path), "bytes": stat.st_size})
    return {
        "directory": str(directory),
        "files": len(files),
        "bytes": sum(f["bytes"] for f in files),
        "paths": [f["path"] for f in files][-20:],
    }


def summary(st: Mapping[str, Any], duration_s: float, warc: Mapping[str, Any]) -> dict[str, Any]:
    """The exit summary as data (the ``left`` JSON line carries it too)."""
    return {
        "pages_fetched": st["pages_fetched"],
        "tasks_queued": st.get("tasks_queued", 0),
        "limit_reached": bool(st.get("page_limit_reached")),
        "bytes_fetched": st.get("bytes_fetched", 0),
        "errors": st["errors"],
        "errors_by_kind": dict(st.get("errors_by_kind") or {}),
        "status_codes": dict(st.get("status_codes") or {}),
        "hosts_unreachable": st.get("hosts_unreachable", 0),
        "urls_unreachable": st.get("urls_unreachable", 0),
        "unreachable": list(st.get("unreachable") or []),
        "duration_s": round(duration_s, 3),
        "warc_files": warc.get("paths", []),
        "warc_bytes": warc.get("bytes", 0),
        # Open network: pages fetched again to check members' done claims (docs/security.md).
        "claims_refetched": int((st.get("claims") or {}).get("refetches", 0)),
    }


def summary_lines(doc: Mapping[str, Any], warc_dir: str, data_dir: str = "DATA_DIR") -> list[str]:
    pages, secs = int(doc["pages_fetched"]), float(doc["duration_s"])
    rate = pages / secs if secs > 0 else 0.0
    files = list(doc["warc_files"])
    lines = [
        f"summary: {pages:,} pages, {_bytes(doc['bytes_fetched'])} in {_duration(secs)} "
        f"({rate:.1f} pages/s)",
        f"  errors: {doc['errors']:,} ({_kinds(doc['errors_by_kind'])})",
        f"  HTTP statuses: {_kinds(doc['status_codes'])}",
    ]
    dead = list(doc.get("unreachable") or [])
    if doc.get("hosts_unreachable"):
        shown = ", ".join(f"{d['origin']} ({d['error']})" for d in dead[:5])
        more = f" and {int(doc['hosts_unreachable']) - 5} more" if len(dead) > 5 else ""
        lines.append(
            f"  unreachable hosts: {doc['hosts_unreachable']}, given up after their retries: "
            f"{shown}{more}; {doc.get('urls_unreachable', 0):,} URLs not fetched"
        )
    if files:
        lines.append(
            f"  WARC: {len(files)} file(s), {_bytes(doc['warc_bytes'])} in {warc_dir}"
            f" (p2pcrawl export {data_dir} lists what they hold)"
        )
        lines += [f"    {p}" for p in files]
    else:
        lines.append(f"  WARC: no file written to {warc_dir} in this run")
    queued = int(doc.get("tasks_queued") or 0)
    if queued:
        why = " (a limit was reached)" if doc.get("limit_reached") else ""
        lines.append(f"  queued: {queued:,} URLs kept in {data_dir} for a later run{why}")
    return lines


def extended_status(peer: Any) -> dict[str, Any]:
    """``peer.status()`` plus what the user-facing views show besides: HTTP statuses, the
    last fetches, and the page limit."""
    st: dict[str, Any] = dict(peer.status())
    eng = peer.engine
    stats = eng.stats if eng is not None else None
    st["status_codes"] = {str(k): v for k, v in sorted(stats.status.items())} if stats else {}
    st["recent"] = (
        [
            {"t": round(t, 3), "url": url, "status": status, "error": error}
            for t, url, status, error in reversed(stats.recent)
        ]
        if stats
        else []
    )
    scope = peer.config.crawl.scope
    st["max_pages"] = scope.max_pages
    st["max_network_pages"] = scope.max_network_pages
    st["page_limit_reached"] = bool(eng is not None and eng.exhausted)
    if eng is not None:
        st.update(eng.unreachable.report())
    return st
