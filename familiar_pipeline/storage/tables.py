"""Declared tables: each derived table of ``memory.duckdb`` is declared once, here generated from.

A projector declares its tables next to its code (``projectors/<name>/tables.py``) as
a frozen record dataclass whose fields carry :func:`col` metadata, wrapped in a
:class:`Table`. From that one declaration come:

* the DDL (``CREATE TABLE``, its sequence and indexes), and the additive migration
  of a store written by older code (a missing table is created, a missing column
  added and filled: :meth:`Table.missing_columns`, run by ``store_schema``);
* the served (Parquet) query and its Arrow schema (``snapshots`` publishes and
  validates with them);
* the record type itself, and the mapping of store rows and Arrow tables to it;
* the common reads every table needs: all rows, rows by key, rows of a scope, and
  which turns each row came from (:func:`provenance_sql`).

Every derived table says where each of its rows came from (its **provenance**: the
source turn ids, directly or through the rows it was built from) and which
conversation scope it belongs to (its ``scope`` column, see ``scopes``). Reading by
scope, retiring what a deleted turn produced and erasing a person are then one
generic mechanism each over these declarations, not a special case per projector.

A declaration is registered by name when it is created; the store creates and
publishes the tables of the projectors registered with it, and a reader finds a
served table's schema here (a table not declared in this process is read as stored).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from familiar_pipeline.storage.times import as_utc

# The scope column every derived table carries (see `scopes`).
SCOPE = "scope"

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
_TS = pa.timestamp("us", tz="UTC")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# DuckDB type -> Arrow type of the served column. A served column's DuckDB type is
# its `serve_type` (or its stored type): the Parquet schema is a stable contract for
# the bot and notebooks, whatever the store declares.
_ARROW: dict[str, pa.DataType] = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "TINYINT": pa.int8(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "DOUBLE": pa.float64(),
    "FLOAT": pa.float32(),
    "TIMESTAMPTZ": _TS,
}


def arrow_type(sql_type: str) -> pa.DataType:
    """The Arrow type of a DuckDB type: scalars, ``T[]`` lists, and ``STRUCT(a T, ...)[]``."""
    text = sql_type.strip()
    if text.endswith("[]"):
        return pa.list_(arrow_type(text[:-2]))
    struct = re.fullmatch(r"STRUCT\((.*)\)", text)
    if struct:
        parts = [p.strip().split(None, 1) for p in struct.group(1).split(",")]
        return pa.struct([(name, arrow_type(kind)) for name, kind in parts])
    try:
        return _ARROW[text]
    except KeyError:
        raise ValueError(f"no Arrow type for DuckDB type {sql_type!r}") from None


@dataclass(frozen=True)
class Column:
    """One column of a declared table.

    ``sql`` is the stored DuckDB type; ``serve_type`` the type it is served as when
    they differ, ``serve_sql`` the served expression when it is not the column itself
    (alias ``t`` is the table; a table's ``serve_from`` may join others); ``stored``
    False marks a record field that is only served (built by ``serve_sql``).
    ``system_time`` marks wall-clock columns that a rebuild cannot reproduce (left out
    when comparing it with an incremental build). ``fill`` is the SQL value existing
    rows get when a migration adds the column to a store written by older code.
    ``prose`` marks free text written from what people said (a fact, a summary): an erasure
    deletes a row whose prose still holds a word only the erased turns used (`erasure.purge`).
    """

    name: str
    sql: str
    nullable: bool = False
    served: bool = True
    stored: bool = True
    in_record: bool = True
    serve_type: str | None = None
    serve_sql: str | None = None
    system_time: bool = False
    fill: str | None = None
    check: str | None = None
    prose: bool = False

    def __post_init__(self) -> None:
        if not _IDENT.fullmatch(self.name):
            raise ValueError(f"bad column name {self.name!r}")
        if self.prose and self.sql != "VARCHAR":
            raise ValueError(f"column {self.name!r}: prose is VARCHAR, not {self.sql}")
        arrow_type(self.serve_type or self.sql)  # fails early on a type we cannot serve

    @property
    def is_list(self) -> bool:
        return self.sql.endswith("[]")

    @property
    def is_time(self) -> bool:
        return self.sql == "TIMESTAMPTZ"

    def ddl(self) -> str:
        check = f" CHECK ({self.check})" if self.check else ""
        return f"{self.name} {self.sql}{'' if self.nullable else ' NOT NULL'}{check}"


def col(sql: str, *, nullable: bool = False, served: bool = True, stored: bool = True,
        serve_type: str | None = None, serve_sql: str | None = None, system_time: bool = False,
        fill: str | None = None, check: str | None = None, prose: bool = False,
        default: Any = dataclasses.MISSING) -> Any:
    """A record field that is a table column (see :class:`Column`); its name is the field's."""
    meta = dict(sql=sql, nullable=nullable, served=served, stored=stored, serve_type=serve_type,
                serve_sql=serve_sql, system_time=system_time, fill=fill, check=check, prose=prose)
    return field(default=default, metadata={"column": meta})


@dataclass(frozen=True)
class Through:
    """Provenance through another table: ``column`` holds ids (one, or a ``BIGINT[]``) of
    rows of ``table`` (by its single-column key), whose own provenance applies."""

    column: str
    table: str


@dataclass(frozen=True)
class Provenance:
    """Where each row came from, as turn ids of the turn log.

    ``turns``: columns holding source turn ids (a ``BIGINT`` or a ``BIGINT[]``);
    ``through``: rows of other tables this row was built from; ``upto``: a column
    ``c`` saying the row was built from every turn of its scope with id <= ``c``
    (a compounding summary). A row's sources are the union of all three.
    """

    turns: tuple[str, ...] = ()
    through: tuple[Through, ...] = ()
    upto: str | None = None
    # When a source goes (a turn edited or deleted, a row it was built through removed):
    # "delete" — the row goes with it (`removal_sql`, run by `ProjectionStore.remove_resting_on`);
    # "own" — its projector follows the change itself (rebuilds the row, or re-embeds the turn).
    on_change: str = "delete"

    def __post_init__(self) -> None:
        if not (self.turns or self.through or self.upto):
            raise ValueError("a derived table must say where its rows come from (turns, through or upto)")
        if self.on_change not in ("delete", "own"):
            raise ValueError(f"on_change is 'delete' or 'own', not {self.on_change!r}")


@dataclass(frozen=True)
class Index:
    """A single-column index (DuckDB uses only those, and only for equality)."""

    name: str
    column: str


@dataclass(frozen=True)
class Internal:
    """A stored column that is not part of the record (a store internal such as a dedup key),
    placed right after ``after`` so a fresh store's column order equals a migrated one's."""

    column: Column
    after: str


@dataclass(frozen=True)
class Migration:
    """What bringing an older store's table up to this declaration takes beyond adding its
    missing columns: SQL run once, after they were added (a backfill, a renamed value)."""

    name: str
    sql: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """One derived table, declared once (module doc).

    ``record`` is the frozen dataclass of its rows (fields from :func:`col`); ``key`` the
    columns that identify and order rows; ``sequence`` the id sequence, if any; ``internal``
    store-only columns; ``serve_from`` the FROM clause of the served query when it joins
    (alias ``t`` is this table); ``views`` notebook views (name -> CREATE OR REPLACE ...);
    ``migrations`` what older stores need beyond new columns, applied once each in order.
    """

    name: str
    record: type
    key: tuple[str, ...]
    provenance: Provenance
    sequence: str | None = None
    indexes: tuple[Index, ...] = ()
    internal: tuple[Internal, ...] = ()
    checks: tuple[str, ...] = ()
    serve_from: str | None = None
    description: str = ""
    views: Mapping[str, str] = field(default_factory=dict)
    migrations: tuple[Migration, ...] = ()
    columns: tuple[Column, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not _IDENT.fullmatch(self.name):
            raise ValueError(f"bad table name {self.name!r}")
        if not (isinstance(self.record, type) and dataclasses.is_dataclass(self.record)):
            raise TypeError(f"table {self.name!r}: record must be a dataclass")
        after: dict[str, list[Column]] = {}
        for extra in self.internal:
            after.setdefault(extra.after, []).append(
                dataclasses.replace(extra.column, in_record=False, served=False))
        columns: list[Column] = []
        for f in dataclasses.fields(self.record):
            meta = f.metadata.get("column")
            if meta is None:
                raise TypeError(f"table {self.name!r}: record field {f.name!r} is not declared with col()")
            columns.append(Column(f.name, **meta))
            columns += after.pop(f.name, [])
        if after:
            raise ValueError(f"table {self.name!r}: internal columns after unknown column(s) {sorted(after)}")
        object.__setattr__(self, "columns", tuple(columns))
        object.__setattr__(self, "key", tuple(self.key))
        names = {c.name for c in self.columns}
        if SCOPE not in names:
            raise ValueError(f"table {self.name!r} has no {SCOPE!r} column: every derived row belongs to a scope")
        missing = [c for c in (*self.key, *self.provenance.turns, *(t.column for t in self.provenance.through),
                               *([self.provenance.upto] if self.provenance.upto else [])) if c not in names]
        if missing:
            raise ValueError(f"table {self.name!r} names unknown column(s) {missing}")
        if self.sequence is not None and not re.fullmatch(r"[a-z_][a-z0-9_]*_seq", self.sequence):
            raise ValueError(f"table {self.name!r}: sequence names end in _seq, got {self.sequence!r}")
        register(self)

    # ---------------------------------------------------------------- shape

    @property
    def stored(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.stored)

    @property
    def served(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.served)

    @property
    def record_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.in_record)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}")

    @property
    def prose_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.stored if c.prose)

    @property
    def system_time_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.stored if c.system_time)

    # ---------------------------------------------------------------- DDL

    def ddl(self) -> list[str]:
        """The statements that create this table in an empty store."""
        body = [c.ddl() for c in self.stored]
        if self.key:
            body.append(f"PRIMARY KEY ({', '.join(self.key)})")
        body += [f"CHECK ({check})" for check in self.checks]
        statements = [f"CREATE SEQUENCE {self.sequence} START 1"] if self.sequence else []
        statements.append(f"CREATE TABLE {self.name} (\n    " + ",\n    ".join(body) + "\n)")
        statements += [f"CREATE INDEX {i.name} ON {self.name} ({i.column})" for i in self.indexes]
        return statements

    def fingerprint(self) -> str:
        """Changes whenever the stored shape or the migrations change (the store then reconciles)."""
        text = "\n".join([*self.ddl(), *(f"{m.name}:{';'.join(m.sql)}" for m in self.migrations)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- serving

    def served_sql(self) -> str:
        """The query a snapshot publishes: every served column cast to its served type, in key order."""
        parts = []
        for c in self.served:
            expr = c.serve_sql or f"t.{c.name}"
            parts.append(f"({expr})::{c.serve_type or c.sql} AS {c.name}")
        source = self.serve_from or f"{self.name} AS t"
        order = ", ".join(f"t.{k}" for k in self.key)
        return f"SELECT {', '.join(parts)} FROM {source}" + (f" ORDER BY {order}" if order else "")

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(c.name, arrow_type(c.serve_type or c.sql)) for c in self.served])

    # ---------------------------------------------------------------- records

    def select_sql(self, alias: str = "t") -> str:
        """``SELECT`` of the stored record columns (times as UTC wall-clock TIMESTAMP: see `from_row`)."""
        parts = [f"{alias}.{c.name}::TIMESTAMP" if c.is_time else f"{alias}.{c.name}"
                 for c in self.record_columns if c.stored]
        return f"SELECT {', '.join(parts)} FROM {self.name} {alias}"

    def from_row(self, row: Sequence[Any], **extra: Any) -> Any:
        """A record from a `select_sql` row; ``extra`` gives the fields that are not stored.

        Times are fetched as UTC wall-clock TIMESTAMPs and tagged here: DuckDB's
        TIMESTAMPTZ-to-Python conversion costs several microseconds per value.
        """
        values = dict(extra)
        stored = [c for c in self.record_columns if c.stored]
        for c, value in zip(stored, row):
            if c.is_time:
                value = as_utc(value)
            elif c.is_list and value is not None:
                value = tuple(value)
            values[c.name] = value
        return self.record(**values)

    def records(self, table: pa.Table, **extra: Sequence[Any]) -> list[Any]:
        """Records of a served Arrow table (every record field must be served or given in ``extra``)."""
        names = [c.name for c in self.record_columns]
        values = {name: (extra[name] if name in extra else column_values(table[name])) for name in names}
        return [self.record(**dict(zip(names, row))) for row in zip(*(values[n] for n in names))]


