"""The projection store kernel: one familiar's ``memory.duckdb``, whatever tables its projectors declare.

Everything in the file is a projection of the turn log (docs/architecture.md §1). Each
projector declares its tables (``tables.Table``) and keeps its own SQL beside them
(``projectors/<name>/``); this module knows none of them. It owns what every
projection shares:

* the connection: one process per file (DuckDB allows one), opened as an attachment
  of one in-process DuckDB instance (``_AttachedFiles``), so a step that opens a store
  per familiar pays ~1 ms per open, not ~16;
* the schema: a writer open creates and migrates the declared tables (``store_schema``);
  a read-only open (a notebook) never changes the file;
* ``transaction()``, which groups writes (a projection's outputs and its watermark), so a
  killed or failed run leaves neither behind;
* the watermarks: how far each projector has read, one row per projector;
* rebuilds (``drop_rows``: empty tables, restart sequences, delete watermarks) and
  table-by-table comparisons (``table_rows``).

Every timestamp is stored as a UTC ``TIMESTAMPTZ`` and returned as an aware UTC
``datetime`` (``times.as_utc``). Writes validate their input before touching the
database (``values``). A store object is not thread-safe; use one per thread (a run is
one thread).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import duckdb

from familiar_pipeline.storage import store_schema
from familiar_pipeline.storage.records import Watermark
from familiar_pipeline.storage.tables import Table, declared_tables, in_dependency_order, removal_sql, stale_sql
from familiar_pipeline.storage.times import as_utc, now_or
from familiar_pipeline.storage.values import as_int

# Sequence names `drop_rows` and `next_ids` accept (they are formatted into SQL).
_SEQUENCE = re.compile(r"^[a-z_][a-z0-9_]*_seq$")


class StoreError(RuntimeError):
    """A problem with the store file itself (not with one call's input)."""


class StoreLockedError(StoreError):
    """Another process holds the file (DuckDB allows one process per file)."""


class SchemaVersionError(StoreError):
    """The file's schema is not the one this code reads."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted on a store opened read-only."""


class _AttachedFiles:
    """The process's writable store files, each ATTACHed to one shared in-memory DuckDB instance.

    Creating a DuckDB instance costs ~16 ms of CPU (its catalog of built-in
    functions) and attaching a file to a live one ~1 ms; a projection step opens one
    store per familiar, so each gets a connection (a cursor) of the shared instance
    with its file as the default database (`USE`). The file is locked exactly as by
    `duckdb.connect` (one process per file) and released at DETACH, when its last
    store in this process closes, so two stores on one file share one attachment as
    two connections to the file shared one instance before. A forked child starts
    its own instance (a parent's does not survive the fork).
    """

    _lock = threading.Lock()
    _pid: int | None = None
    _host: duckdb.DuckDBPyConnection | None = None
    _files: dict[str, list] = {}  # resolved path -> [alias, open stores]
    _count = 0

    @classmethod
    def open(cls, path: Path) -> tuple[duckdb.DuckDBPyConnection, str]:
        """A connection whose default database is `path`; with the key to give `release`."""
        key = str(path.resolve())
        with cls._lock:
            if cls._pid != os.getpid():
                cls._pid, cls._host, cls._files, cls._count = os.getpid(), duckdb.connect(":memory:"), {}, 0
            host = cls._host
            assert host is not None  # this process's instance, started above
            entry = cls._files.get(key)
            if entry is None:
                cls._count += 1
                alias = f"familiar_store_{cls._count}"
                with host.cursor() as cursor:
                    cursor.execute(f"ATTACH '{key.replace(chr(39), chr(39) * 2)}' AS {alias}")
                entry = cls._files[key] = [alias, 0]
            entry[1] += 1
            conn = host.cursor()
        try:
            conn.execute(f"USE {entry[0]}")
        except BaseException:
            conn.close()
            cls.release(key)
            raise
        return conn, key

    @classmethod
    def release(cls, key: str) -> None:
        """One store of `key` closed (its connection first); the last one detaches the file."""
        with cls._lock:
            entry = cls._files.get(key)
            if entry is None or cls._pid != os.getpid():
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del cls._files[key]
            assert cls._host is not None  # the file was attached to this process's instance
            with cls._host.cursor() as cursor:
                cursor.execute(f"DETACH {entry[0]}")


class ProjectionStore:
    """One familiar's projection store (``memory.duckdb``); ``path=None`` is in-memory.

    ``tables``: the declared tables it holds (default: every table declared in this
    process, which is every registered projector's once the built-ins are registered).
    """

    def __init__(self, path: str | Path | None, *, read_only: bool = False, tables: Sequence[Table] | None = None):
        self.path = None if path is None else Path(path)
        self.read_only = read_only
        self.tables: dict[str, Table] = {t.name: t for t in (declared_tables() if tables is None else tables)}
        self._tx_depth = 0
        self._tx_error: duckdb.Error | None = None
        self._marks: dict[str, Watermark] | None = None  # see _watermark_rows
        self._attached: str | None = None  # the _AttachedFiles key of a writable file store
        self._conn: duckdb.DuckDBPyConnection | None
        if self.path is None:
            if read_only:
                raise ValueError("an in-memory store cannot be read-only: there is nothing to read")
            self._conn = duckdb.connect(":memory:")
        else:
            self._conn = self._connect_file(self.path, read_only)
        try:
            self._conn.execute("SET TimeZone = 'UTC'")
            self._open_schema()
        except BaseException:
            self.close()
            raise

    def _connect_file(self, path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
        if read_only and not path.exists():
            raise FileNotFoundError(f"no projection store at {path}")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if read_only:
                return duckdb.connect(str(path), read_only=True)
            conn, self._attached = _AttachedFiles.open(path)
            return conn
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreLockedError(
                    f"{path} is held by another process (a pipeline run?); DuckDB allows one "
                    "process per file, so retry when it finishes or read the serving snapshot"
                ) from exc
            raise

    def _open_schema(self) -> None:
        assert self._conn is not None
        found, count, fingerprints, views = store_schema.open_state(self._conn)
        where = self.path or "in-memory store"
        if found > store_schema.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where} has schema v{found}, newer than this code's "
                f"v{store_schema.SCHEMA_VERSION}; upgrade the code before opening it"
            )
        if found == 0 and count > 0:
            raise SchemaVersionError(f"{where} holds tables but no schema_version: not a familiar projection store")
        if not store_schema.needs_reconcile(self.tables.values(), found, fingerprints, views):
            return
        if self.read_only:
            if found < store_schema.SCHEMA_VERSION or any(t.name not in fingerprints for t in self.tables.values()):
                raise SchemaVersionError(
                    f"{where} has schema v{found}; this code reads v{store_schema.SCHEMA_VERSION}. "
                    "A read-only open never migrates: let a pipeline run (a writer) open it first"
                )
            return  # older views or columns a writer will add: reads of what exists still work
        store_schema.reconcile(self._conn, self.tables.values())

    @property
    def schema_version(self) -> int:
        return store_schema.open_state(self.conn)[0]

    @property
    def conn(self) -> duckdb.DuckDBPyConnection:
        """The raw DuckDB connection (snapshot publishing, notebooks-style SQL)."""
        if self._conn is None:
            raise StoreError("the store is closed")
        self._marks = None  # SQL written through it may change watermarks behind this store's back
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()  # ends (rolls back) a transaction still open on it
            finally:
                self._conn = None
                if self._attached is not None:
                    key, self._attached = self._attached, None
                    _AttachedFiles.release(key)

    def __enter__(self) -> "ProjectionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- statements

    def sql(self, sql: str, params: Sequence[Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Run one statement (what the projectors' table modules write their SQL through).

        A statement that fails inside ``transaction()`` dooms it: the block's exit rolls
        back even if the caller swallowed the error.
        """
        if self._conn is None:
            raise StoreError("the projection store is closed")
        try:
            return self._conn.execute(sql, list(params or []))
        except duckdb.Error as exc:
            if self._tx_depth and self._tx_error is None:
                self._tx_error = exc
            raise

    def next_ids(self, sequence: str, n: int) -> list[int]:
        """The next `n` values of `sequence` in one statement, in order (rows inserted together get them in order)."""
        if not _SEQUENCE.fullmatch(sequence):
            raise ValueError(f"invalid sequence name {sequence!r}")
        return [r[0] for r in self.sql(f"SELECT nextval('{sequence}') FROM range(?) ORDER BY range", [n]).fetchall()]

    @contextmanager
    def transaction(self) -> Iterator["ProjectionStore"]:
        """One short write transaction; a nested use joins the outer one.

        Any exception leaving the block rolls back everything written since
        the outermost ``transaction()`` began. A database error swallowed
        inside the block still aborts it: DuckDB would then turn the COMMIT
        into a silent rollback, so the block's exit raises ``StoreError``.
        """
        if self.read_only:
            raise ReadOnlyStoreError(f"{self.path} was opened read-only; writes go through a pipeline run")
        if self._tx_depth:
            self._tx_depth += 1
            try:
                yield self
            finally:
                self._tx_depth -= 1
            return
        self.sql("BEGIN TRANSACTION")
        self._tx_depth, self._tx_error = 1, None
        try:
            yield self
        except BaseException:
            self._tx_depth, self._marks = 0, None
            self.sql("ROLLBACK")
            raise
        self._tx_depth, failed = 0, self._tx_error
        if failed is not None:
            self._marks = None
            self.sql("ROLLBACK")
            raise StoreError(f"transaction rolled back: a statement inside it failed ({failed})") from failed
        try:
            self.sql("COMMIT")
        except BaseException:
            self._marks = None
            try:
                self.sql("ROLLBACK")
            except duckdb.Error:
                pass  # the failed COMMIT already ended the transaction
            raise

    # ----------------------------------------------------------------- watermarks

    def _watermark_rows(self) -> dict[str, Watermark]:
        """Every watermark row, read once and then kept in step by this store's own writes.

        A step asks for watermarks ~15 times per familiar (each projector its own and
        those it waits on) and sets ~5; one read instead of a statement each. Only
        this store writes the table while it is open (one writer per file), and the
        copy is dropped whenever that could be wrong: a rolled-back transaction,
        `drop_rows`, or SQL run through the raw `conn`.
        """
        if self._marks is None:
            rows = self.sql("SELECT projector, turn_id, fact_id, change_seq, updated_at FROM watermarks").fetchall()
            self._marks = {r[0]: Watermark(r[0], r[1] or 0, r[2] or 0, r[3] or 0, as_utc(r[4])) for r in rows}
        return self._marks

    def get_watermark(self, projector: str) -> Watermark:
        """How far ``projector`` has read; all zeros (and no time) when it never ran."""
        name = _projector_name(projector)
        return self._watermark_rows().get(name) or Watermark(name)

    def watermarks(self) -> list[Watermark]:
        """Every projector's watermark, by projector name."""
        marks = self._watermark_rows()
        return [marks[name] for name in sorted(marks)]

    def serving_watermark(self) -> dict:
        """What a serving snapshot published now is in step with: every projector's
        watermark (recorded in the snapshot's manifest; the turn sensor reads it there)."""
        marks = {
            m.projector: {"turn_id": int(m.turn_id), "fact_id": int(m.fact_id), "change_seq": int(m.change_seq)}
            for m in self.watermarks()
        }
        return {"projectors": marks}

    def set_watermark(
        self,
        projector: str,
        *,
        turn_id: int | None = None,
        fact_id: int | None = None,
        change_seq: int | None = None,
        now: Any = None,
    ) -> Watermark:
        """Set the given axes of ``projector``'s watermark; axes left as None keep their value."""
        name = _projector_name(projector)
        given = {
            axis: as_int(value, axis, minimum=0)
            for axis, value in (("turn_id", turn_id), ("fact_id", fact_id), ("change_seq", change_seq))
            if value is not None
        }
        if not given:
            raise ValueError("set_watermark needs at least one of turn_id, fact_id, change_seq")
        at = now_or(now)
        with self.transaction():
            marks = self._watermark_rows()
            prior = marks.get(name)
            base = prior or Watermark(name)
            mark = Watermark(
                name,
                given.get("turn_id", base.turn_id),
                given.get("fact_id", base.fact_id),
                given.get("change_seq", base.change_seq),
                at,
            )
            # An in-place UPDATE of a known row costs a third of INSERT OR REPLACE (a delete and an insert).
            if prior is None:
                self.sql("INSERT INTO watermarks VALUES (?, ?, ?, ?, ?)",
                         [mark.projector, mark.turn_id, mark.fact_id, mark.change_seq, at])
            else:
                self.sql("UPDATE watermarks SET turn_id = ?, fact_id = ?, change_seq = ?, updated_at = ? WHERE projector = ?",
                         [mark.turn_id, mark.fact_id, mark.change_seq, at, mark.projector])
            marks[name] = mark
        return mark

    # ----------------------------------------------------------------- rows of declared tables

    def table(self, name: str) -> Table:
        """The declaration of a table this store holds."""
        try:
            return self.tables[name]
        except KeyError:
            raise ValueError(f"unknown table {name!r}; known: {', '.join(sorted(self.tables))}") from None

    def rows(self, table: Table, where: str = "", params: Sequence[Any] = (), *, order: str | None = None,
             limit: int | None = None) -> list[Any]:
        """Records of ``table`` (alias ``t``) matching ``where``, by its key unless ``order`` says otherwise."""
        sql = table.select_sql("t")
        if where:
            sql += f" WHERE {where}"
        sql += " ORDER BY " + (order or ", ".join(f"t.{k}" for k in table.key))
        if limit is not None:
            sql += f" LIMIT {as_int(limit, 'limit')}"
        return [table.from_row(row) for row in self.sql(sql, params).fetchall()]

    def count(self, table: Table, where: str = "", params: Sequence[Any] = ()) -> int:
        sql = f"SELECT count(*) FROM {table.name} t" + (f" WHERE {where}" if where else "")
        row = self.sql(sql, params).fetchone()
        assert row is not None  # an aggregate returns one row
        return int(row[0])

    # ----------------------------------------------------------------- rebuilds and comparison

    def drop_rows(
        self,
        *,
        watermarks: Iterable[str],
        tables: Iterable[str] = (),
        sequences: Iterable[str] = (),
        before: Iterable[Callable[["ProjectionStore"], None]] = (),
    ) -> None:
        """Delete projection rows so they rebuild from turns, in one transaction.

        Runs each of `before`, empties `tables` in the order given (dependants
        first), restarts `sequences` at 1 and deletes the `watermarks` rows.
        What each projection drops is declared by its projector
        (`familiar_pipeline.engine.registry.drop_projection` resolves it).
        """
        tables, sequences, watermarks = list(tables), list(sequences), list(watermarks)
        unknown = [t for t in tables if t not in self.tables]
        if unknown:
            raise ValueError(f"cannot drop table(s) {', '.join(unknown)}; known: {', '.join(sorted(self.tables))}")
        bad = [q for q in sequences if not _SEQUENCE.fullmatch(q)]
        if bad:
            raise ValueError(f"invalid sequence name(s) {', '.join(map(repr, bad))}")
        with self.transaction():
            for step in before:
                step(self)
            for table in tables:
                self.sql(f'DELETE FROM "{table}"')
            for sequence in sequences:
                self.sql(f"CREATE OR REPLACE SEQUENCE {sequence} START 1")
            self.sql("DELETE FROM watermarks WHERE projector IN (SELECT unnest(?))", [watermarks])
            self._marks = None

    def remove_resting_on(self, turn_ids: Iterable[int]) -> dict[str, int]:
        """Delete every row resting on these (edited or deleted) turns, directly or through removed rows.

        One generic pass over the declared provenance (`tables.removal_sql`), tables in
        dependency order, in one transaction: a fact citing a turn goes, then every row
        built through that fact. Tables whose projector follows changes itself
        (``on_change="own"``: dossiers, summaries, turn vectors) are left to it. Rows
        deleted per table (tables with none left out).
        """
        turns = sorted({as_int(t, "turn id") for t in turn_ids})
        removed: dict[str, int] = {}
        with self.transaction():
            for table in in_dependency_order(self.tables.values()):
                sql = removal_sql(table, self.tables)
                if sql is None:
                    continue
                n = len(self.sql(sql.replace("$turns", "?::BIGINT[]"), [turns] * sql.count("$turns")).fetchall())
                if n:
                    removed[table.name] = n
        return removed

    def stale_keys(self, table: Table) -> list[tuple]:
        """Keys of ``table``'s rows built through a row that is gone (`tables.stale_sql`), in key order."""
        sql = stale_sql(table, self.tables)
        return [tuple(row) for row in self.sql(sql).fetchall()] if sql else []

    def table_rows(self, table: str, *, exclude: Iterable[str] = ()) -> list[tuple]:
        """Every row of ``table`` in key order, for table-by-table comparisons.

        ``exclude`` leaves columns out, e.g. ``system_time_columns()`` when
        comparing a rebuild with an incremental build made at other times.
        """
        keys = self.tables[table].key if table in self.tables else store_schema.KERNEL_KEYS.get(table)
        if keys is None:
            raise ValueError(f"unknown table {table!r}; known: {', '.join(sorted([*self.tables, *store_schema.KERNEL_KEYS]))}")
        columns = [row[0] for row in self.sql(f'DESCRIBE "{table}"').fetchall()]
        dropped = set(exclude)
        unknown = dropped - set(columns) - set(self.system_time_columns())
        if unknown:
            raise ValueError(f"{table} has no column(s) {', '.join(sorted(unknown))}")
        kept = [c for c in columns if c not in dropped]
        order = ", ".join(f'"{c}"' for c in keys)
        select = ", ".join(f'"{c}"' for c in kept)
        return [tuple(row) for row in self.sql(f'SELECT {select} FROM "{table}" ORDER BY {order}').fetchall()]

    def system_time_columns(self) -> tuple[str, ...]:
        """Columns that carry wall-clock system time in any table: what a rebuild cannot reproduce."""
        kernel = ("updated_at", "applied_at")
        return tuple(dict.fromkeys([*kernel, *(c for t in self.tables.values() for c in t.system_time_columns)]))


def _projector_name(projector: Any) -> str:
    if not isinstance(projector, str) or not projector.strip():
        raise ValueError(f"projector name must be a non-empty string, got {projector!r}")
    return projector
