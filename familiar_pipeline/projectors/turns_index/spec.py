"""The turn full-text index's spec (always on; no model, no table)."""

from __future__ import annotations

from familiar_pipeline.engine.spec import TURN_INDEX, ProjectorSpec

PROJECTOR = "turns_fts"  # the projector's name: its watermark row (always on, never listed in a config)


SPEC = ProjectorSpec(
    name=PROJECTOR,
    run="familiar_pipeline.projectors.turns_index.run:run",
    description="""Full-text index of the turn log (fts/turns): new turns added, edited ones re-indexed, deleted ones removed.

    The bot's retrieval searches it for earlier turns related to the new message. Needs no model.
    """,
    group="turns",
    kinds={"tantivy"},
    trigger=TURN_INDEX,
    needs_llm=False,
    always_on=True,
    search_index="turns",
    search_rows="familiar_pipeline.projectors.turns_index.run:search_rows",
    # No table: a rebuild drops only the watermark and clears fts/turns itself.
)
