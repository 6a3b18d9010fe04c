"""``p2pcrawl join``: a peer's whole life in the foreground, from start-up to the exit summary."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from p2pcrawl.aio import TaskSet
from p2pcrawl.crawl import scheme_hint, urls
from p2pcrawl.ui.logs import json_lines, say, set_node_id
from p2pcrawl.ui.options import EXIT_FAILURE, UsageError, parse_hostport, settings_from
from p2pcrawl.ui.progress import (
    Milestones,
    extended_status,
    progress_line,
    summary,
    summary_lines,
    warc_output,
)

__all__ = ["run_join"]

log = logging.getLogger("p2pcrawl")

TTY_PROGRESS_S = 2.0
LOG_PROGRESS_S = 30.0


async def run_join(opts: dict[str, Any]) -> int:
    from p2pcrawl.network import (
        NetworkKeyError,
        Peer,
        PeerConfig,
        decide_key,
        is_loopback,
        join_command,
    )
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
    open_network = bool(opts.get("open"))
    if open_network and not is_loopback(listen[0]):
        if not opts.get("allow_domain"):
            raise UsageError(
                "--open off loopback needs --allow-domain: without a key the scope other "
                "peers publish cannot be trusted, so each peer must be told what to crawl"
            )
        log.warning(
            "--open: this network has no key; anyone who can reach UDP %s:%d can join it, "
            "take over hosts and feed it URLs (docs/security.md)",
            *listen,
        )
    try:
        key = decide_key(
            Path(opts["data"]),
            listen[0],
            secret=str(opts.get("secret") or ""),
            open_network=open_network,
            founding=not bootstrap,
        )
    except NetworkKeyError as exc:
        raise UsageError(str(exc)) from exc
    opts = {**opts, "secret": key.secret}
    crawl, peer_settings = settings_from(opts)
    if crawl.revisit.enabled and opts.get("exit_when_finished"):
        raise UsageError(
            "--exit-when-finished: a continuous crawl (--revisit) never finishes; "
            "stop it with Ctrl-C or p2pcrawl leave"
        )
    seeds = tuple(opts.get("seed") or ())
    for seed in seeds:
        if urls.canonicalize(seed, max_length=crawl.fetch.max_url_length) is None:
            raise UsageError(f"--seed {seed!r} is not a crawlable URL: {scheme_hint(seed)}")
    if opts.get("recrawl") and not seeds:
        raise UsageError("--recrawl fetches the --seed URLs again: give them with --seed")
    token = opts.get("status_token") or ""
    if not is_loopback(status_addr[0]) and not token:
        raise UsageError(
            f"--status {opts['status']} listens beyond loopback; set --status-token too"
        )
    config = PeerConfig(
        data_dir=Path(opts["data"]),
        listen=listen,
        bootstrap=bootstrap,
        seeds=seeds,
        recrawl=bool(opts.get("recrawl")),
        crawl=crawl,
        peer=peer_settings,
    )
    peer = Peer(config)  # a DataDirError is the command's one-line failure (exit 1)
    server = StatusServer(peer, *status_addr, token=token)
    loop = asyncio.get_running_loop()
    interrupts = 0
    # A progress line redrawn in place is for a person at a terminal, never for JSON lines.
    tty = sys.stderr.isatty() and not json_lines()

    def on_signal(signame: str) -> None:
        nonlocal interrupts
        interrupts += 1
        if tty:
            sys.stderr.write("\n")  # off the progress line
        if interrupts == 1:
            log.info("%s: leaving gracefully (again to force an immediate exit)", signame)
            peer.request_leave()
        else:
            log.warning("%s again: exiting now; replicas will recover this peer's tasks", signame)
            os._exit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    started_wall = time.time()
    try:
        try:
            await server.start()
        except OSError as exc:
            log.error("%s", _bind_error(exc, "TCP", status_addr, "--status"))
            return EXIT_FAILURE
        try:
            await peer.start()
        except BootstrapError as exc:
            log.error("cannot join: %s", exc)
            return EXIT_FAILURE
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise  # not the bind: a store or the WARC writer, with its own message
            log.error("%s", _bind_error(exc, "UDP", listen, "--listen"))
            return EXIT_FAILURE
        # From here on, JSON log lines carry the node ID (a joiner's is chosen in start).
        set_node_id(peer.node_id.hex())
        log.info(
            "peer %s listening on %s:%d (UDP), status at %s",
            peer.node_id.hex()[:8],
            peer.me.host,
            peer.me.port,
            server.url,
        )
        ready: dict[str, Any] = {
            "ready": True,
            "node_id": peer.node_id.hex(),
            "listen": f"{peer.me.host}:{peer.me.port}",
            "status": f"{server.host}:{server.port}",
        }
        if key.stored and not bootstrap:
            command = join_command(peer.me.host, peer.me.port, key.secret)
            ready["join"] = command
            where = Path(opts["data"]) / "network.key"
            made = "generated this network's key" if key.generated else "using the key"
            say(
                f"{made} in {where} (keep it secret). To add a peer, run on the next "
                f"machine:\n\n    {command}\n"
            )
        # One JSON line on stdout with the bound addresses, so scripts can use port 0.
        print(json.dumps(ready), flush=True)
        interval = float(opts.get("progress_interval") or 0) or (
            TTY_PROGRESS_S if tty else LOG_PROGRESS_S
        )
        progress = TaskSet("join")
        progress.spawn(_progress_loop(peer, interval, tty), "progress")
        running = asyncio.ensure_future(peer.run())
        finished = (
            asyncio.ensure_future(peer.finished.wait()) if opts.get("exit_when_finished") else None
        )
        try:
            waits = [running] if finished is None else [running, finished]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            # The network is finished: nothing is queued anywhere, so there is nothing to
            # hand off. Stop where we are; the data directory keeps the history.
            ended_by_finish = not running.done()
        finally:
            await progress.aclose()
            owned = [t for t in (running, finished) if t is not None]
            for t in owned:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*owned, return_exceptions=True)
        if tty:
            sys.stderr.write("\n")  # end the progress line
        warc_dir = config.data_dir / "warc"
        warc = await asyncio.to_thread(warc_output, warc_dir, started_wall)
        done = summary(extended_status(peer), time.monotonic() - peer.started, warc)
        for line in summary_lines(done, str(warc_dir), str(config.data_dir)):
            say(line)
        if ended_by_finish:
            log.info("the network is finished; exiting")
            # Nothing to hand off, but the others should not spend a suspicion timeout
            # finding out that we are gone (a peer still confirming the finish waits on it).
            await peer.say_goodbye()
            print(json.dumps({"finished": True, **done}), flush=True)
            return 0
        report = running.result()
        print(
            json.dumps(
                {
                    "left": True,
                    "handed_off_tasks": report.tasks,
                    "handed_off_done": report.done,
                    "handed_off_backups": report.backups,
                    "failed": report.failed,
                    "queue_at_leave": report.queue_at_leave,
                    **done,
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


def _bind_error(exc: OSError, proto: str, addr: tuple[str, int], flag: str) -> str:
    """One line naming the address, the flag that set it, and what to do."""
    where = f"{proto} {addr[0]}:{addr[1]} ({flag})"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the address is in use, by another peer or program; "
            f"choose another port with {flag}, or port 0 for any free one"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: no interface of this machine has that address"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need root)"
    return f"cannot listen on {where}: {exc.strerror or exc}"


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


async def _progress_loop(peer: Any, interval: float, tty: bool) -> None:
    """A progress line (redrawn on a terminal, logged otherwise) and milestones."""
    milestones = Milestones(peer.config.crawl.scope.max_pages)
    last_line = time.monotonic()
    drawn = False
    while True:
        await asyncio.sleep(min(1.0, interval))
        st = peer.status()
        engine = peer.engine
        for message in milestones.feed(st, bool(engine is not None and engine.exhausted)):
            if drawn:
                sys.stderr.write("\n")
                drawn = False
            log.info("%s", message)
        if time.monotonic() - last_line < interval:
            continue
        last_line = time.monotonic()
        if tty:
            sys.stderr.write("\r" + progress_line(st) + "\x1b[K")
            sys.stderr.flush()
            drawn = True
        else:
            log.info("progress: %s", progress_line(st))
