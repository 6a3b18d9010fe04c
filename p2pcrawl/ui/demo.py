"""``p2pcrawl demo``: a generated test web and a small network of peers, all on loopback.

It shows the whole product with no internet: a founder and joiners form a network, the
hub is seeded through the founder, hosts spread over the peers by ownership, and the
summary checks the crawl against the test web's ground truth.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path

from p2pcrawl.archive import read_warc_urls
from p2pcrawl.crawl import urls
from p2pcrawl.network import Peer, PeerConfig
from p2pcrawl.settings import CrawlSettings, PeerSettings, PolitenessSettings, ScopeSettings
from p2pcrawl.testing import TestWeb, TestWebConfig
from p2pcrawl.ui.status import StatusServer

__all__ = ["crawl_finished", "run_demo"]

QUIET_S = 1.5


def crawl_finished(peers: list[Peer]) -> bool:
    """Nothing queued, nothing in flight, no RPC in transit, on every peer (docs/architecture.md,
    "Finished")."""
    for p in peers:
        s = p.status()
        if s["state"] not in ("active", "finished"):
            return False
        if s["tasks_queued"] or s["tasks_in_flight"] or s["rpc_in_transit"]:
            return False
    return True


async def wait_finished(peers: list[Peer], timeout: float, on_tick: object = None) -> bool:
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        if callable(on_tick):
            on_tick()
        if crawl_finished(peers):
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= QUIET_S:
                return True
        else:
            quiet_since = None
    return False


async def _status_server(peer: Peer, preferred: int) -> StatusServer:
    for port in (preferred, 0):
        server = StatusServer(peer, "127.0.0.1", port)
        try:
            await server.start()
            return server
        except OSError:
            await server.aclose()
    raise OSError("no port for the status server")


async def run_demo(args: argparse.Namespace) -> int:
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if args.data is None:
        tmp = tempfile.TemporaryDirectory(prefix="p2pcrawl-demo-")
        root = Path(tmp.name)
    else:
        root = Path(args.data)
    web = TestWeb(
        TestWebConfig(
            hosts=args.hosts,
            pages_per_host=args.pages,
            seed=7,
            slow_host_delay=0.05,
            large_page_bytes=2 * 1024 * 1024,
        )
    )
    peers: list[Peer] = []
    servers: list[StatusServer] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.start()
        truth = web.ground_truth()
        crawl = CrawlSettings(
            concurrency=16,
            politeness=PolitenessSettings(delay=0.0, politeness_factor=0.0),
            scope=ScopeSettings(allow_domains=tuple(web.allow_domains), allow_private=True),
        )
        print(f"test web: {len(web.hosts)} hosts, {len(truth)} URLs to crawl, hub {web.hub_url}")
        for i in range(args.peers):
            boot = () if i == 0 else ((peers[0].me.host, peers[0].me.port),)
            peer = Peer(
                PeerConfig(
                    data_dir=root / f"peer{i}",
                    listen=("127.0.0.1", 0),
                    bootstrap=boot,
                    crawl=crawl,
                    # Joiners wait out the minimum owner age before they crawl; a second
                    # is plenty on loopback and keeps the demo short.
                    peer=PeerSettings(rpc_timeout=1.0, republish_interval=5.0, min_peer_age=1.0),
                )
            )
            await peer.start()
            peers.append(peer)
            servers.append(await _status_server(peer, 8080 + i))
            role = "founder" if i == 0 else "joiner"
            print(
                f"peer {i} ({role}) {peer.node_id.hex()[:8]} udp {peer.me.host}:{peer.me.port}"
                f"  status {servers[-1].url}"
            )
        started = time.monotonic()
        await peers[0].add_seeds([web.hub_url])
        tty = sys.stdout.isatty()

        def tick() -> None:
            if tty:
                fetched = sum(p.status()["pages_fetched"] for p in peers)  # type: ignore[misc]
                sys.stdout.write(f"\rcrawling: {fetched}/{len(truth)} pages")
                sys.stdout.flush()

        finished = False
        waiter = asyncio.ensure_future(wait_finished(peers, 600.0, tick))
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for t in (waiter, stopper):
            t.cancel()
        await asyncio.gather(waiter, stopper, return_exceptions=True)
        finished = waiter in done and not waiter.cancelled() and waiter.result()
        elapsed = time.monotonic() - started
        if tty:
            print()
        shares = [int(p.status()["pages_fetched"]) for p in peers]  # type: ignore[call-overload]
        total = sum(shares)
        print(
            f"{'finished' if finished else 'stopped'} in {elapsed:.1f} s: {total} pages, "
            f"{total / elapsed if elapsed else 0:.0f} pages/s"
        )
        for i, n in enumerate(shares):
            print(f"  peer {i}: {n} pages ({100 * n / total if total else 0:.0f}%)")
        print(
            f"  (each of the {len(web.hosts)} hosts belongs to the peer whose node ID is "
            "XOR-closest to the host's hash; a joiner takes an ID that halves the busiest "
            "peer's region, so with 3 peers one keeps half of the key space; and a few hosts "
            "share unevenly whatever the IDs, so a peer can own no host at all; a peer "
            "whose fetchers would idle borrows hosts from a busier one, so the pages "
            "fetched even out more than the hosts owned)"
        )
        if args.keep_running and not stop.is_set():
            print("status pages: " + "  ".join(s.url for s in servers))
            print(f"network view: {servers[0].url}network")
            print("running; Ctrl-C to stop")
            await stop.wait()
        # WARC files are complete only once their writers are closed.
        for p in peers:
            await p.aclose()
        fetched_urls: list[str] = []
        hosts_of: list[set[str]] = []
        for i in range(len(peers)):
            mine = read_warc_urls(root / f"peer{i}" / "warc")
            fetched_urls.extend(mine)
            hosts_of.append({urls.host_of(u) for u in mine})
        # A host lent to an idle peer has pages in two peers' WARC files: it counts at both.
        every = set().union(*hosts_of)
        shared = sum(1 for h in every if sum(h in mine for mine in hosts_of) > 1)
        print(
            "hosts with pages in each peer's WARC files: "
            + ", ".join(f"peer {i} {len(h)}" for i, h in enumerate(hosts_of))
            + f" (of {len(web.hosts)} hosts"
            + (
                f"; {shared} fetched partly on loan count at each peer that fetched them"
                if shared
                else ""
            )
            + ")"
        )
        unique = set(fetched_urls)
        match = unique == truth and len(fetched_urls) == len(unique)
        print(
            f"ground truth: {len(truth)} URLs; WARC records for {len(unique)} distinct URLs, "
            f"{len(fetched_urls) - len(unique)} fetched twice -> "
            f"{'MATCH' if match else 'MISMATCH'}"
        )
        files = [
            f
            for i in range(len(peers))
            for f in sorted((root / f"peer{i}" / "warc").glob("*.warc.gz"))
        ]
        size = sum(f.stat().st_size for f in files)
        if tmp is not None:
            print(
                f"WARC files: {len(files)} ({size / 1e6:.1f} MB) in a temporary directory, "
                "deleted now; run with --out DIR to keep them"
            )
        else:
            print(f"WARC files: {len(files)} ({size / 1e6:.1f} MB), kept:")
            for f in files:
                print(f"  {f}")
            dirs = " ".join(str(root / f"peer{i}") for i in range(len(peers)))
            print(f"list what was crawled: p2pcrawl export --format jsonl {dirs}")
        return 0 if finished and match else 1
    finally:
        for p in peers:
            with contextlib.suppress(Exception):
                await p.aclose()
        for s in servers:
            await s.aclose()
        await web.aclose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if tmp is not None:
            tmp.cleanup()
