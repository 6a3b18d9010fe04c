"""Host keys stored once per file: a small integer id stands for a 20-byte DHT key.

A store that groups its rows by host key (the done record, the visit history) keeps each
key once in a ``hosts(id, key)`` table and a 1-3 byte id in every row, instead of the 20
bytes of the key itself (a third of a done-record row).
"""

from __future__ import annotations

import sqlite3

from storage.records import KEY_BYTES

__all__ = ["HOSTS_TABLE", "check_key", "host_id"]

HOSTS_TABLE = "CREATE TABLE IF NOT EXISTS hosts(id INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE)"


def check_key(key: bytes) -> bytes:
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes, got {len(key)}")
    return key


def host_id(conn: sqlite3.Connection, key: bytes, *, create: bool) -> int:
    """The host's row id; 0 when it has none and ``create`` is False."""
    row = conn.execute("SELECT id FROM hosts WHERE key = ?", (key,)).fetchone()
    if row is not None:
        return int(row[0])
    if not create:
        return 0
    cursor = conn.execute("INSERT INTO hosts(key) VALUES (?)", (key,))
    assert cursor.lastrowid is not None
    return cursor.lastrowid
