"""Publishing a serving snapshot: the store's committed tables as versioned Parquet files, then the manifest.

DuckDB lets one process hold a database file; while a Dagster run writes
``memory.duckdb`` another process cannot even open it read-only. So a run, after its
short write transaction, *publishes* the serving tables as Parquet files in
``serving/`` and the bot reads those, lock-free.

Publishing protocol (one publisher per familiar at a time, enforced by a lock file):

1. every table is written with DuckDB ``COPY (query) TO '<temp>' (FORMAT parquet)``
   to a hidden temp name, fsynced, then ``os.replace``d to an immutable versioned
   name such as ``facts.v12.parquet`` (a name is never rewritten once a manifest
   points at it); precombined vector matrices (``vectors``) are written the same way
   as ``.npy`` files, from the same read transaction;
2. the manifest is written as the version's copy (``manifest.v12.json``), then to a
   temp file, fsynced and ``os.replace``d onto ``manifest.json``: this rename is the
   commit point, so a reader sees the whole old or the whole new snapshot, never a mix;
3. files (and manifest copies) of versions older than the previous one are deleted (a
   reader that read the previous manifest a moment ago can still open its files), with
   stray temps. The previous version's copy is what a reader serves when the newest
   snapshot is found damaged (``manifest.published_manifests``).

A failure before step 2 completes removes what it wrote and raises
:class:`SnapshotPublishError`; the previous manifest and its files are untouched.

What is served is declared by the tables themselves (``tables.Table.served_sql``),
plus the kernel's watermarks: :func:`served_tables`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import duckdb

from familiar_pipeline.storage.tables import Table, declared_tables

from .manifest import (
    LOCK_NAME,
    MANIFEST_COPY,
    MANIFEST_NAME,
    TABLE_NAME,
    VERSIONED_FILE,
    Manifest,
    MatrixFile,
    SnapshotFormatError,
    SnapshotPublishError,
    TableFile,
    manifest_copy_name,
    read_manifest,
)
from .files import fsync_dir, fsync_file, remove_quietly, temp_path
from .vectors import ContextMatrix, write_context_matrices

try:  # POSIX only; without it a second concurrent publisher is not excluded.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

_TEMP_FILE = re.compile(r"^\..+\.tmp$")

# The kernel's own served table: how far each projector had read when the snapshot was taken.
WATERMARKS_SQL = """
    SELECT projector::VARCHAR AS projector, turn_id::BIGINT AS turn_id,
           fact_id::BIGINT AS fact_id, change_seq::BIGINT AS change_seq,
           updated_at::TIMESTAMPTZ AS updated_at
    FROM watermarks ORDER BY projector
