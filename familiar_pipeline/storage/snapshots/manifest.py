"""The snapshot manifest: which versioned files make up the published snapshot.

``manifest.json`` is the commit point of a publish (``publish``): it is written last,
with ``os.replace``, so a reader sees the whole old or the whole new snapshot. It is
validated on read, and every file it names must stay inside the serving folder.

Each publish also leaves a copy of its manifest under its version's name
(``manifest.v12.json``), kept as long as that version's files: when ``manifest.json``
is missing or truncated, or a file it names is gone or cut short (`damage`), a
restarted reader serves the newest snapshot that is still whole (`published_manifests`)
instead of nothing, and the turn sensor asks for a run that publishes a whole one again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TypeGuard

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
LOCK_NAME = ".publish.lock"

TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
VERSIONED_FILE = re.compile(r"^(?P<table>[a-z][a-z0-9_]{0,62})\.v(?P<version>[0-9]+)\.(?P<kind>parquet|npy)$")
# The copy of each version's manifest (see above).
MANIFEST_COPY = re.compile(r"^manifest\.v(?P<version>[0-9]+)\.json$")
# The files of a precombined turn matrix are named after this (see `vectors`).
CONTEXT_MATRIX = "turn_context"


class SnapshotPublishError(RuntimeError):
    """Publishing failed; the previous snapshot is still the published one."""


class SnapshotFormatError(ValueError):
    """A manifest that is not valid JSON or not a format this code understands."""




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
            match = VERSIONED_FILE.match(file) if isinstance(file, str) else None
            if (not isinstance(file, str) or not TABLE_NAME.match(str(name)) or match is None or match["table"] != name
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
        match = VERSIONED_FILE.match(entry[key]) if isinstance(entry[key], str) else None
        if match is None or match["kind"] != "npy" or not match["table"].startswith(CONTEXT_MATRIX):
            raise SnapshotFormatError(f"manifest matrix entry names a bad file {entry[key]!r}")
    share = entry["share"]
    if not isinstance(entry["model"], str) or isinstance(share, bool) or not isinstance(share, (int, float)) \
            or not 0.0 <= share <= 1.0:
        raise SnapshotFormatError("manifest matrix entry has a bad model or share")
    if not all(_is_int(entry[k]) and entry[k] >= 0 for k in ("rows", "dim")):
        raise SnapshotFormatError("manifest matrix entry has bad rows/dim")
    return MatrixFile(**{**entry, "share": float(share)})


def read_manifest(serving_dir: str | Path, name: str = MANIFEST_NAME) -> Manifest | None:
    """The published manifest (or the copy named `name`), or None when there is no such file.

    Raises :class:`SnapshotFormatError` when the file exists but is unreadable
    as a manifest (asset checks use this to compare the snapshot with the store).
    """
    path = Path(serving_dir) / name
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise SnapshotFormatError(f"{path} is not valid JSON: {exc}") from exc
    return Manifest.from_json(data)


def manifest_copy_name(version: int) -> str:
    return f"manifest.v{version}.json"


def damage(serving_dir: str | Path, manifest: Manifest) -> str | None:
    """What is wrong with the files `manifest` names (one is missing, or not the size it was
    published at), or None when they are all there: a dozen `stat`s, no file read."""
    serving_dir = Path(serving_dir)
    for entry in manifest.tables.values():
        try:
            size = (serving_dir / entry.file).stat().st_size
        except FileNotFoundError:
            return f"{entry.file} is missing"
        if size != entry.bytes:
            return f"{entry.file} is {size} bytes, published as {entry.bytes}"
    for matrix in manifest.matrices:
        for file in (matrix.file, matrix.ids_file):
            if not (serving_dir / file).exists():
                return f"{file} is missing"
    return None


@dataclass(frozen=True)
class Published:
    """What the serving folder holds: ``manifest.json``'s manifest (None: missing or
    unreadable), what is wrong with it or its files (None: nothing), and every readable
    manifest, ``manifest.json``'s and the versions' copies, newest first."""

    manifest: Manifest | None
    problem: str | None
    manifests: tuple[Manifest, ...]

    def intact(self, serving_dir: str | Path) -> Manifest | None:
        """The newest manifest whose files are all there."""
        return next((m for m in self.manifests if damage(serving_dir, m) is None), None)


def published_manifests(serving_dir: str | Path, *, every_copy: bool = False) -> Published:
    """The serving folder's manifests (see `Published`).

    When ``manifest.json`` and its files are whole, that is one read and a `stat` per
    file (the turn sensor asks at every tick), unless `every_copy` (a reader whose load
    of a whole-looking snapshot failed); else the folder is listed for the copies.
    """
    serving_dir = Path(serving_dir)
    for _ in range(3):  # a publish between the read and the stats can remove what it named: read again
        problem = None
        try:
            current = read_manifest(serving_dir)
        except (OSError, SnapshotFormatError) as exc:
            current, problem = None, f"unreadable {MANIFEST_NAME}: {exc}"
        if current is None or (problem := damage(serving_dir, current)) is None:
            break
        try:
            again = read_manifest(serving_dir)
        except (OSError, SnapshotFormatError):
            break
        if again is None or (again.version, again.published_at) == (current.version, current.published_at):
            break
    if current is not None and not every_copy and problem is None:
        return Published(current, None, (current,))
    found: dict[tuple[int, str], Manifest] = {}
    try:
        names = sorted(os.listdir(serving_dir))
    except FileNotFoundError:
        names = []
    for name in names:
        if MANIFEST_COPY.match(name):
            try:
                copy = read_manifest(serving_dir, name)
            except (OSError, SnapshotFormatError):
                continue
            if copy is not None:
                found.setdefault((copy.version, copy.published_at), copy)
    if current is not None:
        found[(current.version, current.published_at)] = current
        problem = damage(serving_dir, current)
    elif problem is None and found:
        problem = f"{MANIFEST_NAME} is missing"
    # manifest.json first among equal versions: it is the one published last.
    manifests = sorted(found.values(), key=lambda m: (m.version, m is current), reverse=True)
    return Published(current, problem, tuple(manifests))


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)

