"""Fact embeddings' spec: knobs, asset and table."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import FACTS, knob
from familiar_pipeline.projectors.vectors import vector_spec

from .tables import FACT_EMBEDDINGS

PROJECTOR = "fact_embedding"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class FactEmbeddingConfig:
    """[providers.memory.fact_embedding]"""

    batch_size: int = knob(32, minimum=1)


SPEC = vector_spec(
    name=PROJECTOR,
    asset="fact_embeddings",
    run="familiar_pipeline.projectors.fact_embeddings.run:run",
    description="""Opt-in: a vector per current fact for the active embedding model (projector `fact_embedding`).

    Embeds, in batches of `batch_size`, every current fact lacking a vector under the active model's name;
    a model swap adds rows beside the old ones. Needs [providers.embedding].backend other than "off".
    """,
    group="facts",
    inputs=("facts",),
    trigger=FACTS,
    knobs=FactEmbeddingConfig,
    table=FACT_EMBEDDINGS,  # a rebuild drops every vector, all models
)