def column_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """An Arrow column as Python values: timestamps as aware UTC datetimes, lists as tuples.

    Timestamps are read as their int64 microseconds (a zero-copy view) and added to
    the epoch: Arrow's own conversion of a tz-aware timestamp was measured at about
    20 us per value, which made four timestamps per candidate fact the largest cost
    of a reply's fact lookup.
    """
    if pa.types.is_timestamp(column.type):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        return [None if v is None else _EPOCH + timedelta(microseconds=v)
                for chunk in chunks for v in chunk.view(pa.int64()).to_pylist()]
    if pa.types.is_list(column.type) and not pa.types.is_struct(column.type.value_type):
        return [None if v is None else tuple(v) for v in column.to_pylist()]
    return column.to_pylist()


# --------------------------------------------------------------------------- provenance


def provenance_sql(table: Table, tables: Mapping[str, Table] | None = None) -> str:
    """``SELECT key, turn_id`` pairs: every source turn of every row of ``table``.

    ``upto`` sources are all turns of the row's scope up to its column; they live in
    the turn log, not the store, so they come out as the pair ``(key, -upto)``: a
    negative turn id stands for "every turn of the scope with id <= its magnitude".
    """
    known = dict(tables or _TABLES)
    key = table.key[0] if len(table.key) == 1 else None
    if key is None:
        key_expr = "struct_pack(" + ", ".join(f"{k} := p.{k}" for k in table.key) + ")"
    else:
        key_expr = f"p.{key}"
    parts = []
    for name in table.provenance.turns:
        column = table.column(name)
        value = f"unnest(p.{name})" if column.is_list else f"p.{name}"
        parts.append(f"SELECT {key_expr} AS row_key, {value} AS turn_id FROM {table.name} p")
    if table.provenance.upto:
        parts.append(f"SELECT {key_expr} AS row_key, -p.{table.provenance.upto} AS turn_id FROM {table.name} p")
    for through in table.provenance.through:
        source = known.get(through.table)
        if source is None or len(source.key) != 1:
            raise ValueError(f"table {table.name!r}: provenance through {through.table!r}, which is not declared "
                             "with a single-column key")
        column = table.column(through.column)
        ids = f"unnest(p.{through.column})" if column.is_list else f"p.{through.column}"
        parts.append(
            f"SELECT r.row_key, s.turn_id FROM (SELECT {key_expr} AS row_key, {ids} AS source_id FROM {table.name} p) r "
            f"JOIN ({provenance_sql(source, known)}) s ON s.row_key = r.source_id"
        )
    return " UNION ALL ".join(parts)


