"""The people dossiers' spec: knobs, asset, table, and the rule that no dossier is ahead of the facts."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.projectors.facts.store import latest_fact_id
from familiar_pipeline.engine.spec import FACTS, ProjectorSpec, invariant, knob
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .tables import DOSSIERS, dossiers, drop_dossiers

PROJECTOR = "people_dossier"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class PeopleDossierConfig:
    """[providers.memory.people_dossier]"""

    max_facts_per_prompt: int = knob(50, minimum=1)
    # Fold every N extraction batches: one fold per touched person per batch cost 20 calls per 100 turns.
    batches_per_fold: int = knob(4, minimum=1)
    # A dossier that exists is folded only once its unfolded facts weigh this much (importance summed,
    # unknown counting 5): a few small facts wait for more instead of costing a call each time (issue 51).
    fold_min_weight: int = knob(100, minimum=0)



@invariant("dossiers_within_facts", "No dossier's last_fact_id is past the newest fact id.",
           what="(subject, last_fact_id)")
def dossiers_ahead_of_facts(store: ProjectionStore, turn_log: TurnLog | None = None,
                            familiar_id: str = "") -> list[tuple[str, int]]:
    """(subject, last_fact_id) for dossiers claiming facts newer than the newest fact."""
    latest = latest_fact_id(store)
    return [(d.canonical_key, d.last_fact_id) for d in dossiers(store) if d.last_fact_id > latest]


def forget_dossier(store: ProjectionStore, key: str, scope: str | None) -> set[int]:
    """A forgotten person's dossier goes whole (in `scope`, None: every scope), not redacted: it is about them.
    It rests on facts, not directly on turns: no turn ids to report."""
    drop_dossiers(store, [key], None if scope is None else [scope])
    return set()


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="people_dossiers",
    run="familiar_pipeline.projectors.dossiers.run:run",
    description="""One compounding dossier per person, and the familiar's own self-record (projector `people_dossier`).

    Advances one extraction batch at a time, folding each touched subject's new facts into its prior text;
    a subject with a retired fact is rebuilt from its current facts. The self-record (`ego:<id>`) keeps facts
    of importance >= 5 (or unknown), weighted by importance. An empty model reply never overwrites a dossier.
    """,
    group="people",
    kinds={"duckdb", "llm"},
    inputs=("facts", "fact_supersessions"),
    trigger=FACTS,
    knobs=PeopleDossierConfig,
    tables=(DOSSIERS,),
    invariants=(dossiers_ahead_of_facts,),
    scripted="familiar_pipeline.projectors.dossiers.scripted:answer",
    forget_person=forget_dossier,
)
