"""Waiting for the replicas' answers past a suspected one (``network.answers``).

The calls here are plain coroutines standing for STORE_BACKUPs: one answers, one never
does (a crashed replica), and which of them the failure detector suspects is set by the
test. The real peers' version is ``test_replicas.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from p2pcrawl.network.answers import past_suspects
from protocol import TaskSet

pytestmark = pytest.mark.timeout(30)


async def _answer(value: object, after: float = 0.0) -> object:
    await asyncio.sleep(after)
    return value


async def _never(started: asyncio.Event, cancelled: asyncio.Event) -> object:
    started.set()
    try:
        await asyncio.Event().wait()
    finally:
        cancelled.set()
    return None


async def test_a_suspect_is_passed_once_another_replica_held_and_its_call_goes_on() -> None:
    owner = TaskSet("test")
    started, cancelled = asyncio.Event(), asyncio.Event()
    calls = {"live": _answer([]), "dead": _never(started, cancelled)}
    results, passed = await past_suspects(
        calls, lambda a: a is not None, lambda p: p == "dead", owner
    )
    assert (results, passed) == ([[], None], True)
    assert started.is_set() and not cancelled.is_set()  # still under way, owned
    assert len(owner) == 1
    await owner.aclose()  # shutting down: the call left going on is cancelled with it
    await asyncio.wait_for(cancelled.wait(), timeout=5)


async def test_a_replica_not_suspected_is_waited_for() -> None:
    owner = TaskSet("test")
    calls = {"slow": _answer(["late"], after=0.5), "quick": _answer([])}
    results, passed = await past_suspects(calls, lambda a: a is not None, lambda p: False, owner)
    assert (results, passed) == ([["late"], []], False)
    await owner.aclose()


async def test_with_every_replica_still_to_answer_suspected_and_none_held_all_are_waited_for() -> (
    None
):
    """A failed answer is not a held copy: the suspect is waited for too."""
    owner = TaskSet("test")
    calls = {"failed": _answer(None), "suspect": _answer(["at last"], after=0.5)}
    results, passed = await past_suspects(calls, lambda a: a is not None, lambda p: True, owner)
    assert (results, passed) == ([None, ["at last"]], False)
    await owner.aclose()


async def test_an_error_is_raised_as_gather_would_once_every_call_ended() -> None:
    owner = TaskSet("test")

    async def boom() -> object:
        raise RuntimeError("closed")

    with pytest.raises(RuntimeError, match="closed"):
        await past_suspects(
            {"a": boom(), "b": _answer([])}, lambda a: a is not None, lambda p: False, owner
        )
    await owner.aclose()