"""


def served_tables(tables: Iterable[Table]) -> dict[str, str]:
    """name -> SELECT of what a snapshot publishes: every declared table, and the watermarks."""
    return {**{t.name: t.served_sql() for t in tables}, "watermarks": WATERMARKS_SQL}


def publish_snapshot(
    conn: duckdb.DuckDBPyConnection,
    serving_dir: str | Path,
    *,
    store_watermark: Mapping[str, object],
    tables: Mapping[str, str] | None = None,
    durable: bool = True,
    matrices: ContextMatrix | None = None,
    pending_assets: Sequence[str] = (),
) -> Manifest:
    """Publish ``tables`` (name -> SELECT, see `served_tables`; default: every table declared in this
    process, and the watermarks) from ``conn`` as the next snapshot.

    Publishes *committed* state: the COPYs run in one read transaction on a
    cursor of their own, so all tables come from the same database state and a
    transaction the caller has open on ``conn`` is neither seen nor disturbed
    (so call it after the write transaction commits). ``store_watermark`` is
    recorded verbatim in the manifest (datetimes as ISO strings) so checks can
    tell whether the snapshot is in step with the store. ``durable=False`` skips the fsyncs (for
    scratch folders); the rename order alone still keeps readers consistent.

    ``matrices``: the vector tables to precombine (``vectors.ContextMatrix``): each
    model's combined turn matrix is written beside the tables as ``.npy`` files the bot
    memory-maps (combining 100k turns took the bot's first reply after each publish
    several seconds).
    ``pending_assets``: what the publishing run has not run yet for this familiar
    (recorded in the manifest for the turn sensor).
    """
    serving_dir = Path(serving_dir)
    watermark = _jsonable_watermark(store_watermark)
    if tables is None:
        tables = served_tables(declared_tables())
    if not tables:
        raise ValueError("publish_snapshot needs at least one table")
    for name in tables:
        if not isinstance(name, str) or not TABLE_NAME.match(name):
            raise ValueError(
                f"bad serving table name {name!r}: use a-z, 0-9 and '_', starting with a letter"
            )
    serving_dir.mkdir(parents=True, exist_ok=True)

    with _publish_lock(serving_dir):
        previous = _previous_manifest(serving_dir)
        version = max(previous.version if previous else 0, _highest_file_version(serving_dir)) + 1
        written: list[Path] = []
        try:
            entries, written_matrices = _copy_tables(conn, serving_dir, version, tables, written, durable, matrices)
            manifest = Manifest(
                version=version,
                published_at=datetime.now(timezone.utc).isoformat(timespec="microseconds"),
                store_watermark=watermark,
                tables=entries,
                matrices=written_matrices,
                pending_assets=tuple(pending_assets),
            )
            _write_manifest(serving_dir, manifest, written, durable)
        except BaseException as exc:
            remove_quietly(written)
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
        match = VERSIONED_FILE.match(name) or MANIFEST_COPY.match(name)
        if match:
            highest = max(highest, int(match["version"]))
    return highest


def _copy_tables(
    conn: duckdb.DuckDBPyConnection,
    serving_dir: Path,
    version: int,
    tables: Mapping[str, str],
    written: list[Path],
    durable: bool,
    matrices: ContextMatrix | None = None,
) -> tuple[dict[str, TableFile], tuple[MatrixFile, ...]]:
    entries: dict[str, TableFile] = {}
    # A cursor is a separate DuckDB connection to the same database: its own
    # transaction gives every COPY the same committed state, and a failure here
    # cannot abort a transaction the caller may have open on ``conn``.
    # Its default database is the caller's (a store's file may be attached under an alias).
    row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    (database,) = row
    cursor = conn.cursor()
    try:
        cursor.execute(f'USE "{database}"')
        cursor.execute("BEGIN TRANSACTION")
        for name, query in tables.items():
            temp = temp_path(serving_dir, f"{name}.v{version}")
            written.append(temp)
            target_sql = str(temp).replace("'", "''")
            result = cursor.execute(f"COPY ({query}) TO '{target_sql}' (FORMAT parquet)").fetchone()
            rows = int(result[0]) if result else 0
            if durable:
                fsync_file(temp)
            final = serving_dir / f"{name}.v{version}.parquet"
            written.append(final)
            os.replace(temp, final)
            entries[name] = TableFile(file=final.name, rows=rows, bytes=final.stat().st_size)
        written_matrices = () if matrices is None else write_context_matrices(
            cursor, serving_dir, version, tables, entries, matrices, written, durable)
    finally:
        with contextlib.suppress(duckdb.Error):
            cursor.execute("ROLLBACK")  # read-only: nothing to commit
        cursor.close()
    if durable:
        fsync_dir(serving_dir)
    return entries, written_matrices


def _write_manifest(serving_dir: Path, manifest: Manifest, written: list[Path], durable: bool) -> None:
    payload = json.dumps(manifest.to_json(), indent=2, sort_keys=True).encode("utf-8")
    copy = serving_dir / manifest_copy_name(manifest.version)
    for target in (copy, serving_dir / MANIFEST_NAME):  # two files, not links: one damaged leaves the other
        temp = temp_path(serving_dir, "manifest")
        written.append(temp)
        with open(temp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            if durable and target != copy:  # the copy is a fallback: a power cut may cost it, not the commit
                os.fsync(handle.fileno())
        if target == copy:
            written.append(copy)
        os.replace(temp, target)
    # Committed: the versioned files now belong to the published snapshot.
    written.clear()
    if durable:
        try:
            fsync_dir(serving_dir)
        except OSError as exc:  # the rename happened; durability is best effort here
            logger.warning("could not fsync %s after publishing: %s", serving_dir, exc)


def _collect_garbage(serving_dir: Path, keep_versions: set[int]) -> None:
    """Delete versions (files and manifest copies) older than the previous one, and temps of dead publishers.

    Safe under the publish lock: no other publisher is writing a temp file now.
    """
    for name in os.listdir(serving_dir):
        match = VERSIONED_FILE.match(name) or MANIFEST_COPY.match(name)
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


