"""Event-loop CPU by callback, for ``benchmarks/cluster.py --loop-cpu``.

Python imports ``sitecustomize`` at start-up from the first directory on ``sys.path`` that
has one; the cluster benchmark puts this directory first on the peers' ``PYTHONPATH`` and
names a directory in ``P2PCRAWL_LOOP_CPU``. In a ``p2pcrawl join`` process (and nowhere
else: not the benchmark, the web or a parse worker) every callback the event loop runs is
timed in thread CPU time (``time.thread_time``), under the name of the task it steps (the
coroutine's qualified name) or of the plain callback. Every quarter second a thread writes
the running totals to ``<dir>/<pid>.json``; the benchmark reads them at the seed and at the
end of a run, so the difference is the crawl's CPU, callback by callback.

Why not a sampling profiler: py-spy samples wall time, and on two cores shared by eight
peers a sample often lands in a thread that is runnable but not running, or waiting for the
GIL after a wake-up; it put a third of a peer's time where it spent none. Thread CPU time
per callback is exact, and costs two clock reads per callback.
"""

from __future__ import annotations

import os

_DIR = os.environ.get("P2PCRAWL_LOOP_CPU")


def _is_peer() -> bool:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return b"p2pcrawl" in argv and b"join" in argv


if _DIR and _is_peer():
    import asyncio.events
    import json
    import threading
    import time
    from typing import Any

    _cpu: dict[str, float] = {}
    _calls: dict[str, int] = {}
    _run = asyncio.events.Handle._run
    _clock = time.thread_time

    def _name(handle: Any) -> str:
        cb = handle._callback
        owner = getattr(cb, "__self__", None)
        if owner is not None and hasattr(owner, "get_coro"):
            coro = owner.get_coro()
            qual = getattr(coro, "__qualname__", type(coro).__qualname__)
            # An owned task's name says whose it is (``TaskSet``: "dispatch:flush", an
            # RPC's "store_task"); asyncio's own "Task-<n>" says nothing, and a worker's
            # number ("engine:worker-3") splits one job sixteen ways.
            task_name = owner.get_name().rstrip("0123456789").rstrip("-")
            if task_name == "Task":
                return "task " + qual
            return f"task {qual} [{task_name}]"
        fn = getattr(cb, "func", cb)  # functools.partial
        return "callback " + (getattr(fn, "__qualname__", None) or type(fn).__qualname__)

    def _timed_run(self: Any) -> None:
        name = _name(self)  # before: a finished handle may drop its callback
        t0 = _clock()
        try:
            _run(self)
        finally:
            _cpu[name] = _cpu.get(name, 0.0) + (_clock() - t0)
            _calls[name] = _calls.get(name, 0) + 1

    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
    _path = os.path.join(_DIR, f"{os.getpid()}.json")

    def _dump() -> None:
        main = threading.main_thread().ident
        while True:
            time.sleep(0.25)
            try:
                snap = {"cpu": dict(_cpu), "calls": dict(_calls)}
            except RuntimeError:  # a dict grew while copied: next time
                continue
            if main is not None:
                snap["main_thread"] = time.clock_gettime(time.pthread_getcpuclockid(main))
            try:
                with open(_path + ".tmp", "w") as fh:
                    json.dump(snap, fh)
                os.replace(_path + ".tmp", _path)
            except OSError:
                return

    threading.Thread(target=_dump, name="loop-cpu", daemon=True).start()
