"""Parsing off the event loop, in a process of its own and under a deadline.

selectolax holds the GIL while lexbor builds a tree, so a thread would freeze the event loop
as surely as parsing on it; a page that takes seconds (deep nesting, a 10 MB body) must
parse in another process. :class:`ParseWorkers` keeps one or more such processes; each
parses one page at a time and is killed and replaced when a page overruns its deadline,
which is the only way to stop lexbor mid-parse.

Only pages that could be slow come here (:func:`needs_worker`): one with fewer start tags
than :data:`LOOP_MAX_START_TAGS` cannot nest deeper than that, and lexbor parses it in a
few milliseconds at worst, cheaper than a round trip to a process. So ordinary pages cost
the loop one ``bytes.count`` more than before (10 us for 30 kB, ~1% of a page's CPU).

Frames on both pipes (``p2pcrawl.archive.framing``) hold a ``marshal``-ed tuple, as for the WARC
writer process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2pcrawl.archive import frame, read_frame, read_frame_fd, write_frames_fd
from p2pcrawl.crawl.parse import DEFAULT_RULES, PageRules, ParsedPage, extract_links
from p2pcrawl.crawl.parsebound import DEFAULT_MAX_DEPTH, flatten_deep_nesting

__all__ = [
    "LOOP_MAX_BYTES",
    "LOOP_MAX_START_TAGS",
    "BoundedParse",
    "ParseWorkers",
    "needs_worker",
    "parse_bounded",
]

log = logging.getLogger(__name__)

# lexbor's cost grows with the square of the nesting depth: 2,048 nested elements take
# ~3 ms, which the loop can afford; a page that cannot be that deep never needs a process.
LOOP_MAX_START_TAGS = 2048
LOOP_MAX_BYTES = 1 << 20  # lexbor is linear in size, ~5 ms per MiB of ordinary HTML
DEFAULT_DEADLINE_S = 10.0
_START_TIMEOUT_S = 30.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(slots=True)
class BoundedParse:
    """A parse and the bound it hit, if any: ``depth`` (tags of elements nested deeper
    than the cap were dropped before parsing), ``deadline`` (the parse was killed; no
    links) or ``worker`` (the parse process failed; no links)."""

    page: ParsedPage
    bound: str | None = None
    dropped: int = 0


def needs_worker(body: bytes) -> bool:
    """True when parsing ``body`` on the event loop could hold it for long."""
    if len(body) > LOOP_MAX_BYTES:
        return True
    # Start tags bound the depth. Counting "<" runs at ~3 GB/s (10 us for 30 kB); counting
    # "</" (end tags) is three times slower, so only pages with many tags pay for it.
    tags = body.count(b"<")
    if tags <= LOOP_MAX_START_TAGS:
        return False
    return tags - body.count(b"</") > LOOP_MAX_START_TAGS


def parse_bounded(
    body: bytes,
    url: str,
    *,
    encoding: str | None,
    max_links: int,
    max_url_length: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    rules: PageRules = DEFAULT_RULES,
) -> BoundedParse:
    """Flatten nesting beyond ``max_depth``, then extract links (what the process runs)."""
    flat = flatten_deep_nesting(body, max_depth)
    page = extract_links(
        flat.body,
        url,
        encoding=encoding,
        max_links=max_links,
        max_url_length=max_url_length,
        rules=rules,
    )
    return BoundedParse(page, "depth" if flat.dropped else None, flat.dropped)


def _empty(url: str) -> ParsedPage:
    return ParsedPage([], None, url, False, False, 0, 0)


class _Process:
    """One parse process: parses one page at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self.stdin = proc.stdin
        self.stdout = proc.stdout

    async def parse(self, request: tuple[Any, ...]) -> tuple[Any, ...]:
        self.stdin.write(frame(marshal.dumps(request)))
        await self.stdin.drain()
        answer = marshal.loads(await read_frame(self.stdout))
        if not isinstance(answer, tuple):
            raise ValueError(f"not an answer: {answer!r}")
        return answer

    async def stop(self, *, kill: bool) -> None:
        if not self.stdin.is_closing():
            self.stdin.close()
        if kill and self.proc.returncode is None:
            self.proc.kill()
        try:
            async with asyncio.timeout(5.0):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


