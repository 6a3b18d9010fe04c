"""Peers in network namespaces on one machine: the topology of ``cluster.py`` and
``partition.py`` (and the suite's partition test), and cuts between groups of peers.

    web ns   198.18.0.1   the test web (``_clusterweb.py``); ``ip route add local 198.19.0.0/16
                          dev lo`` makes every 198.19.x.y one of its hosts
    ctl ns   198.18.0.2   the harness talks to the peers' status servers from here
    peer ns  198.18.0.10+i  one ``p2pcrawl join`` each, optionally with a ``tbf`` cap on the
                          link towards it (its download)
    br ns    a bridge joining them (veth pairs); nothing is routed anywhere else

Addresses come only from 198.18.0.0/15 (RFC 2544) and exist only inside these namespaces.
Every namespace's name starts with the topology's prefix; ``close`` deletes every one it
made (deleting a namespace deletes the veth ends inside it, and with them their peers).

A **cut** drops, at the bridge, the datagrams and segments between two groups of peers
(``tc`` u32 filters on the bridge-side end of each peer's veth, whose egress is what that
peer receives, into a black-hole class): one way (``b`` no longer hears ``a``) or both. Each
peer still reaches the web and the harness. ``heal`` removes every filter; ``leaked`` says
how many packets the black holes let through (a few at most: their rate is 8 bit/s).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess

WEB_ADDR, CTL_ADDR = "198.18.0.1", "198.18.0.2"
CLONE_NEWNET = 0x40000000


def peer_addr(i: int) -> str:
    return f"198.18.0.{10 + i}"


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def netns_available() -> str | None:
    """None if network namespaces work here, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "ip or tc not installed"
    name = f"p2scprobe{os.getpid()}"
    try:
        run("ip", "netns", "add", name)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"ip netns add failed: {getattr(exc, 'stderr', exc)}"
    with contextlib.suppress(subprocess.CalledProcessError):
        run("ip", "netns", "del", name)
    return None


