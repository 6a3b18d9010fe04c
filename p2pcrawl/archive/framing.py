"""Length-prefixed frames: how a peer and its helper processes talk over pipes.

The WARC writer process and the parse processes each read requests from a pipe and answer
on another. A pipe is a byte stream, so every message is framed: a 4-byte little-endian
length, then the payload (a ``marshal``-ed tuple: C speed for a 30 kB body, and both ends run
the same interpreter). A length beyond ``MAX_FRAME`` means the stream is corrupt (a record is
at most the body limit plus headers), and reading stops there.

Said here, in archive/, the lower of the two layers that use it (crawl/ imports archive/),
and light on purpose: the writer process imports it and nothing of the peer (through
``p2pcrawl.aio`` it would load the protocol too, 0.1 s more at every peer's start).

Three readers, for the three places frames are read: ``read_frame`` on the event loop (an
``asyncio.StreamReader``), ``read_frame_fd`` in a helper process that serves one request at
a time, and ``next_frame`` over a buffer of many frames read at once.
"""

from __future__ import annotations

import asyncio
import os
import struct

__all__ = [
    "FRAME_HEAD",
    "MAX_FRAME",
    "frame",
    "next_frame",
    "read_frame",
    "read_frame_fd",
    "write_frames_fd",
]

FRAME_HEAD = struct.Struct("<I")
MAX_FRAME = 1 << 30
_READ_CHUNK = 1 << 20


def frame(payload: bytes) -> bytes:
    """``payload`` with its length in front."""
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes")
    return FRAME_HEAD.pack(len(payload)) + payload


def _size(head: bytes | bytearray, at: int = 0) -> int:
    (size,) = FRAME_HEAD.unpack_from(head, at)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return int(size)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's payload; ``IncompleteReadError`` if the stream ends first."""
    size = _size(await reader.readexactly(FRAME_HEAD.size))
    return await reader.readexactly(size)


def next_frame(buf: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """The (start, end) of the payload of the frame at ``buf[pos:]``, or None if the buffer
    does not hold all of it yet; the next frame starts at ``end``."""
    if len(buf) - pos < FRAME_HEAD.size:
        return None
    start = pos + FRAME_HEAD.size
    end = start + _size(buf, pos)
    return None if len(buf) < end else (start, end)


def _read_exactly(fd: int, n: int) -> bytes | None:
    parts: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, _READ_CHUNK))
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame_fd(fd: int) -> bytes | None:
    """The next frame's payload from file descriptor ``fd`` (blocking); None once it closed."""
    head = _read_exactly(fd, FRAME_HEAD.size)
    if head is None:
        return None
    return _read_exactly(fd, _size(head))


def write_frames_fd(fd: int, frames: bytes) -> None:
    """Write ``frames`` (one or more, each made by ``frame``) to ``fd``, all of it (blocking)."""
    data = memoryview(frames)
    while data:
        data = data[os.write(fd, data) :]
