"""The check after a purge: no file of the familiar holds an erased word any more (docs/privacy.md).

The purge removes copies by provenance and scrubs what it cannot rebuild; an erasure is not
called done on the strength of those steps. This module looks: it reads every file under the
familiar's folder for the erased messages' distinctive words (`storage.words`), each format
where it keeps text, so a copy the steps missed (a table nobody purged, a file left behind, a
reply that still quotes them) is found and named. Dagster's run history and the logs under its
home are read again by the scrub itself, right after it rewrote them (`words.scrub_tree`).

Where each format keeps text, and how it is read:

* SQLite files we write (the turn log, the model cache): every value of their free-text columns
  (`turns.PROSE_COLUMNS`, `llm.CACHE_PROSE_COLUMNS`), and the raw bytes of their free pages;
  their WAL was emptied by the purge (a WAL written since holds whole pages of current rows,
  which the first reading covers);
* `memory.duckdb` and the Parquet snapshots: the prose columns the tables declare (DuckDB and
  Parquet compress text, so their bytes cannot be searched as they lie);
* the full-text indexes: the index terms an erased word becomes that no source of the index
  produces any more (tantivy keeps terms, stemmed, in compressed blocks), and no segment file
  outside the index's live segments;
* any other file (a log, a spool, a name file, a leftover copy): its bytes, as text.

Not read: the operator's own files (`character.toml`, `character.md`, `lorebook.toml`: authored
canon, which no code writes), the vector matrices (numbers), the manifests and locks (ids).
Words are compared whole and case-insensitively, as the purge removes them; only the paths of the
files still holding any are reported, never the words.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import duckdb

from familiar_pipeline.models.llm import CACHE_PROSE_COLUMNS
from familiar_pipeline.storage.fts import FtsIndex, analyze
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.tables import Table
from familiar_pipeline.storage.turns import PROSE_COLUMNS
from familiar_pipeline.storage.words import SQL_WORD_TABLE, WORD, sql_rows_holding

AUTHORED = frozenset({"character.toml", "character.md", "lorebook.toml"})
NO_TEXT_SUFFIXES = (".npy", ".lock")  # vectors; lock files


@dataclass
class Leftovers:
    """What the check found: how many words it looked for, in how many files, and where any is left."""

    words: int
    files: int = 0
    left: dict[str, int] = field(default_factory=dict)  # path -> values or places still holding a word

    def add(self, path: Path | str, hits: int) -> None:
        self.files += 1
        if hits:
            self.left[str(path)] = self.left.get(str(path), 0) + hits

    def summary(self) -> str:
        return summary(self.words, self.files, self.left)


def summary(words: int, files: int, left: Iterable[str]) -> str:
    """The check in one line for the operator: counts and paths, never a word."""
    where = sorted(left)
    what = f"{words} distinctive word{'s' if words != 1 else ''}"
    if not where:
        return f"0 files hold any of the {what} ({files} files read)"
    return f"{len(where)} file{'s' if len(where) != 1 else ''} still hold some of the {what}: " + ", ".join(where)


def check_familiar(paths: FamiliarPaths, words: Iterable[str], *, tables: Mapping[str, Table],
                   index_sources: Mapping[str, set[str]] | None = None,
                   turn_log_keeps: Mapping[str, tuple[str, list[str]]] | None = None) -> Leftovers:
    """Read every file under the familiar's folder for `words` (module doc).

    `tables`: the declared tables by name (their prose columns). `index_sources`: per full-text
    index folder name, the tokens of the erased words its sources still produce (a term the index
    holds for another reason than an erased copy); an index not named there may hold none.
    `turn_log_keeps`: the turn log's rows to read (`turns.kept_prose`): the check runs before the
    purge's last step blanks the others, so a purge whose check fails keeps the text a retry needs.
    """
    wanted = frozenset(w.lower() for w in words)
    found = Leftovers(len(wanted))
    if not wanted or not paths.dir.is_dir():
        return found
    tokens = {t for w in wanted for t in analyze(w)}
    sql = duckdb.connect(":memory:")  # reads the store and the snapshots, the words in a table once
    sql.execute(SQL_WORD_TABLE, [sorted(wanted)])
    try:
        _check_files(paths, wanted, tables, turn_log_keeps, sql, found)
    finally:
        sql.close()
    if paths.fts_dir.is_dir():
        for index in sorted(p for p in paths.fts_dir.iterdir() if p.is_dir()):
            legit = (index_sources or {}).get(index.name, set())
            found.add(index, index_terms(index, tokens - legit) + orphan_segments(index))
    return found


def _check_files(paths: FamiliarPaths, wanted: frozenset[str], tables: Mapping[str, Table],
                 turn_log_keeps: Mapping[str, tuple[str, list[str]]] | None, sql: duckdb.DuckDBPyConnection,
                 found: Leftovers) -> None:
    for path in sorted(p for p in paths.dir.rglob("*") if p.is_file()):
        rel = path.relative_to(paths.dir)
        name = path.name
        if rel.parts[0] == "fts" or name in AUTHORED or name.endswith(NO_TEXT_SUFFIXES):
            continue
        if name.endswith(("-wal", "-shm", "-journal", ".duckdb.wal")):
            continue  # read through their database (below)
        if path == paths.turns_db:
            found.add(path, sqlite_prose(path, PROSE_COLUMNS, wanted, keep=turn_log_keeps)
                      + sqlite_free_pages(path, wanted))
        elif path == paths.llm_cache:
            found.add(path, sqlite_prose(path, CACHE_PROSE_COLUMNS, wanted) + sqlite_free_pages(path, wanted))
        elif path == paths.memory_db:
            found.add(path, duckdb_prose(sql, path, tables))
        elif rel.parts[0] == "serving" and name.startswith("manifest"):
            continue
        elif rel.parts[0] == "serving" and path.suffix == ".parquet":
            found.add(path, parquet_prose(sql, path, tables.get(name.split(".", 1)[0])))
        else:
            found.add(path, raw_text(path, wanted))


# --------------------------------------------------------------------------- per format


def raw_text(path: Path, words: frozenset[str]) -> int:
    """Occurrences of the words in a file's bytes read as text."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    return sum(1 for w in WORD.findall(text) if w.lower() in words)


