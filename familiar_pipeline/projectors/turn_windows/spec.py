"""Context-window vectors' spec: knobs, asset and table."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import TURN_INDEX, knob
from familiar_pipeline.projectors.vectors import vector_spec

from .tables import TURN_WINDOW_EMBEDDINGS, context_matrix

PROJECTOR = "turn_window_embedding"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class TurnWindowConfig:
    """[providers.memory.turn_window_embedding]"""

    batch_size: int = knob(64, minimum=1)
    # Same-channel turns on each side embedded with a turn (2 measured best on LoCoMo).
    span: int = knob(2, minimum=1, maximum=10)


SPEC = vector_spec(
    name=PROJECTOR,
    asset="turn_window_embeddings",
    run="familiar_pipeline.projectors.turn_windows.run:run",
    description="""Opt-in: per live turn, a vector of the turn with its nearest same-channel turns (projector
    `turn_window_embedding`).

    `span` turns each side; new turns re-embed the windows that reach them, edits and deletions the windows
    around them. `rag_context` blends its cosine with the turn's own (`[memory.retrieval].turn_context`);
    useful with `turn_embedding` on. Needs [providers.embedding].backend other than "off".
    """,
    group="turns",
    trigger=TURN_INDEX,
    knobs=TurnWindowConfig,
    table=TURN_WINDOW_EMBEDDINGS,  # a rebuild drops every window vector, all models
    # Each publish precombines every turn's vector with its window's, at the shipped blend.
    matrices=lambda config: context_matrix(config.memory.retrieval.turn_context),
)
