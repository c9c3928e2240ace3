"""The projection assets: one step that runs each familiar through the selected projectors.

`projection_assets` builds, from the projectors' specs, one multi-asset whose assets
(name, group, kinds, deps, tags, automation condition, description: all from each
spec) stay separate in the UI and can be selected one at a time; a run materializes
any subset of them in one step (`familiar_pipeline.engine.spec`).

Each asset is partitioned per familiar and watermark-driven: materializing it
processes what is new past its watermark (or says "no-op"). A run may cover a range
of familiars; each is processed in turn through every selected projector with one
writer lock, one store connection and one snapshot publish (the engine's run loop,
`familiar_pipeline.engine.run_loop`), and reported here on its own partition of each
asset (`materialize_projections`). The checks run inside that step, on the connection
that wrote. The run config `rebuild: true`
drops the selected projections' rows and watermarks first and rebuilds them from the
turn log. LLM replies are cached by prompt, so a rebuild of unchanged prompts costs
no tokens and yields the same rows.

The order of that work (two passes, a busy familiar requeued, blocked followers, yielding
to a waiting run) is decided in `familiar_pipeline.engine.schedule` and run by
`engine.run_loop`, without Dagster; this module builds the step from the specs and
reports what the loop yields as Dagster events.
"""

import warnings
from pathlib import Path

import dagster as dg
from pydantic import Field

from familiar_pipeline.defs.checks import memory_checks, partition_evaluations
from familiar_pipeline.defs.partitions import asset_key, familiars_partitions, projection_run_queued
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource, runtime_opener
from familiar_pipeline.engine.run_loop import ProjectorResult, run_familiars
from familiar_pipeline.engine.schedule import BUSY_WAIT_S, QueueWatch, WorkOrder
from familiar_pipeline.engine.spec import FACTS, ProjectorSpec
from familiar_pipeline.projectors import builtin

PREVIEW_ROWS = 20

# The tag of a materialization's data version: the one Dagster writes for an asset's output and
# compares in `AutomationCondition.data_version_changed` (its value is not exported publicly).
DATA_VERSION_TAG = "dagster/data_version"

# Dagster 1.13 marks `backfill_policy` on @asset as beta and warns at every definition;
# acknowledged here, where we opt in, so CLI commands do not print it on each start.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)


class ProjectionConfig(dg.Config):
    """Run config of the projection step."""

    rebuild: bool = Field(
        default=False,
        description="Drop the selected projections' rows and watermarks for the partitions, then rebuild them from turns.",
    )
    familiars: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "Per asset, the familiars of the run's partitions it processes; an asset not listed processes all "
            "of them. The turn sensor lists those each asset is due for; the others are skipped without a file opened."
        ),
    )

    def due(self, asset: str, familiar_id: str) -> bool:
        planned = self.familiars.get(asset)
        return planned is None or familiar_id in planned


turns = dg.AssetSpec(
    asset_key("turns"),
    group_name="turns",
    kinds={"sqlite"},
    partitions_def=familiars_partitions,
    description=(
        "The turn log (data/familiars/<id>/turns.db): every message, edit and deletion, appended by the "
        "bot. The source of truth; every other asset is a projection of it."
    ),
)



def result_metadata(result: ProjectorResult) -> dict:
    """A projector's materialization metadata: its report's figures, its model usage, then what the step added."""
    report = result.report
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
        "effective_config": dg.MetadataValue.json(result.knobs),
        "duration_s": round(result.duration_s, 3),
        "llm_seconds": round(report.llm_seconds, 3),
    }
    metadata.update(result.usage)
    for key, value in report.extra.items():
        metadata[key] = value if isinstance(value, (int, float, str)) else dg.MetadataValue.json(value)
    if report.preview:
        metadata["preview"] = dg.MetadataValue.md(markdown_table(report.preview[:PREVIEW_ROWS]))
    metadata.update(result.extra)
    return metadata


def markdown_table(rows: list[dict]) -> str:
    """Rows as a Markdown table (columns in first-seen order), without pandas: ~1 s of import per run saved."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value) -> str:
        return " ".join(str("" if value is None else value).split()).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def dagster_home(instance: dg.DagsterInstance) -> Path | None:
    """The instance's home folder, whose run storage and logs an erasure scrubs (None: none on disk)."""
    root = getattr(instance, "root_directory", None)
    return Path(root) if root else None


