"""The peer's local HTTP server: the status page, the JSON API and Prometheus metrics.

It listens on 127.0.0.1 unless told otherwise; on any other interface a bearer token is
required, because ``POST /api/leave`` stops the peer and ``POST /api/seed`` starts crawls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from p2pcrawl import urls
from p2pcrawl.metrics import PeerMetrics

if TYPE_CHECKING:
    from p2pcrawl.peer import Peer

__all__ = ["StatusServer", "is_loopback_host"]

log = logging.getLogger(__name__)

MAX_SEEDS_PER_REQUEST = 1000
MAX_BODY = 256 * 1024


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class StatusServer:
    def __init__(self, peer: Peer, host: str, port: int, *, token: str = "") -> None:
        if not is_loopback_host(host) and not token:
            raise ValueError(
                f"--status {host}:{port} listens beyond loopback; set --status-token too"
            )
        self.peer = peer
        self.host = host
        self.port = port
        self.token = token
        self.metrics = PeerMetrics(peer)
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._auth])
        app.router.add_get("/", self.page)
        app.router.add_get("/api/status", self.api_status)
        app.router.add_get("/api/peers", self.api_peers)
        app.router.add_get("/api/hosts", self.api_hosts)
        app.router.add_get("/api/events", self.api_events)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_post("/api/seed", self.api_seed)
        app.router.add_post("/api/leave", self.api_leave)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            sockets = getattr(site._server, "sockets", None) or []
            if sockets:
                self.port = int(sockets[0].getsockname()[1])
        self._sampler = asyncio.ensure_future(self._sample_loop())

    async def aclose(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _sample_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.peer.refresh_counts()
            await asyncio.sleep(1.0)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.token:
            given = request.headers.get("Authorization", "")
            expected = f"Bearer {self.token}"
            if not hmac.compare_digest(given.encode(), expected.encode()) and not (
                request.method == "GET"
                and hmac.compare_digest(
                    request.query.get("token", "").encode(), self.token.encode()
                )
            ):
                return _error(401, "missing or wrong status token")
        resp: web.StreamResponse = await handler(request)
        return resp

    # -- pages -----------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.Response:
        html = resources.files("p2pcrawl").joinpath("static/status.html").read_text("utf-8")
        return web.Response(text=html, content_type="text/html", charset="utf-8")

    async def api_status(self, request: web.Request) -> web.Response:
        return web.json_response(self.peer.status())

    async def api_peers(self, request: web.Request) -> web.Response:
        node = self.peer.node
        if node is None:
            return web.json_response({"peers": [], "buckets": [], "rpc": {}})
        return web.json_response(
            {
                "peers": [_peer_json(p) for p in node.peers()],
                "buckets": node.buckets(),
                "rpc": node.stats(),
            },
            dumps=_dumps,
        )

    async def api_hosts(self, request: web.Request) -> web.Response:
        try:
            limit = min(max(int(request.query.get("limit", "20")), 1), 500)
        except ValueError:
            return _error(400, "limit must be an integer")
        return web.json_response({"hosts": self.peer.top_hosts(limit)})

    async def api_events(self, request: web.Request) -> web.Response:
        return web.json_response({"events": list(self.peer.events.events)}, dumps=_dumps)

    async def metrics_text(self, request: web.Request) -> web.Response:
        body, ctype = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def api_seed(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            return _error(400, 'body must be JSON: {"urls": ["http://..."]}')
        seeds = doc.get("urls") if isinstance(doc, dict) else None
        if not isinstance(seeds, list) or not seeds or not all(isinstance(u, str) for u in seeds):
            return _error(400, '"urls" must be a non-empty list of strings')
        if len(seeds) > MAX_SEEDS_PER_REQUEST:
            return _error(413, f"at most {MAX_SEEDS_PER_REQUEST} URLs per request")
        bad = [u for u in seeds if urls.canonicalize(u) is None]
        if bad:
            return _error(400, f"not crawlable URLs: {bad[:5]}")
        if self.peer.state != "active":
            return _error(409, f"peer is {self.peer.state}")
        added = await self.peer.add_seeds(seeds)
        return web.json_response({"accepted": added})

    async def api_leave(self, request: web.Request) -> web.Response:
        if self.peer.state not in ("active", "joining"):
            return _error(409, f"peer is {self.peer.state}")
        self.peer.request_leave()
        return web.json_response({"state": "leaving"}, status=202)


def _peer_json(p: Any) -> dict[str, object]:
    return {"id": p.id.hex(), "host": p.host, "port": p.port}


def _dumps(obj: object) -> str:
    return json.dumps(obj, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))
