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
for again on its own, with backoff (`RETRY_FIRST_S` doubling to `RETRY_MAX_S`),
while it is still due and no run of it is queued: memory catches up once the cause
is gone, without waiting for someone to speak.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from datetime import datetime, timezone
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import dagster as dg

from familiar_pipeline.defs.assets import FOLLOWERS_INCLUDED_TAG, op_name
from familiar_pipeline.defs.partitions import PROJECTION_QUEUE_TAG, WAITING_STATUSES, familiars_partitions
from familiar_pipeline.config import ConfigError, PipelineConfig, load_config, render_config
from familiar_pipeline.storage.paths import FamiliarPaths, data_root, list_familiars
from familiar_pipeline.projectors import registry
from familiar_pipeline.projectors.spec import FACTS, TURN_INDEX, TURNS
from familiar_pipeline.storage.turns import TurnLog

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

# A run covers a contiguous range of partitions. With Dagster's stock SQLite event log, each
# familiar in it that is not due still costs a planned-materialization event per selected asset
# when the run is created (~20 ms each), and a run costs ~2.5 s to start: due familiars more
# than this many partitions apart then go in separate runs. The instance's own event log
# (familiar_pipeline.event_log) records one planned event per asset for the whole range,
# so the sensor does not cut there (`max_gap` None).
MAX_RANGE_GAP = 20

# A run costs ~0.3-0.5 s before its first familiar when forked from the preloaded run worker
# (6-8 s as a fresh process: imports, the model client's import on its first call) and a
# familiar's batch ~0.3-0.5 s (scripted model): the due familiars are cut into several runs
# only when each gets at least this many.
MIN_FAMILIARS_PER_LANE = 8


@dataclass(frozen=True)
class FamiliarState:
    """What the sensor can see of one familiar without opening memory.duckdb."""

    latest_turn_id: int
    latest_change_seq: int
    latest_turn_age_s: float
    snapshot_version: int
    watermarks: dict  # projector -> {"turn_id", "fact_id", "change_seq"}
    closed: tuple[str, ...] = ()  # projectors with a batch closed early (a quiet gap) past their watermark
    log_id: str = ""  # the turn log's own id: a familiar created again under its name is a new log
    pending: tuple[str, ...] = ()  # assets a run planned and left undone (the snapshot's pending_assets)

    def turn_watermark(self, projector: str) -> int:
        return int(self.watermarks.get(projector, {}).get("turn_id", 0))

    def signature(self) -> list[int]:
        # `closed` counts: a batch that closes for quiet, with nothing else new, is news.
        return [self.latest_turn_id, self.latest_change_seq, self.snapshot_version, len(self.closed), self.log_id]


@dataclass(frozen=True)
class InFlightRun:
    """The newest queued or running run of a familiar, as the sensor sees it."""

    waiting: bool  # queued, not started: it will read the turn log when it starts
    dispatched_turn_id: int | None  # newest turn id when it was requested (None: not ours)

    def leaves_a_full_batch(self, config, state: FamiliarState) -> bool:
        """A whole new fact batch arrived after this (running) run was requested.

        Such a run may already have read the turn log, so the new batch would wait for
        the tick after it ends; one follow-on run queued now starts the moment the
        familiar's slot frees (the queue allows one run per familiar at a time).
        """
        if self.waiting or self.dispatched_turn_id is None or not config.memory.is_active("rich_note"):
            return False
        return state.latest_turn_id - self.dispatched_turn_id >= config.memory.rich_note.batch_size


def _triggered(trigger: str) -> list:
    """Registered specs the sensor requests on `trigger`, in registration (dependency) order."""
    return [spec for spec in registry.specs() if spec.trigger == trigger]


