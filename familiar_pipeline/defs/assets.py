"""The projection assets: thin shells that open a familiar, run its projector, and report.

Each asset is partitioned per familiar and watermark-driven: materializing it
processes what is new past its watermark (or says "no-op"), and the run config
`rebuild: true` drops the projection's rows and watermark first and rebuilds it
from the turn log. LLM replies are cached by prompt, so a rebuild of unchanged
prompts costs no tokens and yields the same rows.
"""


import dataclasses
from typing import Callable

import dagster as dg
from pydantic import Field

from familiar_pipeline.defs.partitions import familiars_partitions
from familiar_pipeline.projectors import dossiers as dossier_projection
from familiar_pipeline.projectors import embeddings as embedding_projection
from familiar_pipeline.projectors import facts as fact_projection
from familiar_pipeline.projectors import reflections as reflection_projection
from familiar_pipeline.projectors import summary as summary_projection
from familiar_pipeline.projectors import supersede as supersede_projection
from familiar_pipeline.projectors import turn_embeddings as turn_embedding_projection
from familiar_pipeline.projectors import turns_index
from familiar_pipeline.projectors.report import ProjectionReport
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource, build_runtime
from familiar_pipeline.projectors.runtime import NoModelConfigured

PREVIEW_ROWS = 20


class ProjectionConfig(dg.Config):
    """Run config of every projection asset."""

    rebuild: bool = Field(
        default=False,
        description="Drop this projection's rows and watermark for the partition, then rebuild it from turns.",
    )


turns = dg.AssetSpec(
    "turns",
    group_name="turns",
    kinds={"sqlite"},
    partitions_def=familiars_partitions,
    description=(
        "The turn log (data/familiars/<id>/turns.db): every message, edit and deletion, appended by the "
        "bot. The source of truth; every other asset is a projection of it."
    ),
)


def _llm_usage():
    from familiar_pipeline.models.llm import LlmUsage

    return LlmUsage()


def report_metadata(report: ProjectionReport, usage, knobs: dict) -> dict:
    metadata: dict = {
        "status": report.status if not report.reason else f"{report.status}: {report.reason}",
        "turns_read": report.turns_read,
        "batches": report.batches,
        "rows_written": report.rows_written,
        "rows_suppressed": report.rows_suppressed,
        "rows_dropped": sum(report.dropped.values()),
        "dropped_reasons": dg.MetadataValue.json(dict(report.dropped)),
        "watermark_before": dg.MetadataValue.json(report.watermark_before),
        "watermark_after": dg.MetadataValue.json(report.watermark_after),
        "effective_config": dg.MetadataValue.json(knobs),
        "duration_s": round(report.duration_s, 3),
        "llm_seconds": round(report.llm_seconds, 3),
    }
    if usage is not None:
        metadata.update(usage.as_metadata())
    for key, value in report.extra.items():
        metadata[key] = value if isinstance(value, (int, float, str)) else dg.MetadataValue.json(value)
    if report.preview:
        import pandas as pd  # lazily: ~1 s of import the code location need not pay at load

        frame = pd.DataFrame(report.preview[:PREVIEW_ROWS])
        metadata["preview"] = dg.MetadataValue.md(frame.to_markdown(index=False))
    return metadata


def materialize_projection(
    context: dg.AssetExecutionContext,
    projector: str,
    run: Callable,
    config: ProjectionConfig,
    familiar_data: FamiliarData,
    llm: LlmResource,
    *,
    needs_llm: bool,
    always_on: bool = False,
    embedder: EmbedderResource | None = None,
) -> dg.MaterializeResult:
    familiar_id = context.partition_key
    cfg = familiar_data.config(familiar_id)
    knobs_obj = getattr(cfg.memory, projector, None)
    knobs = dataclasses.asdict(knobs_obj) if dataclasses.is_dataclass(knobs_obj) else {}
    knobs["max_batches_per_run"] = cfg.pipeline.max_batches_per_run
    report = ProjectionReport(projector)
    usage = _llm_usage() if needs_llm else None
    if not always_on and projector not in cfg.memory.projectors:
        report.status = "disabled"
        report.reason = f"'{projector}' is not listed in [providers.memory].projectors"
    else:
        runtime = build_runtime(familiar_data, llm, familiar_id, usage=usage, embedder=embedder)
        try:
            if needs_llm and runtime.llm_client is None:
                report.status = "skipped"
                try:
                    runtime.llm
                except NoModelConfigured as exc:
                    report.reason = str(exc)
            else:
                run(runtime, report, rebuild=config.rebuild)
        finally:
            runtime.close()
    context.log.info(report.summary_line())
    return dg.MaterializeResult(metadata=report_metadata(report, usage, knobs),
                                data_version=output_version(context, report, rebuild=config.rebuild))


