"""``p2pcrawl seed``, ``leave`` and ``status``: small clients of a running peer's status API."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from p2pcrawl.ui.options import UsageError, parse_hostport

__all__ = ["run_client"]


async def _http(method: str, peer: str, path: str, token: str | None, body: Any = None) -> Any:
    import aiohttp

    host, port = parse_hostport(peer)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(
                method, f"http://{host}:{port}{path}", json=body, headers=headers
            ) as resp,
        ):
            try:
                doc = await resp.json(content_type=None)
            except ValueError:
                raise UsageError(f"{peer} is not a p2pcrawl status server: {_PEER_HINT}") from None
            if resp.status >= 400:
                error = doc.get("error", resp.status) if isinstance(doc, dict) else resp.status
                raise UsageError(f"{peer}: {error}")
            return doc
    except aiohttp.ClientConnectorError as exc:
        # The usual mistake: the UDP --listen port, where nothing answers over TCP.
        err = exc.os_error
        reason = os.strerror(err.errno) if err.errno else (err.strerror or str(err))
        # OSError: the command was right, the peer is not there (exit 1, not 2).
        raise OSError(f"cannot reach {peer}: {reason.lower()}; {_PEER_HINT}") from None
    except TimeoutError:
        raise OSError(f"{peer} did not answer within 30 s") from None


_PEER_HINT = (
    "--peer takes a peer's status server address (its join --status, 127.0.0.1:8080 by "
    "default), not its UDP --listen address"
)


_RESULT_LABELS = {
    "accepted": "accepted",
    "already_known": "already known",
    "out_of_scope": "out of scope",
    "refused_private": "refused",
    "invalid": "invalid",
}


def format_seeds(doc: dict[str, Any]) -> str:
    """One line per seed: what became of it and why, then the count."""
    rows = doc.get("seeds") or []
    width = max((len(_RESULT_LABELS.get(r["result"], r["result"])) for r in rows), default=0)
    lines = []
    for r in rows:
        label = _RESULT_LABELS.get(r["result"], r["result"])
        url = r.get("canonical") or r["url"]
        lines.append(f"{label.ljust(width)}  {url}" + (f"  ({r['reason']})" if r["reason"] else ""))
    lines.append(f"accepted {doc['accepted']} of {len(rows)} seed(s)")
    return "\n".join(lines)


def _counts(counts: Any) -> str:
    items = sorted((counts or {}).items(), key=lambda kv: -int(kv[1]))
    return ", ".join(f"{k} {v}" for k, v in items) or "none"


def _format_status(s: dict[str, Any]) -> str:
    rows = [
        ("node", str(s["node_id"])[:16]),
        ("listen", s["listen"]),
        ("state", s["state"]),
        ("version", s.get("version", "")),
        ("uptime", f"{s['uptime_s']:.0f} s"),
        ("peers", f"{s['peers']} (network ~{s.get('network_size', '?')})"),
        ("queued", s["tasks_queued"]),
        ("in flight", s["tasks_in_flight"]),
        ("backups held", s["backups_held"]),
        ("done", s["done"]),
        ("pages fetched", f"{s['pages_fetched']} ({s.get('pages_per_s', 0)}/s)"),
        ("discovered", s["urls_discovered"]),
        ("errors", f"{s['errors']} ({_counts(s.get('errors_by_kind'))})"),
        ("HTTP statuses", _counts(s.get("status_codes"))),
    ]
    out = s.get("output") or {}
    if out:
        rows.append(("WARC", f"{out.get('files', 0)} file(s), {out.get('bytes', 0):,} bytes"))
        rows.append(("in", out.get("directory", "")))
    if s.get("max_pages"):
        reached = " (reached)" if s.get("page_limit_reached") else ""
        rows.append(("max pages", f"{s['max_pages']} per peer{reached}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


async def run_client(args: argparse.Namespace) -> int:
    if args.command == "seed":
        body = {"urls": args.urls, "recrawl": bool(args.recrawl)}
        doc = await _http("POST", args.peer, "/api/seed", args.token, body)
        print(format_seeds(doc))
        # A script learns that nothing will be crawled; "already known" is not a failure.
        return 0 if all(s["result"] in ("accepted", "already_known") for s in doc["seeds"]) else 1
    elif args.command == "leave":
        await _http("POST", args.peer, "/api/leave", args.token)
        print("leaving: the peer hands off its work and exits")
    elif args.network:
        from p2pcrawl.ui.network import format_network

        doc = await _http("GET", args.peer, "/api/network", args.token)
        print(json.dumps(doc, indent=2) if args.json else format_network(doc))
    else:
        doc = await _http("GET", args.peer, "/api/status", args.token)
        print(json.dumps(doc, indent=2) if args.json else _format_status(doc))
    return 0
