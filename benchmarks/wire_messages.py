"""Issue 33: the typed wire messages against the hand-written codecs they replaced.

Every crawl RPC's messages are declared once as msgspec Structs (``protocol.procedures``) and
the wire's msgpack is msgspec's; before, each RPC had hand-written ``*_to_wire`` / ``check_*``
functions over the C ``msgpack``. This measures both on the same messages, as each side of a
call spends it:

- encode: what a sender does, from the values to the datagram body (the reply map or the
  ``[name, [sender, *args]]`` call, packed);
- decode: what the receiver does, from the body to checked values (for STORE_TASK and
  STORE_BACKUP the argument checks only: the task chunk inside is the codec's, unchanged, and
  its cost is ``chunk`` below).

The baseline is the protocol package of another revision (default ``main``), exported with
``git archive`` and run in a subprocess of its own; the current tree runs in another. Rounds
alternate the two (noisy machines), and the ratio of medians is printed per message and for
all of them together (their sum), together with whether the bytes on the wire are the same.

Usage: python benchmarks/wire_messages.py [--baseline main] [--rounds 5] [--quick]
(the baseline needs the ``msgpack`` package: pip install msgpack)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# --- the messages, built the same way on both sides ------------------------------------------


def _fixtures() -> dict[str, Any]:
    from protocol import KeyBatch, TaskItem, key_for

    key = key_for("example.org")
    batch = KeyBatch(key, [TaskItem(f"http://example.org/a/{i:06d}.html", 2) for i in range(40)])
    return {
        "sender": b"\x11" * 20,
        "owner": b"\x22" * 20,
        "key": key,
        "batch": batch,
        "fps": [(i * 0x9E3779B97F4A7C15) % (1 << 64) for i in range(60)],
        "robots": ("http://example.org", b"User-agent: *\nDisallow: /private/\n", 3600),
        "peers": [(bytes([i]) * 20, f"198.18.0.{i + 1}", 7000 + i) for i in range(16)],
        "ones": tuple(float(i % 7) for i in range(160)),
    }


def _values(
    f: dict[str, Any], give_back: Any, lent_robots: Any, load_report: Any
) -> tuple[Any, ...]:
    """The values both sides send, made with either side's types."""
    from protocol import PeerRef, StoreResult
    from protocol.codec import encode_chunks

    payload, keys = encode_chunks([f["batch"]])[0]
    reports = [give_back(9, f["fps"][:30], f["fps"][30:40], False), give_back(10, [], [], True)]
    return (
        payload,
        set(keys),
        f["sender"],
        f["owner"],
        StoreResult(40, 0, [], f["fps"][:20]),
        lent_robots(*f["robots"]),
        reports,
        load_report(1000, f["ones"], tuple(PeerRef(*p) for p in f["peers"])),
    )


def _cases_old(f: dict[str, Any]) -> dict[str, tuple[Callable[[], bytes], Callable[[bytes], Any]]]:
    """The hand-written codecs (the baseline revision's API, so looked up by name)."""
    from importlib import import_module

    from protocol import wire

    msgs: Any = import_module("protocol.messages")
    lending: Any = import_module("protocol.lending")
    loads: Any = import_module("protocol.loadreport")
    check_id = msgs.check_id
    RefreshAnswer = msgs.RefreshAnswer
    GiveBack, LentRobots, LoadReport = lending.GiveBack, lending.LentRobots, loads.LoadReport

    payload, asked, sender, owner, result, robots, reports, load = _values(
        f, GiveBack, LentRobots, LoadReport
    )

    def with_id(reply: dict[str, Any]) -> dict[str, Any]:
        reply["id"] = sender  # what the server adds
        return reply

    def args_of(body: bytes, n: int) -> list[Any]:
        _name, args = wire.unpackb(body)
        check_id(args[0], "sender id")
        if len(args) - 1 != n:
            raise ValueError("arity")
        return list(args[1:])

    def backup_args(body: bytes) -> Any:
        owner_, chunk = args_of(body, 2)
        return check_id(owner_, "owner"), chunk

    def loan_reply() -> dict[str, Any]:
        out: dict[str, Any] = lending.loan_to_wire(7, payload, 300, robots)
        return out

    return {
        "store_task call": (
            lambda: wire.packb(["store_task", [sender, payload]]),
            lambda b: args_of(b, 1),
        ),
        "store_task reply": (
            lambda: wire.packb(with_id(msgs.store_result_to_wire(result, asked))),
            lambda b: msgs.store_result_from_wire(wire.unpackb(b), asked),
        ),
        "store_backup call": (
            lambda: wire.packb(["store_backup", [sender, owner, payload]]),
            backup_args,
        ),
        "count reply": (
            lambda: wire.packb(with_id({"n": 40})),
            lambda b: msgs.count_from_wire(wire.unpackb(b)),
        ),
        "refresh reply": (
            lambda: wire.packb(with_id({"n": 3})),
            lambda b: msgs.refresh_from_wire(wire.unpackb(b)),
        ),
        "quiet reply": (
            lambda: wire.packb(with_id({"quiet": True, "done": 4609})),
            lambda b: (lambda d: (d.get("quiet") is True, int(d.get("done") or 0)))(
                wire.unpackb(b)
            ),
        ),
        "lend call": (
            lambda: wire.packb(["lend", [sender, 64, 0, 4]]),
            lambda b: lending.check_lend_request(args_of(b, 3)),
        ),
        "lend reply": (
            lambda: wire.packb(with_id(loan_reply())),
            lambda b: lending.loan_from_wire(wire.unpackb(b)),
        ),
        "give_back call": (
            lambda: wire.packb(["give_back", [sender, *lending.report_to_wire(reports)]]),
            lambda b: lending.check_return_request(args_of(b, 5)),
        ),
        "give_back reply": (
            lambda: wire.packb(with_id(lending.returns_to_wire([(True, False), (False, False)]))),
            lambda b: lending.returns_from_wire(wire.unpackb(b), 2),
        ),
        "load call": (
            lambda: wire.packb(["load", [sender, bytes(1024)]]),
            lambda b: loads.check_load_request(args_of(b, 1)),
        ),
        "load reply": (
            lambda: wire.packb(with_id(loads.report_to_wire(load))),
            lambda b: loads.report_from_wire(wire.unpackb(b)),
        ),
        "refresh answer": (
            lambda: wire.packb(with_id({"n": 0, "later_ms": 2500})),
            lambda b: msgs.refresh_from_wire(wire.unpackb(b)) == RefreshAnswer(0, 2.5),
        ),
    }


