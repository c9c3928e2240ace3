"""The projection assets: thin shells that open a familiar, run its projector, and report.

Each asset is partitioned per familiar and watermark-driven: materializing it
processes what is new past its watermark (or says "no-op"), and the run config
`rebuild: true` drops the projection's rows and watermark first and rebuilds it
from the turn log. LLM replies are cached by prompt, so a rebuild of unchanged
prompts costs no tokens and yields the same rows.
"""


import dataclasses
import json
from typing import Callable

import dagster as dg
import pandas as pd
from pydantic import Field

from familiar_pipeline.partitions import familiars_partitions
from familiar_pipeline.projections import facts as fact_projection
from familiar_pipeline.projections import summary as summary_projection
from familiar_pipeline.projections import turns_index
from familiar_pipeline.projections.report import ProjectionReport
from familiar_pipeline.resources import FamiliarData, LlmResource, build_runtime
from familiar_pipeline.runtime import NoModelConfigured

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
    from familiar_pipeline.llm import LlmUsage

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
        runtime = build_runtime(familiar_data, llm, familiar_id, usage=usage)
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
    return dg.MaterializeResult(metadata=report_metadata(report, usage, knobs))


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
