"""Passage vectors' spec: knobs, asset and table."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import TURN_INDEX, knob
from familiar_pipeline.projectors.vectors import vector_spec

from .tables import TURN_PASSAGE_EMBEDDINGS

PROJECTOR = "turn_passage_embedding"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class TurnPassageConfig:
    """[providers.memory.turn_passage_embedding]"""

    # Passages embedded per call to the embedding model (and turns read per committed chunk).
    batch_size: int = knob(64, minimum=1)
    # Passage size in characters; a turn longer than 1.5x this is cut into passages (the same cut
    # as [memory.retrieval].turn_passage_chars, which shows a long turn as one passage).
    passage_chars: int = knob(600, minimum=100)


SPEC = vector_spec(
    name=PROJECTOR,
    asset="turn_passage_embeddings",
    run="familiar_pipeline.projectors.turn_passage_embeddings.run:run",
    description="""Opt-in: a vector per passage of each long live turn (projector `turn_passage_embedding`).

    A turn longer than 1.5 x `passage_chars` is cut at paragraph, line or sentence ends and each passage
    embedded as "speaker: passage"; edits re-embed, deletions remove. `rag_context` raises a turn's cosine to
    its best passage's (`[memory.retrieval].turn_passage_weight`); useful with `turn_embedding` on. Needs
    [providers.embedding].backend other than "off".
    """,
    group="turns",
    trigger=TURN_INDEX,
    knobs=TurnPassageConfig,
    table=TURN_PASSAGE_EMBEDDINGS,  # a rebuild drops every passage vector, all models
)
