"""Supersession's spec: knobs, asset, its decision log, what a rebuild undoes, and the lineage rules."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import FACTS, DropRule, ProjectorSpec, invariant, knob
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .tables import SUPERSEDE_DECISIONS, dangling_replacements, facts_retired_more_than_once, unretire_all

PROJECTOR = "fact_supersede"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class FactSupersedeConfig:
    """[providers.memory.fact_supersede]"""

    priors_max: int = knob(20, minimum=1)
    # Most new facts of one extraction batch judged in one call, whoever they name (one call per
    # fact, then per person, cost many times more calls).
    new_facts_per_call: int = knob(30, minimum=1)



@invariant("no_fact_superseded_twice", "No fact was retired by more than one supersession decision.",
           what="(fact id, times retired)", blocking=True)
def facts_superseded_twice(store: ProjectionStore, turn_log: TurnLog | None = None,
                           familiar_id: str = "") -> list[tuple[int, int]]:
    """(fact id, times) for facts that more than one supersession decision retired.

    The store refuses to retire a retired fact, so a hit means the decision log
    and the facts table disagree (a hand edit, or a bug in a writer).
    """
    return facts_retired_more_than_once(store)


@invariant("superseded_by_exists", "Every superseded_by points at an existing, different fact.",
           what="(fact id, missing replacement)", blocking=True)
def dangling_superseded_by(store: ProjectionStore, turn_log: TurnLog | None = None,
                           familiar_id: str = "") -> list[tuple[int, int]]:
    """(fact id, superseded_by) where the replacement fact does not exist (or is the fact itself)."""
    return dangling_replacements(store)


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="fact_supersessions",
    run="familiar_pipeline.projectors.supersede.run:run",
    description="""Retires facts that a newer fact about the same person contradicts or replaces (projector `fact_supersede`).

    Every new fact is evaluated oldest first against the newest `priors_max` current facts about each of its
    subjects with a smaller id. Only ids shown to the model can be retired; nothing is deleted (facts get
    `superseded_at`/`superseded_by`); each model call is logged in `supersede_decisions`; the affected
    subjects' dossiers are dropped so they rebuild clean. The watermark (a fact id) advances even on bad output.
    """,
    group="facts",
    kinds={"duckdb", "llm"},
    inputs=("facts",),
    trigger=FACTS,
    knobs=FactSupersedeConfig,
    # Every retirement becomes current again; that changes what is current for those facts'
    # subjects, so their dossiers go, exactly as retiring them did.
    tables=(SUPERSEDE_DECISIONS,),
    drop=DropRule(before=unretire_all),
    invariants=(facts_superseded_twice, dangling_superseded_by),
    scripted="familiar_pipeline.projectors.supersede.scripted:answer",
)
