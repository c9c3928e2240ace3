"""Leaving no deleted byte in a SQLite file: what erasure asks of the turn log, the response cache
and Dagster's SQLite storage alike.

`PRAGMA secure_delete = ON` (set by each writer) zeroes the cells a DELETE or UPDATE frees in the
new page images; a checkpoint writes those over the old pages and empties the WAL; VACUUM rebuilds
the file without free pages and slack; a second checkpoint empties the WAL the VACUUM went through.
A reader holding the WAL open keeps a checkpoint from finishing: it is retried for a while, and
the caller is told if it never finished (the old page images would still be in the WAL).
"""

from __future__ import annotations

import sqlite3
import time

RETRIES = 50
RETRY_WAIT_S = 0.1


def vacuum(conn: sqlite3.Connection) -> bool:
    """VACUUM `conn`'s database and truncate its WAL; False when a reader kept the WAL from being emptied.

    `conn` must be outside a transaction. A database not in WAL mode has no WAL to empty.
    """
    wal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    if wal:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    if not wal:
        return True
    for _ in range(RETRIES):
        if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
            return True
        time.sleep(RETRY_WAIT_S)
    return False
