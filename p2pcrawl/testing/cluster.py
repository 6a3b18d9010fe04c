"""Local multi-process p2pcrawl networks on loopback: integration tests, benchmarks, examples.

Each peer is ``python -m p2pcrawl join`` in its own process with its own data
directory; the harness reads the peer's ready line for its bound addresses, talks to it only
through its status API, and stops it by its own PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from p2pcrawl.aio import TaskSet
from p2pcrawl.archive import read_warc_urls
from p2pcrawl.testing.bytecode import cache_bytecode

__all__ = ["FAST_DETECTION", "Cluster", "PeerProc", "cpu_seconds"]

# Flags for fast failure detection, so churn tests and benchmarks stay short: a peer that
# stops answering is suspected after a missed 0.5 s ping and declared dead 2 s later, and
# holds the finish back for 3 s, not the merge bound (a crash is not taken for a partition).
FAST_DETECTION = (
    "--rpc-timeout",
    "0.5",
    "--ping-interval",
    "0.5",
    "--suspicion-timeout",
    "2",
    "--republish-interval",
    "2",
    "--min-peer-age",
    "0.5",
    "--partition-hold",
    "3",
)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` and its living children, from /proc;
    0.0 where that cannot be read (another system, or the process is gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    with contextlib.suppress(OSError, ValueError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(c) for c in f.read().split()]
    for p in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


@dataclass
class PeerProc:
    name: str
    data: Path
    proc: asyncio.subprocess.Process
    node_id: str = ""
    listen: str = ""
    status: str = ""
    log_path: Path | None = None
    exit_code: int | None = None
    stdout_lines: list[str] = field(default_factory=list)
    # CPU seconds of the peer and its WARC writer from spawn to its ready line: what starting
    # a peer costs the machine (benchmarks/_chaos.py counts what joiners took of the crawl's).
    start_cpu_s: float = 0.0
    spawned_at: float = 0.0  # time.monotonic() when its process was started

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


class Cluster:
    def __init__(self, root: Path, common_args: list[str], *, startup_timeout: float = 60.0):
        self.root = root
        self.common = common_args
        self.peers: list[PeerProc] = []
        self.startup_timeout = startup_timeout
        self._session: aiohttp.ClientSession | None = None
        self._readers = TaskSet("cluster-stdout")

    async def __aenter__(self) -> Cluster:
        await asyncio.to_thread(cache_bytecode)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_all()
        if self._session is not None:
            await self._session.close()

    # -- processes ---------------------------------------------------------------------------

    async def start_peer(
        self,
        name: str,
        *,
        bootstrap: PeerProc | None = None,
        extra: list[str] | None = None,
        data: Path | None = None,
        expect_ready: bool = True,
    ) -> PeerProc:
        data = data or self.root / name
        data.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable,
            "-m",
            "p2pcrawl",
            "--log-level",
            "info",
            "join",
            "--listen",
            "127.0.0.1:0",
            "--status",
            "127.0.0.1:0",
            "--data",
            str(data),
            *self.common,
            *(extra or []),
        ]
        if bootstrap is not None:
            args += ["--bootstrap", bootstrap.listen]
        log_path = self.root / f"{name}.log"
        log_file = log_path.open("ab")
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=log_file, stdin=asyncio.subprocess.DEVNULL
        )
        log_file.close()
        peer = PeerProc(
            name=name, data=data, proc=proc, log_path=log_path, spawned_at=time.monotonic()
        )
        self.peers.append(peer)
        ready = asyncio.get_running_loop().create_future()
        self._readers.spawn(self._read_stdout(peer, ready), name)
        if not expect_ready:
            # Nobody awaits it: a peer meant to fail must not leave an unretrieved error.
            ready.add_done_callback(lambda f: f.cancelled() or f.exception())
            return peer
        try:
            async with asyncio.timeout(self.startup_timeout):
                await ready
        except TimeoutError:
            raise AssertionError(f"{name} did not start:\n{self.log(peer)}") from None
        return peer

    async def _read_stdout(self, peer: PeerProc, ready: asyncio.Future[None]) -> None:
        assert peer.proc.stdout is not None
        while True:
            line = await peer.proc.stdout.readline()
            if not line:
                break
            text = line.decode(errors="replace").strip()
            peer.stdout_lines.append(text)
            with contextlib.suppress(ValueError):
                doc = json.loads(text)
                if isinstance(doc, dict) and doc.get("ready"):
                    peer.node_id, peer.listen, peer.status = (
                        doc["node_id"],
                        doc["listen"],
                        doc["status"],
                    )
                    peer.start_cpu_s = cpu_seconds(peer.pid)
                    if not ready.done():
                        ready.set_result(None)
        peer.exit_code = await peer.proc.wait()
        if not ready.done():
            # Its log says why, for whoever reads the failure.
            why = self.log(peer)[-1500:]
            ready.set_exception(AssertionError(f"{peer.name} exited {peer.exit_code}:\n{why}"))

    def log(self, peer: PeerProc) -> str:
        assert peer.log_path is not None
        return peer.log_path.read_text(errors="replace")[-4000:]

    async def wait_exit(self, peer: PeerProc, timeout: float) -> int:
        try:
            async with asyncio.timeout(timeout):
                return await peer.proc.wait()
        except TimeoutError:
            raise AssertionError(f"{peer.name} did not exit:\n{self.log(peer)}") from None

    def kill(self, peer: PeerProc) -> None:
        if peer.alive:
            os.kill(peer.pid, signal.SIGKILL)

    def terminate(self, peer: PeerProc) -> None:
        if peer.alive:
            os.kill(peer.pid, signal.SIGTERM)

    async def stop_all(self) -> None:
        for p in self.peers:
            self.kill(p)
        for p in self.peers:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await p.proc.wait()
        await self._readers.aclose()

    # -- the status API ------------------------------------------------------------------------

    async def api(self, peer: PeerProc, path: str, method: str = "GET", body: Any = None) -> Any:
        assert self._session is not None
        async with self._session.request(method, f"http://{peer.status}{path}", json=body) as resp:
            return await resp.json(content_type=None)

    async def statuses(self) -> list[dict[str, Any]]:
        out = []
        for p in self.peers:
            if not p.alive:
                continue
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                out.append(await self.api(p, "/api/status"))
        return out

    async def wait_finished(self, timeout: float, quiet: float = 3.0) -> list[dict[str, Any]]:
        """Every peer idle with no RPC in transit for ``quiet`` seconds (docs/architecture.md,
        "Finished")."""
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            last = await self.statuses()
            alive = [p for p in self.peers if p.alive]
            idle = len(last) == len(alive) and all(
                s["state"] in ("active", "finished")
                and s["tasks_queued"] == 0
                and s["tasks_in_flight"] == 0
                and s["rpc_in_transit"] == 0
                for s in last
            )
            if idle:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= quiet:
                    return last
            else:
                quiet_since = None
            await asyncio.sleep(0.3)
        logs = "\n".join(f"--- {p.name}\n{self.log(p)}" for p in self.peers)
        raise AssertionError(f"crawl did not finish: {last}\n{logs}")

    async def wait_network_finished(self, timeout: float) -> list[dict[str, Any]]:
        """Until every live peer reports ``state: "finished"`` (DESIGN.md's definition, as
        each peer works it out). Fails if any peer said "finished" while a backup of an owner
        that is gone was still unclaimed somewhere: that state must never be premature."""
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            last = await self.statuses()
            alive = [p for p in self.peers if p.alive]
            orphans = sum(int(s.get("backups_orphaned", 0)) for s in last)
            if orphans and any(s["state"] == "finished" for s in last):
                raise AssertionError(f"finished while {orphans} backups were orphaned: {last}")
            if len(last) == len(alive) and all(s["state"] == "finished" for s in last):
                return last
            await asyncio.sleep(0.3)
        logs = "\n".join(f"--- {p.name}\n{self.log(p)}" for p in self.peers)
        raise AssertionError(f"the network never reported finished: {last}\n{logs}")

    async def wait_until(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(await self.statuses()):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    def warc_counts(self) -> Counter[str]:
        c: Counter[str] = Counter()
        # A restarted peer shares its data directory with its earlier incarnation.
        for data in dict.fromkeys(p.data for p in self.peers):
            c.update(read_warc_urls(data / "warc"))
        return c
