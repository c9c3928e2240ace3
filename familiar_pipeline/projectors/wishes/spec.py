"""The standing wishes' spec: knobs, asset, table, and the rule that one wish per point is current."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import TURN_INDEX, ProjectorSpec, invariant, knob
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .tables import MAX_CHARS, WISHES, forget_person

PROJECTOR = "standing_wish"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class StandingWishConfig:
    """[providers.memory.standing_wish]"""

    batch_size: int = knob(500, minimum=1)  # turns read per committed batch
    max_chars: int = knob(MAX_CHARS, minimum=20, maximum=2000)  # a wish's text as kept, at most


@invariant("one_current_wish_per_point",
           "At most one current wish per person, scope and point, and a retired wish names a wish that exists.",
           what="(person, scope, point) or (wish id, retired_by)")
def wish_conflicts(store: ProjectionStore, turn_log: TurnLog, familiar_id: str = "") -> list[tuple]:
    doubled = store.sql("SELECT person_key, scope, point FROM wishes WHERE retired_at IS NULL "
                        "GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL").fetchall()
    dangling = store.sql("SELECT id, retired_by FROM wishes WHERE retired_by IS NOT NULL "
                         "AND retired_by NOT IN (SELECT id FROM wishes) ORDER BY id").fetchall()
    return [tuple(r) for r in doubled] + [tuple(r) for r in dangling]


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="wishes",
    run="familiar_pipeline.projectors.wishes.run:run",
    description="""Standing wishes: instructions and preferences people address to the familiar (projector `standing_wish`).

    "From now on keep answers short", "call me Sam", "never bring up my ex": found by a heuristic with no
    model (quoted text, questions and other people's words are not wishes), one row per wish with its turn
    as provenance; a newer wish by the same person in the same scope on the same point retires the older.
    The bot pins the speaker's current wishes in every reply (`standing_wishes` layer). Needs no model; where
    the extractor runs, its facts of kind "wish" add the wishes the heuristic missed, as the person's own sentence.
    """,
    group="turns",
    kinds={"duckdb"},
    # The facts of kind "wish", where the extractor runs; a facts failure (the model down) does not
    # stop the heuristic's wishes, and a facts rebuild (new fact ids) rebuilds the wishes too.
    soft_inputs=("facts",),
    trigger=TURN_INDEX,
    needs_llm=False,
    knobs=StandingWishConfig,
    tables=(WISHES,),
    invariants=(wish_conflicts,),
    forget_person=forget_person,
)
