"""The built-in projectors: each folder's spec, registered with the engine in run order.

The engine sits below the projectors and imports none of them: this module plugs them in,
as a plugin does (`engine.registry.register_projector`). It is the ``familiar.projectors``
entry point (pyproject.toml), so the registry and config find the built-ins on first use
in any process; code above the projectors (the asset factory, the checks) imports it for
`BUILTIN_SPECS` itself.
"""

from __future__ import annotations

from familiar_pipeline.engine.registry import register_projector
from familiar_pipeline.engine.spec import ProjectorSpec
from familiar_pipeline.projectors.dossiers.spec import SPEC as DOSSIERS
from familiar_pipeline.projectors.fact_embeddings.spec import SPEC as FACT_EMBEDDINGS
from familiar_pipeline.projectors.facts.spec import SPEC as FACTS
from familiar_pipeline.projectors.reflections.spec import SPEC as REFLECTIONS
from familiar_pipeline.projectors.summary.spec import SPEC as SUMMARY
from familiar_pipeline.projectors.supersede.spec import SPEC as SUPERSEDE
from familiar_pipeline.projectors.turn_embeddings.spec import SPEC as TURN_EMBEDDINGS
from familiar_pipeline.projectors.turn_passage_embeddings.spec import SPEC as TURN_PASSAGES
from familiar_pipeline.projectors.turn_windows.spec import SPEC as TURN_WINDOWS
from familiar_pipeline.projectors.turns_index.spec import SPEC as TURNS_INDEX
from familiar_pipeline.projectors.wishes.spec import SPEC as WISHES

# The built-in projectors, in the order a run executes them for each familiar (each after
# what it reads). A new built-in is one line here. Fact embeddings come straight after the
# facts, before supersession retires any: every fact then gets its vector whether the facts
# arrive batch by batch or all at once in a rebuild, so the two build the same rows.
BUILTIN_SPECS: tuple[ProjectorSpec, ...] = (
    TURNS_INDEX,
    SUMMARY,
    FACTS,
    FACT_EMBEDDINGS,
    SUPERSEDE,
    WISHES,  # after the facts and their supersession: it pins the facts of kind "wish" too
    DOSSIERS,
    REFLECTIONS,
    TURN_EMBEDDINGS,
    TURN_WINDOWS,
    TURN_PASSAGES,
)
for _spec in BUILTIN_SPECS:
    register_projector(_spec)

BUILTIN_PROJECTORS: tuple[str, ...] = tuple(spec.name for spec in BUILTIN_SPECS)