class ParseWorkers:
    """Parse processes shared by a peer's page tails; started on first use."""

    def __init__(self, workers: int = 1, *, deadline: float = DEFAULT_DEADLINE_S) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if deadline <= 0:
            raise ValueError("deadline must be > 0")
        self.deadline = deadline
        self._size = workers
        self._idle: asyncio.Queue[_Process | None] | None = None
        self._all: set[_Process] = set()
        self._closed = False
        self.parsed = 0
        self.killed = 0

    def _slots(self) -> asyncio.Queue[_Process | None]:
        if self._idle is None:
            # None: a slot whose process is started when first taken.
            self._idle = asyncio.Queue()
            for _ in range(self._size):
                self._idle.put_nowait(None)
        return self._idle

    async def parse(
        self,
        body: bytes,
        url: str,
        *,
        encoding: str | None,
        max_links: int,
        max_url_length: int,
        max_depth: int = DEFAULT_MAX_DEPTH,
        rules: PageRules = DEFAULT_RULES,
    ) -> BoundedParse:
        """Parse in a process; a page that overruns the deadline gives no links."""
        if self._closed:
            raise RuntimeError("ParseWorkers is closed")
        slots = self._slots()
        worker = await slots.get()
        try:
            if worker is None:
                worker = await self._spawn()
            request = (
                bytes(body),
                url,
                encoding,
                max_links,
                max_url_length,
                max_depth,
                rules.as_tuple(),
            )
            try:
                async with asyncio.timeout(self.deadline):
                    answer = await worker.parse(request)
            except TimeoutError:
                self.killed += 1
                log.warning(
                    "parse of %s overran %.1f s; its process was replaced", url, self.deadline
                )
                await self._retire(worker)
                worker = None
                return BoundedParse(_empty(url), "deadline")
            except (ConnectionError, asyncio.IncompleteReadError, ValueError, EOFError) as exc:
                log.warning("parse process failed on %s: %r", url, exc)
                await self._retire(worker)
                worker = None
                return BoundedParse(_empty(url), "worker")
            except asyncio.CancelledError:
                # Its answer would reach the next page's caller: this process is done.
                self._all.discard(worker)
                if worker.proc.returncode is None:
                    worker.proc.kill()
                worker = None
                raise
            self.parsed += 1
            *fields, needs, bound, dropped = answer
            page = ParsedPage(*fields)
            page.links, page.requisites = list(page.links), list(needs)
            return BoundedParse(page, bound, dropped)
        finally:
            slots.put_nowait(worker)

    async def _spawn(self) -> _Process:
        if not sys.executable:
            raise RuntimeError("no Python interpreter path (sys.executable) for parsing")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            # -c, not -m: the package imports this module, and runpy warns about running a
            # module that is already imported.
            "-c",
            "import sys; from p2pcrawl.crawl.parseproc import main; sys.exit(main())",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        worker = _Process(proc)
        self._all.add(worker)
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                ready = marshal.loads(await read_frame(worker.stdout))
            if ready != ("ready",):
                raise ValueError(f"it said {ready!r}")
        except (asyncio.IncompleteReadError, TimeoutError, ValueError, EOFError) as exc:
            await self._retire(worker)
            raise RuntimeError(f"the parse process did not start: {exc!r}") from exc
        return worker

    async def _retire(self, worker: _Process) -> None:
        self._all.discard(worker)
        await worker.stop(kill=True)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._all]

    async def aclose(self) -> None:
        """Stop every process (a parse in progress is abandoned). Idempotent."""
        self._closed = True
        workers, self._all = self._all, set()
        for worker in workers:
            with contextlib.suppress(Exception):
                await worker.stop(kill=True)


# --- the process side ---------------------------------------------------------------------


def _send(fd: int, payload: bytes) -> None:
    write_frames_fd(fd, frame(payload))


def serve(source: int, answers: int) -> None:
    """Answer every framed request on fd ``source`` until it closes."""
    _send(answers, marshal.dumps(("ready",)))
    while True:
        payload = read_frame_fd(source)
        if payload is None:
            return
        body, url, encoding, max_links, max_url_length, max_depth, rules = marshal.loads(payload)
        result = parse_bounded(
            body,
            url,
            encoding=encoding,
            max_links=max_links,
            max_url_length=max_url_length,
            max_depth=max_depth,
            rules=PageRules(*rules),
        )
        p = result.page
        answer = (
            p.links,
            p.canonical,
            p.base,
            p.nofollow,
            p.noindex,
            p.hrefs_seen,
            p.rejected,
            p.noarchive,
            p.requisites,
            result.bound,
            result.dropped,
        )
        _send(answers, marshal.dumps(answer))


def main() -> int:
    import signal

    # A Ctrl-C to the process group is for the peer; this process ends when its pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.fileno(), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