def output_version(context: dg.AssetExecutionContext, report: ProjectionReport, *, rebuild: bool) -> dg.DataVersion:
    """A data version that changes only when the run changed the projection's rows.

    The followers' automation condition fires on a changed data version, not on any
    materialization: a facts run that wrote nothing (skipped, disabled, no-op, a batch
    whose facts were all dropped) keeps the partition's previous version.
    """
    if report.rows_written > 0 or rebuild:
        return dg.DataVersion(context.run.run_id)
    from dagster._core.definitions.data_version import extract_data_version_from_entry

    record = context.instance.get_latest_data_version_record(context.asset_key, partition_key=context.partition_key)
    previous = extract_data_version_from_entry(record.event_log_entry) if record else None
    return previous or dg.DataVersion("empty")


@dg.asset(
    name="turns_fts",
    partitions_def=familiars_partitions,
    group_name="turns",
    kinds={"tantivy"},
    deps=[turns],
    tags={"projector": "turns_fts"},
)
def turns_fts(context: dg.AssetExecutionContext, config: ProjectionConfig, familiar_data: FamiliarData, llm: LlmResource) -> dg.MaterializeResult:
    """Full-text index of the turn log (fts/turns): new turns added, edited ones re-indexed, deleted ones removed.

    The bot's retrieval searches it for earlier turns related to the new message. Needs no model.
    """
    return materialize_projection(context, turns_index.PROJECTOR, turns_index.run, config, familiar_data, llm, needs_llm=False, always_on=True)


@dg.asset(
    name="rolling_summary",
    partitions_def=familiars_partitions,
    group_name="synthesis",
    kinds={"duckdb", "llm"},
    deps=[turns],
    tags={"projector": "rolling_summary"},
)
def rolling_summary(context: dg.AssetExecutionContext, config: ProjectionConfig, familiar_data: FamiliarData, llm: LlmResource) -> dg.MaterializeResult:
    """The compounding summary of the conversation: the prior summary with each window of `turns_threshold` new turns folded in.

    Shown to the model as "Conversation so far". An empty model reply keeps the old summary and watermark.
    """
    return materialize_projection(context, summary_projection.PROJECTOR, summary_projection.run, config, familiar_data, llm, needs_llm=True)


@dg.asset(
    name="facts",
    partitions_def=familiars_partitions,
    group_name="facts",
    kinds={"duckdb", "tantivy", "llm"},
    deps=[turns],
    tags={"projector": "rich_note"},
)
def facts(context: dg.AssetExecutionContext, config: ProjectionConfig, familiar_data: FamiliarData, llm: LlmResource) -> dg.MaterializeResult:
    """Atomic, attributed facts extracted from fixed batches of `batch_size` turns (projector `rich_note`).

    Claims stay attributed, roleplay is recorded as bits, identity is the participant's canonical key;
    near-duplicates are suppressed at insert; fts/facts is updated. The watermark always advances past
    a processed batch, even when the model's reply was unusable (what was dropped is in the metadata).
    """
    return materialize_projection(context, fact_projection.PROJECTOR, fact_projection.run, config, familiar_data, llm, needs_llm=True)


TURN_DRIVEN_ASSETS = [turns_fts, rolling_summary, facts]


# ----------------------------------------------------------------------------- fact-driven assets

# Run after `facts` (or supersession) changed, for that familiar's partition only:
# a dependency's data version changed (only a run that wrote rows changes it: see
# output_version), none missing or in progress. `turns` is an external asset Dagster
# never sees materialized, so it is ignored; what is new in the turn log is each
# projection's own watermark. Runs the turn sensor launches with the fact-driven assets
# already in them carry this tag; their updates do not trigger the followers a second time.
FOLLOWERS_INCLUDED_TAG = {"familiar/followers": "included"}