def _gone_sources(table: Table, known: Mapping[str, Table]) -> list[str]:
    """Conditions true of a row of ``table`` built through a row that no longer exists."""
    conditions = []
    for through in table.provenance.through:
        source = known.get(through.table)
        if source is None or len(source.key) != 1:
            continue
        key = source.key[0]
        if table.column(through.column).is_list:
            conditions.append(f"EXISTS (SELECT 1 FROM (SELECT unnest({through.column}) AS i) u "
                              f"WHERE u.i NOT IN (SELECT {key} FROM {source.name}))")
        else:
            conditions.append(f"{through.column} NOT IN (SELECT {key} FROM {source.name})")
    return conditions


def removal_sql(table: Table, tables: Mapping[str, Table] | None = None) -> str | None:
    """``DELETE`` of the rows of ``table`` resting on a changed turn or on a row that is gone, or None.

    Parameter ``$turns`` (``BIGINT[]``): the changed turns. A row goes when one of its
    ``turns`` columns names one of them, or when a row it was built ``through`` no longer
    exists in its table (run in dependency order, so a removal reaches every row built on
    it). Returns the deleted rows' keys. None for a table whose projector follows changes
    itself (``on_change="own"``).
    """
    if table.provenance.on_change != "delete":
        return None
    hits = []
    for name in table.provenance.turns:
        hit = "list_has_any({c}, $turns)" if table.column(name).is_list else "{c} IN (SELECT unnest($turns))"
        hits.append(hit.format(c=name))
    hits += _gone_sources(table, dict(tables or _TABLES))
    if not hits:
        return None
    return f"DELETE FROM {table.name} WHERE " + " OR ".join(f"({h})" for h in hits) + \
        " RETURNING " + ", ".join(table.key)


