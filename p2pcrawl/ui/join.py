"""``p2pcrawl join``: a peer's whole life in the foreground, from start-up to the exit summary."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from p2pcrawl.ui.options import EXIT_FAILURE, UsageError, parse_hostport, settings_from

__all__ = ["run_join"]

log = logging.getLogger("p2pcrawl")


async def run_join(opts: dict[str, Any]) -> int:
    from p2pcrawl.network import DataDirError, Peer, PeerConfig
    from p2pcrawl.ui.status import StatusServer
    from protocol import BootstrapError

    if not opts.get("listen"):
        raise UsageError("join needs --listen HOST:PORT")
    try:
        listen = parse_hostport(str(opts["listen"]))
        status_addr = parse_hostport(str(opts["status"]))
        bootstrap = tuple(_resolve_bootstrap(b) for b in opts.get("bootstrap") or ())
    except argparse.ArgumentTypeError as exc:
        raise UsageError(str(exc)) from exc
    crawl, peer_settings = settings_from(opts)
    config = PeerConfig(
        data_dir=Path(opts["data"]),
        listen=listen,
        bootstrap=bootstrap,
        seeds=tuple(opts.get("seed") or ()),
        crawl=crawl,
        peer=peer_settings,
    )
    try:
        peer = Peer(config)
    except DataDirError as exc:
        log.error("%s", exc)
        return EXIT_FAILURE
    server = StatusServer(peer, *status_addr, token=opts.get("status_token") or "")
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_signal(signame: str) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            log.info("%s: leaving gracefully (again to force an immediate exit)", signame)
            peer.request_leave()
        else:
            log.warning("%s again: exiting now; replicas will recover this peer's tasks", signame)
            os._exit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        await server.start()
        try:
            await peer.start()
        except BootstrapError as exc:
            log.error("cannot join: %s", exc)
            return EXIT_FAILURE
        log.info(
            "peer %s listening on %s:%d (UDP), status at %s",
            peer.node_id.hex()[:8],
            peer.me.host,
            peer.me.port,
            server.url,
        )
        # One JSON line on stdout with the bound addresses, so scripts can use port 0.
        print(
            json.dumps(
                {
                    "ready": True,
                    "node_id": peer.node_id.hex(),
                    "listen": f"{peer.me.host}:{peer.me.port}",
                    "status": f"{server.host}:{server.port}",
                }
            ),
            flush=True,
        )
        progress = asyncio.ensure_future(_progress_loop(peer)) if sys.stderr.isatty() else None
        running = asyncio.ensure_future(peer.run())
        finished = (
            asyncio.ensure_future(peer.quiescence.finished.wait())
            if opts.get("exit_when_finished")
            else None
        )
        try:
            waits = [running] if finished is None else [running, finished]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not running.done():
                # The network is finished: nothing is queued anywhere, so there is nothing
                # to hand off. Stop where we are; the data directory keeps the history.
                summary = {"finished": True, **_summary(peer)}
                print(json.dumps(summary), flush=True)
                log.info("the network is finished; exiting")
                return 0
            report = running.result()
        finally:
            for t in (running, finished, progress):
                if t is not None and not t.done():
                    t.cancel()
            await asyncio.gather(
                *(t for t in (running, finished, progress) if t is not None),
                return_exceptions=True,
            )
        print(
            json.dumps(
                {
                    "left": True,
                    "handed_off_tasks": report.tasks,
                    "handed_off_done": report.done,
                    "handed_off_backups": report.backups,
                    "failed": report.failed,
                    "queue_at_leave": report.queue_at_leave,
                }
            ),
            flush=True,
        )
        failure = peer.engine.failure if peer.engine is not None else None
        if failure is not None:
            log.error("left because this peer could not go on crawling: %s", failure)
        return EXIT_FAILURE if report.failed or failure is not None else 0
    finally:
        await peer.aclose()
        await server.aclose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _summary(peer: Any) -> dict[str, object]:
    s = peer.status()
    keys = ("pages_fetched", "done", "errors", "backups_held", "peers", "uptime_s")
    return {k: s[k] for k in keys}


def _resolve_bootstrap(value: str) -> tuple[str, int]:
    import socket

    host, port = parse_hostport(value)
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise argparse.ArgumentTypeError(
            f"bootstrap host {host!r} does not resolve: {exc}"
        ) from exc
    return str(infos[0][4][0]), port


async def _progress_loop(peer: Any) -> None:
    while True:
        await asyncio.sleep(3.0)
        s = peer.status()
        sys.stderr.write(
            f"\r[{s['state']}] peers={s['peers']} queued={s['tasks_queued']} "
            f"in-flight={s['tasks_in_flight']} fetched={s['pages_fetched']} "
            f"({s['pages_per_s']}/s) done={s['done']} backups={s['backups_held']} "
            f"errors={s['errors']}   "
        )
        sys.stderr.flush()
