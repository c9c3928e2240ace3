"""The context-window vectors' table: per (turn, model), the vector of the turn with its nearest
same-channel turns, and the turn matrix blended with it that a reply searches."""

from __future__ import annotations

from typing import Any

import numpy as np

from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS, turn_matrix
from familiar_pipeline.projectors.vectors import TurnVector
from familiar_pipeline.storage.snapshots import ContextMatrix, blend_context_rows, unit_rows
from familiar_pipeline.storage.tables import Provenance, Table

TURN_WINDOW_EMBEDDINGS = Table(
    "turn_window_embeddings",
    TurnVector,
    key=("turn_id", "model"),
    # The window text holds the neighbours too; the projector re-embeds every window within reach
    # of an edited or deleted turn, so a window vector never outlives a neighbour's text.
    provenance=Provenance(turns=("turn_id",), on_change="own"),  # re-embedded or dropped by its run
    description="A vector per (live turn, model) of the turn with its nearest same-channel turns "
                "(projector turn_window_embedding).",
)


def context_matrix(share: float) -> ContextMatrix:
    """What a publish precombines: each turn's vector blended with its window's."""
    return ContextMatrix(own=TURN_EMBEDDINGS.name, windows=TURN_WINDOW_EMBEDDINGS.name, share=share)


def context_turn_matrix(source: Any, model: str, share: float) -> tuple[np.ndarray, np.ndarray] | None:
    """``(turn ids, rows)`` with each row ``(1 - share) x turn vector + share x window vector``.

    Both parts are unit length, so the product with a unit cue is exactly
    ``(1 - share) x cos(turn) + share x cos(window)``: the context blend costs one
    matrix-vector product per reply, the same as the turn vectors alone. A turn whose
    window vector is missing (its projector lags) keeps its own row. None when no
    window vector exists under ``model``. A snapshot published with this share carries
    it precombined (memory-mapped at load); otherwise it is built once per snapshot,
    model and share; the window rows are not kept (the turn rows are, by ``turn_matrix``).
    """
    snap = source.current()
    key = (model, float(share))
    if key in snap.context_matrices:
        return snap.context_matrices[key]

    def build() -> tuple[np.ndarray, np.ndarray] | None:
        wids, windows = unit_rows(snap.table(TURN_WINDOW_EMBEDDINGS.name), model)
        ids, own = turn_matrix(snap, model)
        blended = blend_context_rows(ids, own, wids, windows, share)
        return None if blended is None else (ids, blended)

    return snap.cached(("context_turn_matrix", key), build)