def materialize_projections(
    context: dg.AssetExecutionContext,
    specs: list[ProjectorSpec],
    config: ProjectionConfig,
    familiar_data: FamiliarData,
    llm: LlmResource,
    embedder: EmbedderResource | None = None,
):
    """Every familiar of the run's partitions in turn, each through the selected projectors (`engine.run_loop`).

    A run may cover a range of familiars (the turn sensor's one run per tick, a
    single-run backfill). Each familiar gets its own writer lock, store connection,
    projector runs and publish, and each asset it went through gets a materialization
    of that familiar's partition with its figures. A run over several familiars takes
    them in two passes (`schedule.passes`): every familiar's facts first, then everything else,
    so facts reach the bot without waiting for other familiars' followers; what a
    failure in the first pass holds back stays held in the second. A familiar in the
    range that the run's plan leaves out is not opened and gets no materialization:
    Dagster records one per partition of the range when an asset yields its output, so
    the step reports each partition it processed itself (an `AssetMaterialization` per
    familiar) and yields no outputs. A projector that raises for one familiar is
    reported on that partition (status "failed: ..." and an error event); its
    watermark stays where its last committed batch left it, so a later run retries it.
    A familiar whose writer lock another process holds is taken up again after the
    others, waiting up to BUSY_WAIT_S for it, then reported failed (FamiliarBusy). When
    another projection run waits in the queue (every lane busy: new facts are due
    elsewhere), a run that is not a rebuild leaves the second pass of each familiar it
    published in the first to a later run: their snapshots list those assets as pending,
    and the turn sensor requests them (`schedule.due_assets`). An
    asset fails (and with it the step, after the rest is recorded) only when every
    familiar it processed failed, so a run of one familiar fails as it always did.
    """
    selected = {key.path[-1] for key in context.selected_asset_keys}
    specs = [s for s in specs if s.asset in selected]
    selected_checks = set(context.selected_asset_check_keys)
    checks = tuple(c for c in memory_checks(s.asset for s in specs) if c.key in selected_checks)
    # One embedder per embedding config for the whole step.
    open_runtime = runtime_opener(familiar_data, llm, embedder, embedders={})
    done: dict[str, int] = {s.asset: 0 for s in specs}
    failed: dict[str, dict[str, Exception]] = {s.asset: {} for s in specs}
    check_results: dict[dg.AssetCheckKey, dict[str, dg.AssetCheckResult]] = {c.key: {} for c in checks}
    # A rebuild never yields: its followers must be rebuilt in the same run.
    waiting = None if config.rebuild else QueueWatch(lambda: projection_run_queued(context.instance)).run_waiting
    order = WorkOrder(specs, context.partition_keys, planned=config.due, run_waiting=waiting, busy_wait_s=BUSY_WAIT_S)
    for familiar_id, outcome in run_familiars(order, rebuild=config.rebuild, open_runtime=open_runtime, checks=checks,
                                              dagster_home=dagster_home(context.instance), note=context.log.info):
        for asset, error in outcome.failed.items():
            failed[asset][familiar_id] = error
            context.log.error(f"[{familiar_id}] {asset} failed: {type(error).__name__}: {error}", exc_info=error)
            yield dg.AssetMaterialization(asset_key(asset), partition=familiar_id,
                                          metadata={"status": f"failed: {type(error).__name__}: {error}"},
                                          tags=data_version_tags(context, asset, familiar_id, changed=False))
        for asset, result in outcome.results.items():
            done[asset] += 1
            changed = config.rebuild or result.report.rows_written > 0
            yield dg.AssetMaterialization(asset_key(asset), partition=familiar_id, metadata=result_metadata(result),
                                          tags=data_version_tags(context, asset, familiar_id, changed=changed))
        # One line per familiar that did something (each is an event the run's log stores: the
        # per-asset details are on each partition's materialization).
        worked = [r.report for r in outcome.results.values() if r.report.status not in ("no-op", "disabled")]
        if worked:
            context.log.info(f"[{familiar_id}] " + "; ".join(r.summary_line() for r in worked))
        for key, check_result in outcome.checks.items():
            check_results[key][familiar_id] = check_result
    if left := order.left:
        context.log.info(
            f"A projection run is waiting in the queue: the rest of {len(left)} familiar(s) "
            f"({', '.join(left[:10])}{', ...' if len(left) > 10 else ''}) is left to a later run; "
            "their snapshots list it as pending and the turn sensor requests it"
        )
    # each familiar's evaluation of each check on its own partition (checks.partition_evaluations)
    yield from partition_evaluations(context.instance, context.run.run_id, checks, check_results, context.partition_keys)
    lost = [(asset, f, e) for asset, errors in failed.items() if errors and not done[asset] for f, e in errors.items()]
    if len(lost) == 1:
        raise lost[0][2]
    if lost:
        raise dg.Failure(
            description="every familiar failed: " + "; ".join(f"{a} for {f}: {type(e).__name__}: {e}" for a, f, e in lost)
        )


# The assets whose changes the followers' automation condition watches (FOLLOWS_FACTS): the
# inputs of the fact-driven projectors. Their materializations carry a data version.
VERSIONED_ASSETS = frozenset(i for s in builtin.BUILTIN_SPECS if s.trigger == FACTS for i in s.inputs) - {"turns"}