def _cases_new(f: dict[str, Any]) -> dict[str, tuple[Callable[[], bytes], Callable[[bytes], Any]]]:
    """The typed messages (this tree's API)."""
    from protocol import wire
    from protocol.loadreport import LOAD, LoadArgs, LoadReport, load_reply, report_of
    from protocol.loans import (
        GIVE_BACK,
        LEND,
        GiveBack,
        LendArgs,
        LentRobots,
        answers_of,
        loan_of,
        loan_reply,
        report_args,
        returns_reply,
    )
    from protocol.messages import (
        QUIET,
        REFRESH_TASK,
        STORE_BACKUP,
        STORE_TASK,
        BackupArgs,
        QuietReply,
        RefreshAnswer,
        RefreshReply,
        StoreTaskArgs,
        check_id,
        refresh_answer,
        store_reply,
        store_result,
    )
    from protocol.procedures import (
        Count,
        Procedure,
        parse_args,
    )

    payload, asked, sender, owner, result, robots, reports, load = _values(
        f, GiveBack, LentRobots, LoadReport
    )

    def call(proc: Procedure[Any, Any], args: Any) -> bytes:
        return wire.packb([proc.name, [sender, *proc.args_to_wire(args)]])

    def args_of(proc: Procedure[Any, Any], body: bytes) -> Any:
        _name, args = wire.unpackb(body)
        check_id(args[0], "sender id")
        return parse_args(proc, args[1:])

    def reply(proc: Procedure[Any, Any], body: bytes) -> Any:
        return proc.decode_reply(body)

    def with_id(reply: Any) -> Any:
        reply.id = sender  # what the server adds
        return reply

    return {
        "store_task call": (
            lambda: call(STORE_TASK, StoreTaskArgs(payload)),
            lambda b: args_of(STORE_TASK, b),
        ),
        "store_task reply": (
            lambda: wire.packb(with_id(store_reply(result, asked))),
            lambda b: store_result(reply(STORE_TASK, b), asked),
        ),
        "store_backup call": (
            lambda: call(STORE_BACKUP, BackupArgs(owner, payload)),
            lambda b: args_of(STORE_BACKUP, b),
        ),
        "count reply": (
            lambda: wire.packb(with_id(Count(40))),
            lambda b: reply(STORE_BACKUP, b).n,
        ),
        "refresh reply": (
            lambda: wire.packb(with_id(RefreshReply(3))),
            lambda b: refresh_answer(reply(REFRESH_TASK, b)),
        ),
        "quiet reply": (
            lambda: wire.packb(with_id(QuietReply(True, 4609))),
            lambda b: reply(QUIET, b),
        ),
        "lend call": (lambda: call(LEND, LendArgs(64, 0, 4)), lambda b: args_of(LEND, b)),
        "lend reply": (
            lambda: wire.packb(with_id(loan_reply(7, payload, 300, robots))),
            lambda b: loan_of(reply(LEND, b)),
        ),
        "give_back call": (
            lambda: call(GIVE_BACK, report_args(reports)),
            lambda b: args_of(GIVE_BACK, b).reports(),
        ),
        "give_back reply": (
            lambda: wire.packb(with_id(returns_reply([(True, False), (False, False)]))),
            lambda b: answers_of(reply(GIVE_BACK, b), 2),
        ),
        "load call": (
            lambda: call(LOAD, LoadArgs(bytes(1024))),
            lambda b: args_of(LOAD, b),
        ),
        "load reply": (
            lambda: wire.packb(with_id(load_reply(load))),
            lambda b: report_of(reply(LOAD, b)),
        ),
        "refresh answer": (
            lambda: wire.packb(with_id(RefreshReply(0, 2500))),
            lambda b: refresh_answer(reply(REFRESH_TASK, b)) == RefreshAnswer(0, 2.5),
        ),
    }


