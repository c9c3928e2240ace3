"""The projection assets: thin shells that open a familiar, run its projector, and report.

One factory, `projection_asset`, builds every projector's asset from its spec
(`familiar_pipeline.projectors.spec`): name, group, kinds, deps, tags, automation
condition, description and resources all come from there.

Each asset is partitioned per familiar and watermark-driven: materializing it
processes what is new past its watermark (or says "no-op"). A run may cover a
range of familiars; each is processed in turn and reported on its own partition
(`materialize_projection`). The run config
`rebuild: true` drops the projection's rows and watermark first and rebuilds it
from the turn log. LLM replies are cached by prompt, so a rebuild of unchanged
prompts costs no tokens and yields the same rows.
"""


import dataclasses
import warnings

import dagster as dg
from pydantic import Field

from familiar_pipeline.defs.partitions import familiars_partitions
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource, build_runtime
from familiar_pipeline.projectors import registry
from familiar_pipeline.projectors.report import ProjectionReport
from familiar_pipeline.projectors.runtime import NoModelConfigured
from familiar_pipeline.projectors.spec import FACTS, ProjectorSpec

PREVIEW_ROWS = 20

# Dagster 1.13 marks `backfill_policy` on @asset as beta and warns at every definition;
# acknowledged here, where we opt in, so CLI commands do not print it on each start.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)


