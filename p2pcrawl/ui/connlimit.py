"""Connection limits for the status server, which aiohttp's server does not have.

aiohttp waits forever for a request's headers, so a client that opens connections and
sends nothing (or one byte a minute) holds a descriptor each: with a 1,024-descriptor limit
about a thousand of them starve the peer itself. Each accepted connection here passes a
thin protocol in front of aiohttp's, which

- refuses (resets) a connection beyond ``max_connections`` open at once,
- closes one whose first request's headers have not arrived ``header_timeout`` seconds after
  it opened, and
- closes any connection ``max_lifetime`` seconds after it opened, which bounds a slow
  request body and a slow second request alike (a browser that polls just reconnects).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["ConnectionLimits", "GuardedServer"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 128
    header_timeout: float = 5.0
    max_lifetime: float = 60.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if self.header_timeout <= 0 or self.max_lifetime <= 0:
            raise ValueError("header_timeout and max_lifetime must be > 0")


class GuardedServer:
    """Serves an aiohttp low-level server (``AppRunner.server``) under :class:`ConnectionLimits`."""

    def __init__(self, handler_factory: web.Server, limits: ConnectionLimits) -> None:
        self.factory = handler_factory
        self.limits = limits
        self.open = 0
        self.refused = 0
        self.timed_out = 0
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Guarded(self, self.factory()), host, port, backlog=128
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            await server.wait_closed()


class _Guarded(asyncio.Protocol):
    """Forwards everything to aiohttp's protocol; owns the connection's deadlines."""

    def __init__(self, owner: GuardedServer, inner: Any) -> None:
        self.owner = owner
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.counted = False
        self.headers_seen = False
        self._tail = b""
        self._timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        owner = self.owner
        if owner.open >= owner.limits.max_connections:
            owner.refused += 1
            transport.abort()
            return
        owner.open += 1
        self.counted = True
        self.transport = transport
        loop = asyncio.get_running_loop()
        limits = owner.limits
        self._timers = [
            loop.call_later(limits.header_timeout, self._headers_late),
            loop.call_later(limits.max_lifetime, self._expire),
        ]
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.headers_seen:
            if b"\r\n\r\n" in self._tail + data:
                self.headers_seen = True
                self._timers[0].cancel()
            self._tail = data[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.inner.eof_received()
        return result

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.counted:
            return
        self.counted = False
        self.owner.open -= 1
        for timer in self._timers:
            timer.cancel()
        self.inner.connection_lost(exc)

    def _headers_late(self) -> None:
        if not self.headers_seen:
            self._expire()

    def _expire(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.owner.timed_out += 1
            self.transport.abort()
