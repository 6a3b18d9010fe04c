"""Issue 34: what a flooded peer takes off its socket, and how many of a member's calls it answers.

One keyed peer (a ``CrawlNode`` in a process of its own) is flooded from one source with junk
datagrams as fast as one process sends them (``_detection.FLOOD``, the flood of the churn
test and benchmark). Meanwhile a member (a node of this process, in the peer's routing table,
with the same secret) pings it ``--calls`` times, paced over the flood, each call with the
default 2 s timeout and its resends (``protocol.outstanding``). Builds of the peer's read
path, interleaved round by round:

* ``asyncio``: the node's socket served by asyncio's own datagram transport, as before
  ``protocol.datagram`` (one datagram per readiness event, each into a fresh 256 KiB buffer),
  every datagram through the HMAC;
* ``asyncio+4MiB``: that, with a 4 MiB receive buffer asked for (the node asks for 2 MiB):
  whether a bigger buffer helps under a sustained flood;
* ``one-per-wakeup``: ``DrainingTransport`` reading one datagram per readiness event, every
  datagram through the HMAC (``InboundLimits(drain=1, junk=None)``);
* ``drain``: up to ``datagram.DRAIN`` datagrams per readiness event (``drain+4MiB``: with
  the bigger buffer);
* ``drain+junk``: that, and a source whose datagrams keep failing to open is dropped unread
  for a second (``datagram.JunkSources``): the defaults.

Prints per build: flood datagrams sent, datagrams the peer read per second, the share of the
flood it read (the kernel dropped the rest at the full socket, members' datagrams with them),
and the share of the member's pings answered; then each build's ratios against the first.

    python benchmarks/flood_reads.py                 # 3 rounds, 8 s floods, 200 pings each
    python benchmarks/flood_reads.py --quick         # 1 round, 6 s floods, 80 pings
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from _detection import spawn_flood

from protocol import (
    CrawlNode,
    NodeConfig,
    PeerRef,
    PeerTimeout,
    new_node_id,
)
from protocol.serving import NoWork

SECRET = "flood-reads-benchmark"
# drain 0: the default, -1: asyncio's transport; rcvbuf 0: the node's own (sockstats)
BUILDS = {
    "asyncio": {"drain": -1, "junk": 0, "rcvbuf": 0},
    "asyncio+4MiB": {"drain": -1, "junk": 0, "rcvbuf": 4 << 20},
    "one-per-wakeup": {"drain": 1, "junk": 0, "rcvbuf": 0},
    "drain": {"drain": 0, "junk": 0, "rcvbuf": 0},
    "drain+4MiB": {"drain": 0, "junk": 0, "rcvbuf": 4 << 20},
    "drain+junk": {"drain": 0, "junk": 1, "rcvbuf": 0},
}

# The flooded peer: prints its address, serves until its stdin closes, then prints its stats.
TARGET = r"""
import asyncio, dataclasses, json, socket, sys
from protocol import CrawlNode, InboundLimits, NodeConfig, new_node_id
from protocol.serving import NoWork
secret, drain, junk, rcvbuf = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
limits = InboundLimits()
if drain > 0:
    limits = dataclasses.replace(limits, drain=drain)
if not junk:
    limits = dataclasses.replace(limits, junk=None)
if drain < 0:  # the node's socket as it was served before: asyncio's transport
    import protocol.node
    async def asyncio_udp(proto, host, port, drain=0):
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: proto, local_addr=(host, port))
        return transport
    protocol.node.open_udp = asyncio_udp
