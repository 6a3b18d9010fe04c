"""What this node's socket shows of local overload, for the failure detector's local health.

Lifeguard (liveness) distrusts its own view while this peer is overloaded. Two signs come
from the socket: datagrams the kernel dropped because the receive buffer was full (from
``/proc/net/udp``: we could not read replies in time), and junk (datagrams the endpoint
dropped unread: a flood). Each probe round asks for what is new since the last one.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from protocol.liveness import socket_drops, socket_inode
from protocol.rpcstats import RpcStats

__all__ = ["SOCKET_BUFFER", "SocketStats", "widen_buffers"]

log = logging.getLogger(__name__)

SOCKET_BUFFER = 2 * 1024 * 1024  # bursts of 8 KiB chunks overflow the 208 KiB Linux default


def widen_buffers(sock: socket.socket) -> None:
    """Ask for ``SOCKET_BUFFER`` each way (best effort: capped by net.core.rmem_max and
    wmem_max), and say so when the receive side is capped."""
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass
    got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    if got < SOCKET_BUFFER:
        log.warning(
            "UDP receive buffer capped at %d KiB (sysctl net.core.rmem_max): bursts of "
            "task chunks may be dropped and retried",
            got // 1024,
        )


class SocketStats:
    def __init__(self, stats: RpcStats) -> None:
        self._stats = stats
        self._inode: int | None = None
        self._drops: int | None = None
        self._junk = 0

    async def attach(self, sock: socket.socket) -> None:
        """Start counting for ``sock`` (the drops so far are not news)."""
        self._inode = socket_inode(sock.fileno())
        self._drops = await asyncio.to_thread(socket_drops, self._inode)

    async def new_drops(self) -> int:
        """Datagrams the kernel dropped on the socket since the last call (0 if unknown)."""
        if self._inode is None:
            return 0
        total = await asyncio.to_thread(socket_drops, self._inode)
        if total is None:
            return 0
        before, self._drops = self._drops, total
        return 0 if before is None else max(0, total - before)

    def new_junk(self) -> int:
        """Datagrams the endpoint dropped unread since the last call."""
        total = sum(self._stats.dropped.values())
        before, self._junk = self._junk, total
        return total - before
