"""The passage vectors' table: one vector per (long turn, passage, model), and the passage matrix a reply searches."""

from __future__ import annotations

from dataclasses import make_dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.tables import Provenance, Table, col

PassageVector = make_dataclass("PassageVector", [
    ("turn_id", int, col("BIGINT")),
    ("passage", int, col("INTEGER")),  # the passage's index among its turn's passages (storage.passages)
    ("model", str, col("VARCHAR")),
    ("dim", int, col("INTEGER")),
    ("vector", tuple, col("FLOAT[]")),
    ("created_at", datetime, col("TIMESTAMPTZ", system_time=True)),
    ("scope", str, col("VARCHAR", fill=f"'{FAMILIAR_WIDE}'", default=FAMILIAR_WIDE)),
], frozen=True)

TURN_PASSAGE_EMBEDDINGS = Table(
    "turn_passage_embeddings",
    PassageVector,
    key=("turn_id", "passage", "model"),
    provenance=Provenance(turns=("turn_id",), on_change="own"),  # re-embedded or dropped by its run
    description="A vector per (passage of a long live turn, embedding model) (projector turn_passage_embedding).",
)


class PassageMatrix(NamedTuple):
    """Every passage vector under one model: row ``r`` is passage ``passages[r]`` of turn ``turn_ids[r]``
    (sorted by turn, then passage)."""

    turn_ids: np.ndarray
    passages: np.ndarray
    matrix: np.ndarray


def passage_rows(table: pa.Table, model: str) -> PassageMatrix:
    """``model``'s rows of a passage vector table as unit float32 rows (rows of another dimension
    than the first are left out: a corrupt row must not break every reply)."""
    empty = PassageMatrix(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.float32))
    if table.num_rows == 0:
        return empty
    hits = table.filter(pc.equal(table["model"], pa.scalar(model, pa.string())))
    if hits.num_rows == 0:
        return empty
    dim = int(hits["dim"][0].as_py())
    hits = hits.filter(pc.equal(hits["dim"], pa.scalar(dim, pa.int32())))
    ids = hits["turn_id"].to_numpy().astype(np.int64, copy=False)
    passages = hits["passage"].to_numpy().astype(np.int64, copy=False)
    flat = pc.list_flatten(hits["vector"]).to_numpy(zero_copy_only=False)
    matrix = flat.astype(np.float32, copy=False).reshape(hits.num_rows, dim)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    matrix = matrix / np.where(norms > 0, norms, np.float32(1.0))
    order = np.lexsort((passages, ids))
    return PassageMatrix(ids[order], passages[order], np.ascontiguousarray(matrix[order]))


def passage_matrix(source: Any, model: str) -> PassageMatrix:
    """The :class:`PassageMatrix` of a serving snapshot under ``model``, built once per snapshot and model."""
    snap = source.current()
    return snap.cached(("passage_matrix", model), lambda: passage_rows(snap.table(TURN_PASSAGE_EMBEDDINGS.name), model))
