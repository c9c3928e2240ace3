"""Builders for the fact-driven projection tests: runtimes, seeded facts, Dagster runs of the whole graph."""

from __future__ import annotations

from datetime import datetime, timezone

from familiar_pipeline.defs.assets import FACT_DRIVEN, TURN_DRIVEN
from familiar_pipeline.defs.jobs import materializations, materialize_in_process
from familiar_pipeline.models.llm import LlmUsage
from familiar_pipeline.engine.report import ProjectionReport
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource, build_runtime
from familiar_pipeline.projectors.facts.store import FactDraft
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.projectors.facts import store as facts_db

from .helpers import make_familiar

ALL_ASSETS = [*TURN_DRIVEN, *FACT_DRIVEN]
CASS, BO, MIA = Subject("discord:111", "Cass"), Subject("discord:222", "Bo"), Subject("discord:333", "Mia")

# Every default projector and fact embeddings, on the hash embedder: the whole fact-driven graph.
GRAPH_MEMORY_TOML = """
[providers.embedding]
backend = "hash"
dim = 64

[providers.memory]
projectors = ["rolling_summary", "rich_note", "fact_supersede", "people_dossier", "reflection", "standing_wish", "fact_embedding"]
"""
GRAPH_TOML = '[llm.background]\nmodel = "fake/careful"\n' + GRAPH_MEMORY_TOML


def familiar(root, familiar_id: str = "fam", toml: str = GRAPH_TOML):
    return make_familiar(root, familiar_id, toml)


def run_projector(module, root, familiar_id: str = "fam", *, rebuild: bool = False, embedder: bool = False,
                  model=None) -> ProjectionReport:
    """Run one projector's logic directly (no Dagster), as an asset would.

    `embedder`: build the configured embedder; `model`: use this embedder object instead.
    """
    usage = LlmUsage()
    rt = build_runtime(
        FamiliarData(data_root=str(root)), LlmResource(), familiar_id, usage=usage,
        embedder=EmbedderResource() if embedder else None,
    )
    if model is not None:
        rt.embedder = model
    report = ProjectionReport(module.PROJECTOR)
    try:
        module.run(rt, report, rebuild=rebuild)
    finally:
        rt.close()
    report.extra["usage"] = usage
    return report


def add_facts(paths, drafts, *, rich_note_turn: int | None = None) -> list:
    """Insert facts as the extractor would; optionally set its turn watermark."""
    with ProjectionStore(paths.memory_db) as store:
        written = [facts_db.append_fact(store, d)[0] for d in drafts]
        if rich_note_turn is not None:
            store.set_watermark("rich_note", turn_id=rich_note_turn)
    return written


# The scope of `helpers.append_chat`'s turns (server 1): extraction gives a fact its turns' scope.
CHAT_SCOPE = "guild:1"


def fact(text: str, *subjects: Subject, turn: int = 1, importance=None, valid_to=None,
         scope: str = CHAT_SCOPE) -> FactDraft:
    return FactDraft(text=text, source_turn_ids=(turn,), subjects=subjects, importance=importance, valid_to=valid_to,
                     scope=scope)


def materialize(root, instance, assets, *, familiar_id: str = "fam", rebuild: bool = False, raise_on_error=True):
    """The named assets (with their checks) for one familiar, as a run of the projection step."""
    instance.add_dynamic_partitions("familiars", [familiar_id])
    return materialize_in_process(assets, instance=instance, data_root=root, partition_key=familiar_id,
                                  rebuild=rebuild, raise_on_error=raise_on_error)


def metadata(result, asset_name: str) -> dict:
    mats = list(materializations(result, asset_name))
    assert mats, f"{asset_name} did not materialize"
    return {k: v.value for k, v in mats[-1].metadata.items()}


def populate_every_table(store: ProjectionStore) -> tuple:
    """One row or more in every built-in table (a fact retired by another, its decision, dossiers, a
    summary, a reflection, vectors, a standing wish) and every projector's watermark: for drop and rebuild tests."""
    from familiar_pipeline.projectors.dossiers import tables as dossier_db
    from familiar_pipeline.projectors.fact_embeddings import tables as fact_vectors
    from familiar_pipeline.projectors.reflections import tables as reflection_db
    from familiar_pipeline.projectors.builtin import BUILTIN_PROJECTORS
    from familiar_pipeline.projectors.summary import tables as summary_db
    from familiar_pipeline.projectors.supersede import tables as supersede_db
    from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS
    from familiar_pipeline.projectors.turn_passage_embeddings.run import set_passage_vectors
    from familiar_pipeline.projectors.turn_windows.tables import TURN_WINDOW_EMBEDDINGS
    from familiar_pipeline.projectors.vectors import set_vectors
    from familiar_pipeline.projectors.wishes import tables as wishes_db

    cass, aria = Subject("discord:1", "Cass"), Subject("discord:2", "Aria")
    a, b, c = (facts_db.append_fact(store, FactDraft(text, source_turn_ids=(turn,), subjects=(who,)))[0]
               for text, turn, who in (("Cass likes tea.", 1, cass), ("Cass likes coffee now.", 2, cass),
                                       ("Aria sings.", 3, aria)))
    supersede_db.supersede(store, [a.id], b.id)
    supersede_db.record_supersede_decision(store, new_fact_id=b.id, subject_key="discord:1", shown_prior_ids=[a.id],
                                           retired_ids=[a.id], skipped=[], model="m")
    dossier_db.put_dossier(store, "discord:1", "Cass.", b.id)
    dossier_db.put_dossier(store, "discord:2", "Aria.", c.id)
    summary_db.put_summary(store, "Summary.", 3)
    reflection_db.append_reflection(store, channel_id=1, text="R.", cited_turn_ids=[1], cited_fact_ids=[a.id],
                                    last_turn_id=3, last_fact_id=c.id)
    fact_vectors.set_fact_embedding(store, b.id, "m", [1.0])
    set_vectors(store, TURN_EMBEDDINGS, "m", [(1, [1.0])])
    set_vectors(store, TURN_WINDOW_EMBEDDINGS, "m", [(1, [1.0])])
    set_passage_vectors(store, "m", [(1, 0, [1.0], "familiar"), (1, 1, [0.5], "familiar")])
    wishes_db.insert_wishes(store, [wishes_db.WishDraft("discord:1", "call", "Call me Cass.", 2, 1,
                                                        datetime(2026, 1, 1, tzinfo=timezone.utc), "dm:discord:1")])
    for name in BUILTIN_PROJECTORS:
        store.set_watermark(name, turn_id=3, fact_id=c.id)
    return a, b, c
