"""The turn-watermark sensor: notices new turns and requests runs of the turn-driven assets.

Each tick scans data/familiars/*/turns.db, adds familiars it has not seen as
dynamic partitions, and for each familiar compares the turn log (latest turn id,
latest edit/delete seq) and the published snapshot's watermarks with what it
dispatched last time. It requests runs covering every familiar that is due: each
a partition key range from the first to the last of its familiars (in partition
order), the union of their due assets, and, per asset, the familiars it is due
for (`ProjectionConfig.familiars`), so a run's fixed cost (process start,
imports, code location load) is paid once for many familiars. The due familiars
are cut into as many runs as the run queue starts at once (`run_lanes`: its
`familiar/queue` limit) when each gets enough of them (`lanes`), and, on an
instance that records one planned event per partition, where far apart in the
partition order (`blocks`). The cursor only records what was dispatched; what each
projection has processed is its own watermark in memory.duckdb (read here,
lock-free, from the serving manifest). Resetting the cursor therefore loses
nothing: the next tick re-dispatches and each asset processes only what is new.
The manifest also lists what a run planned for the familiar and did not run
(`pending_assets`: it yielded its second pass to a waiting run, or died): those
assets are due too. A familiar whose dispatched run ended without publishing
anything (it failed: a full disk, a broken store) looks unchanged, so it is asked
for again on its own, with backoff (`schedule.RETRY_FIRST_S` doubling to
`RETRY_MAX_S`), while it is still due and no run of it is queued: memory catches up
once the cause is gone, without waiting for someone to speak.

A familiar found settled (nothing due, and nothing the clock alone can make due: no short
batch waiting to close for quiet, no index waiting for quiet, no purge waiting for its
retention) is remembered in the cursor with a fingerprint of its files (`schedule.QUIET`,
`files_fingerprint`: the turn log and its WAL, the manifest, the serving folder, the rebuild
marker, its own and the default config). While the fingerprint holds, a tick skips it with
seven `stat` calls instead of loading its config and opening its turn log, so a hundred quiet
familiars cost a tick next to nothing (`benchmarks/idle.py`).

Each familiar has its own cadence, `[pipeline].sensor_interval_s` in its character.toml: the
sensor ticks at the smallest among the familiars (read when the code location loads) and, at
each tick, looks only at the familiars whose own interval has passed since it last looked
(`schedule.cadence_due`, re-reading each config every tick, so an edit takes effect at once;
an interval made shorter than the tick is said, in the tick's log, to need a reload).

What is due and how the due familiars are cut into runs is decided in
`familiar_pipeline.engine.schedule` (`plan_tick`), without Dagster; this module reads
the instance (partitions, runs in flight, the run queue's lanes) and turns that plan into
run requests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Callable

import dagster as dg

from familiar_pipeline import shards
from familiar_pipeline.config import ConfigError, PipelineConfig, load_config
from familiar_pipeline.defs.assets import FOLLOWERS_INCLUDED_TAG, op_name
from familiar_pipeline.defs.partitions import FAMILIARS, PROJECTION_QUEUE_TAG, WAITING_STATUSES, asset_key, familiars_partitions
from familiar_pipeline.engine.schedule import (
    MAX_RANGE_GAP, FamiliarState, InFlightRun, TickPlan, plan_tick, triggered,
)
from familiar_pipeline.engine.spec import FACTS
from familiar_pipeline.storage.paths import data_root, list_familiars

log = logging.getLogger(__name__)

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
WAITING = set(WAITING_STATUSES)
DISPATCHED_TURN_TAG = "familiar/turn_id"  # a run of one familiar: its newest turn id when requested
DISPATCHED_TURNS_TAG = "familiar/turn_ids"  # a run the sensor requested: {familiar: newest turn id}, JSON
RANGE_START_TAG = "dagster/asset_partition_range_start"  # what RunRequest.partition_key_range reads
RANGE_END_TAG = "dagster/asset_partition_range_end"


def run_requests(plan: TickPlan, ops: dict[str, str] | None = None) -> list[dg.RunRequest]:
    """One request per run of a tick's plan (`schedule.plan_tick`), each over a partition range.

    `ops`: asset -> the step that materializes it (default: `op_name`).
    """
    return [range_request(run, {f: plan.states[f] for f in run}, ops, attempt=max(plan.attempts.get(f, 0) for f in run))
            for run in plan.runs]


def run_lanes(instance: dg.DagsterInstance) -> int:
    """How many runs with PROJECTION_QUEUE_TAG the instance's run queue starts at once (1 if unsaid)."""
    try:
        queue = instance.get_concurrency_config().run_queue_config
    except Exception:  # no queued run coordinator: one at a time is the safe reading
        return 1
    if queue is None:
        return 1
    limits = queue.tag_concurrency_limits
    (key, value), = PROJECTION_QUEUE_TAG.items()
    for limit in limits or ():
        # `value` unset, this queue's value, or per unique value (a shard's own lanes: familiar_pipeline.shards)
        per_value = isinstance(limit.get("value"), dict) and bool(limit["value"].get("applyLimitPerUniqueValue"))
        if limit.get("key") == key and (limit.get("value") in (None, value) or per_value):
            return max(1, int(limit.get("limit", 1)))
    return 1


