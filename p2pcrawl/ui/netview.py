"""The network view's rows and totals, and the table ``p2pcrawl status --network`` prints.

Pure: :func:`collect_rows` takes the two I/O steps (look a node's status address up, ask
it for ``/api/status``) as callables, so the live monitor and the tests share it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_PEERS",
    "PeerRow",
    "collect_rows",
    "format_network",
    "network_state",
    "network_view",
]

MAX_PEERS = 256  # a view never asks more status servers than this

# The fields of /api/status a row keeps; the rest stays on the peer's own page.
_ROW_FIELDS = (
    "state",
    "listen",
    "version",
    "pages_fetched",
    "pages_per_s",
    "tasks_queued",
    "tasks_in_flight",
    "backups_held",
    "done",
    "errors",
    "bytes_fetched",
    "uptime_s",
)
_SUMMED = (
    "pages_fetched",
    "pages_per_s",
    "tasks_queued",
    "tasks_in_flight",
    "backups_held",
    "done",
    "errors",
    "bytes_fetched",
)


# What a row keeps of a continuous-mode peer's revisits.
_REVISIT_FIELDS = (
    "revisits_per_hour",
    "not_modified_share",
    "changes_detected",
    "tracked",
    "due_now",
    "next_due_at",
)


@dataclass(slots=True)
class PeerRow:
    """One peer in the view: where it is, and its status or why it could not be read."""

    node_id: str
    status_addr: str | None
    status: dict[str, Any] | None
    problem: str = ""
    me: bool = False

    def as_dict(self, total_pages: int) -> dict[str, Any]:
        st = self.status or {}
        pages = int(st.get("pages_fetched") or 0)
        row: dict[str, Any] = {
            "node_id": self.node_id,
            "status_addr": self.status_addr,
            "page": f"http://{self.status_addr}/" if self.status_addr else None,
            "me": self.me,
            "reachable": self.status is not None,
            "problem": self.problem,
            "share": round(pages / total_pages, 4) if total_pages else 0.0,
        }
        for f in _ROW_FIELDS:
            row[f] = st.get(f)
        row["state"] = st.get("state") or "unknown"
        # Two lanes' fields, shown when the peer has them.
        row["errors_by_kind"] = st.get("errors_by_kind") or {}
        row["loop_lag_ms"] = st.get("loop_lag_p99_ms")  # p99 of the peer's recent samples
        rev = st.get("revisit")
        if isinstance(rev, dict):  # continuous mode (docs/freshness.md)
            row["revisit"] = {f: rev.get(f) for f in _REVISIT_FIELDS}
        return row


def network_state(rows: Sequence[PeerRow]) -> str:
    """``finished`` once every peer says so and none is unaccounted for; ``unknown`` while a
    peer cannot be read; otherwise the state most peers are in, ``active`` first."""
    if any(r.status is None for r in rows):
        return "unknown"
    states = [str((r.status or {}).get("state")) for r in rows]
    if states and all(s in ("finished", "waiting") for s in states):
        # Continuous mode: a network with revisits to come is waiting, never finished.
        return "waiting" if "waiting" in states else "finished"
    for s in ("active", "joining", "leaving", "waiting", "finished", "stopped"):
        if s in states:
            return s
    return "unknown"


def network_view(rows: Sequence[PeerRow], now: float | None = None) -> dict[str, Any]:
    """``/api/network``: the peers (this one first, then by node ID) and the totals."""
    ordered = sorted(rows, key=lambda r: (not r.me, r.node_id))
    totals: dict[str, float] = dict.fromkeys(_SUMMED, 0)
    for r in ordered:
        for f in _SUMMED:
            v = (r.status or {}).get(f)
            if isinstance(v, int | float) and not isinstance(v, bool):
                totals[f] += v
    totals["pages_per_s"] = round(totals["pages_per_s"], 2)
    total_pages = int(totals["pages_fetched"])
    doc = {
        "generated_at": time.time() if now is None else now,
        "state": network_state(ordered),
        "peers_known": len(ordered),
        "peers_reachable": sum(r.status is not None for r in ordered),
        "totals": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in totals.items()},
        "peers": [r.as_dict(total_pages) for r in ordered],
    }
    revisits = [r.status["revisit"] for r in ordered if r.status and r.status.get("revisit")]
    if revisits:
        doc["revisit"] = revisit_totals(revisits)
    return doc


def revisit_totals(revisits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The network's revisits (continuous mode): sums, the share of answers that were 304
    over all of them, and the soonest next due time."""

    def total(f: str) -> int:
        return sum(int(r.get(f) or 0) for r in revisits)

    answered = total("not_modified") + total("unchanged") + total("changes_detected")
    due = [float(r["next_due_at"]) for r in revisits if r.get("next_due_at") is not None]
    return {
        "peers": len(revisits),
        "revisits_per_hour": total("revisits_per_hour"),
        "revisits": total("revisits"),
        "not_modified_share": round(total("not_modified") / answered, 4) if answered else None,
        "changes_detected": total("changes_detected"),
        "tracked": total("tracked"),
        "due_now": total("due_now"),
        "next_due_at": min(due, default=None),
    }


