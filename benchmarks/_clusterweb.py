"""The many-host test web of ``cluster.py``: one server answering for every 198.19.x.y host.

Run inside the web's network namespace, where ``ip route add local 198.19.0.0/16 dev lo``
makes the whole /16 local: one socket bound to 0.0.0.0:80 accepts connections to any of those
addresses, and the ``Host`` header says which host is meant. Pages and links come from
``_zipfweb.ZipfWeb``; each host answers after its own latency (``netem`` is not available, so
the server adds it), drawn once per host. ``/robots.txt`` answers 404 (RFC 9309 §2.3.1.3: all
allowed). On ``--control`` (an address outside 198.19/16), ``GET /stats`` gives request
counts, ``GET /requests`` every request since the last reset (s after it, host index, client
address, path; at most ``MAX_LOG``), and ``POST /reset`` clears them between runs.

Prints one JSON line when ready; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections import Counter

from _zipfweb import ZipfWeb
from aiohttp import web

TRACKED = 3
MAX_LOG = 1_000_000  # requests kept for GET /requests per run (about 100 MB at most)

_PAD = (
    "<p>peer crawl host page link queue frontier owner node key hash ring table bucket "
    "fetch parse robots delay polite server client socket request response header body</p>\n"
)


_SITE_FILES = frozenset({"/robots.txt", "/sitemap.xml"})


class ClusterWeb:
    def __init__(self, zweb: ZipfWeb, page_bytes: int, lat_min: float, lat_max: float) -> None:
        self.web = zweb
        self.page_bytes = page_bytes
        rng = random.Random(f"latency:{zweb.seed}")
        self.latency = [rng.uniform(lat_min, lat_max) for _ in range(zweb.hosts)]
        self.requests: Counter[str] = Counter()
        self.robots = 0
        self.bytes_sent = 0
        self.control = ""
        # The largest hosts' first and last request: fetched one request at a time wherever
        # they are crawled, they bound how soon a crawl can end however many peers it has.
        self.tracked = set(sorted(range(zweb.hosts), key=lambda i: -zweb.pages[i])[:TRACKED])
        self.spans: dict[int, list[float]] = {}
        # Each client's (peer's) last page request: how far apart the peers ran dry, and
        # how long after the last page the run was seen finished.
        self.last_by_client: dict[str, float] = {}
        # Every request, timed: which peer fetched which host when (cluster.py --request-log).
        self.log: list[tuple[float, int, str, str]] = []
        self.t0 = time.monotonic()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        host = (request.host or "").rsplit(":", 1)[0]
        if host == self.control:
            return self.control_answer(request)
        try:
            index = ZipfWeb.host_index(host)
        except (ValueError, IndexError):
            return web.Response(status=404)
        if index >= self.web.hosts:
            return web.Response(status=404)
        await asyncio.sleep(self.latency[index])
        path = request.path
        now = time.monotonic() - self.t0
        if len(self.log) < MAX_LOG:
            self.log.append((round(now, 4), index, request.remote or "", path))
        if path in _SITE_FILES:
            # A host's own files (robots.txt, and the sitemap a crawler tries where robots.txt
            # names none) are not pages of the web: counted apart, absent here.
            self.robots += 1
            return web.Response(status=404)
        self.requests[f"{host}{path}"] += 1
        self.last_by_client[request.remote or ""] = now
        if index in self.tracked:
            self.spans.setdefault(index, [now, now])[1] = now
        page = 0 if path == "/" else _page_number(path)
        if page is None or page >= self.web.pages[index]:
            return web.Response(status=404)
        body = self.render(index, page)
        self.bytes_sent += len(body)
        return web.Response(body=body, content_type="text/html")

    def render(self, index: int, page: int) -> bytes:
        links = "".join(
            f'<li><a href="{self.web.url(h, p)}">link</a></li>\n'
            for h, p in self.web.links(index, page)
        )
        head = f"<!DOCTYPE html>\n<html><head><title>{index}/{page}</title></head><body>\n<ul>\n"
        doc = head + links + "</ul>\n"
        if len(doc) < self.page_bytes:
            doc += _PAD * ((self.page_bytes - len(doc)) // len(_PAD) + 1)
            doc = doc[: self.page_bytes]
        return (doc + "</body></html>\n").encode()

    def control_answer(self, request: web.BaseRequest) -> web.Response:
        if request.method == "POST" and request.path == "/reset":
            self.requests.clear()
            self.robots = self.bytes_sent = 0
            self.spans.clear()
            self.last_by_client.clear()
            self.log = []
            self.t0 = time.monotonic()
            return web.Response(text="{}", content_type="application/json")
        if request.path == "/requests":
            return web.Response(text=json.dumps(self.log), content_type="application/json")
        doc = {
            "requests": sum(self.requests.values()),
            "unique": len(self.requests),
            "robots": self.robots,
            "bytes": self.bytes_sent,
            # pages, first and last request (s after the reset) of the largest hosts
            "largest": [
                [self.web.pages[i], round(a, 2), round(b, 2)]
                for i, (a, b) in sorted(self.spans.items(), key=lambda kv: -self.web.pages[kv[0]])
            ],
            # each peer's last page request (s after the reset), earliest first
            "last_requests": sorted(round(t, 2) for t in self.last_by_client.values()),
        }
        return web.Response(text=json.dumps(doc), content_type="application/json")


def _page_number(path: str) -> int | None:
    if path.startswith("/p") and path[2:].isdigit():
        return int(path[2:])
    return None


async def serve(args: argparse.Namespace) -> None:
    zweb = ZipfWeb(args.hosts, args.max_pages, args.exponent, args.seed)
    app = ClusterWeb(zweb, args.page_bytes, args.lat_min, args.lat_max)
    app.control = args.control
    runner = web.ServerRunner(web.Server(app.handle, access_log=None))
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", args.port, backlog=4096).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"ready": True, "pages": zweb.total_pages}), flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--max-pages", type=int, required=True)
    p.add_argument("--exponent", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--page-bytes", type=int, default=16_000)
    p.add_argument("--lat-min", type=float, default=0.01)
    p.add_argument("--lat-max", type=float, default=0.05)
    p.add_argument("--port", type=int, default=80)
    p.add_argument("--control", required=True, help="address answering /stats and /reset")
    asyncio.run(serve(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