def range_request(plan: dict[str, list[str]], states: dict[str, FamiliarState], ops: dict[str, str] | None = None,
                  *, attempt: int = 0) -> dg.RunRequest:
    """One run over every planned familiar: the range from the first to the last (in partition order).

    Familiars between them that are not in the plan are in the range too; the step's
    `familiars` config lists, per asset, those it is due for, and it skips the others unopened.
    `attempt` > 0 asks again for a state an earlier run did not get through: its run key
    differs, or Dagster would skip the request as one it already ran.
    """
    first, last = next(iter(plan)), next(reversed(plan))
    selection = list(dict.fromkeys(a for assets in plan.values() for a in assets))
    due_for = {asset: [f for f, assets in plan.items() if asset in assets] for asset in selection}
    dispatched = {f: states[f].latest_turn_id for f in plan}
    marks = json.dumps(
        {f: [s.log_id, s.latest_turn_id, s.latest_change_seq, s.snapshot_version] for f, s in states.items()},
        sort_keys=True,
    )
    return dg.RunRequest(
        # Idempotent: the same familiars in the same state ask for the same run.
        run_key=f"{first}..{last}:{hashlib.sha256((marks + repr(selection)).encode()).hexdigest()[:16]}"
                + (f":retry{attempt}" if attempt else ""),
        asset_selection=[asset_key(a) for a in selection],
        run_config={"ops": step_config(due_for, ops)},
        tags={
            RANGE_START_TAG: first,
            RANGE_END_TAG: last,
            "trigger": "turn_watermark_sensor",
            DISPATCHED_TURNS_TAG: json.dumps(dispatched, separators=(",", ":")),
            **PROJECTION_QUEUE_TAG,
            **(FOLLOWERS_INCLUDED_TAG if any(s.asset in selection for s in triggered(FACTS)) else {}),
        },
    )


def step_config(due_for: dict[str, list[str]], ops: dict[str, str] | None = None) -> dict:
    """The run config of each step: per asset it materializes, the familiars that asset is due for."""
    config: dict[str, dict] = {}
    for asset, familiars in due_for.items():
        step = (ops or {}).get(asset) or op_name(asset)
        config.setdefault(step, {"config": {"familiars": {}}})["config"]["familiars"][asset] = familiars
    return config


def run_familiars(run: dg.DagsterRun, order: list[str]) -> dict[str, int | None]:
    """The familiars a queued or running run serves, each with its newest turn id when requested (None: not known)."""
    tags = run.tags
    if DISPATCHED_TURNS_TAG in tags:
        try:
            return {f: int(t) for f, t in json.loads(tags[DISPATCHED_TURNS_TAG]).items()}
        except (ValueError, TypeError, AttributeError):
            pass
    if "dagster/partition" in tags:
        dispatched = tags.get(DISPATCHED_TURN_TAG)
        return {tags["dagster/partition"]: int(dispatched) if dispatched and dispatched.isdigit() else None}
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if start in order and end in order:  # a backfill or automation run over a range
        return {f: None for f in order[order.index(start): order.index(end) + 1]}
    return {}