def read_state(paths: FamiliarPaths, config=None) -> FamiliarState:
    """The familiar's turn log and published watermarks; with its config, also which short batches have closed."""
    version, marks, pending = 0, {}, ()
    try:
        manifest = json.loads((paths.serving_dir / "manifest.json").read_text())
        version = int(manifest.get("version", 0))
        marks = (manifest.get("store_watermark") or {}).get("projectors") or {}
        pending = tuple(a for a in manifest.get("pending_assets") or () if isinstance(a, str))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    now = datetime.now(timezone.utc)
    with TurnLog(paths.turns_db, readonly=True) as turn_log:
        latest, change, log_id = turn_log.latest_id(), turn_log.latest_change_seq(), turn_log.log_id()
        newest = turn_log.turns_by_ids([latest]) if latest else []
        closed = tuple(_closed_early(turn_log, config, latest, marks, now)) if config is not None else ()
    age = (now - newest[0].created_at).total_seconds() if newest else float("inf")
    return FamiliarState(latest, change, age, version, marks, closed, log_id, pending)


def _closed_early(turn_log, config, latest: int, marks: dict, now: datetime):
    """Active turn-driven projectors whose next batch, though short of their batch knob, is complete."""
    for spec in _triggered(TURNS):
        if spec.batch_closed is None or spec.name not in config.memory.projectors:
            continue
        knobs = config.memory.knobs(spec.name)
        mark = int(marks.get(spec.name, {}).get("turn_id", 0))
        if 0 < latest - mark < getattr(knobs, spec.batch_knob) and spec.batch_closed(turn_log, knobs, mark, now):
            yield spec.name


def due_assets(config, state: FamiliarState, *, hold: frozenset[str] = frozenset()) -> list[str]:
    """Asset names whose thresholds are met, per the familiar's effective config.

    `hold`: assets not to request (those that would only say "skipped" again).
    """
    due = []
    active = set(config.memory.projectors)
    for spec in _triggered(TURNS):
        pending = state.latest_turn_id - state.turn_watermark(spec.name)
        if spec.name in active and spec.asset not in hold and (pending >= getattr(config.memory.knobs(spec.name), spec.batch_knob)
                                    or spec.name in state.closed):
            due.append(spec.asset)
    if "facts" in due:
        # The fact-driven assets ride in the same run: one process start instead of a second
        # queued run per batch. Automation still covers facts changed any other way.
        due.extend(spec.asset for spec in _triggered(FACTS) if spec.name in active)
    if index_behind(state) and (due or state.latest_turn_age_s >= config.pipeline.index_quiet_s):
        # Turn vectors follow the same turns as the full-text index, in the same run.
        due[:0] = [spec.asset for spec in _triggered(TURN_INDEX) if spec.always_on or spec.name in active]
    if state.pending:
        # What a run planned and left undone (it stopped between passes for a waiting run, or died).
        due.extend(spec.asset for spec in registry.specs()
                   if spec.asset in state.pending and spec.asset not in due and spec.asset not in hold
                   and (spec.always_on or spec.name in active))
    return due


def index_behind(state: FamiliarState) -> bool:
    mark = state.watermarks.get("turns_fts", {})
    return state.latest_turn_id > int(mark.get("turn_id", 0)) or state.latest_change_seq > int(mark.get("change_seq", 0))


# Cursor key (never a familiar id: those start with a letter or digit) of the familiars whose
# model-needing assets already ran once without a model: familiar id -> config fingerprint.
TOLD_NO_MODEL = "~told_no_model"

# Cursor key of the familiars dispatched while due: familiar id -> [attempts, when to ask again
# (epoch s)] should the dispatched run end with nothing published (the familiar then looks
# unchanged). The first retry comes RETRY_FIRST_S after a dispatch, then the wait doubles up to
# RETRY_MAX_S, so a familiar that keeps failing costs one run per RETRY_MAX_S.
RETRIES = "~retry"
RETRY_FIRST_S = 15.0
RETRY_MAX_S = 120.0


def retry_wait(attempts: int) -> float:
    """Seconds until a familiar dispatched `attempts` times before is asked for again."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** attempts)


def config_fingerprint(config) -> str:
    """Changes whenever the familiar's effective config does (secrets are masked in the rendering)."""
    return hashlib.sha256(render_config(config).encode()).hexdigest()[:16]