# -- collecting the rows ----------------------------------------------------------------------

Lookup = Callable[[bytes], Awaitable[str | None]]  # node ID -> its status address
Fetch = Callable[[str], Awaitable[dict[str, Any]]]  # status address -> its /api/status


async def collect_rows(
    me: PeerRow,
    others: Iterable[bytes],
    lookup: Lookup,
    fetch: Fetch,
    *,
    concurrency: int = 8,
    timeout: float = 3.0,
) -> list[PeerRow]:
    """This peer's row plus one per other node: looked up, then asked, ``concurrency`` at a
    time, each bounded by ``timeout``; a failure becomes the row's ``problem``."""
    gate = asyncio.Semaphore(concurrency)
    ids = list(dict.fromkeys(others))[: MAX_PEERS - 1]

    async def one(node_id: bytes) -> PeerRow:
        row = PeerRow(node_id.hex(), None, None)
        async with gate:
            try:
                async with asyncio.timeout(timeout):
                    row.status_addr = await lookup(node_id)
                    if row.status_addr is None:
                        row.problem = "no status address announced in the DHT (yet)"
                        return row
                    row.status = await fetch(row.status_addr)
            except TimeoutError:
                row.problem = f"no answer within {timeout:.0f} s"
            except Exception as exc:  # any failure of one peer is that row's, not the view's
                row.problem = str(exc) or type(exc).__name__
        if row.status is not None and row.status.get("node_id") not in (None, row.node_id):
            row.problem = f"{row.status_addr} answers as another node"
            row.status = None
        return row

    return [me, *await asyncio.gather(*(one(i) for i in ids))]


def _cell(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * float(value):.0f}%"
    if kind == "rate":
        return f"{float(value):.1f}"
    return str(value)


def format_network(doc: Mapping[str, Any]) -> str:
    """The view as a terminal table, one peer a line, totals last."""
    head = ("node", "state", "share", "pages", "pages/s", "queued", "backups", "errors", "page")
    lines: list[tuple[str, ...]] = [head]
    for p in doc.get("peers", []):
        node = str(p.get("node_id", ""))[:8] + ("*" if p.get("me") else "")
        state = p.get("state") or "unknown"
        if not p.get("reachable"):
            lines.append((node, "?", "-", "-", "-", "-", "-", "-", p.get("problem") or ""))
            continue
        lines.append(
            (
                node,
                str(state),
                _cell(p.get("share"), "pct"),
                _cell(p.get("pages_fetched")),
                _cell(p.get("pages_per_s"), "rate"),
                _cell(p.get("tasks_queued")),
                _cell(p.get("backups_held")),
                _cell(p.get("errors")),
                p.get("page") or "",
            )
        )
    t = doc.get("totals", {})
    lines.append(
        (
            "total",
            str(doc.get("state", "")),
            "100%" if t.get("pages_fetched") else "-",
            _cell(t.get("pages_fetched")),
            _cell(t.get("pages_per_s"), "rate"),
            _cell(t.get("tasks_queued")),
            _cell(t.get("backups_held")),
            _cell(t.get("errors")),
            f"{doc.get('peers_reachable', 0)}/{doc.get('peers_known', 0)} peers answered",
        )
    )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head) - 1)]
    right = {2, 3, 4, 5, 6, 7}
    out = []
    for row in lines:
        cells = [
            row[i].rjust(widths[i]) if i in right else row[i].ljust(widths[i])
            for i in range(len(head) - 1)
        ]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    rv = doc.get("revisit")
    if rv:
        due = rv.get("next_due_at")
        when = f"in {max(0.0, due - float(doc.get('generated_at', due))):.0f}s" if due else "-"
        out.append(
            f"revisits: {rv['revisits_per_hour']}/hour, answered 304: "
            f"{_cell(rv.get('not_modified_share'), 'pct')}, changes detected: "
            f"{rv['changes_detected']}, pages tracked: {rv['tracked']}, next due: {when}"
        )
    out.append(
        "(* = the peer asked; share = a peer's part of the pages fetched by the peers that "
        "answered, its own hosts' and those it fetched on loan)"
    )
    return "\n".join(out)
