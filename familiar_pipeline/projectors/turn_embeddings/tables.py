"""The turn vectors' table: one vector per (turn, model), and the turn matrix a reply searches."""

from __future__ import annotations

from typing import Any

import numpy as np

from familiar_pipeline.projectors.vectors import TurnVector
from familiar_pipeline.storage.snapshots import unit_rows
from familiar_pipeline.storage.tables import Provenance, Table

TURN_EMBEDDINGS = Table(
    "turn_embeddings",
    TurnVector,
    key=("turn_id", "model"),
    provenance=Provenance(turns=("turn_id",), on_change="own"),  # re-embedded or dropped by its run
    description="A vector per (live turn, embedding model) (projector turn_embedding).",
)


def turn_matrix(source: Any, model: str, table: str = TURN_EMBEDDINGS.name) -> tuple[np.ndarray, np.ndarray]:
    """``(turn ids, unit-length float32 rows)`` of every turn vector under ``model`` in a serving snapshot.

    Built once per snapshot, table and model (the snapshot never changes), so a reply's
    dense turn search is one matrix-vector product. Rows of another dimension than the
    model's first row are left out (a corrupt row must not break every reply).
    ``table`` may name another turn vector table (the context windows').
    """
    snap = source.current()
    return snap.cached(("turn_matrix", table, model), lambda: unit_rows(snap.table(table), model))