def projection_run_waiting(records) -> bool:
    """Among in-flight run records, a run over many familiars queued and not started: every lane is busy."""
    key, value = next(iter(PROJECTION_QUEUE_TAG.items()))
    return any(r.dagster_run.status in WAITING and r.dagster_run.tags.get(key) == value for r in records)


def in_flight_records(instance: dg.DagsterInstance) -> list:
    """Every queued or running run's record, newest first (one query per tick)."""
    return list(instance.get_run_records(filters=dg.RunsFilter(statuses=IN_FLIGHT)))


def in_flight_runs(instance: dg.DagsterInstance, order: list[str], records=None) -> dict[str, InFlightRun]:
    """Familiar -> its newest queued or running run, whether that run serves one familiar or many."""
    in_flight: dict[str, InFlightRun] = {}
    for record in in_flight_records(instance) if records is None else records:  # newest first
        run = record.dagster_run
        for familiar_id, dispatched in run_familiars(run, order).items():
            in_flight.setdefault(familiar_id, InFlightRun(waiting=run.status in WAITING, dispatched_turn_id=dispatched))
    return in_flight


def owned_familiars(root) -> list[str]:
    """The familiars under the data root that this code location serves: on a shard, only those it owns."""
    found = list_familiars(root)
    owned = shards.shard_familiars()
    return found if owned is None else [f for f in found if f in owned]


# The daemon's sensor loop wakes every 5 s (MIN_INTERVAL_LOOP_TIME in Dagster's sensor daemon) and
# measures a sensor's elapsed time from its previous tick, so an interval equal to a multiple of the
# loop period misses a wake-up now and then (measured: a 5 s interval ticked after 10 s in 1 of 5
# gaps). The minimum handed to Dagster is one loop-jitter less, and the UI shows that number:
# the description says so.
TICK_JITTER_S = 1
NAMES_SHOWN = 10  # per interval in the description; the rest are counted


@dataclass(frozen=True)
class Cadences:
    """Each familiar's `[pipeline].sensor_interval_s` when the code location loaded, and the sensor's tick.

    The sensor ticks at the smallest interval (`tick_s`) and looks at each familiar at its own
    (`schedule.cadence_due`, re-read from its config at every tick, so an edit takes effect at the
    next tick); only an interval shorter than `tick_s`, set after the load, needs a reload.
    With no familiar yet, the defaults' interval (and FAMILIAR__PIPELINE__SENSOR_INTERVAL_S).
    """

    tick_s: int
    intervals: dict[str, int]  # familiar -> seconds
    errors: dict[str, str]  # familiar -> the config error it was read with (it is skipped at every tick too)


def sensor_cadences(root=None) -> Cadences:
    root = data_root() if root is None else root
    intervals: dict[str, int] = {}
    errors: dict[str, str] = {}
    for familiar_id in owned_familiars(root):
        try:
            intervals[familiar_id] = int(load_config(familiar_id, root=root).pipeline.sensor_interval_s)
        except Exception as exc:  # a broken config must not stop the code location from loading
            errors[familiar_id] = " ".join(str(exc).split())
    if intervals:
        return Cadences(min(intervals.values()), intervals, errors)
    try:
        default = int(load_config(None, root=root).pipeline.sensor_interval_s)
    except Exception as exc:
        default = PipelineConfig.sensor_interval_s
        errors["the defaults"] = " ".join(str(exc).split())
    return Cadences(default, intervals, errors)


def minimum_interval(interval_s: int) -> int:
    """The `minimum_interval_seconds` that makes the sensor tick every `interval_s` seconds."""
    return max(1, interval_s - TICK_JITTER_S)


