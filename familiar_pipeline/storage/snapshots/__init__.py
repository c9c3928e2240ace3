"""Parquet serving snapshots: how the bot reads memory without opening DuckDB.

A run publishes the store's committed tables as versioned Parquet files and swaps
``manifest.json`` (``publish``); the bot's :class:`SnapshotReader` (``reader``) loads
the published :class:`Snapshot` (``snapshot``) and keeps the last good one. What each
table means, and its reads over a snapshot, live with the table's declaration in its
projector's folder; here are only the kernel's parts:

* ``manifest``: the manifest format and its validation, the versions' manifest copies and
  what a damaged snapshot falls back to (``published_manifests``);
* ``publish``: the publishing protocol (temp files, ``os.replace``, the manifest as the
  commit point, garbage collection), and what is served (:func:`served_tables`);
* ``snapshot``: one loaded snapshot, checked against the declared schemas;
* ``reader``: the bot's reader;
* ``vectors``: unit-row matrices and the precombined turn-and-window matrix.
"""

from .manifest import LOCK_NAME, MANIFEST_FORMAT, MANIFEST_NAME, Manifest, MatrixFile, TableFile
from .manifest import Published, SnapshotFormatError, SnapshotPublishError, damage, published_manifests, read_manifest
from .publish import WATERMARKS_SQL, publish_snapshot, served_tables
from .reader import SnapshotReader
from .snapshot import Snapshot, empty_table, load_snapshot, served_schema
from .vectors import TURN_CONTEXT_SHARE, ContextMatrix, blend_context_rows, unit_rows, where

__all__ = [
    "LOCK_NAME", "MANIFEST_FORMAT", "MANIFEST_NAME", "TURN_CONTEXT_SHARE", "WATERMARKS_SQL", "ContextMatrix",
    "Manifest", "MatrixFile", "Published", "Snapshot", "SnapshotFormatError", "SnapshotPublishError", "SnapshotReader",
    "TableFile", "blend_context_rows", "damage", "empty_table", "load_snapshot", "publish_snapshot",
    "published_manifests", "read_manifest",
    "served_schema", "served_tables", "unit_rows", "where",
]
