"""A UDP transport that drains its socket, and the table of sources whose junk goes unread.

asyncio's selector datagram transport takes one datagram off the socket per readiness event:
a wakeup of the event loop, a callback and one ``recvfrom`` per datagram. Flooded with junk
on loopback, a peer read about a fifth of what reached its socket; the kernel dropped the
rest when the receive buffer was full, and members' requests and replies with it.
``DrainingTransport`` reads up to ``drain`` datagrams per readiness event (until the socket
would block), so the per-datagram cost is a ``recvfrom`` and the endpoint's own checks. The
bound keeps the loop fair: a flood gets at most one batch between two turns of every other
task. Errors are handled as asyncio's transport handles them (an ICMP error for an earlier
send, such as ECONNREFUSED on loopback, is reported through ``error_received`` and reading
goes on).

``JunkSources`` is the endpoint's cheap first look: a source that sent more datagrams that
fail to open (bad HMAC, bad kind, too short) than ``junk`` allows is dropped on a dict lookup,
before the HMAC, for ``JUNK_HOLD`` seconds. A UDP source address can be forged, so a member of
the routing table is never held (forging a member's address buys no more than the HMAC check
it costs us today), and a stranger whose address was forged is held at most ``JUNK_HOLD``
seconds after the forger stops.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections import OrderedDict, deque
from typing import Any

from protocol.ratelimit import Rate, SourceLimits

__all__ = ["DRAIN", "JUNK_HOLD", "DrainingTransport", "JunkSources", "open_udp"]

DRAIN = 128  # datagrams read per readiness event at most
MAX_DATAGRAM = 65536  # UDP's largest payload fits
SEND_BUFFER = 4 * 1024 * 1024  # bytes queued while the socket's send buffer is full
JUNK_HOLD = 1.0  # seconds a source that sent too much junk goes unread


class DrainingTransport(asyncio.DatagramTransport, asyncio.ReadTransport):
    """A datagram transport over our own bound, non-blocking socket (``open_udp``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.DatagramProtocol,
        drain: int = DRAIN,
    ) -> None:
        super().__init__({"socket": sock, "sockname": sock.getsockname(), "peername": None})
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._drain = max(1, drain)
        self._buffer: deque[tuple[bytes, Any]] = deque()
        self._buffered = 0
        self._closing = False
        self._paused = False
        self._lost = False
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read_ready)

    def _read_ready(self) -> None:
        recvfrom = self._sock.recvfrom
        received = self._protocol.datagram_received
        for _ in range(self._drain):
            if self._closing or self._paused:  # closed or paused by the last datagram's work
                return
            try:
                data, addr = recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # a pending socket error, now cleared: read on
                self._protocol.error_received(exc)
                continue
            received(data, addr)

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self._closing or not data:
            return
        if not self._buffer:
            try:
                self._sock.sendto(data, addr)
                return
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._fd, self._write_ready)
            except OSError as exc:
                self._protocol.error_received(exc)
                return
        if self._buffered + len(data) > SEND_BUFFER:  # as a kernel with no room would say
            self._protocol.error_received(OSError(errno.ENOBUFS, "send queue full"))
            return
        self._buffer.append((bytes(data), addr))
        self._buffered += len(data)

    def _write_ready(self) -> None:
        while self._buffer:
            data, addr = self._buffer[0]
            try:
                self._sock.sendto(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._protocol.error_received(exc)
            self._buffer.popleft()
            self._buffered -= len(data)
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._loop.call_soon(self._connection_lost, None)

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return not self._closing and not self._paused

    def pause_reading(self) -> None:
        if self.is_reading():
            self._paused = True
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if self._paused and not self._closing:
            self._paused = False
            self._loop.add_reader(self._fd, self._read_ready)

    def close(self) -> None:
        """Stop reading; the socket closes once what is queued is sent."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._buffer:
            self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self._buffer.clear()
        self._buffered = 0
        self._loop.remove_writer(self._fd)
        if not self._closing:
            self._closing = True
            self._loop.remove_reader(self._fd)
        self._loop.call_soon(self._connection_lost, None)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()


async def open_udp(
    protocol: asyncio.DatagramProtocol, host: str, port: int, drain: int = DRAIN
) -> DrainingTransport:
    """Bind a UDP socket to ``host:port`` (the first address that binds, as
    ``loop.create_datagram_endpoint`` does) and serve it to ``protocol``."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    error: OSError = OSError(f"no address to bind for {host}:{port}")
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.bind(addr)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return DrainingTransport(loop, sock, protocol, drain)
    raise error


class JunkSources:
    """Sources sending more junk than ``rate`` allows, held unread for ``hold`` seconds."""

    def __init__(self, rate: Rate, hold: float = JUNK_HOLD, max_sources: int = 1024) -> None:
        self._rate = SourceLimits(rate, max_sources=4 * max_sources)
        self._hold = hold
        self._max = max_sources
        self._held: OrderedDict[tuple[str, int], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def held(self, addr: tuple[str, int]) -> bool:
        """Whether to drop ``addr``'s datagram unread (the hot path under a flood)."""
        if not self._held:
            return False
        until = self._held.get(addr)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._held[addr]
        return False

    def junk(self, addr: tuple[str, int]) -> None:
        """``addr`` sent a datagram that failed to open (the caller spares members)."""
        if self._rate.allow(addr):
            return
        if len(self._held) >= self._max:
            self._held.popitem(last=False)
        self._held[addr] = time.monotonic() + self._hold
