"""Per-peer persistent stores: task store, backup store, done record, Bloom filters, and
the visit history of continuous mode.

Nothing here knows about HTTP or the network. Each store is one SQLite file (WAL) owned by
one background thread that group-commits; every ``add`` returns once its rows are durable
against the process being killed. Fingerprints are unsigned 64-bit ints in this API.
"""

from __future__ import annotations

from storage.backups import BackupStore
from storage.bloom import SplittableBloom, false_positive_rate, optimal_k
from storage.done import PROOF_DIGEST_BYTES, DoneRecord, Proof
from storage.failures import StoreClosed, StoreCorrupt, StoreUnwritable
from storage.lock import DataDirLocked, DirLock
from storage.records import StoredTask
from storage.tasks import TaskStore
from storage.visits import MAX_VALIDATOR, Visit, VisitStore, pack_visits, unpack_visits

__all__ = [
    "MAX_VALIDATOR",
    "PROOF_DIGEST_BYTES",
    "BackupStore",
    "DataDirLocked",
    "DirLock",
    "DoneRecord",
    "Proof",
    "SplittableBloom",
    "StoreClosed",
    "StoreCorrupt",
    "StoreUnwritable",
    "StoredTask",
    "TaskStore",
    "Visit",
    "VisitStore",
    "false_positive_rate",
    "optimal_k",
    "pack_visits",
    "unpack_visits",
]
