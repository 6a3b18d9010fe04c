"""The periodic loop: run a job every so many seconds, for as long as its owner lets it.

A background job that raises must not end its loop: a liveness round that died on one odd
reply would silently stop every later round. So a failure is logged and the loop goes on;
only cancellation (its owner's ``TaskSet`` closing) ends it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

__all__ = ["every"]

log = logging.getLogger(__name__)


async def every(
    interval: float,
    job: Callable[[], Awaitable[object]],
    *,
    first: float | None = None,
    failures: int = logging.ERROR,
) -> NoReturn:
    """Run ``job`` every ``interval`` seconds until cancelled, the first time after ``first``
    seconds (default: one interval). A run that raises is logged at level ``failures`` (with
    its traceback) and the loop goes on; ``logging.DEBUG`` suits a job whose failures are
    expected (its resources close under it while the peer stops)."""
    if interval <= 0:
        raise ValueError("interval must be > 0")
    await asyncio.sleep(interval if first is None else first)
    while True:
        try:
            await job()
        except Exception:
            log.log(failures, "background job %s failed", _name(job), exc_info=True)
        await asyncio.sleep(interval)


def _name(job: Callable[[], Awaitable[object]]) -> str:
    return str(getattr(job, "__qualname__", None) or getattr(job, "__name__", None) or job)