FOLLOWS_FACTS = (
    dg.AutomationCondition.any_deps_match(
        dg.AutomationCondition.data_version_changed()
        & ~dg.AutomationCondition.executed_with_tags(tag_values=FOLLOWERS_INCLUDED_TAG)
    )
    .ignore(dg.AssetSelection.assets("turns"))
    .with_label("facts changed (rows written) outside a run that already included the followers")
    & ~dg.AutomationCondition.any_deps_missing().ignore(dg.AssetSelection.assets("turns"))
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("after facts change")


@dg.asset(
    name="fact_supersessions",
    partitions_def=familiars_partitions,
    group_name="facts",
    kinds={"duckdb", "llm"},
    deps=[facts],
    tags={"projector": "fact_supersede"},
    automation_condition=FOLLOWS_FACTS,
)
def fact_supersessions(context: dg.AssetExecutionContext, config: ProjectionConfig, familiar_data: FamiliarData, llm: LlmResource) -> dg.MaterializeResult:
    """Retires facts that a newer fact about the same person contradicts or replaces (projector `fact_supersede`).

    Every new fact is evaluated oldest first against the newest `priors_max` current facts about each of its
    subjects with a smaller id. Only ids shown to the model can be retired; nothing is deleted (facts get
    `superseded_at`/`superseded_by`); each model call is logged in `supersede_decisions`; the affected
    subjects' dossiers are dropped so they rebuild clean. The watermark (a fact id) advances even on bad output.
    """
    return materialize_projection(context, supersede_projection.PROJECTOR, supersede_projection.run, config, familiar_data, llm, needs_llm=True)


@dg.asset(
    name="people_dossiers",
    partitions_def=familiars_partitions,
    group_name="people",
    kinds={"duckdb", "llm"},
    deps=[facts, fact_supersessions],
    tags={"projector": "people_dossier"},
    automation_condition=FOLLOWS_FACTS,
)
def people_dossiers(context: dg.AssetExecutionContext, config: ProjectionConfig, familiar_data: FamiliarData, llm: LlmResource) -> dg.MaterializeResult:
    """One compounding dossier per person, and the familiar's own self-record (projector `people_dossier`).

    Advances one extraction batch at a time, folding each touched subject's new facts into its prior text;
    a subject with a retired fact is rebuilt from its current facts. The self-record (`ego:<id>`) keeps facts
    of importance >= 5 (or unknown), weighted by importance. An empty model reply never overwrites a dossier.
    """
    return materialize_projection(context, dossier_projection.PROJECTOR, dossier_projection.run, config, familiar_data, llm, needs_llm=True)


@dg.asset(
    name="reflections",
    partitions_def=familiars_partitions,
    group_name="synthesis",
    kinds={"duckdb", "llm"},
    # Supersession is a dependency too: a window shows the facts current at its end,
    # so it waits until supersession has judged them.
    deps=[turns, facts, fact_supersessions],
    tags={"projector": "reflection"},
    automation_condition=FOLLOWS_FACTS,
)
def reflections(context: dg.AssetExecutionContext, config: ProjectionConfig, familiar_data: FamiliarData, llm: LlmResource) -> dg.MaterializeResult:
    """Cited reflections over each window of `turns_threshold` turns and the newest facts (projector `reflection`).

    Keeps only citations of turns in the window or facts that exist; drops uncited items; at most
    `max_reflections_per_tick` per window; cross-channel windows give channel-agnostic rows. The watermark
    always advances past a window, whatever the model replied.
    """
    return materialize_projection(context, reflection_projection.PROJECTOR, reflection_projection.run, config, familiar_data, llm, needs_llm=True)


@dg.asset(
    name="fact_embeddings",
    partitions_def=familiars_partitions,
    group_name="facts",
    kinds={"duckdb"},
    deps=[facts],
    tags={"projector": "fact_embedding"},
    automation_condition=FOLLOWS_FACTS,
)
def fact_embeddings(
    context: dg.AssetExecutionContext,
    config: ProjectionConfig,
    familiar_data: FamiliarData,
    llm: LlmResource,
    embedder: EmbedderResource,
) -> dg.MaterializeResult:
    """Opt-in: a vector per current fact for the active embedding model (projector `fact_embedding`).

    Embeds, in batches of `batch_size`, every current fact lacking a vector under the active model's name;
    a model swap adds rows beside the old ones. Needs [providers.embedding].backend other than "off".
    """
    return materialize_projection(
        context, embedding_projection.PROJECTOR, embedding_projection.run, config, familiar_data, llm,
        needs_llm=False, embedder=embedder,
    )


FACT_DRIVEN_ASSETS = [fact_supersessions, people_dossiers, reflections, fact_embeddings]


@dg.asset(
    name="turn_embeddings",
    partitions_def=familiars_partitions,
    group_name="turns",
    kinds={"duckdb"},
    deps=[turns],
    tags={"projector": "turn_embedding"},
)
def turn_embeddings(
    context: dg.AssetExecutionContext,
    config: ProjectionConfig,
    familiar_data: FamiliarData,
    llm: LlmResource,
    embedder: EmbedderResource,
) -> dg.MaterializeResult:
    """Opt-in: a vector per live turn for the active embedding model (projector `turn_embedding`).

    New turns are embedded in batches of `batch_size`, edited turns re-embedded, deleted turns' vectors
    removed; `rag_context` fuses the cosine with BM25 (`[memory.retrieval].turn_embedding_weight`).
    Needs [providers.embedding].backend other than "off".
    """
    return materialize_projection(
        context, turn_embedding_projection.PROJECTOR, turn_embedding_projection.run, config, familiar_data, llm,
        needs_llm=False, embedder=embedder,
    )


# Turn-driven too, but kept out of TURN_DRIVEN_ASSETS' list order so existing selections stay as they were.
TURN_EMBEDDING_ASSETS = [turn_embeddings]