def data_version_tags(context: dg.AssetExecutionContext, asset: str, familiar_id: str, *, changed: bool) -> dict:
    """The data version of one familiar's materialization: new only when the run changed its rows.

    The followers' automation condition fires on a changed data version, not on any
    materialization: a facts run that wrote nothing for a familiar (skipped, disabled,
    no-op, a batch whose facts were all dropped, a failure) keeps that partition's
    previous version. Only the assets the followers watch carry one.
    """
    if asset not in VERSIONED_ASSETS:
        return {}
    if changed:
        return {DATA_VERSION_TAG: context.run.run_id}
    record = context.instance.get_latest_data_version_record(asset_key(asset), partition_key=familiar_id)
    previous = (record.event_log_entry.tags or {}).get(DATA_VERSION_TAG) if record else None
    return {DATA_VERSION_TAG: previous or "empty"}


# Run after `facts` (or supersession) changed, for that familiar's partition only:
# a dependency's data version changed (only a run that wrote rows changes it: see
# data_version_tags), none missing or in progress. `turns` is an external asset Dagster
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
    .ignore(dg.AssetSelection.assets(asset_key("turns")))
    .with_label("facts changed (rows written) outside a run that already included the followers")
    & ~dg.AutomationCondition.any_deps_missing().ignore(dg.AssetSelection.assets(asset_key("turns")))
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("after facts change")


MEMORY_OP = "memory"


def asset_spec(spec: ProjectorSpec) -> dg.AssetSpec:
    """The Dagster asset of one projector, everything about it read from its spec."""
    return dg.AssetSpec(
        asset_key(spec.asset),
        deps=[asset_key(i) for i in spec.reads],
        description=spec.description or None,
        group_name=spec.group,
        kinds=set(spec.kinds),
        tags={"projector": spec.name},
        automation_condition=FOLLOWS_FACTS if spec.trigger == FACTS else None,
        partitions_def=familiars_partitions,
        skippable=True,
    )


def projection_assets(specs: list[ProjectorSpec], name: str) -> dg.AssetsDefinition:
    """One step that materializes any subset of `specs`' assets, each familiar through all of them in turn.

    Per familiar: one writer lock, one store connection, one snapshot publish, the
    checks on the connection it wrote with. The assets stay separate in the UI (lineage,
    per-partition materializations, backfills, automation); a run picks any of them.
    """
    resources = {"familiar_data", "llm"} | ({"embedder"} if any(s.needs_embedder for s in specs) else set())
    for i, spec in enumerate(specs):  # the step runs them in this order, so each must come after what it reads
        later = {s.asset for s in specs[i:]}.intersection(spec.reads)
        if later:
            raise ValueError(f"projector {spec.name!r} reads {sorted(later)}, which its step runs after it")

    @dg.multi_asset(
        name=name,
        specs=[asset_spec(s) for s in specs],
        check_specs=[c.spec for c in memory_checks(s.asset for s in specs)],
        partitions_def=familiars_partitions,
        can_subset=True,
        # A UI or CLI backfill (and declarative automation) over many familiars is one run
        # per contiguous range of them, not one per familiar: the run's fixed cost is paid once.
        backfill_policy=dg.BackfillPolicy.single_run(),
        required_resource_keys=resources,
        description="Memory projections of the run's familiars, each familiar through the selected ones in turn.",
    )
    def _projections(context: dg.AssetExecutionContext, config: ProjectionConfig):
        res = context.resources
        embedder = res.embedder if "embedder" in resources else None
        yield from materialize_projections(context, specs, config, res.familiar_data, res.llm, embedder)

    return _projections


def projection_asset(spec: ProjectorSpec) -> dg.AssetsDefinition:
    """A plugin projector's asset: the same step over its one spec, named after its asset."""
    return projection_assets([spec], spec.asset)


# The built-in projectors: one step, each asset selectable on its own.
MEMORY = projection_assets(list(builtin.BUILTIN_SPECS), MEMORY_OP)
ASSET_KEYS: dict[str, dg.AssetKey] = {spec.asset: asset_key(spec.asset) for spec in builtin.BUILTIN_SPECS}

TURN_DRIVEN = [ASSET_KEYS[s.asset] for s in builtin.BUILTIN_SPECS if s.trigger != FACTS and not s.needs_embedder]
FACT_DRIVEN = [ASSET_KEYS[s.asset] for s in builtin.BUILTIN_SPECS if s.trigger == FACTS]
TURN_EMBEDDING = [ASSET_KEYS[s.asset] for s in builtin.BUILTIN_SPECS if s.trigger != FACTS and s.needs_embedder]


def op_name(asset: str) -> str:
    """The step (op) that materializes an asset: `memory` for the built-ins, a plugin asset's own name."""
    return MEMORY_OP if asset in ASSET_KEYS else asset
