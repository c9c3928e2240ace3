"""The schema of ``memory.duckdb``: the kernel's own tables, and every declared table made to match its declaration.

The file is written only by pipeline runs, so the schema changes when a *writer*
opens it; a read-only open never changes the file (it may be a notebook peeking
while no run holds it).

The kernel owns three tables: ``schema_version`` (the kernel's version, below),
``watermarks`` (how far each projector has read, written in the same transaction as
its outputs) and ``table_versions`` (per declared table, the fingerprint of the
declaration it was last made to match, and the named migrations applied to it).
Every other table is declared by a projector (``tables.Table``) and reconciled at a
writer open when its fingerprint changed: created from its declaration when
missing; otherwise its missing columns are added (existing rows get the column's
``fill``), its missing indexes created, and its declared migrations not yet applied
run once. Each table's reconcile commits together with its ``table_versions`` row,
so a crash mid-migration leaves the file consistent, and the next writer open
picks up where it stopped.

Kernel versions: 1-4 created the tables by hand-written DDL (main up to 3e67a85);
5 reconciles them from declarations, which adds the ``scope`` and provenance
columns to stores written before them (tests/test_store_migration.py opens such a
store, exported by that code).

Notebook views come with their tables' declarations; they are derived SQL, so each
writer open whose views fingerprint changed replaces them all.

Two DuckDB facts shape the declared DDL (checked against duckdb 2.0.1): only a
single-column ART index is used for lookups, and only for equality on that column;
and columns that updates touch should carry no index, so the update stays in place.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import duckdb

from familiar_pipeline.storage.tables import Table, in_dependency_order

SCHEMA_VERSION = 5

KERNEL_DDL: dict[str, str] = {
    "schema_version": "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)",
    "watermarks": """
        CREATE TABLE watermarks (
            projector  VARCHAR PRIMARY KEY,
            turn_id    BIGINT NOT NULL DEFAULT 0,
            fact_id    BIGINT NOT NULL DEFAULT 0,
            change_seq BIGINT NOT NULL DEFAULT 0,
            updated_at TIMESTAMPTZ NOT NULL
        )
    """,
    "table_versions": """
        CREATE TABLE table_versions (
            name        VARCHAR PRIMARY KEY,
            fingerprint VARCHAR NOT NULL,
            migrations  VARCHAR[] NOT NULL,
            updated_at  TIMESTAMPTZ NOT NULL
        )
    """,
}
# The kernel's tables with the columns that order their rows.
KERNEL_KEYS: dict[str, tuple[str, ...]] = {
    "watermarks": ("projector",),
    "schema_version": ("version",),
    "table_versions": ("name",),
}
VIEWS_TABLE = "notebook_views_version"


class SchemaError(RuntimeError):
    """The file is not a projection store this code can open (message says why)."""


def open_state(conn: duckdb.DuckDBPyConnection) -> tuple[int, int, dict[str, str], str | None]:
    """(kernel version, table count, table fingerprints, views fingerprint) in at most two statements."""
    rows = conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database()"
    ).fetchall()
    names = {table for schema, table in rows if schema == "main"}
    if "schema_version" not in names:
        return 0, len(rows), {}, None
    versions = "(SELECT map(list(name), list(fingerprint)) FROM table_versions)" if "table_versions" in names else "NULL"
    views = f"(SELECT max(fingerprint) FROM {VIEWS_TABLE})" if VIEWS_TABLE in names else "NULL"
    row = conn.execute(f"SELECT (SELECT max(version) FROM schema_version), {versions}, {views}").fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    version, fingerprints, view_print = row
    return int(version or 0), len(rows), dict(fingerprints or {}), view_print


def needs_reconcile(tables: Iterable[Table], version: int, fingerprints: dict[str, str], views: str | None) -> bool:
    tables = list(tables)
    return (version < SCHEMA_VERSION or any(fingerprints.get(t.name) != t.fingerprint() for t in tables)
            or views != views_fingerprint(tables))


def _has(conn: duckdb.DuckDBPyConnection, kind: str, name: str) -> bool:
    function = {"table": "duckdb_tables()", "index": "duckdb_indexes()", "sequence": "duckdb_sequences()"}[kind]
    column = {"table": "table_name", "index": "index_name", "sequence": "sequence_name"}[kind]
    row = conn.execute(f"SELECT count(*) FROM {function} WHERE database_name = current_database() "
                       f"AND schema_name = 'main' AND {column} = ?", [name]).fetchone()
    return bool(row and row[0])


def _columns(conn: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [row[0] for row in conn.execute(f'DESCRIBE "{table}"').fetchall()]


def reconcile(conn: duckdb.DuckDBPyConnection, tables: Iterable[Table]) -> list[str]:
    """Bring the kernel tables and every declared table up to this code; returns what it changed."""
    changed: list[str] = []
    for name, ddl in KERNEL_DDL.items():
        if not _has(conn, "table", name):
            conn.execute(ddl)
            changed.append(f"created {name}")
    applied = {row[0]: (row[1], list(row[2])) for row in
               conn.execute("SELECT name, fingerprint, migrations FROM table_versions").fetchall()}
    ordered = in_dependency_order(tables)
    for table in ordered:
        recorded = applied.get(table.name)
        if recorded is not None and recorded[0] == table.fingerprint():
            continue
        conn.execute("BEGIN TRANSACTION")
        try:
            done = _reconcile_table(conn, table, recorded[1] if recorded else None, changed)
            conn.execute("INSERT OR REPLACE INTO table_versions VALUES (?, ?, ?, now())",
                         [table.name, table.fingerprint(), done])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    assert row is not None  # an aggregate returns one row
    version = row[0]
    if version < SCHEMA_VERSION:
        conn.execute("INSERT INTO schema_version VALUES (?, now())", [SCHEMA_VERSION])
        changed.append(f"schema v{version} -> v{SCHEMA_VERSION}")
    create_views(conn, ordered)
    return changed


def _reconcile_table(conn: duckdb.DuckDBPyConnection, table: Table, migrations: list[str] | None,
                     changed: list[str]) -> list[str]:
    """One table made to match its declaration; returns the names of the migrations now applied."""
    if not _has(conn, "table", table.name):
        for statement in table.ddl():
            if statement.startswith("CREATE SEQUENCE") and table.sequence and _has(conn, "sequence", table.sequence):
                continue
            conn.execute(statement)
        changed.append(f"created {table.name}")
        return [m.name for m in table.migrations]  # a table created now needs none of them
    present = set(_columns(conn, table.name))
    missing = [c for c in table.stored if c.name not in present]
    if missing:  # DuckDB alters no table an index depends on: its indexes go, and come back below
        for (index,) in conn.execute("SELECT index_name FROM duckdb_indexes() WHERE database_name = current_database() "
                                     "AND table_name = ?", [table.name]).fetchall():
            conn.execute(f'DROP INDEX "{index}"')
    for column in missing:
        if column.fill is None and not column.nullable:
            raise SchemaError(f"{table.name}.{column.name} is new and has no fill for existing rows")
        fill = f" DEFAULT {column.fill}" if column.fill is not None else ""
        conn.execute(f"ALTER TABLE {table.name} ADD COLUMN {column.ddl()}{fill}")
        if fill:
            conn.execute(f"ALTER TABLE {table.name} ALTER COLUMN {column.name} DROP DEFAULT")
        changed.append(f"added {table.name}.{column.name}")
    if _primary_key(conn, table.name) != table.key:
        _rekey(conn, table)
        changed.append(f"rekeyed {table.name} by ({', '.join(table.key)})")
    if table.sequence and not _has(conn, "sequence", table.sequence):
        conn.execute(f"CREATE SEQUENCE {table.sequence} START 1")
    for index in table.indexes:
        if not _has(conn, "index", index.name):
            conn.execute(f"CREATE INDEX {index.name} ON {table.name} ({index.column})")
    done = list(migrations or [])
    for migration in table.migrations:
        if migration.name not in done:
            for statement in migration.sql:
                conn.execute(statement)
            done.append(migration.name)
            changed.append(f"migrated {table.name}: {migration.name}")
    return done


def _primary_key(conn: duckdb.DuckDBPyConnection, table: str) -> tuple[str, ...]:
    row = conn.execute("SELECT constraint_column_names FROM duckdb_constraints() WHERE database_name = current_database() "
                       "AND table_name = ? AND constraint_type = 'PRIMARY KEY'", [table]).fetchone()
    return tuple(row[0]) if row else ()


def _rekey(conn: duckdb.DuckDBPyConnection, table: Table) -> None:
    """A table whose declared key changed, copied into one with the new key (DuckDB alters no
    primary key in place); every row is kept, and a key that would now be duplicated is an error."""
    temporary = f"{table.name}__rekey"
    [create] = [s for s in table.ddl() if s.startswith("CREATE TABLE ")]
    conn.execute(create.replace(f"CREATE TABLE {table.name} (", f"CREATE TABLE {temporary} (", 1))
    columns = ", ".join(c.name for c in table.stored)
    try:
        conn.execute(f"INSERT INTO {temporary} ({columns}) SELECT {columns} FROM {table.name}")
    except duckdb.ConstraintException as exc:
        raise SchemaError(f"{table.name}: its rows are not unique by the new key ({', '.join(table.key)}): {exc}") from None
    conn.execute(f"DROP TABLE {table.name}")
    conn.execute(f"ALTER TABLE {temporary} RENAME TO {table.name}")


def views_fingerprint(tables: Iterable[Table]) -> str:
    text = "\n;\n".join(sql for t in tables for sql in t.views.values())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def create_views(conn: duckdb.DuckDBPyConnection, tables: list[Table]) -> None:
    """(Re)create the declared notebook views and macros, in one transaction."""
    conn.execute("BEGIN TRANSACTION")
    try:
        for table in tables:
            for statement in table.views.values():
                conn.execute(statement)
        conn.execute(f"CREATE OR REPLACE TABLE {VIEWS_TABLE} (fingerprint VARCHAR)")
        conn.execute(f"INSERT INTO {VIEWS_TABLE} VALUES (?)", [views_fingerprint(tables)])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
