"""The fact extractor's spec: its knobs, its asset, what a rebuild drops, and the rules its rows keep."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import TURNS, DropRule, ProjectorSpec, invariant, knob
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import provenance_sql
from familiar_pipeline.storage.turns import TurnLog

from .store import fact_subject_keys, fact_texts
from .tables import FACT_SUBJECTS, FACTS

PROJECTOR = "rich_note"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class RichNoteConfig:
    """[providers.memory.rich_note]"""

    # 20 turns per call: half the extraction calls of 10, and supersession and dossier folds go per
    # batch, so they shrink too (62.9 -> 40.0 calls per 100 turns with the summary at 20 and dossier
    # folds every 4 batches: docs/benchmarks.md); a quiet gap still closes a batch early.
    batch_size: int = knob(20, minimum=1)
    participants_max: int = knob(30, minimum=1)
    quiet_s: int = knob(120, minimum=0)  # 0: batches close only at batch_size


@invariant("facts_cite_existing_turns", "Every fact's source_turn_ids exist in the turn log.",
           what="(fact id, missing turn id)", blocking=True)
def missing_source_turns(store: ProjectionStore, turn_log: TurnLog, familiar_id: str = "") -> list[tuple[int, int]]:
    """(fact id, turn id) pairs where a fact cites a turn the log does not have (its provenance, see `tables`)."""
    cited = store.sql(f"SELECT row_key, turn_id FROM ({provenance_sql(FACTS)}) ORDER BY row_key, turn_id").fetchall()
    existing = {t.id for t in turn_log.turns_by_ids(sorted({turn_id for _, turn_id in cited}))}
    return [(fact_id, turn_id) for fact_id, turn_id in cited if turn_id not in existing]


@invariant("fact_subjects_are_participants", "Every subject key is a known participant or the familiar's own ego key.",
           what="(fact id, unknown key)", blocking=True)
def unknown_subject_keys(store: ProjectionStore, turn_log: TurnLog, familiar_id: str) -> list[tuple[int, str]]:
    """(fact id, key) pairs whose subject is neither a known participant nor the familiar itself."""
    known = {p.canonical_key for p in turn_log.participants()} | {ego_key(familiar_id)}
    return [(fact_id, key) for fact_id, key in fact_subject_keys(store) if key not in known]


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="facts",
    run="familiar_pipeline.projectors.facts.run:run",
    description="""Atomic, attributed facts extracted from batches of `batch_size` turns, or fewer at a quiet gap
    of `quiet_s` (projector `rich_note`).

    Claims stay attributed, roleplay is recorded as bits, identity is the participant's canonical key;
    near-duplicates are suppressed at insert; fts/facts is updated. The watermark always advances past
    a processed batch, even when the model's reply was unusable (what was dropped is in the metadata).
    """,
    group="facts",
    kinds={"duckdb", "tantivy", "llm"},
    trigger=TURNS,
    follows_changes=True,
    batch_knob="batch_size",
    batch_closed="familiar_pipeline.projectors.facts.batches:batch_closed",
    knobs=RichNoteConfig,
    tables=(FACTS, FACT_SUBJECTS),
    # Everything built on facts goes with them, so nothing citing a fact id survives and the id
    # sequence restarts: a rebuild gives every fact the id the incremental build gave it.
    drop=DropRule(cascade=True),
    invariants=(missing_source_turns, unknown_subject_keys),
    scripted="familiar_pipeline.projectors.facts.scripted:answer",
    search_index="facts",
    search_rows=lambda rt, store: fact_texts(store),
    forget_person="familiar_pipeline.projectors.facts.changes:forget_subject",
)
