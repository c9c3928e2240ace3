"""The reflections' spec: knobs, asset, table, and the rule that every reflection cites something."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.projectors.facts.store import all_fact_ids
from familiar_pipeline.engine.spec import FACTS, ProjectorSpec, invariant, knob
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .tables import REFLECTIONS, all_reflections

PROJECTOR = "reflection"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class ReflectionConfig:
    """[providers.memory.reflection]"""

    turns_threshold: int = knob(40, minimum=1)
    max_reflections_per_tick: int = knob(3, minimum=1)
    max_turns_per_tick: int = knob(50, minimum=1)
    recent_facts_limit: int = knob(20, minimum=0)  # 0 leaves facts out of the prompt



@invariant("reflections_cite_something", "Every reflection cites at least one existing turn or fact.",
           what="(reflection id, citations)")
def uncited_reflections(store: ProjectionStore, turn_log: TurnLog, familiar_id: str = "") -> list[tuple[int, str]]:
    """(reflection id, why) for reflections citing no existing turn and no existing fact."""
    rows = all_reflections(store)
    all_turns = sorted({t for r in rows for t in r.cited_turn_ids})
    existing_turns = {t.id for t in turn_log.turns_by_ids(all_turns)} if all_turns else set()
    existing_facts = all_fact_ids(store)
    return [
        (r.id, f"turns {list(r.cited_turn_ids)}, facts {list(r.cited_fact_ids)}")
        for r in rows
        if not (set(r.cited_turn_ids) & existing_turns or set(r.cited_fact_ids) & existing_facts)
    ]


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="reflections",
    run="familiar_pipeline.projectors.reflections.run:run",
    description="""Cited reflections over each window of `turns_threshold` turns and the newest facts (projector `reflection`).

    Keeps only citations of turns in the window or facts that exist; drops uncited items; at most
    `max_reflections_per_tick` per window; cross-channel windows give channel-agnostic rows. The watermark
    always advances past a window, whatever the model replied.
    """,
    group="synthesis",
    kinds={"duckdb", "llm"},
    # Supersession is an input too: a window shows the facts current at its end,
    # so it waits until supersession has judged them.
    inputs=("turns", "facts", "fact_supersessions"),
    trigger=FACTS,
    knobs=ReflectionConfig,
    tables=(REFLECTIONS,),
    invariants=(uncited_reflections,),
    scripted="familiar_pipeline.projectors.reflections.scripted:answer",
)
