"""The words an erasure takes out of files it cannot rebuild: run history, logs.

Memory the project rebuilds (the store, the indexes, the snapshots, the LLM cache) is
erased by provenance: the rows resting on the erased turns go. Files written along the
way by other programs cannot be rebuilt: Dagster's run and event storage (log lines, error
messages, and the metadata previews older versions of this code wrote with fact text) and
the log files. Those are scrubbed by content: the *distinctive words* of the erased turns,
those no surviving turn of the familiar uses, are replaced by ``[erased]``. A word that
someone else also said stays: it is not theirs to take out of other people's lines.

Dagster's records are JSON. Only free text is rewritten (log messages, error messages and
stacks, text, markdown and JSON metadata values): structural fields (asset keys, run ids,
partitions, class names) never are, so an erased word that happens to be an asset's name
cannot corrupt the run history.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from familiar_pipeline.storage.wipe import vacuum
from familiar_pipeline.storage.words import ERASED, distinctive_words, holds_any, redact, words_of

__all__ = ["ERASED", "FREE_TEXT_KEYS", "ScrubReport", "Scrubber", "distinctive_words", "scrub_tree", "words_of"]

log = logging.getLogger(__name__)

# Keys of Dagster's serialized records whose values are free text, searched recursively: log lines
# (`user_message`, `message`), errors (`message`, `stack`, `cause`), metadata values (`text`, `md_str`,
# `data`: a JSON metadata value), descriptions.
FREE_TEXT_KEYS = frozenset({"user_message", "message", "stack", "text", "md_str", "data", "description", "cause",
                            "context", "raw_value"})
TEXT_SUFFIXES = (".log", ".out", ".err", ".txt", ".complete")


class Scrubber:
    """Replaces a set of words (whole words, any case) with ``[erased]``.

    A text is cut into its words (`storage.words.WORD`: maximal runs of letters and digits) and each is
    looked up in the set: linear in the text, whatever the number of words (an alternation
    regex of 10,000 erased words took ~0.5 ms per record).
    """

    def __init__(self, words: Iterable[str]):
        self.words = sorted({w.lower() for w in words})
        self._set = frozenset(self.words)

    def __bool__(self) -> bool:
        return bool(self._set)

    def hits(self, text: str | None) -> bool:
        return holds_any(text, self._set)

    def text(self, text: str) -> str:
        return redact(text, self._set)

    def hits_record(self, value: str | None) -> bool:
        """`hits`, also through the ``\\uXXXX`` escapes of a JSON record (Dagster writes ASCII JSON)."""
        if self.hits(value):
            return True
        if not value or "\\u" not in value or not value.lstrip().startswith("{"):
            return False
        try:
            return self.hits(json.dumps(json.loads(value), ensure_ascii=False))
        except ValueError:
            return False

    def holds_free_text(self, value: str | None) -> bool:
        """Whether a stored record's free text (as `record` rewrites it) still holds a word."""
        return bool(value) and self.hits_record(value) and _scrub_value(value or "", self) != value

    def record(self, value: Any, *, free: bool = False) -> Any:
        """A JSON value with the words replaced in its free text (under `FREE_TEXT_KEYS`) only."""
        if isinstance(value, dict):
            return {k: self.record(v, free=free or k in FREE_TEXT_KEYS) for k, v in value.items()}
        if isinstance(value, list):
            return [self.record(v, free=free) for v in value]
        if isinstance(value, str) and free:
            return self.text(value)
        return value


@dataclass
class ScrubReport:
    files: int = 0  # files looked at
    rewritten: dict[str, int] = field(default_factory=dict)  # file -> values or lines rewritten
    failed: dict[str, str] = field(default_factory=dict)  # file -> why it could not be scrubbed
    # file -> values or lines still holding a word when read again after the rewrite (what the
    # scrub saw: records and lines written meanwhile by the run itself are not its to judge)
    left: dict[str, int] = field(default_factory=dict)

    @property
    def values(self) -> int:
        return sum(self.rewritten.values())


