"""Waiting for the replicas' answers without waiting on a suspected one.

An owner waits for its replicas before a page counts as done (its new tasks' copies, the
news that it is finished: ``replication``). A dead replica holds nothing whether or not we
wait, and waiting for it until it was declared stood a page's tail still for the detection
time: every owner it replicated crawled nothing once its pipeline tickets ran out, for about
4 s after a kill (a trace of chaos seed 3: the big host's owner and the Crawl-delay host's,
neither of them killed). So a replica the failure detector suspects is not waited for once
another replica has held its copy; the call to it goes on, and its answer or its failure
reaches the follower as a missed copy's always did. A suspect that is only slow gets its
copy late. With every replica still to answer suspected and none held, each is waited for:
no page counts as done on the owner's word alone (docs/membership.md, "A suspected replica
does not hold the crawl").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, TypeVar

from protocol import TaskSet

__all__ = ["SUSPECT_CHECK_S", "past_suspects"]

# How often a wait looks again at who is suspected.
SUSPECT_CHECK_S = 0.1
# How long a call left going on may take to unwind once its owner is closed.
SETTLE_GRACE_S = 1.0

P = TypeVar("P", bound=Hashable)


async def past_suspects(
    calls: dict[P, Coroutine[Any, Any, Any]],
    held: Callable[[Any], bool],
    suspect: Callable[[P], bool],
    owner: TaskSet,
) -> tuple[list[Any], bool]:
    """Each call's answer, in order, and whether some were not waited for (their answers
    are None here; ``owner`` sees the calls to their end). ``held``: whether an answer means
    the replica holds its copy; ``suspect``: whether the failure detector suspects a
    replica now. Raises a call's error as ``asyncio.gather`` would, when all have ended."""
    if len(calls) < 2:
        return list(await asyncio.gather(*calls.values())), False
    peers = list(calls)
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(c) for c in calls.values()]
    pending: set[asyncio.Future[Any]] = set(tasks)
    try:
        while pending:
            _, pending = await asyncio.wait(pending, timeout=SUSPECT_CHECK_S)
            if pending and _passable(peers, tasks, pending, held, suspect):
                break
    except BaseException:  # cancelled: as ``asyncio.gather`` would, so are the calls
        _cancel(pending)
        raise
    if pending:
        settling = owner.spawn(_settle(pending), "past-suspect")
        if settling is None:  # shutting down
            _cancel(pending)
        else:  # cancelled by its owner, perhaps before it ran: so are the calls
            settling.add_done_callback(lambda _: _cancel(pending))
        return [_result(t) if t.done() else None for t in tasks], True
    errors = [t.exception() for t in tasks]  # each read, so none is reported unread
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        raise failed
    return [t.result() for t in tasks], False


def _passable(
    peers: list[P],
    tasks: list[asyncio.Future[Any]],
    pending: set[asyncio.Future[Any]],
    held: Callable[[Any], bool],
    suspect: Callable[[P], bool],
) -> bool:
    """Whether every replica still to answer is suspected, and another one held."""
    left = [p for p, t in zip(peers, tasks, strict=True) if t in pending]
    if not all(suspect(p) for p in left):
        return False
    return any(t not in pending and held(_result(t)) for t in tasks)


def _result(task: asyncio.Future[Any]) -> Any:
    """A finished call's answer; None if it failed or was cancelled."""
    if task.cancelled() or task.exception() is not None:
        return None
    return task.result()


def _cancel(calls: set[asyncio.Future[Any]]) -> None:
    for c in calls:
        c.cancel()


async def _settle(calls: set[asyncio.Future[Any]]) -> None:
    try:
        await asyncio.gather(*calls, return_exceptions=True)
    except asyncio.CancelledError:
        # Shutting down: the calls are cancelled with us, and end before we do.
        _cancel(calls)
        await asyncio.wait(calls, timeout=SETTLE_GRACE_S)
        raise