def sqlite_prose(path: Path, columns: Mapping[str, tuple[str, ...]], words: frozenset[str], *,
                 keep: Mapping[str, tuple[str, list]] | None = None) -> int:
    """Values of these free-text columns holding a word (a read-only connection: the WAL is read too);
    `keep`: per table, a condition selecting the rows to read (the others are about to be blanked)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        conn.create_function("holds_word", 1, lambda text: any(w.lower() in words for w in WORD.findall(text or "")),
                             deterministic=True)
        present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        hits = 0
        for table, cols in columns.items():
            if table in present:
                have = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
                where, params = (keep or {}).get(table, ("1", []))
                for column in (c for c in cols if c in have):
                    hits += conn.execute(f'SELECT count(*) FROM "{table}" WHERE holds_word("{column}") AND ({where})',
                                         params).fetchone()[0]
        return hits
    finally:
        conn.close()


def sqlite_free_pages(path: Path, words: frozenset[str]) -> int:
    """Occurrences of the words in the raw bytes of a SQLite file's free pages (a deleted row's bytes
    stay there unless the writer zeroes them; ours do, `secure_delete`, and vacuum after a purge)."""
    data = path.read_bytes()
    if len(data) < 100:
        return 0
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    trunk, hits, seen = int.from_bytes(data[32:36], "big"), 0, set()
    while trunk and trunk not in seen:
        seen.add(trunk)
        page = data[(trunk - 1) * page_size: trunk * page_size]
        if len(page) < 8:
            break
        count = int.from_bytes(page[4:8], "big")
        leaves = [int.from_bytes(page[8 + 4 * i: 12 + 4 * i], "big") for i in range(min(count, (page_size - 8) // 4))]
        for number in [trunk, *leaves]:
            chunk = data[(number - 1) * page_size: number * page_size]
            hits += sum(1 for w in WORD.findall(chunk.decode("utf-8", errors="replace")) if w.lower() in words)
        trunk = int.from_bytes(page[0:4], "big")
    return hits


def duckdb_prose(sql: duckdb.DuckDBPyConnection, path: Path, tables: Mapping[str, Table]) -> int:
    """Rows of the store's declared tables whose prose holds one of the words `sql` binds (read-only)."""
    sql.execute(f"ATTACH {_literal(path)} AS checked_store (READ_ONLY)")
    try:
        present = {r[0] for r in sql.execute("SELECT table_name FROM information_schema.tables "
                                             "WHERE table_catalog = 'checked_store'").fetchall()}
        return sum(_holding(sql, f"checked_store.{name}", table.prose_columns, "rowid")
                   for name, table in tables.items() if name in present and table.prose_columns)
    finally:
        sql.execute("DETACH checked_store")


def parquet_prose(sql: duckdb.DuckDBPyConnection, path: Path, table: Table | None) -> int:
    """Rows of a snapshot file whose declared prose holds one of the words `sql` binds (a table no
    projector declares is the kernel's own, watermarks: no prose)."""
    if table is None or not table.prose_columns:
        return 0
    return _holding(sql, f"read_parquet({_literal(path)}, file_row_number = true)", table.prose_columns,
                    "file_row_number")


def _holding(sql: duckdb.DuckDBPyConnection, source: str, columns: tuple[str, ...], key: str) -> int:
    row = sql.execute(f"SELECT count(*) FROM ({sql_rows_holding(source, columns, key)})").fetchone()
    return int(row[0]) if row else 0


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def index_terms(folder: Path, tokens: set[str]) -> int:
    """How many of these terms a full-text index holds (in any document, deleted ones too)."""
    if not tokens or not (folder / "meta.json").exists():
        return 0
    index = FtsIndex(folder)
    try:
        return sum(1 for t in tokens if index.doc_freq(t))
    finally:
        index.close()


def orphan_segments(folder: Path) -> int:
    """Segment files of an index that its live segments do not list: an old segment's terms."""
    meta = folder / "meta.json"
    if not meta.exists():
        return 0
    live = {str(s.get("segment_id", "")).replace("-", "") for s in json.loads(meta.read_text()).get("segments", [])}
    stems = (p.name.split(".", 1)[0] for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    return sum(1 for stem in stems if len(stem) == 32 and stem not in live)
