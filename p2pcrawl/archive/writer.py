"""WARC output from the event loop: :class:`WarcWriter` feeds a writer process over a pipe.

The record format is :mod:`p2pcrawl.archive.records`'s and the files
:mod:`p2pcrawl.archive.files`'s:
one ``response`` record and its ``request`` record per fetched page, gzip member per record,
files rotated at a size limit. This module only moves records to the process that writes
them and tells each caller when its record is on disk.

Why a process. Hashing (SHA-1 payload and block digests), deflate and ``write()`` of ~1,000
records a second is about a third of a crawling peer's CPU. In a thread, that work must take
the GIL back after every C call that released it, and the event loop, busy with the next pages,
gives it up only at its switch interval: the writer thread was starved and every durable write
waited on it (benchmarks/README.md has the measurements). A process has its own interpreter;
the loop's share of a record is one ``marshal.dumps`` and one pipe write.

Bounded: a semaphore of ``queue_size`` slots limits the records sent but not yet written, and
the pipe's transport is drained above a byte mark, so a slow disk slows the fetchers down
(``await write()`` waits) instead of growing memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import marshal
import os
import sys
from pathlib import Path
from typing import Any

from p2pcrawl import __version__
from p2pcrawl.archive.files import check_options
from p2pcrawl.archive.framing import read_frame
from p2pcrawl.archive.process import encode_record
from p2pcrawl.archive.records import (
    DEFAULT_COMPRESS_LEVEL,
    FetchRecord,
)

__all__ = ["WarcWriteError", "WarcWriter"]

log = logging.getLogger(__name__)

# Bytes sent down the pipe but not yet taken by the writer process before write() waits.
_PIPE_HIGH_WATER = 8 << 20
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_START_TIMEOUT_S = 60.0  # an interpreter start and a few imports, on a machine under load


class WarcWriteError(RuntimeError):
    """The writer process failed (disk full, permissions, killed); later writes are refused."""


class WarcWriter:
    """Append :class:`FetchRecord` s to rotating ``*.warc.gz`` files through a writer process.

    ``records_written`` counts fetch records (each a response plus a request record),
    ``bytes_written`` the compressed bytes across all files, ``files`` every file opened, in
    order. All three follow the process's answers, so they describe what is on disk.
    """

    def __init__(
        self,
        directory: Path,
        *,
        prefix: str,
        max_bytes: int = 1 << 30,
        queue_size: int = 256,
        software: str = "p2pcrawl",
        user_agent: str = "",
        compress_level: int = DEFAULT_COMPRESS_LEVEL,
    ) -> None:
        check_options(prefix, max_bytes, compress_level)
        if queue_size <= 0:
            raise ValueError("queue_size must be positive")
        self.directory = directory
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.queue_size = queue_size
        self.compress_level = compress_level
        self.software = software if "/" in software else f"{software}/{__version__}"
        self.user_agent = user_agent
        self.files: list[Path] = []
        self.records_written = 0
        self.bytes_written = 0

        self._proc: asyncio.subprocess.Process | None = None
        self._stdin: asyncio.StreamWriter | None = None
        self._slots: asyncio.Semaphore | None = None
        # One future per record sent, in order; done once the process answered for it.
        self._sent: collections.deque[asyncio.Future[None]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._out: list[bytes] = []  # frames not yet handed to the pipe
        self._out_bytes = 0
        self._closing = False
        self._error: BaseException | None = None

    @property
    def pid(self) -> int | None:
        """The writer process's PID while it runs."""
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the writer process; the first file is created with the first record."""
        if self._proc is not None:
            raise RuntimeError("WarcWriter already started")
        opts = {
            "directory": str(self.directory),
            "prefix": self.prefix,
            "max_bytes": self.max_bytes,
            "software": self.software,
            "user_agent": self.user_agent,
            "compress_level": self.compress_level,
        }
        if not sys.executable:
            raise RuntimeError("no Python interpreter path (sys.executable) for the WARC writer")
        env = dict(os.environ)
        # The process must import this very copy of p2pcrawl, installed or not.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",  # not the working directory on sys.path
            "-m",
            "p2pcrawl.archive",
            json.dumps(opts),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                ready = await _read_answer(proc.stdout)
            if ready != ("ready",):
                raise ValueError(f"it said {ready!r}, not ready")
        except (asyncio.IncompleteReadError, TimeoutError, ValueError, EOFError) as exc:
            proc.stdin.close()
            if proc.returncode is None:
                proc.kill()
            rc = await proc.wait()
            raise WarcWriteError(
                f"the WARC writer process did not start (exit status {rc}; "
                f"its error, if any, is on stderr): {exc!r}"
            ) from exc
        # Set only now: after a failed start there is nothing for aclose() to stop.
        self._proc = proc
        self._stdin = proc.stdin
        self._stdin.transport.set_write_buffer_limits(high=_PIPE_HIGH_WATER)
        self._slots = asyncio.Semaphore(self.queue_size)
        self._reader = asyncio.get_running_loop().create_task(
            self._read_answers(proc.stdout), name="warc-answers"
        )

    async def write(self, record: FetchRecord, *, durable: bool = False) -> None:
        """Send ``record`` to be written; waits while ``queue_size`` records are pending.

        With ``durable`` it returns only once the record is in the file (handed to the OS,
        so it survives the process being killed): a crawler marks a URL done only after
        its record is safe, or a crash would lose the page.
        """
        written = await self.submit(record)
        if durable:
            await written

    async def submit(self, record: FetchRecord) -> asyncio.Future[None]:
        """Send ``record`` (waiting for a slot) and return a future that is done once the
        record is in the file, or fails with :class:`WarcWriteError`. A caller can do other
        work for the page meanwhile and await the future before it counts the page done."""
        if self._slots is None:
            raise RuntimeError("WarcWriter.start() was not awaited")
        if self._closing:
            raise RuntimeError("WarcWriter is closed")
        self._raise_if_failed()
        try:
            frame = encode_record(record)
        except ValueError as exc:
            raise ValueError(f"record too large to write: {exc}") from None
        await self._slots.acquire()
        if self._closing or self._error is not None:
            # Something happened while we waited for a slot: aclose() began, or the process
            # failed and this record would only be dropped.
            self._slots.release()
            self._raise_if_failed()
            raise RuntimeError("WarcWriter is closed")
        assert self._stdin is not None and self._reader is not None
        if self._reader.done():
            # Nobody is left to answer for this record.
            self._slots.release()
            self._fail(WarcWriteError("WARC writer process is gone"))
            self._raise_if_failed()
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The failure is logged once by _fail; a caller cancelled before awaiting its
        # future must not add a "never retrieved" warning per record.
        written.add_done_callback(_retrieve)
        self._sent.append(written)
        self._out.append(frame)
        self._out_bytes += len(frame)
        if len(self._out) == 1:
            # Frames sent while the loop runs one batch of callbacks go down the pipe in one
            # write: one wake-up of the writer process for several records.
            asyncio.get_running_loop().call_soon(self._flush)
        if self._out_bytes + self._stdin.transport.get_write_buffer_size() > _PIPE_HIGH_WATER:
            self._flush()
            try:
                await self._stdin.drain()
            except ConnectionError as exc:
                self._fail(WarcWriteError(f"WARC writer process is gone: {exc!r}"))
        return written

    def _flush(self) -> None:
        if not self._out:
            return
        assert self._stdin is not None
        out, self._out, self._out_bytes = self._out, [], 0
        if self._stdin.is_closing():
            return  # the process is gone; the answer reader fails what was sent
        self._stdin.write(out[0] if len(out) == 1 else b"".join(out))

    async def aclose(self) -> None:
        """Write everything sent, close the file and wait for the process. Idempotent."""
        self._closing = True
        if self._proc is None:
            return
        # shield: a cancelled caller must not leave the process half-stopped; the next
        # aclose() finds it done and returns at once.
        await asyncio.shield(self._stop())
        self._raise_if_failed()

    async def _stop(self) -> None:
        assert self._proc is not None and self._stdin is not None and self._reader is not None
        self._flush()
        if not self._stdin.is_closing():
            with contextlib.suppress(ConnectionError):
                await self._stdin.drain()
            self._stdin.close()
        with contextlib.suppress(ConnectionError):
            await self._stdin.wait_closed()
        # The process writes what it was sent, closes the file and exits; its last answer
        # arrives before the end of its stdout.
        await asyncio.shield(self._reader)
        rc = await self._proc.wait()
        if rc != 0 and self._error is None:
            self._error = WarcWriteError(f"WARC writer process exited with status {rc}")

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._as_write_error()

    def _as_write_error(self) -> WarcWriteError:
        assert self._error is not None
        if isinstance(self._error, WarcWriteError):
            return self._error
        return WarcWriteError(f"WARC writer failed: {self._error!r}")

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
            log.error("%s", exc)

    # --- answers from the process ---------------------------------------------------------

    async def _read_answers(self, stdout: asyncio.StreamReader) -> None:
        try:
            while True:
                try:
                    answer = await _read_answer(stdout)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        raise
                    break
                kind = answer[0]
                if kind == "written":
                    _, n, self.records_written, self.bytes_written = answer
                    self._release(n)
                elif kind == "file":
                    self.files.append(Path(answer[1]))
                elif kind == "error":
                    self._fail(WarcWriteError(f"WARC writer failed: {answer[1]}"))
        except (ValueError, EOFError, asyncio.IncompleteReadError, TypeError) as exc:
            self._fail(WarcWriteError(f"WARC writer sent a bad answer: {exc!r}"))
        finally:
            if self._sent:
                # Records sent but never answered: the process died with them.
                self._fail(WarcWriteError("WARC writer process ended before writing every record"))
                self._release(len(self._sent))

    def _release(self, n: int) -> None:
        """Free the slots of the next ``n`` records sent and wake their durable writers (the
        records are in the file, or failed and ``_error`` says so)."""
        assert self._slots is not None
        for _ in range(min(n, len(self._sent))):
            fut = self._sent.popleft()
            self._slots.release()
            if fut.done():
                continue
            if self._error is None:
                fut.set_result(None)
            else:
                fut.set_exception(self._as_write_error())


async def _read_answer(stdout: asyncio.StreamReader) -> tuple[Any, ...]:
    answer = marshal.loads(await read_frame(stdout))
    if not isinstance(answer, tuple) or not answer:
        raise ValueError(f"not an answer: {answer!r}")
    return answer


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()
