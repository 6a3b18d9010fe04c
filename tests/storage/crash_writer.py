"""Helper for test_durability: writes to all three stores until it is killed.

Run as ``python crash_writer.py DIR START``. Iteration i adds batch i to each store and,
once all three adds have returned (committed), prints ``i`` on its own line. Several
writers run at once so that kills also land in group commits of many batches. The parent
kills the process with SIGKILL mid-write and checks that every printed batch survived.
The loop is bounded so a parent that dies first does not leave it running for ever.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from storage import BackupStore, DoneRecord, StoredTask, TaskStore

BATCH = 20
OWNER = b"\x01" * 20
MAX_ITERATIONS = 20_000
WRITERS = 4


def batch(i: int) -> list[StoredTask]:
    # Fingerprints spread over the whole unsigned range, upper half included.
    return [
        StoredTask(
            url=f"https://h{i % 7}.example/{i}/{j}",
            key=bytes([i % 7]) * 20,
            fp=((i * BATCH + j) * 0x9E3779B97F4A7C15) % (1 << 64),
            depth=j,
        )
        for j in range(BATCH)
    ]


async def main(directory: Path, start: int) -> None:
    tasks = await TaskStore.open(directory / "tasks.sqlite3")
    backups = await BackupStore.open(directory / "backups.sqlite3")
    done = await DoneRecord.open(directory / "done.sqlite3", expected=10_000)
    print("ready", flush=True)

    async def writer(first: int) -> None:
        for i in range(first, start + MAX_ITERATIONS, WRITERS):
            b = batch(i)
            await asyncio.gather(
                tasks.add(b),
                backups.add(OWNER, b),
                done.add([(t.key, t.fp) for t in b]),
            )
            print(i, flush=True)

    await asyncio.gather(*(writer(start + r) for r in range(WRITERS)))
    await asyncio.gather(tasks.aclose(), backups.aclose(), done.aclose())


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