def stale_sql(table: Table, tables: Mapping[str, Table] | None = None) -> str | None:
    """``SELECT`` of the keys of ``table``'s rows built through a row that no longer exists, or None.

    For a table whose projector follows changes itself (a dossier that folded a removed fact
    is rebuilt, not deleted, by its projector).
    """
    conditions = _gone_sources(table, dict(tables or _TABLES))
    if not conditions:
        return None
    return (f"SELECT {', '.join(table.key)} FROM {table.name} WHERE " + " OR ".join(f"({c})" for c in conditions)
            + f" ORDER BY {', '.join(table.key)}")


# --------------------------------------------------------------------------- the declarations


_TABLES: dict[str, Table] = {}


def register(table: Table) -> None:
    """Record a declaration by name (a redeclaration with the same name replaces it)."""
    _TABLES[table.name] = table


def unregister(name: str) -> None:
    """Forget a declaration (its projector was unregistered)."""
    _TABLES.pop(name, None)


def declared(name: str) -> Table | None:
    return _TABLES.get(name)


def declared_tables() -> tuple[Table, ...]:
    return tuple(_TABLES.values())


def in_dependency_order(tables: Iterable[Table]) -> list[Table]:
    """Tables ordered so that each comes after the tables its provenance goes through."""
    pending = {t.name: t for t in tables}
    done: list[Table] = []
    placed: set[str] = set()
    while pending:
        ready = [t for t in pending.values() if all(x.table in placed or x.table not in pending
                                                    for x in t.provenance.through)]
        if not ready:
            raise ValueError(f"provenance cycle among tables {sorted(pending)}")
        for t in ready:
            done.append(t)
            placed.add(t.name)
            del pending[t.name]
    return done