def describe_cadences(cadences: Cadences) -> str:
    """The sensor's description in the UI: its tick, each familiar's cadence, why Dagster shows one second less."""
    tick = cadences.tick_s
    by_interval: dict[int, list[str]] = {}
    for familiar_id, interval in sorted(cadences.intervals.items()):
        by_interval.setdefault(interval, []).append(familiar_id)
    groups = []
    for interval, names in sorted(by_interval.items()):
        more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
        groups.append(f"every {interval}s: {', '.join(names[:NAMES_SHOWN])}{more}")
    listed = "; ".join(groups) if groups else "no familiar yet, so the defaults'"
    broken = "".join(f" {name}: config error, skipped until fixed ({why})." for name, why in sorted(cadences.errors.items()))
    return (
        f"Ticks every {tick}s, the smallest [pipeline].sensor_interval_s among the familiars, and looks at each "
        f"familiar at its own interval ({listed}). Each tick reads every familiar's character.toml again, so a "
        f"changed interval takes effect at its next tick; one shorter than {tick}s is looked at every {tick}s until "
        "the code location is reloaded (the tick's log says so). Dagster shows a minimum interval of "
        f"{minimum_interval(tick)}s: one second under {tick}s, because its daemon wakes sensors every 5 s and counts "
        f"from the previous tick, so a minimum of exactly {tick}s would skip a wake-up now and then. Each look adds "
        "new familiars as partitions and requests one run over every familiar whose thresholds are met (a partition "
        "range), with turns_fts, rolling_summary and facts (and the active fact-driven assets) as due for each."
        + broken
    )


def build_turn_watermark_sensor(targets, *, clock: Callable[[], float] = time.time) -> dg.SensorDefinition:
    """The turn sensor; `clock` (epoch seconds) decides which familiars' cadence is due at a tick."""
    cadences = sensor_cadences()
    model_assets = frozenset(
        spec.key.path[-1] for asset in targets for spec in asset.specs if "llm" in spec.kinds
    )
    ops = {key.path[-1]: asset.op.name for asset in targets for key in asset.keys}
    tick = cadences.tick_s

    @dg.sensor(
        name="turn_watermark_sensor",
        minimum_interval_seconds=minimum_interval(tick),
        default_status=dg.DefaultSensorStatus.RUNNING,
        target=targets,
        description=describe_cadences(cadences),
        metadata={"sensor_interval_s": tick,
                  "familiar_intervals_s": json.dumps(cadences.intervals, sort_keys=True, separators=(",", ":"))},
    )
    def turn_watermark_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        root = data_root()
        cursor = json.loads(context.cursor) if context.cursor else {}
        familiars = owned_familiars(root)
        known = list(context.instance.get_dynamic_partitions(FAMILIARS))
        records = in_flight_records(context.instance)
        in_flight = in_flight_runs(context.instance, known, records)
        try:
            max_requests = load_config(None, root=root).pipeline.max_familiars_per_tick
        except ConfigError:
            max_requests = PipelineConfig.max_familiars_per_tick
        per_partition = not context.instance.event_log_storage.supports_partition_subset_in_asset_materialization_planned_events
        plan = plan_tick(
            cursor, familiars, known, root=root, in_flight=in_flight, max_requests=max_requests,
            model_assets=model_assets, lanes=run_lanes(context.instance),
            max_gap=MAX_RANGE_GAP if per_partition else None, queue_waiting=projection_run_waiting(records),
            now=clock(), tick_s=tick,
        )
        requests = run_requests(plan, ops)
        for note in plan.notes:
            context.log.info(note)
        new_partitions = plan.new_partitions
        reload = [note for note in plan.notes if "shorter than the sensor's tick" in note]
        return dg.SensorResult(
            run_requests=requests,
            cursor=json.dumps(plan.cursor, sort_keys=True),
            dynamic_partitions_requests=[familiars_partitions.build_add_request(new_partitions)] if new_partitions else [],
            skip_reason=None if requests or new_partitions else " ".join(["no familiar has pending work.", *reload]),
        )

    return turn_watermark_sensor