def held_for_no_model(config, told: dict, familiar_id: str, model_assets: frozenset[str]) -> frozenset[str]:
    """The model-needing assets to leave out: they already reported "skipped" under this config.

    The first run without a model shows, per asset, "skipped: no model configured ..." with the
    setting to change; requesting them again would only repeat it. A config change (a model
    set, or anything else) lets them run again.
    """
    if config.llm.slot("background").configured or told.get(familiar_id) != config_fingerprint(config):
        return frozenset()
    return model_assets


def evaluate_tick(
    cursor: dict,
    familiars: list[str],
    known_partitions: Iterable[str],
    *,
    root: Path,
    in_flight: dict[str, InFlightRun],
    max_requests: int,
    model_assets: frozenset[str] = frozenset(),
    ops: dict[str, str] | None = None,
    lanes: int = 1,
    max_gap: int | None = MAX_RANGE_GAP,
    queue_waiting: bool = False,
    now: float | None = None,
) -> tuple[list[dg.RunRequest], list[str], dict, list[str]]:
    """Pure tick logic: (run requests, new partitions, new cursor, log lines).

    `known_partitions`: the dynamic partitions in their order (Dagster's: insertion);
    the new ones are added after them in `familiars` order. At most `max_requests`
    familiars in all (the flood guard), cut into runs by `blocks` (`max_gap`; None: never)
    and then `lanes` (how many runs the queue starts at once). `queue_waiting`: a
    projection run is queued and not started yet; the due familiars then wait for the
    next tick (their cursor is not advanced), so that while every lane is busy they
    gather into one run instead of a queue of small ones, each paying a run's start.
    `model_assets`: the assets that need the background model (kind "llm"); `ops`: asset ->
    the step that materializes it (default: `op_name`). `now` (epoch seconds, default the
    clock) decides which unchanged but still due familiars are asked for again (`RETRIES`).
    """
    now = time.time() if now is None else now
    notes: list[str] = []
    new_cursor = dict(cursor)
    told = dict(cursor.get(TOLD_NO_MODEL, {}))
    retries = dict(cursor.get(RETRIES, {}))
    attempts: dict[str, int] = {}  # familiar -> earlier dispatches of the same state, for this tick's run key
    known = list(dict.fromkeys(known_partitions))
    known_set, on_disk = set(known), set(familiars)
    new_partitions = [f for f in familiars if f not in known_set]
    order = [f for f in known if f in on_disk] + new_partitions
    plan: dict[str, list[str]] = {}  # familiar -> its due assets, in partition order
    states: dict[str, FamiliarState] = {}
    for familiar_id in order:
        paths = FamiliarPaths.for_id(familiar_id, root)
        try:
            config = load_config(familiar_id, root=root)
            state = read_state(paths, config)
        except (ConfigError, OSError, ValueError) as exc:
            notes.append(f"{familiar_id}: skipped ({exc})")
            continue
        unchanged = cursor.get(familiar_id) == state.signature()
        retry = retries.get(familiar_id)
        if unchanged and (retry is None or now < retry[1] or familiar_id in in_flight):
            continue
        if not unchanged:
            retries.pop(familiar_id, None)
            retry = None
        running = in_flight.get(familiar_id)
        if running is not None and not running.leaves_a_full_batch(config, state):
            notes.append(f"{familiar_id}: a run is already queued or running; will look again")
            continue
        assets = due_assets(config, state, hold=held_for_no_model(config, told, familiar_id, model_assets))
        if not assets:
            retries.pop(familiar_id, None)
            if not index_behind(state):  # else the index waits for quiet: look again next tick
                new_cursor[familiar_id] = state.signature()
            continue
        if unchanged:
            notes.append(f"{familiar_id}: its last run ended with nothing published and it is still due; "
                         f"asking again (attempt {retry[0] + 1})")
        if len(plan) >= max_requests:
            notes.append(f"{familiar_id}: deferred by the flood guard (max {max_requests} familiars per run)")
            continue
        knobs = {f"{s.name}.{s.batch_knob}": getattr(config.memory.knobs(s.name), s.batch_knob) for s in _triggered(TURNS)}
        notes.append(f"{familiar_id}: turns up to {state.latest_turn_id} -> {', '.join(assets)} ({knobs})")
        plan[familiar_id], states[familiar_id] = assets, state
        new_cursor[familiar_id] = state.signature()
        attempts[familiar_id] = retry[0] + 1 if retry else 0
        retries[familiar_id] = [attempts[familiar_id], now + retry_wait(attempts[familiar_id])]
        if config.llm.slot("background").configured:
            told.pop(familiar_id, None)
        elif model_assets.intersection(assets):
            told[familiar_id] = config_fingerprint(config)
    told = {f: mark for f, mark in told.items() if f in on_disk}
    retries = {f: retry for f, retry in retries.items() if f in on_disk}
    for key, value in ((TOLD_NO_MODEL, told), (RETRIES, retries)):
        if value:
            new_cursor[key] = value
        else:
            new_cursor.pop(key, None)
    position = {f: i for i, f in enumerate(order)}
    if queue_waiting and plan:
        for familiar_id in [*plan, TOLD_NO_MODEL, RETRIES]:  # looked at again next tick, with whatever else is due by then
            if familiar_id in cursor:
                new_cursor[familiar_id] = cursor[familiar_id]
            else:
                new_cursor.pop(familiar_id, None)
        notes.append(f"{len(plan)} due familiar(s) wait: a projection run is queued and not started yet")
        return [], new_partitions, new_cursor, notes
    runs = split_lanes(blocks(list(plan), position, max_gap), lanes)
    requests = [range_request({f: plan[f] for f in run}, {f: states[f] for f in run}, ops,
                              attempt=max(attempts[f] for f in run)) for run in runs]
    return requests, new_partitions, new_cursor, notes