class Topology:
    """The namespaces, bridge, veths and caps; ``close`` removes every one it made.

    ``name`` goes into every namespace's name (``p2sc`` for the cluster benchmark, the
    partition benchmark and test use their own), so runs of different tools never collide.
    """

    def __init__(self, peers: int, rate_mbit: float | None, name: str = "p2sc") -> None:
        # Interface names have 15 characters at most: keep the tag short.
        self.tag = f"{name[:4]}{os.getpid() % 100000}"
        self.prefix = f"{name}-{os.getpid() % 100000}-"
        self.peers = peers
        self.rate_mbit = rate_mbit
        self.made: list[str] = []
        self._cut: set[int] = set()  # peers whose bridge-side veth has a drop filter

    def ns(self, name: str) -> str:
        return self.prefix + name

    def _add_ns(self, name: str) -> str:
        full = self.ns(name)
        run("ip", "netns", "add", full)
        self.made.append(full)
        run("ip", "-n", full, "link", "set", "lo", "up")
        return full

    def bridge_end(self, index: int) -> str:
        """The bridge-side veth of attachment ``index`` (web 0, ctl 1, peer i at i + 2)."""
        return f"{self.tag}{index}b"

    def _attach(
        self, name: str, index: int, addr: str, cap_mbit: float | None, cuttable: bool = False
    ) -> None:
        ns, br = self.ns(name), self.ns("br")
        a, b = f"{self.tag}{index}a", self.bridge_end(index)
        run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        run("ip", "link", "set", a, "netns", ns)
        run("ip", "link", "set", b, "netns", br)
        run("ip", "-n", ns, "link", "set", a, "name", "eth0")
        run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", br, "link", "set", b, "master", "br0")
        run("ip", "-n", br, "link", "set", b, "up")
        tc = ("ip", "netns", "exec", br, "tc")
        if cap_mbit:
            # Egress of the bridge-side end is the peer's download: the pages it fetches.
            run(
                *tc, "qdisc", "add", "dev", b, "root", "tbf",
                "rate", f"{cap_mbit}mbit", "burst", "64kb", "latency", "200ms",
            )  # fmt: skip
        elif cuttable:
            # A classful root for the filters of a cut (tbf takes none): everything goes to
            # 1:20, unshaped; a cut sends the other group's packets to 1:10, a black hole
            # (8 bit/s behind a one-packet queue: the kernel here has no drop action).
            run(*tc, "qdisc", "add", "dev", b, "root", "handle", "1:", "htb", "default", "20")
            run(*tc, "class", "add", "dev", b, "parent", "1:", "classid", "1:20", "htb",
                "rate", "10gbit")  # fmt: skip
            run(*tc, "class", "add", "dev", b, "parent", "1:", "classid", "1:10", "htb",
                "rate", "8bit", "ceil", "8bit", "burst", "1", "cburst", "1")  # fmt: skip
            run(*tc, "qdisc", "add", "dev", b, "parent", "1:10", "pfifo", "limit", "1")

    def open(self) -> None:
        br = self._add_ns("br")
        run("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", br, "link", "set", "br0", "up")
        web = self._add_ns("web")
        self._attach("web", 0, WEB_ADDR, None)
        run("ip", "-n", web, "route", "add", "local", "198.19.0.0/16", "dev", "lo")
        self._add_ns("ctl")
        self._attach("ctl", 1, CTL_ADDR, None)
        for i in range(self.peers):
            ns = self._add_ns(f"p{i}")
            self._attach(f"p{i}", i + 2, peer_addr(i), self.rate_mbit, cuttable=True)
            run("ip", "-n", ns, "route", "add", "198.19.0.0/16", "via", WEB_ADDR)

    def cut(self, a: list[int], b: list[int], *, both: bool = True) -> None:
        """Peers ``b`` stop hearing peers ``a`` (and, ``both``, ``a`` stop hearing ``b``).
        Only without a cap (``rate_mbit`` None)."""
        if self.rate_mbit:
            raise ValueError("cuts need uncapped links")
        pairs = [(dst, src) for dst in b for src in a]
        if both:
            pairs += [(dst, src) for dst in a for src in b]
        tc = ("ip", "netns", "exec", self.ns("br"), "tc")
        for dst, src in pairs:
            run(
                *tc, "filter", "add", "dev", self.bridge_end(dst + 2), "parent", "1:",
                "protocol", "ip", "prio", "1", "u32", "match", "ip", "src",
                f"{peer_addr(src)}/32", "flowid", "1:10",
            )  # fmt: skip
            self._cut.add(dst)

    def heal(self) -> None:
        """Remove every drop filter: all peers hear each other again."""
        tc = ("ip", "netns", "exec", self.ns("br"), "tc")
        for dst in sorted(self._cut):
            with contextlib.suppress(subprocess.CalledProcessError):
                run(
                    *tc,
                    "filter",
                    "del",
                    "dev",
                    self.bridge_end(dst + 2),
                    "parent",
                    "1:",
                    "prio",
                    "1",
                )
        self._cut.clear()

    def leaked(self) -> int:
        """Packets the cuts' black holes let through, over every peer, so far."""
        total = 0
        for i in range(self.peers):
            out = subprocess.run(
                ["ip", "netns", "exec", self.ns("br"), "tc", "-s", "class", "show", "dev",
                 self.bridge_end(i + 2), "classid", "1:10"],
                capture_output=True, text=True, check=False,
            ).stdout  # fmt: skip
            words = out.split()
            if "Sent" in words:
                total += int(words[words.index("Sent") + 3])  # "Sent N bytes M pkt"
        return total

    def close(self) -> None:
        for full in reversed(self.made):
            with contextlib.suppress(subprocess.CalledProcessError, OSError):
                run("ip", "netns", "del", full)
        self.made.clear()

    def enter(self, name: str) -> None:
        """Move this thread (the event loop's) into namespace ``name``: its sockets live there."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.ns(name)}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns failed")
        finally:
            os.close(fd)
