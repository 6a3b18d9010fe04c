"""``p2pcrawl seed``, ``leave`` and ``status``: small clients of a running peer's status API."""

from __future__ import annotations

import argparse
import json
from typing import Any

from p2pcrawl.ui.options import UsageError, parse_hostport

__all__ = ["run_client"]


async def _http(method: str, peer: str, path: str, token: str | None, body: Any = None) -> Any:
    import aiohttp

    host, port = parse_hostport(peer)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(method, f"http://{host}:{port}{path}", json=body, headers=headers) as resp,
    ):
        doc = await resp.json(content_type=None)
        if resp.status >= 400:
            raise UsageError(f"{peer}: {doc.get('error', resp.status)}")
        return doc


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
        ("errors", s["errors"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


async def run_client(args: argparse.Namespace) -> int:
    if args.command == "seed":
        doc = await _http("POST", args.peer, "/api/seed", args.token, {"urls": args.urls})
        print(f"accepted {doc['accepted']} seed(s)")
    elif args.command == "leave":
        await _http("POST", args.peer, "/api/leave", args.token)
        print("leaving: the peer hands off its work and exits")
    else:
        doc = await _http("GET", args.peer, "/api/status", args.token)
        print(json.dumps(doc, indent=2) if args.json else _format_status(doc))
    return 0
