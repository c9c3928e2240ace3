"""One loaded snapshot: immutable Arrow tables, checked against their declarations, with per-snapshot caches.

Queries run with pyarrow compute over the immutable tables, so everything here is
safe to call from several threads without a lock. (An in-process DuckDB was measured
here at 20-150 ms per connect and ~1 ms per query; pyarrow answers a reply's small
lookups in well under a millisecond.) What a table means is its projector's business:
each declared table's reads over a snapshot live beside its declaration
(``projectors/<name>/reads.py``); this module knows tables only by their declarations.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from familiar_pipeline.storage.records import Watermark
from familiar_pipeline.storage.tables import Table, column_values, declared

from .manifest import Manifest, SnapshotFormatError, TableFile, damage
from .vectors import load_context_matrices, where

T = TypeVar("T")

_WATERMARKS = pa.schema([("projector", pa.string()), ("turn_id", pa.int64()), ("fact_id", pa.int64()),
                         ("change_seq", pa.int64()), ("updated_at", pa.timestamp("us", tz="UTC"))])


def served_schema(name: str) -> pa.Schema | None:
    """The Arrow schema a served table has: its declaration's (or the kernel's watermarks)."""
    if name == "watermarks":
        return _WATERMARKS
    table = declared(name)
    return None if table is None else table.arrow_schema


def empty_table(name: str) -> pa.Table:
    """The served table ``name`` with no rows (what a reader has before any publish)."""
    schema = served_schema(name)
    if schema is None:
        raise KeyError(f"no serving table {name!r} is declared")
    # Not Schema.empty_table(): that imports pandas, seconds on a cold start.
    return pa.Table.from_batches([], schema=schema)


class _Tables(dict):
    """Served tables by name; a name in ``lazy`` is read on first use (once, under a lock)."""

    def __init__(self, tables: Mapping[str, pa.Table], lazy: Mapping[str, Callable[[], pa.Table]]):
        super().__init__(tables)
        self._lazy = dict(lazy)
        self._lock = threading.Lock()

    def is_lazy(self, name: str) -> bool:
        return name in self._lazy

    def names(self) -> list[str]:
        return sorted(set(self) | set(self._lazy))

    def __missing__(self, name: str) -> pa.Table:
        if name in self._lazy:
            with self._lock:
                if not dict.__contains__(self, name):
                    self[name] = self._lazy[name]()
                return dict.__getitem__(self, name)
        with self._lock:  # not published (yet): empty, with its declared schema
            if not dict.__contains__(self, name):
                self[name] = empty_table(name)
            return dict.__getitem__(self, name)


class Snapshot:
    """One published snapshot, loaded in memory and never changed afterwards.

    ``table(name)`` is a served table (sorted by its declared key at load; empty, with
    its declared schema, when the snapshot does not have it); ``records(table)`` its
    rows as the declaration's records; ``cached(key, build)`` memoises what a reader
    derives from it (an index, a matrix), since the snapshot never changes.
    """

    def __init__(self, manifest: Manifest | None, tables: Mapping[str, pa.Table], *,
                 lazy: Mapping[str, Callable[[], pa.Table]] | None = None,
                 context: Mapping[tuple[str, float], tuple[np.ndarray, np.ndarray]] | None = None):
        self.manifest = manifest
        self._tables = _Tables({name: _in_key_order(name, table) for name, table in tables.items()}, lazy or {})
        # (model, share) -> (turn ids, combined rows): memory-mapped from the publish (see `vectors`).
        self.context_matrices: dict[tuple[str, float], Any] = dict(context or {})
        self._cache: dict[Any, Any] = {}
        self._cache_lock = threading.Lock()

    @classmethod
    def empty(cls) -> "Snapshot":
        return cls(None, {})

    def current(self) -> "Snapshot":
        """Itself: readers and snapshots answer the same reads (see `SnapshotReader.current`)."""
        return self

    @property
    def version(self) -> int:
        return self.manifest.version if self.manifest else 0

    def table_names(self) -> list[str]:
        return self._tables.names()

    def table(self, name: str) -> pa.Table:
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(f"no serving table {name!r}; known: {', '.join(self.table_names())}") from None

    def records(self, table: Table, rows: pa.Table | None = None, **extra: Any) -> list[Any]:
        """``table``'s rows (or the given subset of them) as its declaration's records."""
        return table.records(self.table(table.name) if rows is None else rows, **extra)

    def cached(self, key: Any, build: Callable[[], T]) -> T:
        """``build()`` once per snapshot and key (concurrent first calls may both build; one wins)."""
        try:
            return self._cache[key]
        except KeyError:
            value = build()
            with self._cache_lock:
                return self._cache.setdefault(key, value)

    def watermark(self, projector: str) -> Watermark:
        """How far ``projector`` had read; zeros (and no time) when it never ran."""
        marks = self.table("watermarks")
        hit = where(marks, pc.equal(marks["projector"], pa.scalar(projector, pa.string())))
        if hit.num_rows == 0:
            return Watermark(projector)
        row = {name: column_values(hit[name])[0] for name in hit.column_names}
        return Watermark(**row)


# --------------------------------------------------------------------------- loading


def load_snapshot(serving_dir: str | Path, manifest: Manifest) -> Snapshot:
    """Read every table the manifest names; raises OSError/ArrowException/
    SnapshotFormatError when a file is missing, damaged or not as announced.

    A snapshot with precombined vector matrices memory-maps them, and its vector
    tables (~300 MB at 100k turns, read for nothing when the matrix is there) are only
    opened and checked: their rows are read if a reply asks. Open files and maps keep
    working after a later publish collects them.
    """
    serving_dir = Path(serving_dir)
    problem = damage(serving_dir, manifest)
    if problem is not None:  # a cut-short file is caught here, before a lazy table is read mid-reply
        raise SnapshotFormatError(problem)
    context = load_context_matrices(serving_dir, manifest)
    tables: dict[str, pa.Table] = {}
    lazy: dict[str, Callable[[], pa.Table]] = {}
    for name, entry in manifest.tables.items():
        parquet = pq.ParquetFile(str(serving_dir / entry.file))
        if context and "vector" in parquet.schema_arrow.names:
            _check_table(parquet.schema_arrow.names, parquet.metadata.num_rows, name, entry)
            lazy[name] = _reader(parquet, name, entry)
            continue
        try:
            tables[name] = _validated(parquet.read(), name, entry)
        finally:
            parquet.close()
    return Snapshot(manifest, tables, lazy=lazy, context=context)


def _check_table(columns: list[str], rows: int, name: str, entry: TableFile) -> None:
    if rows != entry.rows:
        raise SnapshotFormatError(f"{entry.file} has {rows} rows, the manifest says {entry.rows}")
    schema = served_schema(name)
    missing = [c for c in schema.names if c not in columns] if schema is not None else []
    if missing:
        raise SnapshotFormatError(f"{entry.file} lacks columns {missing}")


def _validated(table: pa.Table, name: str, entry: TableFile) -> pa.Table:
    """``table`` checked against the manifest and cast to its declared served schema."""
    _check_table(table.column_names, table.num_rows, name, entry)
    schema = served_schema(name)
    return table if schema is None else table.select(schema.names).cast(schema)


def _reader(parquet: pq.ParquetFile, name: str, entry: TableFile) -> Callable[[], pa.Table]:
    def read() -> pa.Table:
        try:
            return _validated(parquet.read(), name, entry)
        finally:
            parquet.close()
    return read


def _in_key_order(name: str, table: pa.Table) -> pa.Table:
    """A table sorted by its declared key at load, so reads never depend on how a file was written.

    Vector tables are left as served (the publish writes every table in key order): at
    100k turns a sort would cost more than the reads it protects.
    """
    declaration = declared(name)
    if declaration is None or not declaration.key or "vector" in table.column_names:
        return table
    return table.sort_by([(k, "ascending") for k in declaration.key]).combine_chunks()
