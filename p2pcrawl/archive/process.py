"""The WARC writer process: ``python -m p2pcrawl.archive '<json options>'``.

:class:`p2pcrawl.archive.writer.WarcWriter`, on the event loop, starts it and feeds it
records over its stdin; it writes them with :class:`p2pcrawl.archive.files.WarcFiles` and
answers on its stdout. A
process rather than a thread because a thread hashing, compressing and writing ~1,000 records
a second has to take the GIL back after every one of those C calls, and each time the event
loop waits (benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import signal
import sys
import time
from dataclasses import astuple
from pathlib import Path

from p2pcrawl.archive.files import WarcFiles
from p2pcrawl.archive.framing import frame, next_frame, write_frames_fd
from p2pcrawl.archive.records import FetchRecord, RevisitOf

__all__ = ["decode_record", "encode_answer", "encode_record", "main", "serve"]

# The event loop sends records down the process's stdin; the process answers on its stdout.
# Both directions are frames (``framing``) holding a ``marshal``-ed tuple. Answers:
#   ("ready",)                     first, once the process is set up
#   ("file", path)                 a new file was opened (sent before records written to it)
#   ("written", n, records, bytes) the next n records sent are in the file (or failed, below)
#   ("error", text)                writing failed; every record after it is dropped, not written
# A record counts as written only once ``write()`` has handed it to the OS, so it survives
# this process or the peer being killed; "written" answers are what lets a page count as done.

# An answer goes out once the records read so far are written, or after this much writing
# if more are waiting: one wake-up of the event loop for a run of records, yet no record
# waits long behind others for its answer (the page it belongs to is not done until then).
_ANSWER_AFTER_S = 0.001
_READ_CHUNK = 1 << 20


def encode_record(rec: FetchRecord) -> bytes:
    payload = marshal.dumps(
        (
            rec.url,
            rec.status,
            rec.reason,
            rec.http_version,
            # Exact strs: marshal refuses str subclasses such as multidict's istr.
            [(str(k), str(v)) for k, v in rec.request_headers],
            [(str(k), str(v)) for k, v in rec.response_headers],
            bytes(rec.body),
            rec.truncated,
            rec.ip,
            rec.fetched_at,
            rec.record_id,
            None if rec.revisit is None else astuple(rec.revisit),
            [(str(k), str(v)) for k, v in rec.warc_fields],
        )
    )
    return frame(payload)


def decode_record(payload: bytes | bytearray) -> FetchRecord:
    (
        url,
        status,
        reason,
        version,
        req,
        resp,
        body,
        truncated,
        ip,
        fetched_at,
        rid,
        revisit,
        extra,
    ) = marshal.loads(payload)
    return FetchRecord(
        url,
        status,
        reason,
        version,
        req,
        resp,
        body,
        truncated,
        ip,
        fetched_at,
        rid,
        None if revisit is None else RevisitOf(*revisit),
        tuple((k, v) for k, v in extra),
    )


def encode_answer(*fields: str | int) -> bytes:
    return frame(marshal.dumps(fields))


def serve(files: WarcFiles, source: int, answers: int) -> None:
    """Write every record framed on fd ``source`` until it closes, answering on ``answers``."""
    buf = bytearray()
    failed = False
    while True:
        chunk = os.read(source, _READ_CHUNK)
        if not chunk:
            break
        buf += chunk
        out: list[bytes] = []
        pending = 0
        pos = 0
        answered_at = time.monotonic()
        while (span := next_frame(buf, pos)) is not None:
            start, end = span
            rec = decode_record(buf[start:end])
            pos = end
            if not failed:
                before = len(files.files)
                try:
                    files.write(rec)
                except Exception as exc:
                    # The records before this one are written and answered as such; this
                    # and every later one are answered after the error, so their writers
                    # see it. Reading goes on so that nobody waits forever.
                    failed = True
                    if pending:
                        out.append(_written(files, pending))
                        pending = 0
                    out.append(encode_answer("error", f"{type(exc).__name__}: {exc}"))
                out += (encode_answer("file", str(p)) for p in files.files[before:])
            pending += 1
            if time.monotonic() - answered_at >= _ANSWER_AFTER_S:
                out.append(_written(files, pending))
                _send(answers, b"".join(out))
                out, pending = [], 0
                answered_at = time.monotonic()
        del buf[:pos]
        if pending:
            out.append(_written(files, pending))
        if out:
            _send(answers, b"".join(out))
    if buf:
        raise ValueError(f"input ended inside a frame ({len(buf)} bytes left)")


def _written(files: WarcFiles, n: int) -> bytes:
    return encode_answer("written", n, files.records_written, files.bytes_written)


def _send(fd: int, data: bytes) -> None:
    try:
        write_frames_fd(fd, data)
    except BrokenPipeError:
        pass  # the peer is gone; keep writing what it sent until its pipe closes


def main(argv: list[str] | None = None) -> int:
    """The writer process: ``python -m p2pcrawl.archive.files '<json options>'``."""
    args = sys.argv[1:] if argv is None else argv
    opts = json.loads(args[0])
    # Ctrl-C reaches the whole process group and a service manager may signal every process
    # of the peer: this one stops when the peer closes its stdin (or dies), after writing
    # everything it was sent, never halfway through.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Answers get a private copy of stdout; anything a library prints goes to stderr instead
    # of into the frame stream.
    answers = os.dup(1)
    os.dup2(2, 1)
    with contextlib.suppress(OSError, ImportError):
        import fcntl  # Unix only, like the pipe-size call

        # Fewer, larger reads: one 30 kB record fills half of a default 64 kB pipe.
        fcntl.fcntl(0, fcntl.F_SETPIPE_SZ, 1 << 20)
    files = WarcFiles(
        Path(opts["directory"]),
        prefix=opts["prefix"],
        max_bytes=opts["max_bytes"],
        software=opts["software"],
        user_agent=opts["user_agent"],
        compress_level=opts["compress_level"],
    )
    _send(answers, encode_answer("ready"))
    try:
        serve(files, 0, answers)
    finally:
        try:
            files.close()
        except Exception as exc:
            _send(answers, encode_answer("error", f"{type(exc).__name__}: {exc}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
