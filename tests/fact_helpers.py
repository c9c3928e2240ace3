"""Builders for the fact-driven projection tests: runtimes, seeded facts, Dagster runs of the whole graph."""

from __future__ import annotations

import dagster as dg

from familiar_pipeline.defs.assets import FACT_DRIVEN_ASSETS, TURN_DRIVEN_ASSETS, turns
from familiar_pipeline.models.llm import LlmUsage
from familiar_pipeline.projectors.report import ProjectionReport
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource, build_runtime
from familiar_pipeline.storage.store import FactDraft, ProjectionStore, Subject

from .helpers import make_familiar

ALL_ASSETS = [*TURN_DRIVEN_ASSETS, *FACT_DRIVEN_ASSETS]
CASS, BO, MIA = Subject("discord:111", "Cass"), Subject("discord:222", "Bo"), Subject("discord:333", "Mia")

GRAPH_TOML = """
[llm.background]
model = "fake/careful"

[providers.embedding]
backend = "hash"
dim = 64

[providers.memory]
projectors = ["rolling_summary", "rich_note", "fact_supersede", "people_dossier", "reflection", "fact_embedding"]
"""


def familiar(root, familiar_id: str = "fam", toml: str = GRAPH_TOML):
    return make_familiar(root, familiar_id, toml)


def run_projector(module, root, familiar_id: str = "fam", *, rebuild: bool = False, embedder: bool = False) -> ProjectionReport:
    """Run one projector's logic directly (no Dagster), as an asset would."""
    usage = LlmUsage()
    rt = build_runtime(
        FamiliarData(data_root=str(root)), LlmResource(), familiar_id, usage=usage,
        embedder=EmbedderResource() if embedder else None,
    )
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
        written = [store.append_fact(d)[0] for d in drafts]
        if rich_note_turn is not None:
            store.set_watermark("rich_note", turn_id=rich_note_turn)
    return written


def fact(text: str, *subjects: Subject, turn: int = 1, importance=None, valid_to=None) -> FactDraft:
    return FactDraft(text=text, source_turn_ids=(turn,), subjects=subjects, importance=importance, valid_to=valid_to)


def materialize(root, instance, assets, *, familiar_id: str = "fam", rebuild: bool = False, checks=(), raise_on_error=True):
    instance.add_dynamic_partitions("familiars", [familiar_id])
    return dg.materialize(
        [turns, *assets, *checks],
        partition_key=familiar_id,
        instance=instance,
        resources={
            "familiar_data": FamiliarData(data_root=str(root)),
            "llm": LlmResource(),
            "embedder": EmbedderResource(),
        },
        run_config={"ops": {a.key.path[-1]: {"config": {"rebuild": rebuild}} for a in assets}},
        selection=[a.key for a in assets],
        raise_on_error=raise_on_error,
    )


def metadata(result, asset_name: str) -> dict:
    mats = list(result.asset_materializations_for_node(asset_name))
    assert mats, f"{asset_name} did not materialize"
    return {k: v.value for k, v in mats[-1].metadata.items()}