class ProjectionConfig(dg.Config):
    """Run config of every projection asset."""

    rebuild: bool = Field(
        default=False,
        description="Drop this projection's rows and watermark for the partition, then rebuild it from turns.",
    )
    familiars: list[str] = Field(
        default_factory=list,
        description=(
            "The familiars of the run's partitions to process; empty: all of them. The turn sensor lists "
            "those this asset is due for; the others in its partition range are skipped without a file opened."
        ),
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
        metadata["preview"] = dg.MetadataValue.md(markdown_table(report.preview[:PREVIEW_ROWS]))
    return metadata


def markdown_table(rows: list[dict]) -> str:
    """Rows as a Markdown table (columns in first-seen order), without pandas: ~1 s of import per run saved."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value) -> str:
        return " ".join(str("" if value is None else value).split()).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def project_familiar(
    spec: ProjectorSpec,
    familiar_id: str,
    *,
    rebuild: bool,
    familiar_data: FamiliarData,
    llm: LlmResource,
    embedder: EmbedderResource | None = None,
) -> dict:
    """One familiar: open it, drop the projection first on `rebuild`, run the projector; its metadata.

    The runtime takes the familiar's writer lock at its first write and keeps it until it is
    closed here, so the whole of this familiar's work in the step has one writer.
    """
    cfg = familiar_data.config(familiar_id)
    knobs_obj = cfg.memory.knobs(spec.name) if not spec.always_on else None
    knobs = dataclasses.asdict(knobs_obj) if dataclasses.is_dataclass(knobs_obj) else {}
    knobs["max_batches_per_run"] = cfg.pipeline.max_batches_per_run
    report = ProjectionReport(spec.name)
    usage = _llm_usage() if spec.needs_llm else None
    if not spec.always_on and spec.name not in cfg.memory.projectors:
        report.status = "disabled"
        report.reason = f"'{spec.name}' is not listed in [providers.memory].projectors"
    else:
        runtime = build_runtime(familiar_data, llm, familiar_id, usage=usage, embedder=embedder, config=cfg)
        try:
            if spec.needs_llm and runtime.llm_client is None:
                report.status = "skipped"
                try:
                    runtime.llm
                except NoModelConfigured as exc:
                    report.reason = str(exc)
            else:
                if rebuild and not (spec.needs_embedder and runtime.embedder is None):
                    with runtime.store() as store:
                        registry.drop_projection(store, spec.name)
                        runtime.publish(store)
                spec.run(runtime, report, rebuild=rebuild)
        finally:
            runtime.close()
    return {"report": report, "metadata": report_metadata(report, usage, knobs)}


# What a familiar in the run's partition range that the run's plan leaves out reports.
NOT_DUE = "not due: outside this run's plan (ProjectionConfig.familiars); nothing was opened"


def materialize_projection(
    context: dg.AssetExecutionContext,
    spec: ProjectorSpec,
    config: ProjectionConfig,
    familiar_data: FamiliarData,
    llm: LlmResource,
    embedder: EmbedderResource | None = None,
) -> dg.MaterializeResult:
    """Every familiar of the run's partitions in turn, each reported as its own partition.

    A run may cover a range of familiars (the turn sensor's one run per tick, a
    single-run backfill). Each familiar gets its own writer lock, store transactions,
    projector run and publish, and its metadata goes on its partition's
    materialization. One familiar's failure is caught and reported on its partition
    (status "failed: ..." and an error event); its watermark stays where its last
    committed batch left it, so a later run retries it. The step fails only when every
    familiar it processed failed, so a run of one familiar fails as it always did.
    """
    planned = set(config.familiars)
    done: dict[str, ProjectionReport] = {}
    failed: dict[str, Exception] = {}
    for familiar_id in context.partition_keys:
        if planned and familiar_id not in planned:
            context.add_asset_metadata({"status": NOT_DUE}, partition_key=familiar_id)
            continue
        try:
            outcome = project_familiar(spec, familiar_id, rebuild=config.rebuild, familiar_data=familiar_data,
                                       llm=llm, embedder=embedder)
        except Exception as exc:  # reported on this familiar's partition; the others carry on
            failed[familiar_id] = exc
            context.log.error(f"[{familiar_id}] {spec.name} failed: {type(exc).__name__}: {exc}", exc_info=exc)
            context.add_asset_metadata({"status": f"failed: {type(exc).__name__}: {exc}"}, partition_key=familiar_id)
            continue
        done[familiar_id] = outcome["report"]
        context.log.info(f"[{familiar_id}] {outcome['report'].summary_line()}")
        context.add_asset_metadata(outcome["metadata"], partition_key=familiar_id)
    if failed and not done:
        if len(failed) == 1:
            raise next(iter(failed.values()))
        raise dg.Failure(
            description=f"{spec.asset}: every familiar failed: "
            + "; ".join(f"{f}: {type(e).__name__}: {e}" for f, e in failed.items())
        )
    return dg.MaterializeResult(data_version=output_version(context, done, rebuild=config.rebuild))


def output_version(context: dg.AssetExecutionContext, reports: dict[str, ProjectionReport], *, rebuild: bool) -> dg.DataVersion:
    """A data version that changes only when the run changed the projection's rows.

    The followers' automation condition fires on a changed data version, not on any
    materialization: a facts run that wrote nothing (skipped, disabled, no-op, a batch
    whose facts were all dropped) keeps the partition's previous version. Dagster gives
    every partition of a run the same version, so in a run over several familiars any
    familiar's new rows give them all the new version; the turn sensor's runs that include
    `facts` also include its followers and are tagged so (FOLLOWERS_INCLUDED_TAG), which
    keeps that from re-triggering them.
    """
    if rebuild or any(report.rows_written > 0 for report in reports.values()):
        return dg.DataVersion(context.run.run_id)
    from dagster._core.definitions.data_version import extract_data_version_from_entry

    previous = set()
    for partition_key in context.partition_keys:
        record = context.instance.get_latest_data_version_record(context.asset_key, partition_key=partition_key)
        previous.add(extract_data_version_from_entry(record.event_log_entry) if record else None)
    if len(previous) == 1:
        return previous.pop() or dg.DataVersion("empty")
    return dg.DataVersion(context.run.run_id)  # the familiars' versions differ: one value cannot keep them all


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
        # `executed_with_tags` looks only at the asset's latest materialization of any
        # partition: in a run over many familiars, that is one of them. The per-partition
        # test (every update since the last evaluation came from such a run) covers the
        # others; it needs a previous evaluation that saw an event, the first covers that.
        & ~(dg.AutomationCondition.executed_with_tags(tag_values=FOLLOWERS_INCLUDED_TAG)
            | dg.AutomationCondition.all_new_updates_have_run_tags(tag_values=FOLLOWERS_INCLUDED_TAG))
    )
    .ignore(dg.AssetSelection.assets("turns"))
    .with_label("facts changed (rows written) outside a run that already included the followers")
    & ~dg.AutomationCondition.any_deps_missing().ignore(dg.AssetSelection.assets("turns"))
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("after facts change")


def projection_asset(spec: ProjectorSpec) -> dg.AssetsDefinition:
    """The Dagster asset of one projector, everything about it read from its spec."""
    resources = {"familiar_data", "llm"} | ({"embedder"} if spec.needs_embedder else set())

    def materialize(context: dg.AssetExecutionContext, config: ProjectionConfig) -> dg.MaterializeResult:
        res = context.resources
        embedder = res.embedder if spec.needs_embedder else None
        return materialize_projection(context, spec, config, res.familiar_data, res.llm, embedder)

    materialize.__doc__ = spec.description or None  # Dagster formats it like a docstring
    return dg.asset(
        name=spec.asset,
        partitions_def=familiars_partitions,
        group_name=spec.group,
        kinds=set(spec.kinds),
        deps=list(spec.inputs),
        tags={"projector": spec.name},
        automation_condition=FOLLOWS_FACTS if spec.trigger == FACTS else None,
        # A UI or CLI backfill (and declarative automation) over many familiars is one run
        # per contiguous range of them, not one per familiar: the run's fixed cost is paid once.
        backfill_policy=dg.BackfillPolicy.single_run(),
        required_resource_keys=resources,
    )(materialize)


ASSETS: dict[str, dg.AssetsDefinition] = {spec.asset: projection_asset(spec) for spec in registry.BUILTIN_SPECS}

TURN_DRIVEN_ASSETS = [ASSETS[s.asset] for s in registry.BUILTIN_SPECS if s.trigger != FACTS and not s.needs_embedder]
FACT_DRIVEN_ASSETS = [ASSETS[s.asset] for s in registry.BUILTIN_SPECS if s.trigger == FACTS]
# Turn-driven too, but kept out of TURN_DRIVEN_ASSETS so selections without an embedder resource stay valid.
TURN_EMBEDDING_ASSETS = [ASSETS[s.asset] for s in registry.BUILTIN_SPECS if s.trigger != FACTS and s.needs_embedder]


def __getattr__(name: str) -> dg.AssetsDefinition:
    """Each built-in asset by its name, e.g. `from familiar_pipeline.defs.assets import facts`."""
    try:
        return ASSETS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
