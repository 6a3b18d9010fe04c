"""The peer's local HTTP server: the status page, the JSON API and Prometheus metrics.

It listens on 127.0.0.1 unless told otherwise; on any other interface a bearer token is
required, because ``POST /api/leave`` stops the peer and ``POST /api/seed`` starts crawls.
Without a token the server still refuses two browser attacks on a loopback service: a page
on another site posting to it (cross-origin ``Origin``) and DNS rebinding (a ``Host`` that
is not a loopback name).

Every answer outside the page is JSON, errors included: ``{"error": "..."}`` with a 4xx.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web
from yarl import URL

from p2pcrawl.aio import TaskSet, every
from p2pcrawl.network import is_loopback
from p2pcrawl.ui.connlimit import ConnectionLimits, GuardedServer
from p2pcrawl.ui.metrics import PeerMetrics
from p2pcrawl.ui.network import NetworkMonitor, announced_address
from p2pcrawl.ui.prerender import prerender
from p2pcrawl.ui.progress import extended_status, warc_output

if TYPE_CHECKING:
    from p2pcrawl.network import Peer

__all__ = ["BadRequest", "StatusServer", "parse_seed_body", "token_matches"]

log = logging.getLogger(__name__)

MAX_SEEDS_PER_REQUEST = 1000
MAX_BODY = 256 * 1024
MAX_HOSTS = 500
MAX_HISTORY_S = 3600
MAX_EVENTS = 1000
OWNER_COUNTS_EVERY_S = 5.0  # a GROUP BY over the backup store: not every second
OUTPUT_SCAN_EVERY_S = 5.0  # a directory listing of the WARC files, in a thread

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def token_matches(given: str, token: str) -> bool:
    """Constant time in both the content and the length of the secret.

    ``hmac.compare_digest`` on the raw strings returns early when the lengths differ, which
    tells an attacker the token's length; comparing fixed-size digests does not.
    """
    a = hashlib.sha256(given.encode("utf-8", "surrogatepass")).digest()
    b = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
    return hmac.compare_digest(a, b)


def parse_seed_body(doc: object) -> list[str]:
    """The URLs of a ``POST /api/seed`` body, or BadRequest saying what is wrong with it."""
    if not isinstance(doc, dict):
        raise BadRequest(400, 'body must be a JSON object: {"urls": ["http://..."]}')
    extra = sorted(set(doc) - {"urls", "recrawl"})
    if extra:
        raise BadRequest(400, f"unknown fields: {extra[:5]}")
    seeds = doc.get("urls")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(u, str) for u in seeds):
        raise BadRequest(400, '"urls" must be a non-empty list of strings')
    if len(seeds) > MAX_SEEDS_PER_REQUEST:
        raise BadRequest(413, f"at most {MAX_SEEDS_PER_REQUEST} URLs per request")
    if not isinstance(doc.get("recrawl", False), bool):
        raise BadRequest(400, '"recrawl" must be true or false')
    # A URL that is not crawlable gets its own "invalid" verdict beside the others' (the
    # peer's seed check says why); one typo does not turn the whole request away.
    return seeds


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(400, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise BadRequest(400, f"{name} must be between {low} and {high}")
    return value


def _host_port(value: str) -> tuple[str, int | None]:
    """(host, port) of a Host header or an Origin; ("", None) when it does not parse."""
    try:
        url = URL(value) if "://" in value else URL(f"http://{value}")
        return url.host or "", url.port
    except ValueError:
        return "", None


def _csp_hash(html: str, tag: str) -> str:
    """CSP source for the page's one inline <script> or <style>: the page runs, nothing else.

    The hash covers the exact text between the tags, so it is computed from the file served.
    """
    found = re.search(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
    if found is None:
        return "'none'"
    digest = hashlib.sha256(found.group(1).encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


class StatusServer:
    def __init__(
        self,
        peer: Peer,
        host: str,
        port: int,
        *,
        token: str = "",
        limits: ConnectionLimits | None = None,
    ) -> None:
        if not is_loopback(host) and not token:
            raise ValueError(
                f"--status {host}:{port} listens beyond loopback; set --status-token too"
            )
        self.peer = peer
        self.host = host
        self.port = port
        self.token = token
        self.metrics = PeerMetrics(peer)
        self._pages = {name: _page_with_headers(_page(name)) for name in PAGES}
        self.network = NetworkMonitor(peer, self.announced_address, token)
        self._backup_owners: dict[str, int] = {}
        self._output: dict[str, Any] = {}
        self._last_owners = self._last_output = -OUTPUT_SCAN_EVERY_S  # sampler rounds
        self._runner: web.AppRunner | None = None
        self.limits = limits or ConnectionLimits()
        self.connections: GuardedServer | None = None
        self._tasks: TaskSet | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def announced_address(self) -> str:
        """Where other peers reach this server (its bind address, or the peer's UDP host
        when it listens on every interface)."""
        node = self.peer.node
        udp_host = node.me.host if node is not None and node.listening else self.host
        return announced_address(self.host, self.port, udp_host)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors, self._guard])
        app.router.add_get("/", self.page)
        app.router.add_get("/network", self.network_page)
        app.router.add_get("/api/network", self.api_network)
        app.router.add_get("/api/status", self.api_status)
        app.router.add_get("/api/peers", self.api_peers)
        app.router.add_get("/api/hosts", self.api_hosts)
        app.router.add_get("/api/events", self.api_events)
        app.router.add_get("/api/history", self.api_history)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_post("/api/seed", self.api_seed)
        app.router.add_post("/api/leave", self.api_leave)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        assert self._runner.server is not None
        # Not a TCPSite: aiohttp's server has no header timeout and no connection cap.
        self.connections = GuardedServer(self._runner.server, self.limits)
        try:
            self.port = await self.connections.start(self.host, self.port)
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        self._tasks = TaskSet("status")
        self._tasks.spawn(
            every(1.0, self._sample_once, first=0.0, failures=logging.DEBUG), "sampler"
        )
        await self.network.start()

    async def aclose(self) -> None:
        await self.network.aclose()
        if self._tasks is not None:
            await self._tasks.aclose()
            self._tasks = None
        if self.connections is not None:
            await self.connections.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _sample_once(self) -> None:
        """One round of the sampler. The stores close under it while the peer stops (its
        failures are logged at debug level); the next round retries."""
        await self.peer.refresh_counts()
        now = time.monotonic()
        if now - self._last_output >= OUTPUT_SCAN_EVERY_S:
            self._last_output = now
            warc_dir = self.peer.config.data_dir / "warc"
            self._output = await asyncio.to_thread(warc_output, warc_dir)
            self._output["data_dir"] = str(self.peer.config.data_dir)
        if now - self._last_owners >= OWNER_COUNTS_EVERY_S:
            counts = await self.peer.backup_owners()
            if counts is not None:
                self._last_owners = now
                self._backup_owners = {o.hex(): n for o, n in counts.items()}

    # -- middlewares -------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """aiohttp's own 404/405/413 (and a crash) come as text; API callers expect JSON."""
        try:
            return await handler(request)
        except BadRequest as exc:
            return _error(exc.status, exc.message)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            message = {
                404: f"no such path: {request.path}",
                405: f"{request.method} is not allowed on {request.path}",
                413: f"body larger than {MAX_BODY} bytes",
            }.get(exc.status, exc.reason)
            return _error(exc.status, message, headers)
        except Exception:
            log.exception("status server: %s %s failed", request.method, request.path)
            return _error(500, "internal error; see the peer's log")

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.token:
            if not self._authorized(request):
                return _error(401, "missing or wrong status token", {"WWW-Authenticate": "Bearer"})
        elif not is_loopback(_host_port(request.host)[0]):
            # DNS rebinding: a hostile name resolving to 127.0.0.1 is same-origin to the page
            # that fetched it, but its Host header gives it away.
            return _error(403, "Host must be a loopback name; set --status-token otherwise")
        origin = request.headers.get("Origin")
        # Browsers send Origin with every POST; "null" (sandboxed frames, file:) never matches.
        unsafe = request.method not in ("GET", "HEAD")
        if unsafe and origin is not None and _host_port(origin) != _host_port(request.host):
            return _error(403, "cross-origin requests are refused")
        return await handler(request)

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, cred = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token_matches(cred.strip(), self.token):
            return True
        # Only GET takes the token from the URL, so the page can be opened as a link; a
        # state-changing request must carry it in a header.
        given = request.query.get("token")
        if given is None or request.method not in ("GET", "HEAD"):
            return False
        return token_matches(given, self.token)

    # -- pages -------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.Response:
        # The first values are on the page itself: readable without JavaScript (curl /).
        text, headers = self._pages["status.html"]
        text = prerender(text, self._status_doc())
        return web.Response(text=text, content_type="text/html", charset="utf-8", headers=headers)

    async def network_page(self, request: web.Request) -> web.Response:
        return self._html("network.html")

    def _html(self, name: str) -> web.Response:
        text, headers = self._pages[name]
        return web.Response(text=text, content_type="text/html", charset="utf-8", headers=headers)

    async def api_network(self, request: web.Request) -> web.Response:
        """Every peer this one knows, each asked for its status, and the network's totals."""
        return _json(await self.network.view())

    def _status_doc(self) -> dict[str, Any]:
        doc = extended_status(self.peer)
        doc["backups_by_owner"] = dict(self._backup_owners)
        doc["output"] = dict(self._output)
        return doc

    async def api_status(self, request: web.Request) -> web.Response:
        return _json(self._status_doc())

    async def api_peers(self, request: web.Request) -> web.Response:
        return _json(self.peer.routing() or {"peers": [], "buckets": [], "rpc": {}})

    async def api_hosts(self, request: web.Request) -> web.Response:
        limit = _int_param(request, "limit", 20, 1, MAX_HOSTS)
        return _json({"hosts": self.peer.top_hosts(limit)})

    async def api_events(self, request: web.Request) -> web.Response:
        limit = _int_param(request, "limit", MAX_EVENTS, 0, MAX_EVENTS)
        events = list(self.peer.events.events)
        # "now" lets a reader on another machine age the events by the peer's clock.
        return _json({"now": time.time(), "events": events[max(0, len(events) - limit) :]})

    async def api_history(self, request: web.Request) -> web.Response:
        """Once-a-second samples of the crawl counters, ``t`` in seconds of uptime."""
        seconds = _int_param(request, "seconds", 300, 1, MAX_HISTORY_S)
        stats = self.peer.crawl_stats
        rows = list(stats.history) if stats is not None else []
        now = time.monotonic()
        start = self.peer.started
        samples = [
            [round(t - start, 3), pages, found, size]
            for t, pages, found, size in rows
            if now - t <= seconds
        ]
        return _json(
            {
                "uptime_s": round(now - start, 3),
                "columns": ["t", "pages_fetched", "urls_discovered", "bytes_fetched"],
                "samples": samples,
            }
        )

    async def metrics_text(self, request: web.Request) -> web.Response:
        body, ctype = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def api_seed(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise BadRequest(400, 'body must be JSON: {"urls": ["http://..."]}') from None
        seeds = parse_seed_body(doc)
        if self.peer.state not in ("active", "finished"):  # a finished crawl takes new seeds
            raise BadRequest(409, f"peer is {self.peer.state}")
        recrawl = bool(doc.get("recrawl", False)) if isinstance(doc, dict) else False
        verdicts = await self.peer.seed(seeds, recrawl=recrawl, forward=self.network.recrawl_at)
        accepted = sum(v.result == "accepted" for v in verdicts)
        return _json({"accepted": accepted, "seeds": [v.as_dict() for v in verdicts]})

    async def api_leave(self, request: web.Request) -> web.Response:
        if self.peer.state not in ("active", "joining"):
            raise BadRequest(409, f"peer is {self.peer.state}")
        self.peer.request_leave()
        return _json({"state": "leaving"}, status=202)


PAGES = ("status.html", "network.html")
# A page's one copy of the shared style and script: inlined where the page names it, so every
# page is still a single response with no external resource, covered by its CSP hashes.
_INCLUDES = {"/* include: common.css */": "common.css", "// include: common.js": "common.js"}


def _page(name: str) -> str:
    static = resources.files("p2pcrawl.ui").joinpath("static")
    html = static.joinpath(name).read_text("utf-8")
    for marker, part in _INCLUDES.items():
        html = html.replace(marker, static.joinpath(part).read_text("utf-8").rstrip("\n"))
    return html


def _page_with_headers(html: str) -> tuple[str, dict[str, str]]:
    return html, {
        "Content-Security-Policy": (
            "default-src 'none'; "
            f"script-src {_csp_hash(html, 'script')}; "
            f"style-src {_csp_hash(html, 'style')}; "
            "connect-src 'self'; img-src 'self' data:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
        # The token may be in the page's URL: never send it anywhere as a referrer.
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }


def _json(doc: object, status: int = 200) -> web.Response:
    return web.json_response(
        doc, status=status, dumps=_dumps, headers={"Cache-Control": "no-store"}
    )


def _dumps(obj: object) -> str:
    # Event details come from many modules; a stray bytes or enum must not break the API.
    return json.dumps(obj, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))
