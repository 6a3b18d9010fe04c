"""Length-prefixed frames over pipes (the WARC writer and parse processes)."""

from __future__ import annotations

import asyncio
import os

import pytest

from p2pcrawl.archive import (
    FRAME_HEAD,
    MAX_FRAME,
    frame,
    next_frame,
    read_frame,
    read_frame_fd,
    write_frames_fd,
)


def test_frames_split_back_out_of_a_buffer_whole_or_not_at_all() -> None:
    buf = bytearray(frame(b"one") + frame(b"") + frame(b"three"))
    out, pos = [], 0
    while (span := next_frame(buf, pos)) is not None:
        out.append(bytes(buf[span[0] : span[1]]))
        pos = span[1]
    assert out == [b"one", b"", b"three"] and pos == len(buf)
    partial = frame(b"four")[:-1]
    assert next_frame(partial, 0) is None
    assert next_frame(partial[:2], 0) is None


def test_an_impossible_length_is_refused() -> None:
    with pytest.raises(ValueError):
        next_frame(FRAME_HEAD.pack(MAX_FRAME + 1) + b"x", 0)


def test_frames_cross_a_real_pipe() -> None:
    r, w = os.pipe()  # a pipe holds 64 KiB: the frames fit without a reader
    try:
        write_frames_fd(w, frame(b"a" * 40_000) + frame(b"b"))
        os.close(w)
        w = -1
        assert read_frame_fd(r) == b"a" * 40_000
        assert read_frame_fd(r) == b"b"
        assert read_frame_fd(r) is None  # closed
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


async def test_a_stream_reader_reads_frames_and_fails_on_a_cut_one() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(frame(b"hello") + frame(b"cut")[:-1])
    reader.feed_eof()
    assert await read_frame(reader) == b"hello"
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(reader)