def _per_call_us(fn: Callable[[], Any], budget_s: float) -> float:
    """Microseconds per call: the best of five batches sized to ``budget_s`` in all."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        took = time.perf_counter() - t0
        if took > budget_s / 25:
            break
        n *= 2
    best = took / n
    for _ in range(4):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def measure(budget_s: float) -> dict[str, Any]:
    """Run in a subprocess: time each message of whichever API ``protocol`` here has."""
    import protocol.messages

    f = _fixtures()
    old = hasattr(protocol.messages, "store_result_to_wire")
    cases = _cases_old(f) if old else _cases_new(f)
    from protocol.codec import decode_batches, encode_chunks

    payload = encode_chunks([f["batch"]])[0][0]
    out: dict[str, Any] = {"api": "hand-written" if old else "typed", "messages": {}}
    for name, (encode, decode) in cases.items():
        body = encode()
        decode(body)  # it must accept what it wrote
        out["messages"][name] = {
            "bytes": body.hex(),
            "encode_us": _per_call_us(encode, budget_s),
            "decode_us": _per_call_us(lambda b=body, d=decode: d(b), budget_s),  # type: ignore[misc]
        }
    out["chunk_us"] = {
        "encode": _per_call_us(lambda: encode_chunks([f["batch"]]), budget_s),
        "decode": _per_call_us(lambda: decode_batches(payload), budget_s),
    }
    return out


# --- the driver ------------------------------------------------------------------------------


def _export(rev: str, into: Path) -> None:
    """The ``protocol`` package of ``rev``, unpacked under ``into``."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "protocol"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")


def _run(path: Path, budget_s: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(path), str(ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-P", __file__, "--measure", str(budget_s)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=path,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", default="main", help="git revision of the hand-written codecs")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each side once per round")
    ap.add_argument("--quick", action="store_true", help="one round, short timings")
    ap.add_argument("--measure", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure)))
        return 0
    rounds, budget = (1, 0.1) if args.quick else (args.rounds, 0.5)
    with tempfile.TemporaryDirectory(prefix="wire-baseline-") as tmp:
        base = Path(tmp)
        _export(args.baseline, base)
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        for _ in range(rounds):
            runs["old"].append(_run(base, budget))
            runs["new"].append(_run(ROOT, budget))
    old, new = runs["old"], runs["new"]
    if old[0]["api"] != "hand-written" or new[0]["api"] != "typed":
        print(f"expected hand-written vs typed, got {old[0]['api']} vs {new[0]['api']}")
        return 1

    def med(side: list[dict[str, Any]], name: str, what: str) -> float:
        return float(statistics.median(r["messages"][name][what] for r in side))

    print(f"wire messages, {rounds} round(s): {args.baseline} (hand-written) vs this tree (typed)")
    print(
        f"{'message':<18} {'old enc':>8} {'new enc':>8} {'old dec':>8} {'new dec':>8} "
        f"{'old/new':>8}  same bytes"
    )
    tot_old = tot_new = 0.0
    for name in old[0]["messages"]:
        oe, ne = med(old, name, "encode_us"), med(new, name, "encode_us")
        od, nd = med(old, name, "decode_us"), med(new, name, "decode_us")
        tot_old += oe + od
        tot_new += ne + nd
        same = old[0]["messages"][name]["bytes"] == new[0]["messages"][name]["bytes"]
        print(
            f"{name:<18} {oe:8.2f} {ne:8.2f} {od:8.2f} {nd:8.2f} {(oe + od) / (ne + nd):8.2f}x"
            f"  {'yes' if same else 'no'}"
        )
    print(
        f"{'all (sum, us)':<18} {tot_old:35.2f} -> {tot_new:.2f}  old/new {tot_old / tot_new:.2f}x"
    )
    for what in ("encode", "decode"):
        o = statistics.median(r["chunk_us"][what] for r in old)
        n = statistics.median(r["chunk_us"][what] for r in new)
        print(
            f"task chunk {what} (40 URLs, the codec's msgpack inside): {o:.1f} -> {n:.1f} us,"
            f" old/new {o / n:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
