"""Run inside a fresh network namespace (``unshare -n``) by ``test_admission``: peers on a
non-loopback address (198.18.77.1 on a veth pair that exists only in the namespace).

Prints one JSON object with what happened; the namespace, and all its traffic, vanish with
this process.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import umsgpack

from p2pcrawl.testing import Cluster

ADDR = "198.18.77.1"


def setup_namespace() -> None:
    for cmd in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "add", "adm0", "type", "veth", "peer", "name", "adm1"],
        ["ip", "addr", "add", f"{ADDR}/24", "dev", "adm0"],
        ["ip", "link", "set", "adm0", "up"],
        ["ip", "link", "set", "adm1", "up"],
    ):
        subprocess.run(cmd, check=True)


async def main() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="p2pcrawl-netns-") as tmp:
        async with Cluster(Path(tmp), ["--rpc-timeout", "0.5", "--ping-interval", "0.5"]) as c:
            founder = await c.start_peer("founder", extra=["--listen", f"{ADDR}:0"])
            ready = json.loads(founder.stdout_lines[0])
            out["founder_listen"] = founder.listen
            out["join"] = ready.get("join", "")
            key = (founder.data / "network.key").read_text().strip()
            port = int(founder.listen.rsplit(":", 1)[1])
            boot = f"{ADDR}:{port}"
            keyless = await c.start_peer(
                "keyless", extra=["--listen", f"{ADDR}:0", "--bootstrap", boot], expect_ready=False
            )
            out["keyless_exit"] = await c.wait_exit(keyless, 20)
            out["keyless_log"] = c.log(keyless)[-600:]
            joiner = await c.start_peer(
                "joiner", extra=["--listen", f"{ADDR}:0", "--bootstrap", boot, "--secret", key]
            )
            await c.wait_until(
                lambda ss: len(ss) == 2 and all(s["peers"] == 1 for s in ss), 20, "a pair"
            )
            # An unkeyed script on the same address: its pings are dropped unanswered.
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((ADDR, 0))
            s.settimeout(1.0)
            for _ in range(10):
                fake = secrets.token_bytes(20)
                s.sendto(
                    b"\x00" + secrets.token_bytes(20) + umsgpack.packb(["ping", [fake]]),
                    (ADDR, port),
                )
            try:
                s.recv(65536)
                out["attacker_answered"] = True
            except TimeoutError:
                out["attacker_answered"] = False
            s.close()
            out["peers"] = [st["peers"] for st in await c.statuses()]
            for p in (founder, joiner):
                c.terminate(p)
            out["exits"] = [await c.wait_exit(p, 30) for p in (founder, joiner)]
    return out


if __name__ == "__main__":
    setup_namespace()
    print(json.dumps(asyncio.run(main())))
    sys.exit(0)
