"""A network key by default off loopback, and a keyed network against a hostile script.

Peers are real ``p2pcrawl join`` processes. Off-loopback means listening on 0.0.0.0 (every
datagram still goes over loopback: the peers bootstrap through 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import stat
from typing import Any

import aiohttp
import pytest
import umsgpack

from p2pcrawl.crawl import urls
from p2pcrawl.testing import TestWeb
from protocol import key_for
from tests.integration.conftest import crawl_args

pytestmark = pytest.mark.timeout(180)

FAST = ["--ping-interval", "0.5", "--rpc-timeout", "0.5", "--republish-interval", "1"]


def port_of(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


async def test_a_founder_off_loopback_generates_a_key_and_prints_the_join_command(
    web: TestWeb, make_cluster: Any
) -> None:
    cluster = await make_cluster(crawl_args(web, *FAST))
    founder = await cluster.start_peer("founder", extra=["--listen", "0.0.0.0:0"])
    port = port_of(founder.listen)
    key_file = founder.data / "network.key"
    key = key_file.read_text().strip()
    assert len(key) >= 32 and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    ready = json.loads(founder.stdout_lines[0])
    assert ready["join"].startswith("p2pcrawl join --bootstrap ")
    assert ready["join"].endswith(f":{port} --listen 0.0.0.0:{port} --secret {key}")
    assert ready["join"] in cluster.log(founder)  # printed for the operator too

    # The printed key lets the next peer in ...
    joiner = await cluster.start_peer(
        "joiner",
        extra=["--listen", "0.0.0.0:0", "--bootstrap", f"127.0.0.1:{port}", "--secret", key],
    )
    await cluster.wait_until(lambda ss: all(s["peers"] == 1 for s in ss), 20, "a pair")
    # ... and without it a peer off loopback refuses to start, saying what to do.
    keyless = await cluster.start_peer(
        "keyless",
        extra=["--listen", "0.0.0.0:0", "--bootstrap", f"127.0.0.1:{port}"],
        expect_ready=False,
    )
    assert await cluster.wait_exit(keyless, 20) == 2
    assert "--secret" in cluster.log(keyless) and "network.key" in cluster.log(keyless)
    # A restarted founder finds its key again (same network, same join command).
    cluster.terminate(founder)
    cluster.terminate(joiner)
    assert await cluster.wait_exit(founder, 30) == 0
    again = await cluster.start_peer("again", data=founder.data, extra=["--listen", "0.0.0.0:0"])
    assert json.loads(again.stdout_lines[0])["join"].endswith(f"--secret {key}")


async def test_open_off_loopback_needs_a_scope_and_warns(web: TestWeb, make_cluster: Any) -> None:
    cluster = await make_cluster(["--allow-private"])
    bare = await cluster.start_peer(
        "bare", extra=["--listen", "0.0.0.0:0", "--open"], expect_ready=False
    )
    assert await cluster.wait_exit(bare, 20) == 2
    assert "--allow-domain" in cluster.log(bare)
    scoped = await cluster.start_peer(
        "scoped", extra=["--listen", "0.0.0.0:0", "--open", "--allow-domain", "example.test"]
    )
    assert not (scoped.data / "network.key").exists()
    assert "has no key" in cluster.log(scoped)


async def test_fake_close_ids_take_no_task_from_a_keyed_network(
    web: TestWeb, make_cluster: Any
) -> None:
    cluster = await make_cluster(crawl_args(web, "--delay", "0.1", "--secret", "team-key", *FAST))
    a = await cluster.start_peer("a")
    b = await cluster.start_peer("b", bootstrap=a)
    await cluster.wait_until(lambda ss: all(s["peers"] == 1 for s in ss), 20, "a pair")
    await cluster.api(a, "/api/seed", "POST", {"urls": [web.hub_url]})
    # The script's IDs sit next to every host's key: in an open network, the owner of each.
    keys = {key_for(urls.host_of(u)) for u in web.ground_truth()}
    fakes = [k[:-1] + bytes([k[-1] ^ 1]) for k in keys]
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker.bind(("127.0.0.1", 0))
    attacker.setblocking(False)
    received: list[bytes] = []
    sent = 0
    try:
        loop = asyncio.get_running_loop()
        for _ in range(5):  # announce, and keep announcing while the crawl runs
            for peer in (a, b):
                for fake in fakes:
                    msg = b"\x00" + secrets.token_bytes(20) + umsgpack.packb(["ping", [fake]])
                    attacker.sendto(msg, ("127.0.0.1", port_of(peer.listen)))
                    sent += 1
            try:
                while True:
                    received.append(await asyncio.wait_for(loop.sock_recv(attacker, 65536), 0.5))
            except TimeoutError:
                pass
        statuses = await cluster.wait_finished(timeout=120)
    finally:
        attacker.close()
    assert received == []  # no reply, no challenge, and no STORE_TASK ever came its way
    assert all(s["peers"] == 1 for s in statuses)
    dropped = 0.0
    for peer in (a, b):
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{peer.status}/metrics") as resp,
        ):
            metrics = await resp.text()
        for line in metrics.splitlines():
            if line.startswith('p2pcrawl_datagrams_dropped_total{reason="bad_hmac"}'):
                dropped += float(line.rsplit(" ", 1)[1])
    assert dropped == sent
    for p in cluster.peers:
        cluster.terminate(p)
    for p in cluster.peers:
        assert await cluster.wait_exit(p, 30) == 0
    counts = cluster.warc_counts()
    assert set(counts) == web.ground_truth()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def metrics_of(peer: Any) -> dict[str, float]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{peer.status}/metrics") as resp,
    ):
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def test_store_and_new_contact_floods_keep_a_peer_small(
    web: TestWeb, make_cluster: Any
) -> None:
    # An open peer on loopback (the stock DHT's STORE is unauthenticated there): 30,000 STOREs
    # of 7 KB, each under a new made-up node ID, from 30 ports.
    cluster = await make_cluster(crawl_args(web, *FAST))
    peer = await cluster.start_peer("target")
    await asyncio.sleep(1.0)
    before = rss_kib(peer.pid)
    addr = ("127.0.0.1", port_of(peer.listen))
    flood = []
    for _ in range(30):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        flood.append(s)
    try:
        for i in range(1000):
            for s in flood:
                args = [secrets.token_bytes(20), secrets.token_bytes(20), secrets.token_bytes(7000)]
                msg = b"\x00" + secrets.token_bytes(20) + umsgpack.packb(["store", args])
                s.sendto(msg, addr)
            if i % 10 == 9:
                await asyncio.sleep(0.01)  # a sustained flood, not one burst into a full buffer
    finally:
        for s in flood:
            s.close()
    await asyncio.sleep(2.0)
    grown_mib = (rss_kib(peer.pid) - before) / 1024
    m = await metrics_of(peer)
    status = await cluster.api(peer, "/api/status")
    print(f"store flood: RSS +{grown_mib:.1f} MiB; {m}")
    assert status["peers"] == 0  # no made-up ID got into the routing table
    assert m["p2pcrawl_dht_values"] <= 4096
    assert m['p2pcrawl_datagrams_dropped_total{reason="rate_limited"}'] > 0
    assert grown_mib < 40  # stock kademlia kept every value: ~200 MB for this flood


async def test_off_loopback_in_a_network_namespace() -> None:
    """Peers on 198.18.77.1, a non-loopback address that exists only inside a namespace made
    for this test (``unshare -n``): key generated, keyless joiner refused, keyed joiner in,
    an unkeyed script ignored."""
    import os
    import shutil
    import sys
    from pathlib import Path

    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip to make a network namespace")
    helper = Path(__file__).with_name("netns_keyed.py")
    proc = await asyncio.create_subprocess_exec(
        "unshare",
        "-n",
        sys.executable,
        str(helper),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(120):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0 and b"Operation not permitted" in err:
        pytest.skip("network namespaces are not permitted here")
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["founder_listen"].startswith("198.18.77.1:")
    assert result["join"].startswith("p2pcrawl join --bootstrap 198.18.77.1:")
    assert result["keyless_exit"] == 2 and "--secret" in result["keyless_log"]
    assert result["peers"] == [1, 1]
    assert result["attacker_answered"] is False
    assert result["exits"] == [0, 0]
