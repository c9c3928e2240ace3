"""Turn embeddings' spec: knobs, asset and table."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import TURN_INDEX, knob
from familiar_pipeline.projectors.vectors import vector_spec

from .tables import TURN_EMBEDDINGS

PROJECTOR = "turn_embedding"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class TurnEmbeddingConfig:
    """[providers.memory.turn_embedding]"""

    batch_size: int = knob(64, minimum=1)


SPEC = vector_spec(
    name=PROJECTOR,
    asset="turn_embeddings",
    run="familiar_pipeline.projectors.turn_embeddings.run:run",
    description="""Opt-in: a vector per live turn for the active embedding model (projector `turn_embedding`).

    New turns are embedded in batches of `batch_size`, edited turns re-embedded, deleted turns' vectors
    removed; `rag_context` fuses the cosine with BM25 (`[memory.retrieval].turn_embedding_weight`).
    Needs [providers.embedding].backend other than "off".
    """,
    group="turns",
    trigger=TURN_INDEX,
    knobs=TurnEmbeddingConfig,
    table=TURN_EMBEDDINGS,  # a rebuild drops every turn vector, all models
)
