"""Vector matrices in a snapshot: unit rows per model, and the precombined turn-and-window matrix.

A reply's dense turn search is one matrix-vector product over unit rows. When a
familiar keeps both a vector per turn and a vector per turn's context window (two
declared vector tables, named by the projectors that keep them: ``ContextMatrix``),
the publish writes, per model, the blend ``(1 - share) x turn + share x window`` as a
``.npy`` matrix the bot memory-maps (``load_context_matrices``), and a reader of a
snapshot without it builds the same blend on first use (``blend_context_rows``, the
one definition of it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .files import fsync_dir, temp_path
from .manifest import CONTEXT_MATRIX, Manifest, MatrixFile, SnapshotFormatError, TableFile

# The shipped ``[memory.retrieval].turn_context`` (tests hold the two equal): the share of
# each turn's context-window vector in the turn matrix a snapshot precombines at publish.
TURN_CONTEXT_SHARE = 0.5


@dataclass(frozen=True)
class ContextMatrix:
    """Which served vector tables a publish precombines: ``own`` (a vector per turn) and
    ``windows`` (a vector per turn's context window), blended with ``share`` of the window."""

    own: str
    windows: str
    share: float = TURN_CONTEXT_SHARE


def where(table: pa.Table, mask: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Rows where ``mask`` is true (NULL counts as false), in table order.

    ``take`` of the matching indices touches only those rows; ``Table.filter``
    would rebuild every column, which costs milliseconds at 20k facts. When
    every row matches, the table itself (no copy).
    """
    rows = pc.indices_nonzero(pc.fill_null(mask, False))
    return table if len(rows) == table.num_rows else table.take(rows)


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


def unit_rows(table: pa.Table, model: str) -> tuple[np.ndarray, np.ndarray]:
    """``(turn ids ascending, unit float32 rows)`` of ``model``'s rows of a turn vector table."""
    ids = np.zeros(0, dtype=np.int64)
    matrix = np.zeros((0, 0), dtype=np.float32)
    if table.num_rows:
        hits = where(table, pc.equal(table["model"], pa.scalar(model, pa.string())))
        if hits.num_rows:
            dim = int(hits["dim"][0].as_py())
            hits = where(hits, pc.equal(hits["dim"], pa.scalar(dim, pa.int32())))
            ids = hits["turn_id"].to_numpy().astype(np.int64, copy=False)
            flat = pc.list_flatten(hits["vector"]).to_numpy(zero_copy_only=False)
            matrix = flat.astype(np.float32, copy=False).reshape(hits.num_rows, dim)
            norms = np.linalg.norm(matrix, axis=1, keepdims=True)
            matrix = matrix / np.where(norms > 0, norms, np.float32(1.0))
            if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):  # served sorted; else sort
                order = np.argsort(ids, kind="stable")
                ids, matrix = ids[order], matrix[order]
    return ids, np.ascontiguousarray(matrix)



def write_context_matrices(cursor: duckdb.DuckDBPyConnection, serving_dir: Path, version: int,
                           tables: Mapping[str, str], entries: Mapping[str, TableFile], matrices: ContextMatrix,
                           written: list[Path], durable: bool) -> tuple[MatrixFile, ...]:
    """Each model's precombined turn matrix, from the turn and window rows just copied.

    Runs in the publish's read transaction, so the matrix is of the same rows as
    the tables; the rows come straight from DuckDB (reading the Parquet back was
    ~3x slower at 100k turns).
    """
    own_name, window_name, share = matrices.own, matrices.windows, matrices.share
    if not {own_name, window_name} <= set(entries) or not 0.0 <= share <= 1.0:
        return ()
    if entries[window_name].rows == 0 or entries[own_name].rows == 0:
        return ()
    own_table = cursor.sql(tables[own_name]).to_arrow_table()
    window_table = cursor.sql(tables[window_name]).to_arrow_table()
    out = []
    for position, model in enumerate(sorted(set(pc.unique(own_table["model"]).to_pylist()))):
        ids, own = unit_rows(own_table, model)
        wids, windows = unit_rows(window_table, model)
        matrix = blend_context_rows(ids, own, wids, windows, share)
        if matrix is None:
            continue
        stem = f"{CONTEXT_MATRIX}_{position}"
        files = {}
        for name, array in ((f"{stem}_ids", ids), (stem, matrix)):
            temp = temp_path(serving_dir, f"{name}.v{version}")
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
        fsync_dir(serving_dir)
    return tuple(out)


def load_context_matrices(serving_dir: Path, manifest: Manifest) -> dict[tuple[str, float], tuple[np.ndarray, np.ndarray]]:
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


