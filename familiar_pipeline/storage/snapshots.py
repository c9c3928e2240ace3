"""Parquet serving snapshots: how the bot reads memory without opening DuckDB.

DuckDB lets one process hold a database file; while a Dagster run writes
``memory.duckdb`` another process cannot even open it read-only. So a run, after
its short write transaction, *publishes* the serving tables as Parquet files in
``serving/`` and the bot reads those, lock-free.

Publishing protocol (one publisher per familiar at a time, enforced by a lock file):

1. every table is written with DuckDB ``COPY (query) TO '<temp>' (FORMAT parquet)``
   to a hidden temp name, fsynced, then ``os.replace``d to an immutable versioned
   name such as ``facts.v12.parquet`` (a name is never rewritten once a manifest
   points at it); with turn and window vectors, each model's precombined turn
   matrix is written the same way as ``turn_context_<n>.v12.npy`` (rows) and
   ``turn_context_<n>_ids.v12.npy`` (turn ids), from the same read transaction;
2. ``manifest.json`` is written to a temp file, fsynced and ``os.replace``d: this
   rename is the commit point, so a reader sees the whole old or the whole new
   snapshot, never a mix;
3. files of versions older than the previous one are deleted (a reader that read
   the previous manifest a moment ago can still open its files), with stray temps.

A failure before step 2 completes removes what it wrote and raises
:class:`SnapshotPublishError`; the previous manifest and its files are untouched.

The reader (:class:`SnapshotReader`) re-reads the small manifest on ``refresh()``
and loads the tables only when the published snapshot changed. Each loaded
snapshot is an immutable :class:`Snapshot` (Arrow tables, queried with pyarrow
compute), swapped in atomically, so callers on other threads keep a consistent
view. Query helpers return the store's own records (``records.py``: Fact,
Summary, Dossier, Reflection, Watermark) and select facts with the same
``records.FactView`` the store's SQL uses, so the two read paths cannot drift.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from familiar_pipeline.storage.records import (
    Dossier,
    Fact,
    FactView,
    Reflection,
    Summary,
    Watermark,
    stored_subject,
)

try:  # POSIX only; without it a second concurrent publisher is not excluded.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
LOCK_NAME = ".publish.lock"
SUMMARY_SCOPE = "conversation"

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_VERSIONED_FILE = re.compile(r"^(?P<table>[a-z][a-z0-9_]{0,62})\.v(?P<version>[0-9]+)\.(?P<kind>parquet|npy)$")
# The shipped ``[memory.retrieval].turn_context`` (tests hold the two equal): the share of
# each turn's context-window vector in the turn matrix a snapshot precombines at publish.
TURN_CONTEXT_SHARE = 0.5
CONTEXT_MATRIX = "turn_context"
_TEMP_FILE = re.compile(r"^\..+\.tmp$")


class SnapshotPublishError(RuntimeError):
    """Publishing failed; the previous snapshot is still the published one."""


class SnapshotFormatError(ValueError):
    """A manifest that is not valid JSON or not a format this code understands."""


# --------------------------------------------------------------------------- #
# The serving contract: what is published and with which types.
# --------------------------------------------------------------------------- #

def _vector_sql(table: str, key: str) -> str:
    """The served query of an embedding table (one vector per key and model, every model)."""
    return f"""
        SELECT {key}::BIGINT AS {key}, model::VARCHAR AS model, dim::INTEGER AS dim,
               vector::FLOAT[] AS vector, created_at::TIMESTAMPTZ AS created_at
        FROM {table} ORDER BY model, {key}
    """


# Columns are cast explicitly so the Parquet schema is a stable contract for the
# bot and notebooks, independent of how the store happens to declare them.
# `facts` carries every row (superseded and expired ones too: `as_of` reads and
# the `(stale)` flag need them) plus its subjects in write order; the store's
# dedup keys (norm_text, subject_set) are store internals and are not served.
SERVING_TABLES: dict[str, str] = {
    "facts": """
        SELECT f.id::BIGINT AS id,
               f.channel_id::BIGINT AS channel_id,
               f.text::VARCHAR AS text,
               f.source_turn_ids::BIGINT[] AS source_turn_ids,
               COALESCE(s.subjects, [])::STRUCT(canonical_key VARCHAR, display_at_write VARCHAR)[]
                   AS subjects,
               f.importance::INTEGER AS importance,
               f.created_at::TIMESTAMPTZ AS created_at,
               f.superseded_at::TIMESTAMPTZ AS superseded_at,
               f.superseded_by::BIGINT AS superseded_by,
               f.valid_from::TIMESTAMPTZ AS valid_from,
               f.valid_to::TIMESTAMPTZ AS valid_to
        FROM facts AS f
        LEFT JOIN (
            SELECT fact_id,
                   list({'canonical_key': canonical_key, 'display_at_write': display_at_write}
                        ORDER BY position, canonical_key) AS subjects
            FROM fact_subjects
            GROUP BY fact_id
        ) AS s ON s.fact_id = f.id
        ORDER BY f.id
    """,
    "fact_subjects": """
        SELECT fact_id::BIGINT AS fact_id, canonical_key::VARCHAR AS canonical_key,
               display_at_write::VARCHAR AS display_at_write, position::INTEGER AS position
        FROM fact_subjects ORDER BY fact_id, position, canonical_key
    """,
    "summaries": """
        SELECT scope::VARCHAR AS scope, summary_text::VARCHAR AS summary_text,
               last_turn_id::BIGINT AS last_turn_id, created_at::TIMESTAMPTZ AS created_at
        FROM summaries ORDER BY scope
    """,
    "people_dossiers": """
        SELECT canonical_key::VARCHAR AS canonical_key, dossier_text::VARCHAR AS dossier_text,
               last_fact_id::BIGINT AS last_fact_id, created_at::TIMESTAMPTZ AS created_at
        FROM people_dossiers ORDER BY canonical_key
    """,
    "reflections": """
        SELECT id::BIGINT AS id, channel_id::BIGINT AS channel_id, text::VARCHAR AS text,
               cited_turn_ids::BIGINT[] AS cited_turn_ids, cited_fact_ids::BIGINT[] AS cited_fact_ids,
               last_turn_id::BIGINT AS last_turn_id, last_fact_id::BIGINT AS last_fact_id,
               created_at::TIMESTAMPTZ AS created_at
        FROM reflections ORDER BY id
    """,
    # Every model's vectors: switching the active model must not need a re-publish.
    "fact_embeddings": _vector_sql("fact_embeddings", "fact_id"),
    "turn_embeddings": _vector_sql("turn_embeddings", "turn_id"),
    "turn_window_embeddings": _vector_sql("turn_window_embeddings", "turn_id"),
    "watermarks": """
        SELECT projector::VARCHAR AS projector, turn_id::BIGINT AS turn_id,
               fact_id::BIGINT AS fact_id, change_seq::BIGINT AS change_seq,
               updated_at::TIMESTAMPTZ AS updated_at
        FROM watermarks ORDER BY projector
    """,
}

_TS = pa.timestamp("us", tz="UTC")


def _vector_schema(key: str) -> pa.Schema:
    """Embedding rows (facts' and turns' alike): one vector per key and model."""
    return pa.schema([(key, pa.int64()), ("model", pa.string()), ("dim", pa.int32()),
                      ("vector", pa.list_(pa.float32())), ("created_at", _TS)])


_SUBJECT = pa.struct([("canonical_key", pa.string()), ("display_at_write", pa.string())])

# The Arrow schema of each served table; also the schema of the empty tables a
# reader returns before anything was published.
SERVING_SCHEMAS: dict[str, pa.Schema] = {
    "facts": pa.schema(
        [
            ("id", pa.int64()),
            ("channel_id", pa.int64()),
            ("text", pa.string()),
            ("source_turn_ids", pa.list_(pa.int64())),
            ("subjects", pa.list_(_SUBJECT)),
            ("importance", pa.int32()),
            ("created_at", _TS),
            ("superseded_at", _TS),
            ("superseded_by", pa.int64()),
            ("valid_from", _TS),
            ("valid_to", _TS),
        ]
    ),
    "fact_subjects": pa.schema(
        [
            ("fact_id", pa.int64()),
            ("canonical_key", pa.string()),
            ("display_at_write", pa.string()),
            ("position", pa.int32()),
        ]
    ),
    "summaries": pa.schema(
        [
            ("scope", pa.string()),
            ("summary_text", pa.string()),
            ("last_turn_id", pa.int64()),
            ("created_at", _TS),
        ]
    ),
    "people_dossiers": pa.schema(
        [
            ("canonical_key", pa.string()),
            ("dossier_text", pa.string()),
            ("last_fact_id", pa.int64()),
            ("created_at", _TS),
        ]
    ),
    "reflections": pa.schema(
        [
            ("id", pa.int64()),
            ("channel_id", pa.int64()),
            ("text", pa.string()),
            ("cited_turn_ids", pa.list_(pa.int64())),
            ("cited_fact_ids", pa.list_(pa.int64())),
            ("last_turn_id", pa.int64()),
            ("last_fact_id", pa.int64()),
            ("created_at", _TS),
        ]
    ),
    "fact_embeddings": _vector_schema("fact_id"),
    "turn_embeddings": _vector_schema("turn_id"),
    "turn_window_embeddings": _vector_schema("turn_id"),
    "watermarks": pa.schema(
        [
            ("projector", pa.string()),
            ("turn_id", pa.int64()),
            ("fact_id", pa.int64()),
            ("change_seq", pa.int64()),
            ("updated_at", _TS),
        ]
    ),
}


# --------------------------------------------------------------------------- #
# Manifest
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class TableFile:
    file: str  # a bare file name inside the serving folder
    rows: int
    bytes: int


@dataclass(frozen=True)
class MatrixFile:
    """One model's precombined turn matrix: ``rows`` unit float32 rows of ``dim`` in ``file``
    (a ``.npy``) for the ascending turn ids in ``ids_file``; each row is ``(1 - share) x``
    the turn's vector ``+ share x`` its context window's (see :func:`blend_context_rows`)."""

    model: str
    share: float
    file: str
    ids_file: str
    rows: int
    dim: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Manifest:
    version: int
    published_at: str  # ISO-8601 UTC
    store_watermark: Mapping[str, Any]
    tables: Mapping[str, TableFile]
    format: int = MANIFEST_FORMAT
    # Derived at publish from the tables (readers written before them ignore the key).
    matrices: tuple[MatrixFile, ...] = ()
    # Assets a run planned for this familiar and had not run when it published (it left them to
    # a later run, or has yet to reach them): the turn sensor requests them (readers ignore it).
    pending_assets: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "published_at": self.published_at,
            "store_watermark": dict(self.store_watermark),
            "tables": {
                name: {"file": t.file, "rows": t.rows, "bytes": t.bytes}
                for name, t in self.tables.items()
            },
            "matrices": [m.to_json() for m in self.matrices],
            "pending_assets": list(self.pending_assets),
        }

    @classmethod
    def from_json(cls, data: Any) -> "Manifest":
        """Validate a parsed manifest; file names must stay inside the folder."""
        if not isinstance(data, dict):
            raise SnapshotFormatError("manifest is not a JSON object")
        if data.get("format") != MANIFEST_FORMAT:
            raise SnapshotFormatError(
                f"unsupported snapshot format {data.get('format')!r} (this code reads {MANIFEST_FORMAT})"
            )
        version = data.get("version")
        if not _is_int(version) or version < 1:
            raise SnapshotFormatError(f"manifest version must be a positive integer, got {version!r}")
        published_at = data.get("published_at")
        if not isinstance(published_at, str):
            raise SnapshotFormatError("manifest published_at must be a string")
        watermark = data.get("store_watermark", {})
        if not isinstance(watermark, dict):
            raise SnapshotFormatError("manifest store_watermark must be an object")
        raw_tables = data.get("tables")
        if not isinstance(raw_tables, dict):
            raise SnapshotFormatError("manifest tables must be an object")
        tables: dict[str, TableFile] = {}
        for name, entry in raw_tables.items():
            if not isinstance(entry, dict):
                raise SnapshotFormatError(f"manifest entry for table {name!r} is not an object")
            file, rows, size = entry.get("file"), entry.get("rows"), entry.get("bytes")
            match = _VERSIONED_FILE.match(file) if isinstance(file, str) else None
            if (not _TABLE_NAME.match(str(name)) or match is None or match["table"] != name
                    or match["kind"] != "parquet"):
                raise SnapshotFormatError(f"manifest entry for table {name!r} names a bad file {file!r}")
            if not _is_int(rows) or rows < 0 or not _is_int(size) or size < 0:
                raise SnapshotFormatError(f"manifest entry for table {name!r} has bad rows/bytes")
            tables[name] = TableFile(file=file, rows=rows, bytes=size)
        raw_matrices = data.get("matrices", [])
        if not isinstance(raw_matrices, list):
            raise SnapshotFormatError("manifest matrices must be a list")
        matrices = tuple(_matrix_entry(entry) for entry in raw_matrices)
        pending = data.get("pending_assets", [])
        if not isinstance(pending, list) or not all(isinstance(a, str) for a in pending):
            raise SnapshotFormatError("manifest pending_assets must be a list of asset names")
        return cls(version=version, published_at=published_at, store_watermark=watermark, tables=tables,
                   matrices=matrices, pending_assets=tuple(pending))


def _matrix_entry(entry: Any) -> MatrixFile:
    """One validated ``matrices`` item of a manifest (files inside the folder, sane sizes)."""
    fields = [f.name for f in dataclasses.fields(MatrixFile)]
    if not isinstance(entry, dict) or sorted(entry) != sorted(fields):
        raise SnapshotFormatError(f"manifest matrix entry must have exactly {', '.join(fields)}")
    for key in ("file", "ids_file"):
        match = _VERSIONED_FILE.match(entry[key]) if isinstance(entry[key], str) else None
        if match is None or match["kind"] != "npy" or not match["table"].startswith(CONTEXT_MATRIX):
            raise SnapshotFormatError(f"manifest matrix entry names a bad file {entry[key]!r}")
    share = entry["share"]
    if not isinstance(entry["model"], str) or isinstance(share, bool) or not isinstance(share, (int, float)) \
            or not 0.0 <= share <= 1.0:
        raise SnapshotFormatError("manifest matrix entry has a bad model or share")
    if not all(_is_int(entry[k]) and entry[k] >= 0 for k in ("rows", "dim")):
        raise SnapshotFormatError("manifest matrix entry has bad rows/dim")
    return MatrixFile(**{**entry, "share": float(share)})


def read_manifest(serving_dir: str | Path) -> Manifest | None:
    """The published manifest, or None when nothing was published yet.

    Raises :class:`SnapshotFormatError` when the file exists but is unreadable
    as a manifest (asset checks use this to compare the snapshot with the store).
    """
    path = Path(serving_dir) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise SnapshotFormatError(f"{path} is not valid JSON: {exc}") from exc
    return Manifest.from_json(data)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- #
# Publisher
# --------------------------------------------------------------------------- #


def publish_snapshot(
    conn: duckdb.DuckDBPyConnection,
    serving_dir: str | Path,
    *,
    store_watermark: Mapping[str, object],
    tables: Mapping[str, str] = SERVING_TABLES,
    durable: bool = True,
    turn_context: float | None = TURN_CONTEXT_SHARE,
    pending_assets: Sequence[str] = (),
) -> Manifest:
    """Publish ``tables`` (name -> SELECT) from ``conn`` as the next snapshot.

    Publishes *committed* state: the COPYs run in one read transaction on a
    cursor of their own, so all tables come from the same database state and a
    transaction the caller has open on ``conn`` is neither seen nor disturbed
    (so call it after the write transaction commits). ``store_watermark`` is
    recorded verbatim in the manifest (datetimes as ISO strings) so checks can
    tell whether the snapshot is in step with the store. ``durable=False`` skips the fsyncs (for
    scratch folders); the rename order alone still keeps readers consistent.

    With turn vectors and context-window vectors in ``tables``, each model's
    precombined turn matrix (window share ``turn_context``; None for none) is
    written beside them as ``.npy`` files the bot memory-maps: combining 100k
    turns took the bot's first reply after each publish several seconds.
    ``pending_assets``: what the publishing run has not run yet for this familiar
    (recorded in the manifest for the turn sensor).
    """
    serving_dir = Path(serving_dir)
    watermark = _jsonable_watermark(store_watermark)
    if not tables:
        raise ValueError("publish_snapshot needs at least one table")
    for name in tables:
        if not isinstance(name, str) or not _TABLE_NAME.match(name):
            raise ValueError(
                f"bad serving table name {name!r}: use a-z, 0-9 and '_', starting with a letter"
            )
    serving_dir.mkdir(parents=True, exist_ok=True)

    with _publish_lock(serving_dir):
        previous = _previous_manifest(serving_dir)
        version = max(previous.version if previous else 0, _highest_file_version(serving_dir)) + 1
        written: list[Path] = []
        try:
            entries, matrices = _copy_tables(conn, serving_dir, version, tables, written, durable, turn_context)
            manifest = Manifest(
                version=version,
                published_at=datetime.now(timezone.utc).isoformat(timespec="microseconds"),
                store_watermark=watermark,
                tables=entries,
                matrices=matrices,
                pending_assets=tuple(pending_assets),
            )
            _write_manifest(serving_dir, manifest, written, durable)
        except BaseException as exc:
            _remove_quietly(written)
            if isinstance(exc, Exception):
                raise SnapshotPublishError(
                    f"publishing snapshot v{version} to {serving_dir} failed "
                    f"({type(exc).__name__}: {exc}); v{previous.version if previous else 0} "
                    "is still the published snapshot"
                ) from exc
            raise
        keep = {version} | ({previous.version} if previous else set())
        _collect_garbage(serving_dir, keep)
    return manifest


def _jsonable_watermark(store_watermark: Mapping[str, object]) -> dict[str, Any]:
    def encode(value: Any) -> Any:
        if isinstance(value, datetime):
            if value.tzinfo is not None:
                value = value.astimezone(timezone.utc)
            return value.isoformat()
        if isinstance(value, date):
            return value.isoformat()
        if isinstance(value, (set, frozenset, tuple)):
            return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
        raise TypeError(f"{type(value).__name__} is not JSON-serialisable")

    if not isinstance(store_watermark, Mapping):
        raise TypeError("store_watermark must be a mapping")
    try:
        return json.loads(json.dumps(dict(store_watermark), default=encode, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"store_watermark cannot go in the manifest: {exc}") from exc


@contextlib.contextmanager
def _publish_lock(serving_dir: Path) -> Iterator[None]:
    """Exclude a second publisher (e.g. a backfill racing a sensor run)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(serving_dir / LOCK_NAME, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _previous_manifest(serving_dir: Path) -> Manifest | None:
    try:
        return read_manifest(serving_dir)
    except (SnapshotFormatError, OSError) as exc:
        logger.warning("replacing an unreadable snapshot manifest in %s: %s", serving_dir, exc)
        return None


def _highest_file_version(serving_dir: Path) -> int:
    """Versions never reuse a file name, even after a lost or corrupt manifest."""
    highest = 0
    for name in os.listdir(serving_dir):
        match = _VERSIONED_FILE.match(name)
        if match:
            highest = max(highest, int(match["version"]))
    return highest


def _temp_path(serving_dir: Path, stem: str) -> Path:
    return serving_dir / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _copy_tables(
    conn: duckdb.DuckDBPyConnection,
    serving_dir: Path,
    version: int,
    tables: Mapping[str, str],
    written: list[Path],
    durable: bool,
    turn_context: float | None = None,
) -> tuple[dict[str, TableFile], tuple[MatrixFile, ...]]:
    entries: dict[str, TableFile] = {}
    # A cursor is a separate DuckDB connection to the same database: its own
    # transaction gives every COPY the same committed state, and a failure here
    # cannot abort a transaction the caller may have open on ``conn``.
    # Its default database is the caller's (a store's file may be attached under an alias).
    (database,) = conn.execute("SELECT current_database()").fetchone()
    cursor = conn.cursor()
    try:
        cursor.execute(f'USE "{database}"')
        cursor.execute("BEGIN TRANSACTION")
        for name, query in tables.items():
            temp = _temp_path(serving_dir, f"{name}.v{version}")
            written.append(temp)
            target_sql = str(temp).replace("'", "''")
            result = cursor.execute(f"COPY ({query}) TO '{target_sql}' (FORMAT parquet)").fetchone()
            rows = int(result[0]) if result else 0
            if durable:
                _fsync_file(temp)
            final = serving_dir / f"{name}.v{version}.parquet"
            written.append(final)
            os.replace(temp, final)
            entries[name] = TableFile(file=final.name, rows=rows, bytes=final.stat().st_size)
        matrices = () if turn_context is None else _write_context_matrices(
            cursor, serving_dir, version, tables, entries, float(turn_context), written, durable)
    finally:
        with contextlib.suppress(duckdb.Error):
            cursor.execute("ROLLBACK")  # read-only: nothing to commit
        cursor.close()
    if durable:
        _fsync_dir(serving_dir)
    return entries, matrices


def _write_context_matrices(cursor: duckdb.DuckDBPyConnection, serving_dir: Path, version: int,
                            tables: Mapping[str, str], entries: Mapping[str, TableFile], share: float,
                            written: list[Path], durable: bool) -> tuple[MatrixFile, ...]:
    """Each model's precombined turn matrix, from the turn and window rows just copied.

    Runs in the publish's read transaction, so the matrix is of the same rows as
    the tables; the rows come straight from DuckDB (reading the Parquet back was
    ~3x slower at 100k turns).
    """
    if not {"turn_embeddings", "turn_window_embeddings"} <= set(entries) or not 0.0 <= share <= 1.0:
        return ()
    if entries["turn_window_embeddings"].rows == 0 or entries["turn_embeddings"].rows == 0:
        return ()
    own_table = cursor.sql(tables["turn_embeddings"]).to_arrow_table()
    window_table = cursor.sql(tables["turn_window_embeddings"]).to_arrow_table()
    out = []
    for position, model in enumerate(sorted(set(pc.unique(own_table["model"]).to_pylist()))):
        ids, own = _unit_rows(own_table, model)
        wids, windows = _unit_rows(window_table, model)
        matrix = blend_context_rows(ids, own, wids, windows, share)
        if matrix is None:
            continue
        stem = f"{CONTEXT_MATRIX}_{position}"
        files = {}
        for name, array in ((f"{stem}_ids", ids), (stem, matrix)):
            temp = _temp_path(serving_dir, f"{name}.v{version}")
            written.append(temp)
            with open(temp, "wb") as handle:
                np.save(handle, array, allow_pickle=False)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            final = serving_dir / f"{name}.v{version}.npy"
            written.append(final)
            os.replace(temp, final)
            files[name] = final.name
        out.append(MatrixFile(model=model, share=share, file=files[stem], ids_file=files[f"{stem}_ids"],
                              rows=int(matrix.shape[0]), dim=int(matrix.shape[1])))
    if durable and out:
        _fsync_dir(serving_dir)
    return tuple(out)


def _write_manifest(serving_dir: Path, manifest: Manifest, written: list[Path], durable: bool) -> None:
    temp = _temp_path(serving_dir, "manifest")
    written.append(temp)
    payload = json.dumps(manifest.to_json(), indent=2, sort_keys=True).encode("utf-8")
    with open(temp, "wb") as handle:
        handle.write(payload)
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    os.replace(temp, serving_dir / MANIFEST_NAME)
    # Committed: the versioned files now belong to the published snapshot.
    written.clear()
    if durable:
        try:
            _fsync_dir(serving_dir)
        except OSError as exc:  # the rename happened; durability is best effort here
            logger.warning("could not fsync %s after publishing: %s", serving_dir, exc)


def _collect_garbage(serving_dir: Path, keep_versions: set[int]) -> None:
    """Delete versions older than the previous one, and temps of dead publishers.

    Safe under the publish lock: no other publisher is writing a temp file now.
    """
    for name in os.listdir(serving_dir):
        match = _VERSIONED_FILE.match(name)
        stale = (match is not None and int(match["version"]) not in keep_versions) or bool(
            _TEMP_FILE.match(name)
        )
        if stale:
            try:
                os.unlink(serving_dir / name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("could not delete old snapshot file %s: %s", serving_dir / name, exc)


def _remove_quietly(paths: Iterable[Path]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("could not remove %s after a failed publish: %s", path, exc)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":  # pragma: no cover - directories cannot be fsynced on Windows
        return
    _fsync_file(path)


# --------------------------------------------------------------------------- #
# One loaded snapshot
# --------------------------------------------------------------------------- #

# Sort keys applied at load, so helpers never depend on how a file was written.
_SORT_KEYS: dict[str, list[tuple[str, str]]] = {
    "facts": [("id", "ascending")],
    "fact_subjects": [("fact_id", "ascending"), ("position", "ascending")],
    "reflections": [("id", "ascending")],
}


def empty_table(name: str) -> pa.Table:
    """The served table ``name`` with no rows (what a reader has before any publish)."""
    # Not Schema.empty_table(): that imports pandas, seconds on a cold start.
    return pa.Table.from_batches([], schema=SERVING_SCHEMAS[name])


def _clean_ids(ids: Iterable[int]) -> pa.Array:
    return pa.array(sorted({int(i) for i in ids}), type=pa.int64())


def _where(table: pa.Table, mask: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Rows where ``mask`` is true (NULL counts as false), in table order.

    ``take`` of the matching indices touches only those rows; ``Table.filter``
    would rebuild every column, which costs milliseconds at 20k facts. When
    every row matches, the table itself (no copy).
    """
    rows = pc.indices_nonzero(pc.fill_null(mask, False))
    return table if len(rows) == table.num_rows else table.take(rows)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _column_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """A column as Python values; timestamps as aware UTC datetimes.

    Timestamps are read as their int64 microseconds (a zero-copy view) and
    added to the epoch: Arrow's own conversion of a tz-aware timestamp was
    measured at about 20 us per value, which made four timestamps per
    candidate fact the largest cost of a reply's fact lookup.
    """
    if pa.types.is_timestamp(column.type):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        return [None if v is None else _EPOCH + timedelta(microseconds=v)
                for chunk in chunks for v in chunk.view(pa.int64()).to_pylist()]
    if pa.types.is_list(column.type) and not pa.types.is_struct(column.type.value_type):
        return [None if v is None else tuple(v) for v in column.to_pylist()]
    return column.to_pylist()


def _records(table: pa.Table, record: type, columns: list[str]) -> list[Any]:
    """``record(*row)`` for each row of ``columns`` (in the record's field order)."""
    values = [_column_values(table[name]) for name in columns]
    return [record(*row) for row in zip(*values)]


_FACT_COLUMNS = [f.name for f in dataclasses.fields(Fact)]


def _facts(table: pa.Table) -> list[Fact]:
    values = {name: _column_values(table[name]) for name in _FACT_COLUMNS}
    values["subjects"] = [
        tuple(stored_subject(s["canonical_key"], s["display_at_write"]) for s in subjects or ())
        for subjects in values["subjects"]
    ]
    values["source_turn_ids"] = [ids or () for ids in values["source_turn_ids"]]
    return [Fact(*row) for row in zip(*(values[name] for name in _FACT_COLUMNS))]


class Snapshot:
    """One published snapshot, loaded in memory and never changed afterwards.

    Queries run with pyarrow compute over the immutable Arrow tables, so every
    method is safe to call from several threads without a lock. (An in-process
    DuckDB was measured here at 20-150 ms per connect and ~1 ms per query;
    pyarrow answers these small lookups in well under a millisecond.)

    Facts, reflections, summaries, dossiers and watermarks come back as the
    store's records (``records.py``): datetimes aware UTC, id lists tuples, a
    fact's ``subjects`` a tuple of ``Subject`` in write order.
    """

    def __init__(self, manifest: Manifest | None, tables: Mapping[str, pa.Table], *,
                 lazy: Mapping[str, Callable[[], pa.Table]] | None = None,
                 context: Mapping[tuple[str, float], tuple[np.ndarray, np.ndarray]] | None = None):
        self.manifest = manifest
        self._tables = _Tables(tables, lazy or {})
        for name, schema in SERVING_SCHEMAS.items():
            if name not in self._tables and not self._tables.is_lazy(name):
                self._tables[name] = empty_table(name)
        for name, keys in _SORT_KEYS.items():
            self._tables[name] = self._tables[name].sort_by(keys).combine_chunks()
        # (model, share) -> (turn ids, combined rows): precombined at publish, else built on first use.
        self._context_matrices: dict = dict(context or {})

    @classmethod
    def empty(cls) -> "Snapshot":
        return cls(None, {})

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

    # -- facts ---------------------------------------------------------------- #
    # Same signatures and results as the store's reads of the same name.

    def _fact_rows(self, ids: Iterable[int]) -> pa.Table:
        """The fact rows with these ids, ascending: a binary search of the sorted id
        column, so a reply's few dozen candidates never scan every fact."""
        cache = self.__dict__.setdefault("_fact_ids", [])
        if not cache:
            cache.append(self._tables["facts"]["id"].to_numpy())
        known = cache[0]
        wanted = np.unique(np.fromiter((int(i) for i in ids), dtype=np.int64))
        at = np.searchsorted(known, wanted)
        hit = at[(at < len(known)) & (known[np.minimum(at, len(known) - 1)] == wanted)] if len(known) else at[:0]
        return self._tables["facts"].take(pa.array(hit, pa.int64()))

    def facts_by_ids(self, ids: Iterable[int]) -> list[Fact]:
        """Every row with these ids, superseded or expired included, ascending."""
        return _facts(self._fact_rows(ids))

    def current_facts(self, now: datetime | None = None, *, ids: Iterable[int] | None = None) -> list[Fact]:
        """Current truth at ``now`` (``FactView``), ascending; with ``ids``, only among those."""
        facts = self._tables["facts"] if ids is None else self._fact_rows(ids)
        return _facts(_where(facts, FactView.of(now=now).arrow_mask(facts)))

    def recent_facts(
        self,
        limit: int,
        as_of: datetime | None = None,
        *,
        include_superseded: bool = False,
        now: datetime | None = None,
    ) -> list[Fact]:
        """Newest first: the ``FactView`` of these arguments, at most ``limit`` rows."""
        if limit <= 0:
            return []
        facts = self._tables["facts"]
        view = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now)
        visible = pc.indices_nonzero(view.arrow_mask(facts))
        newest = visible.slice(max(len(visible) - int(limit), 0))
        return _facts(facts.take(newest))[::-1]

    def facts_for_subject(
        self,
        key: str,
        as_of: datetime | None = None,
        *,
        include_superseded: bool = False,
        now: datetime | None = None,
    ) -> list[Fact]:
        """Facts naming ``key`` as a subject (exact key match) in the ``FactView``, ascending."""
        subjects = self._tables["fact_subjects"]
        ids = _where(subjects, pc.equal(subjects["canonical_key"], pa.scalar(key, pa.string())))["fact_id"]
        if len(ids) == 0:
            return []
        facts = self._tables["facts"]
        named = pc.is_in(facts["id"], value_set=ids.combine_chunks())
        view = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now)
        return _facts(_where(facts, pc.and_(named, view.arrow_mask(facts))))

    def superseded_fact_ids(self, ids: Iterable[int]) -> set[int]:
        wanted = _clean_ids(ids)
        if len(wanted) == 0:
            return set()
        facts = self._tables["facts"]
        mask = pc.and_(pc.is_in(facts["id"], value_set=wanted), pc.is_valid(facts["superseded_at"]))
        return set(_where(facts, mask)["id"].to_pylist())

    def latest_fact_id(self) -> int:
        """Highest fact id ever written (superseded rows count), or 0."""
        highest = pc.max(self._tables["facts"]["id"]).as_py()
        return int(highest) if highest is not None else 0

    # -- the other projections ------------------------------------------------ #

    def summary(self, scope: str = SUMMARY_SCOPE) -> Summary | None:
        summaries = self._tables["summaries"]
        rows = _records(
            _where(summaries, pc.equal(summaries["scope"], pa.scalar(scope, pa.string()))),
            Summary,
            ["summary_text", "last_turn_id", "created_at"],
        )
        return rows[0] if rows else None

    def dossier(self, key: str) -> Dossier | None:
        return self.dossiers([key]).get(key)

    def dossiers(self, keys: Iterable[str]) -> dict[str, Dossier]:
        """``{key: dossier}`` for the keys that have one."""
        wanted = pa.array(sorted({str(k) for k in keys}), type=pa.string())
        if len(wanted) == 0:
            return {}
        dossiers = self._tables["people_dossiers"]
        rows = _records(
            _where(dossiers, pc.is_in(dossiers["canonical_key"], value_set=wanted)),
            Dossier,
            ["canonical_key", "dossier_text", "last_fact_id", "created_at"],
        )
        return {r.canonical_key: r for r in rows}

    def recent_reflections(self, channel_id: int | None = None, limit: int = 10) -> list[Reflection]:
        """Newest first: that channel's rows plus channel-agnostic (NULL) rows;
        with ``channel_id=None`` every row."""
        if limit <= 0:
            return []
        reflections = self._tables["reflections"]
        if channel_id is not None:
            channel = reflections["channel_id"]
            here = pc.equal(channel, pa.scalar(int(channel_id), pa.int64()))
            mask = pc.or_kleene(pc.is_null(channel), here)
            reflections = _where(reflections, mask)
        newest = reflections.slice(max(reflections.num_rows - int(limit), 0))
        return _records(newest, Reflection, [f.name for f in dataclasses.fields(Reflection)])[::-1]

    def watermark(self, projector: str) -> Watermark:
        """How far ``projector`` had read; zeros (and no time) when it never ran."""
        marks = self._tables["watermarks"]
        rows = _records(
            _where(marks, pc.equal(marks["projector"], pa.scalar(projector, pa.string()))),
            Watermark,
            [f.name for f in dataclasses.fields(Watermark)],
        )
        return rows[0] if rows else Watermark(projector)

    def _fact_vector_rows(self, model: str) -> tuple[np.ndarray, np.ndarray]:
        """``(fact ids ascending, their row numbers in fact_embeddings)`` for ``model``.

        Built once per snapshot and model (the snapshot never changes), so a reply's
        few dozen candidates are a binary search instead of an ``is_in`` over every
        vector row (20k rows: ~1 ms per reply). Where an id repeats, its last row in
        table order comes last, which is the row ``embeddings_for`` returns.
        """
        cache = self.__dict__.setdefault("_fact_vector_index", {})
        if model not in cache:
            table = self._tables["fact_embeddings"]
            rows = pc.indices_nonzero(pc.fill_null(
                pc.equal(table["model"], pa.scalar(model, pa.string())), False)).to_numpy().astype(np.int64)
            ids = table["fact_id"].take(pa.array(rows, pa.int64())).to_numpy().astype(np.int64, copy=False)
            order = np.argsort(ids, kind="stable")
            cache[model] = (ids[order], rows[order])
        return cache[model]

    def fact_vector_count(self, model: str) -> int:
        """How many rows of ``fact_embeddings`` are under ``model`` (0: the side-index is cold for it)."""
        return len(self._fact_vector_rows(model)[0])

    def embeddings_for(self, model: str, fact_ids: Iterable[int]) -> dict[int, np.ndarray]:
        """``{fact_id: float32 vector}`` of ``model`` only; facts without one are absent."""
        wanted = np.unique(np.fromiter((int(i) for i in fact_ids), dtype=np.int64))
        table = self._tables["fact_embeddings"]
        if len(wanted) == 0 or table.num_rows == 0:
            return {}
        ids, rows = self._fact_vector_rows(model)
        if len(ids) == 0:
            return {}
        at = np.searchsorted(ids, wanted, side="right") - 1
        found = (at >= 0) & (ids[np.maximum(at, 0)] == wanted)
        hits = table.take(pa.array(rows[at[found]], pa.int64()))
        out: dict[int, np.ndarray] = {}
        for fact_id, vector in zip(hits["fact_id"].to_pylist(), hits["vector"]):
            if vector.is_valid:
                out[fact_id] = vector.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=True)
        return out

    def turn_matrix(self, model: str, table: str = "turn_embeddings") -> tuple[np.ndarray, np.ndarray]:
        """``(turn ids, unit-length float32 rows)`` of every turn vector under ``model``.

        Built once per snapshot, table and model (the snapshot never changes), so
        a reply's dense turn search is one matrix-vector product. Rows of another
        dimension than the model's first row are left out (a corrupt row must
        not break every reply). ``table`` may name ``turn_window_embeddings``.
        """
        cache = self.__dict__.setdefault("_turn_matrices", {})
        if (table, model) not in cache:
            cache[(table, model)] = _unit_rows(self._tables[table], model)
        return cache[(table, model)]

    def context_turn_matrix(self, model: str, share: float) -> tuple[np.ndarray, np.ndarray] | None:
        """``(turn ids, rows)`` with each row ``(1 - share) x turn vector + share x window vector``.

        Both parts are unit length, so the product with a unit cue is exactly
        ``(1 - share) x cos(turn) + share x cos(window)``: the context blend costs
        one matrix-vector product per reply, the same as the turn vectors alone.
        A turn whose window vector is missing (its projector lags) keeps its own
        row. None when no window vector exists under ``model``. A snapshot published
        with this share carries it precombined (memory-mapped at load); otherwise it
        is built once per snapshot, model and share; the window rows are not kept
        (the turn rows are, by ``turn_matrix``).
        """
        cache = self._context_matrices
        key = (model, float(share))
        if key not in cache:
            wids, windows = _unit_rows(self._tables["turn_window_embeddings"], model)
            ids, own = self.turn_matrix(model)
            blended = blend_context_rows(ids, own, wids, windows, share)
            cache[key] = None if blended is None else (ids, blended)
        return cache[key]


def blend_context_rows(ids: np.ndarray, own: np.ndarray, wids: np.ndarray, windows: np.ndarray,
                       share: float) -> np.ndarray | None:
    """``(1 - share) x own + share x window`` row by row (rows of ``ids``; a turn without a
    window vector keeps its own row), or None when there is nothing to combine.

    The one definition of the combined turn matrix: the publisher writes it, and
    a reader of a snapshot published without it (or with another share) builds it.
    """
    if len(wids) == 0 or len(ids) == 0 or windows.shape[1] != own.shape[1]:
        return None
    if np.array_equal(wids, ids):  # every turn has its window (the usual case): no gathers
        blended = own * np.float32(1 - share)
        blended += np.float32(share) * windows
        return blended
    at = np.searchsorted(wids, ids).clip(0, len(wids) - 1)
    has = wids[at] == ids
    blended = own.copy()
    blended[has] = (1 - share) * own[has] + share * windows[at[has]]
    return blended


def _unit_rows(table: pa.Table, model: str) -> tuple[np.ndarray, np.ndarray]:
    """``(turn ids ascending, unit float32 rows)`` of ``model``'s rows of a turn vector table."""
    ids = np.zeros(0, dtype=np.int64)
    matrix = np.zeros((0, 0), dtype=np.float32)
    if table.num_rows:
        hits = _where(table, pc.equal(table["model"], pa.scalar(model, pa.string())))
        if hits.num_rows:
            dim = int(hits["dim"][0].as_py())
            hits = _where(hits, pc.equal(hits["dim"], pa.scalar(dim, pa.int32())))
            ids = hits["turn_id"].to_numpy().astype(np.int64, copy=False)
            flat = pc.list_flatten(hits["vector"]).to_numpy(zero_copy_only=False)
            matrix = flat.astype(np.float32, copy=False).reshape(hits.num_rows, dim)
            norms = np.linalg.norm(matrix, axis=1, keepdims=True)
            matrix = matrix / np.where(norms > 0, norms, np.float32(1.0))
            if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):  # served sorted; else sort
                order = np.argsort(ids, kind="stable")
                ids, matrix = ids[order], matrix[order]
    return ids, np.ascontiguousarray(matrix)


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
        if name not in self._lazy:
            raise KeyError(name)
        with self._lock:
            if not dict.__contains__(self, name):
                self[name] = self._lazy[name]()
            return dict.__getitem__(self, name)


# Read only when a reply needs them once the snapshot carries the precombined turn matrix.
_LAZY_WITH_CONTEXT = frozenset({"turn_embeddings", "turn_window_embeddings"})


def load_snapshot(serving_dir: str | Path, manifest: Manifest) -> Snapshot:
    """Read every table the manifest names; raises OSError/ArrowException/
    SnapshotFormatError when a file is missing, damaged or not as announced.

    A snapshot with precombined turn matrices memory-maps them, and the two turn
    vector tables (~300 MB at 100k turns, read for nothing when the matrix is
    there) are only opened and checked: their rows are read if a reply asks.
    Open files and maps keep working after a later publish collects them.
    """
    serving_dir = Path(serving_dir)
    context = _context_matrices(serving_dir, manifest)
    tables: dict[str, pa.Table] = {}
    lazy: dict[str, Callable[[], pa.Table]] = {}
    for name, entry in manifest.tables.items():
        parquet = pq.ParquetFile(str(serving_dir / entry.file))
        if context and name in _LAZY_WITH_CONTEXT:
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
    schema = SERVING_SCHEMAS.get(name)
    missing = [c for c in schema.names if c not in columns] if schema is not None else []
    if missing:
        raise SnapshotFormatError(f"{entry.file} lacks columns {missing}")


def _validated(table: pa.Table, name: str, entry: TableFile) -> pa.Table:
    """``table`` checked against the manifest and cast to the served schema."""
    _check_table(table.column_names, table.num_rows, name, entry)
    schema = SERVING_SCHEMAS.get(name)
    return table if schema is None else table.select(schema.names).cast(schema)


def _reader(parquet: pq.ParquetFile, name: str, entry: TableFile) -> Callable[[], pa.Table]:
    def read() -> pa.Table:
        try:
            return _validated(parquet.read(), name, entry)
        finally:
            parquet.close()
    return read


def _context_matrices(serving_dir: Path, manifest: Manifest) -> dict[tuple[str, float], tuple[np.ndarray, np.ndarray]]:
    """The manifest's precombined turn matrices, memory-mapped, keyed ``(model, share)``."""
    out = {}
    for m in manifest.matrices:
        try:
            ids = np.load(serving_dir / m.ids_file, allow_pickle=False)
            rows = np.load(serving_dir / m.file, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise SnapshotFormatError(f"{m.file} is not a readable matrix: {exc}") from exc
        if (ids.dtype != np.int64 or ids.shape != (m.rows,) or rows.dtype != np.float32
                or rows.shape != (m.rows, m.dim)):
            raise SnapshotFormatError(f"{m.file} does not hold the {m.rows} x {m.dim} rows the manifest says")
        out[(m.model, m.share)] = (ids, rows)
    return out


# --------------------------------------------------------------------------- #
# The bot's reader
# --------------------------------------------------------------------------- #


class SnapshotReader:
    """The bot's view of one familiar's serving folder.

    ``refresh()`` is cheap when nothing changed (one read of a small JSON file)
    and never raises: a missing or corrupt manifest, or a file that vanished
    or is damaged, keeps the last good snapshot and logs one warning per
    distinct problem (``last_error`` holds it). The query helpers answer from
    the current :class:`Snapshot`; for several reads that must agree with each
    other, take ``snap = reader.current()`` once and query ``snap``.
    """

    def __init__(self, serving_dir: str | Path, *, retry_failed_after: float = 30.0):
        self.serving_dir = Path(serving_dir)
        self.retry_failed_after = retry_failed_after
        self.last_error: str | None = None
        self._snapshot = Snapshot.empty()
        self._refresh_lock = threading.Lock()
        # (version, published_at) of a snapshot that failed to load, and when:
        # not retried on every refresh, only after `retry_failed_after` seconds.
        self._failed: tuple[tuple[int, str], float] | None = None
        self.refresh()

    # -- loading ------------------------------------------------------------ #

    def refresh(self) -> bool:
        """Load the published snapshot if it changed; True when a new one was loaded."""
        with self._refresh_lock:
            try:
                return self._refresh_locked()
            except Exception as exc:  # the bot must keep answering from the last good one
                self._problem(f"unexpected error refreshing snapshot: {type(exc).__name__}: {exc}")
                return False

    def _refresh_locked(self) -> bool:
        manifest = self._read_manifest()
        if manifest is None:
            return False
        if self._is_current(manifest):
            self._recovered()
            return False
        key = (manifest.version, manifest.published_at)
        if self._failed and self._failed[0] == key:
            if time.monotonic() - self._failed[1] < self.retry_failed_after:
                return False
        for attempt in (1, 2):
            try:
                snapshot = load_snapshot(self.serving_dir, manifest)
            except (OSError, pa.ArrowException, SnapshotFormatError) as exc:
                message = f"cannot load snapshot v{manifest.version}: {type(exc).__name__}: {exc}"
                if attempt == 2:
                    self._failed = ((manifest.version, manifest.published_at), time.monotonic())
                    self._problem(message + f"; keeping v{self.version}")
                    return False
                # Usually a publisher replaced the manifest and collected the
                # files in between: the newer manifest names files that exist.
                newer = self._read_manifest()
                if newer is None or self._is_current(newer):
                    self._problem(message + f"; keeping v{self.version}")
                    return False
                manifest = newer
                continue
            self._snapshot = snapshot
            self._failed = None
            self._recovered()
            return True
        return False  # pragma: no cover - the loop always returns

    def _read_manifest(self) -> Manifest | None:
        try:
            manifest = read_manifest(self.serving_dir)
        except (OSError, SnapshotFormatError) as exc:
            self._problem(f"unreadable snapshot manifest: {exc}; keeping v{self.version}")
            return None
        if manifest is None and self.version:
            self._problem(f"{self.serving_dir / MANIFEST_NAME} is missing; keeping v{self.version}")
        return manifest

    def _is_current(self, manifest: Manifest) -> bool:
        current = self._snapshot.manifest
        return current is not None and (current.version, current.published_at) == (
            manifest.version,
            manifest.published_at,
        )

    def _recovered(self) -> None:
        if self.last_error is not None:
            logger.info("snapshot reader for %s is in step again at v%d", self.serving_dir, self.version)
            self.last_error = None

    def _problem(self, message: str) -> None:
        if message != self.last_error:
            logger.warning("snapshot reader for %s: %s", self.serving_dir, message)
        self.last_error = message

    # -- the current snapshot ---------------------------------------------- #

    def current(self) -> Snapshot:
        return self._snapshot

    @property
    def version(self) -> int:
        """0 until a snapshot was loaded."""
        return self._snapshot.version

    @property
    def manifest(self) -> Manifest | None:
        return self._snapshot.manifest

    # The queries answer from the snapshot current at the call: each call may
    # see a newer one than the last. They are the Snapshot's own methods, looked
    # up here rather than restated one forwarder each.
    QUERIES = frozenset({
        "table", "facts_by_ids", "current_facts", "recent_facts", "facts_for_subject",
        "superseded_fact_ids", "latest_fact_id", "summary", "dossier", "dossiers",
        "recent_reflections", "watermark", "fact_vector_count", "embeddings_for", "turn_matrix", "context_turn_matrix",
    })

    def __getattr__(self, name: str) -> Any:
        if name in SnapshotReader.QUERIES:
            return getattr(self._snapshot, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