def scrub_tree(root: Path, scrubber: Scrubber, report: ScrubReport | None = None) -> ScrubReport:
    """Scrub every SQLite file and text log under `root` (Dagster's home); what was rewritten."""
    report = report or ScrubReport()
    if not scrubber or not root.is_dir():
        return report
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            if _is_sqlite(path):
                report.files += 1
                n, left = scrub_sqlite(path, scrubber)
            elif path.suffix in TEXT_SUFFIXES:
                report.files += 1
                n, left = scrub_text_file(path, scrubber)
            else:
                continue
        except (OSError, sqlite3.Error) as exc:
            report.failed[str(path)] = f"{type(exc).__name__}: {exc}"
            log.warning("erasure: could not scrub %s: %s", path, exc)
            continue
        if n:
            report.rewritten[str(path)] = n
        if left:
            report.left[str(path)] = left
    return report


def _is_sqlite(path: Path) -> bool:
    if path.name.endswith(("-wal", "-shm", "-journal")):
        return False
    try:
        with path.open("rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def scrub_sqlite(path: Path, scrubber: Scrubber) -> tuple[int, int]:
    """Rewrite the JSON records of every text column of `path` that hold a word; VACUUM if any did.
    (values rewritten, values whose free text still holds a word when read again afterwards).

    A column value that is not a JSON object is left alone: in Dagster's tables those are
    ids, keys and names, never free text. The second reading covers the values the first found
    holding a word (by rowid): a value that held none cannot hold one after the rewrite, and the
    run doing the purge keeps writing events of its own, which are not the scrub's to judge.
    """
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA secure_delete = ON")
        conn.create_function("erased_hit", 1, scrubber.hits_record, deterministic=True)
        changed = 0
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "AND name NOT LIKE 'sqlite_%'")]
        hit: dict[tuple[str, str], list[int]] = {}
        for table in tables:
            for column in text_columns(conn, table):
                rows = conn.execute(f'SELECT rowid, "{column}" FROM "{table}" WHERE typeof("{column}") = \'text\' '
                                    f'AND erased_hit("{column}")').fetchall()
                hit[(table, column)] = [rowid for rowid, _ in rows]
                updates = []
                for rowid, value in rows:
                    new = _scrub_value(value, scrubber)
                    if new != value:
                        updates.append((new, rowid))
                if updates:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.executemany(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = ?', updates)
                    conn.execute("COMMIT")
                    changed += len(updates)
        if changed and not vacuum(conn):
            raise sqlite3.OperationalError("a reader kept its WAL busy; the rewritten records' old pages are still in it")
        left = 0
        for (table, column), rowids in hit.items():
            for chunk in (rowids[i:i + 500] for i in range(0, len(rowids), 500)):
                values = conn.execute(f'SELECT "{column}" FROM "{table}" WHERE rowid IN ({", ".join("?" * len(chunk))})',
                                      chunk).fetchall()
                left += sum(1 for (value,) in values if isinstance(value, str) and scrubber.holds_free_text(value))
        return changed, left
    finally:
        conn.close()


def text_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """The columns of a SQLite table that may hold text."""
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')
            if (r[2] or "").upper() in ("TEXT", "VARCHAR", "") or "CHAR" in (r[2] or "").upper()]


def _scrub_value(value: str, scrubber: Scrubber) -> str:
    stripped = value.lstrip()
    if not stripped.startswith("{"):
        return value
    try:
        record = json.loads(value)
    except ValueError:
        return value
    scrubbed = scrubber.record(record)
    return value if scrubbed == record else json.dumps(scrubbed)


def scrub_text_file(path: Path, scrubber: Scrubber) -> tuple[int, int]:
    """Replace the words in a text file's lines, in place; (lines changed, lines still holding a word
    when what was written is read again).

    Rewritten through the same inode, not a new file renamed over it: a process appending to
    it (`familiar up` writes its log with O_APPEND) keeps writing to the file the path names.
    """
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="surrogateescape")
    lines = text.splitlines(keepends=True)
    changed = 0
    out = []
    for line in lines:
        new = scrubber.text(line) if scrubber.hits(line) else line
        changed += new != line
        out.append(new)
    size = len(raw)
    if changed:
        data = "".join(out).encode("utf-8", errors="surrogateescape")
        with path.open("r+b") as f:
            f.write(data)
            f.truncate(len(data))
            f.flush()
            os.fsync(f.fileno())
        size = len(data)
    with path.open("rb") as f:  # what was written, not lines appended since
        again = f.read(size).decode("utf-8", errors="surrogateescape")
    return changed, sum(scrubber.hits(line) for line in again.splitlines())