async def main():
    node = CrawlNode(new_node_id(), NoWork(), NodeConfig(secret=secret, inbound=limits))
    await node.listen_on("127.0.0.1", 0)
    if rcvbuf:
        sock = node.rpc.endpoint.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    print(json.dumps([node.me.id.hex(), node.me.host, node.me.port]), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    s = node.rpc_stats
    print(json.dumps({"in": s.datagrams_in, "dropped": dict(s.dropped)}), flush=True)
    await node.aclose()
asyncio.run(main())
"""


async def one_run(build: str, seconds: float, calls: int) -> dict[str, float]:
    opts = BUILDS[build]
    target = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        TARGET,
        SECRET,
        str(opts["drain"]),
        str(opts["junk"]),
        str(opts["rcvbuf"]),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert target.stdin is not None and target.stdout is not None
    member = CrawlNode(new_node_id(), NoWork(), NodeConfig(secret=SECRET))
    flood = None
    try:
        node_id, host, port = json.loads(await asyncio.wait_for(target.stdout.readline(), 30))
        peer = PeerRef(bytes.fromhex(node_id), host, port)
        await member.listen_on("127.0.0.1", 0)
        await member.join([peer.addr])
        flood = await spawn_flood(host, port, seconds, out=asyncio.subprocess.PIPE)
        await asyncio.sleep(0.5)  # the flood is under way

        async def ping() -> bool:
            try:
                await member.ping_peer(peer)
                return True
            except PeerTimeout:
                return False

        # Paced over the flood, each with the default timeout: done before the flood ends.
        gap = (seconds - 0.5 - 2 * member.config.rpc_timeout) / calls
        pings = []
        for _ in range(calls):
            pings.append(asyncio.ensure_future(ping()))
            await asyncio.sleep(gap)
        answered = sum(await asyncio.gather(*pings))
        out, _ = await asyncio.wait_for(flood.communicate(), seconds + 30)
        sent = int((out.decode().split() or ["0"])[0])
        target.stdin.close()
        stats = json.loads(await asyncio.wait_for(target.stdout.readline(), 30))
    finally:
        await member.aclose()
        for proc in (flood, target):
            if proc is not None and proc.returncode is None:
                proc.kill()  # by its own PID
                await proc.wait()
    junk = sum(stats["dropped"].values())
    return {
        "sent": sent,
        "read_per_s": stats["in"] / seconds,
        "read_share": min(1.0, junk / sent) if sent else 0.0,
        "answered": answered / calls,
    }


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round, 6 s floods, 80 pings")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (3)")
    ap.add_argument("--seconds", type=float, help="flood duration (8)")
    ap.add_argument("--calls", type=int, help="member pings per flood (200)")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (6.0 if args.quick else 8.0)
    calls = args.calls or (80 if args.quick else 200)
    runs: dict[str, list[dict[str, float]]] = {b: [] for b in BUILDS}
    started = time.monotonic()
    for r in range(rounds):
        for build in BUILDS:
            result = await one_run(build, seconds, calls)
            runs[build].append(result)
            shown = json.dumps({k: round(v, 3) for k, v in result.items()})
            print(f"round {r + 1} {build:20s} {shown}")
    print(
        f"\n{rounds} rounds of {seconds:.0f} s floods, {calls} member pings each "
        f"({time.monotonic() - started:.0f} s)"
    )
    med = {b: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for b, rs in runs.items()}
    base = med["asyncio"]
    print(f"{'build':20s} {'sent/s':>9s} {'read/s':>9s} {'read':>6s} {'pings answered':>15s}")
    for build, m in med.items():
        print(
            f"{build:20s} {m['sent'] / seconds:9.0f} {m['read_per_s']:9.0f} "
            f"{100 * m['read_share']:5.1f}% {100 * m['answered']:14.1f}%"
        )
    for build, m in med.items():
        if build != "asyncio":
            print(
                f"{build}: reads {m['read_per_s'] / base['read_per_s']:.2f}x a second, "
                f"{m['read_share'] / base['read_share']:.2f}x the flood's share; pings unanswered "
                f"{1 - m['answered']:.3f} against {1 - base['answered']:.3f}"
            )
    print(json.dumps({b: {k: round(v, 3) for k, v in m.items()} for b, m in med.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