def blocks(due: list[str], position: dict[str, int], max_gap: int | None = MAX_RANGE_GAP) -> list[list[str]]:
    """The due familiars (in partition order) cut where more than `max_gap` others lie between two."""
    out: list[list[str]] = []
    for familiar in due:
        if out and (max_gap is None or position[familiar] - position[out[-1][-1]] - 1 <= max_gap):
            out[-1].append(familiar)
        else:
            out.append([familiar])
    return out


def split_lanes(runs: list[list[str]], lanes: int, min_per_lane: int = MIN_FAMILIARS_PER_LANE) -> list[list[str]]:
    """One run of due familiars cut into up to `lanes` near-equal runs (partition order kept).

    The queue starts `lanes` projection runs at once: a wave of due familiars in one run
    would use one core of several while the others wait. Each part keeps at least
    `min_per_lane` familiars, so a run's start cost stays small beside its work. Runs
    already cut (far apart, `blocks`) are left as they are.
    """
    if len(runs) != 1:
        return runs
    [run] = runs
    parts = max(1, min(lanes, len(run) // min_per_lane))
    size, extra = divmod(len(run), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(run[start:end])
        start = end
    return out


def run_lanes(instance: dg.DagsterInstance) -> int:
    """How many runs with PROJECTION_QUEUE_TAG the instance's run queue starts at once (1 if unsaid)."""
    try:
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    except Exception:  # no queued run coordinator: one at a time is the safe reading
        return 1
    (key, value), = PROJECTION_QUEUE_TAG.items()
    for limit in limits or ():
        if limit.get("key") == key and limit.get("value") in (None, value):
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
        asset_selection=[dg.AssetKey(a) for a in selection],
        run_config={"ops": step_config(due_for, ops)},
        tags={
            RANGE_START_TAG: first,
            RANGE_END_TAG: last,
            "trigger": "turn_watermark_sensor",
            DISPATCHED_TURNS_TAG: json.dumps(dispatched, separators=(",", ":")),
            **PROJECTION_QUEUE_TAG,
            **(FOLLOWERS_INCLUDED_TAG if any(s.asset in selection for s in _triggered(FACTS)) else {}),
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


# The daemon's sensor loop wakes every 5 s (dagster._daemon.sensor.MIN_INTERVAL_LOOP_TIME) and
# measures a sensor's elapsed time from the *end* of its previous tick, so an interval equal to a
# multiple of the loop period misses every other wake-up now and then (measured: a 5 s interval
# ticked after 10 s in 1 of 5 gaps). The minimum handed to Dagster is one loop-jitter less.
TICK_JITTER_S = 1


@dataclass(frozen=True)
class Cadence:
    """The code location's sensor interval and whose config it came from.

    One code location serves every familiar under the data root, but a sensor has one
    interval: it is the `[pipeline]` of the familiar named by ``FAMILIAR_ID`` (the one
    `familiar up --familiar X` serves; it sets that variable for its children), else
    `data/familiars/_default`. ``FAMILIAR__PIPELINE__SENSOR_INTERVAL_S`` overrides both.
    Per-familiar knobs (batch sizes, thresholds, `index_quiet_s`) are read per familiar
    at every tick.
    """

    interval_s: int
    source: str  # "familiar 'demo'" or "the defaults", for the UI
    error: str | None = None  # the config error that made it fall back to the default


def sensor_cadence() -> Cadence:
    served = os.environ.get("FAMILIAR_ID") or None
    source = f"familiar {served!r}" if served else "the defaults (no FAMILIAR_ID)"
    try:
        return Cadence(int(load_config(served).pipeline.sensor_interval_s), source)
    except Exception as exc:  # a broken config must not stop the code location from loading
        return Cadence(PipelineConfig.sensor_interval_s, source, error=str(exc))


def minimum_interval(interval_s: int) -> int:
    """The `minimum_interval_seconds` that makes the sensor tick every `interval_s` seconds."""
    return max(1, interval_s - TICK_JITTER_S)


def build_turn_watermark_sensor(targets) -> dg.SensorDefinition:
    cadence = sensor_cadence()
    model_assets = frozenset(
        spec.key.path[-1] for asset in targets for spec in asset.specs if "llm" in spec.kinds
    )
    ops = {key.path[-1]: asset.op.name for asset in targets for key in asset.keys}
    interval = cadence.interval_s
    fallback = f" Config error, using the default: {cadence.error}" if cadence.error else ""

    @dg.sensor(
        name="turn_watermark_sensor",
        minimum_interval_seconds=minimum_interval(interval),
        default_status=dg.DefaultSensorStatus.RUNNING,
        target=targets,
        description=(
            f"Every {interval}s ([pipeline].sensor_interval_s of {cadence.source}, read when the code "
            "location loads): adds new familiars as partitions and requests one run over every familiar whose "
            "thresholds are met (a partition range), with turns_fts, rolling_summary and facts (and the active "
            f"fact-driven assets) as due for each.{fallback}"
        ),
        metadata={"sensor_interval_s": interval, "cadence_from": cadence.source},
    )
    def turn_watermark_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        root = data_root()
        cursor = json.loads(context.cursor) if context.cursor else {}
        familiars = list_familiars(root)
        known = list(context.instance.get_dynamic_partitions(familiars_partitions.name))
        records = in_flight_records(context.instance)
        in_flight = in_flight_runs(context.instance, known, records)
        try:
            max_requests = load_config(None, root=root).pipeline.max_familiars_per_tick
        except ConfigError:
            max_requests = PipelineConfig.max_familiars_per_tick
        per_partition = not context.instance.event_log_storage.supports_partition_subset_in_asset_materialization_planned_events
        requests, new_partitions, new_cursor, notes = evaluate_tick(
            cursor, familiars, known, root=root, in_flight=in_flight, max_requests=max_requests,
            model_assets=model_assets, ops=ops, lanes=run_lanes(context.instance),
            max_gap=MAX_RANGE_GAP if per_partition else None, queue_waiting=projection_run_waiting(records),
        )
        for note in notes:
            context.log.info(note)
        return dg.SensorResult(
            run_requests=requests,
            cursor=json.dumps(new_cursor, sort_keys=True),
            dynamic_partitions_requests=[familiars_partitions.build_add_request(new_partitions)] if new_partitions else [],
            skip_reason=None if requests or new_partitions else "no familiar has pending work",
        )

    return turn_watermark_sensor
