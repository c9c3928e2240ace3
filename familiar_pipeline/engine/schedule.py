"""What runs when: the projection step's work order and the turn sensor's due assets, without Dagster.

Both halves decide, neither talks to Dagster: `run_loop.py` runs the step's work order
(`defs/assets.py` reports it as Dagster events), `defs/sensors.py` turns the tick plan into
run requests, and `tests/test_schedule.py` calls them directly.

The step (one run over a range of familiars, `WorkOrder`):

* **two passes** (`passes`): each familiar's facts and whatever they read first, then
  the rest, so the last familiar's facts reach the bot after one short pass over the run;
* **lock requeueing**: a familiar whose writer lock another process holds goes to the end
  of the queue and is waited for there (up to `BUSY_WAIT_S`) before it is reported failed;
* **blocked followers** (`hold_followers`): a projector that raised, a failed blocking
  check, or a familiar that could not be opened holds back what is built on that asset for
  that familiar only, carried across its passes;
* **yielding**: while another projection run waits for a lane (`QueueWatch`), a run that is
  not a rebuild leaves the second pass of each familiar it published in the first to a
  later run (the snapshot lists it as pending, the sensor requests it).

The sensor (one tick, `plan_tick`): what each familiar is due for from its turn log and
its snapshot manifest (`FamiliarState`, `due_assets`: batch thresholds, batches a quiet gap
closed, the index after `index_quiet_s`, what a run left pending, the fact-driven
followers riding with facts, model assets held while no model is set), and how the due
familiars are cut into runs (`blocks`, `split_lanes`).
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from familiar_pipeline.config import ConfigError, FamiliarConfig, load_config, render_config
from familiar_pipeline.erasure.due import changed_read, purge_due
from familiar_pipeline.engine import registry
from familiar_pipeline.engine.spec import FACTS, TURN_INDEX, TURNS, ProjectorSpec
from familiar_pipeline.storage import corrupt
from familiar_pipeline.storage.paths import FamiliarPaths, default_dir
from familiar_pipeline.storage.snapshots import published_manifests
from familiar_pipeline.storage.turns import TurnLog

# ---------------------------------------------------------------------------------------------
# The step's work order
# ---------------------------------------------------------------------------------------------

# A familiar whose writer lock another process holds (another run, a rebuild) is left to
# the end of the run, then waited for this long before it is reported failed (FamiliarBusy).
BUSY_WAIT_S = 60.0

# What the bot needs soonest from a new batch: its facts (recent turns are in the prompt's
# history anyway, so the turn index can follow). A run over several familiars takes these (and
# whatever they read) for every familiar first, each published as it is done, then the rest
# (turn index, summaries, supersession, dossiers, reflections): the last familiar's facts reach
# the bot after one short pass over the run, not after every familiar's full work.
FIRST_PASS = ("facts",)

# How often a run between its passes asks whether another projection run waits in the queue.
QUEUE_CHECK_S = 1.0


def passes(specs: list[ProjectorSpec]) -> list[list[ProjectorSpec]]:
    """The selected specs in the order a run over several familiars takes them: two passes.

    First the FIRST_PASS assets and every selected spec they read (transitively), then the
    rest; each pass keeps the given dependency order, and nothing in the first reads the
    second. An empty pass is left out.
    """
    by_asset = {s.asset: s for s in specs}
    first: set[str] = set()
    todo = [a for a in FIRST_PASS if a in by_asset]
    while todo:
        asset = todo.pop()
        if asset not in first:
            first.add(asset)
            todo += [i for i in by_asset[asset].reads if i in by_asset]
    split = [[s for s in specs if s.asset in first], [s for s in specs if s.asset not in first]]
    return [p for p in split if p]


def hold_followers(blocked: dict[str, str], spec: ProjectorSpec, why: str) -> None:
    """Hold back, for one familiar, every projector built on `spec`'s asset (the first reason stays);
    not one that reads it as a soft input (`ProjectorSpec.soft_inputs`), unless through another."""
    for follower in registry.dependants(spec.name, soft=False):
        blocked.setdefault(follower.asset, why)


class QueueWatch:
    """Whether another projection run waits for a lane: asked at most every QUEUE_CHECK_S, sticky once seen.

    `probe` asks the run queue (Dagster's instance, in `defs/assets.py`).
    """

    def __init__(self, probe: Callable[[], bool], *, clock: Callable[[], float] = time.monotonic):
        self.probe, self.clock = probe, clock
        self.waiting, self._checked = False, float("-inf")

    def run_waiting(self) -> bool:
        if not self.waiting and self.clock() - self._checked >= QUEUE_CHECK_S:
            self._checked = self.clock()
            self.waiting = self.probe()
        return self.waiting


class _Work(NamedTuple):
    familiar_id: str
    step: int  # which pass
    lock_wait_s: float  # how long to wait for its writer lock (0: refused at once)


@dataclass(frozen=True)
class Visit:
    """One familiar's turn in one pass: what to run for it and what its later passes still plan."""

    familiar_id: str
    step: int
    specs: list[ProjectorSpec]  # this pass's specs planned for the familiar, in dependency order
    later: tuple[str, ...]  # the assets of its later passes planned for it (the snapshot's pending)
    lock_wait_s: float
    blocked: dict[str, str]  # asset -> why it does not run for this familiar, shared across its passes


class WorkOrder:
    """The step's queue over (familiar, pass, lock wait), in the order a run takes them.

    Iterate it for `Visit`s; after each, say how it went: `busy` (another writer holds the
    familiar: back to the end of the queue, once), `not_opened` (its later passes would not
    open it either) and always `done` unless `busy` requeued it. One familiar: one pass.
    `planned(asset, familiar)`: whether the run's plan has that asset for that familiar.
    `run_waiting`: whether another projection run waits for a lane (None: never yield, a rebuild).
    """

    def __init__(
        self,
        specs: list[ProjectorSpec],
        familiars: Sequence[str],
        *,
        planned: Callable[[str, str], bool] = lambda asset, familiar_id: True,
        run_waiting: Callable[[], bool] | None = None,
        busy_wait_s: float = BUSY_WAIT_S,
    ):
        # A run over several familiars takes them in two passes: each familiar's facts are
        # published before any familiar's followers run. One familiar: one pass, one open, one publish.
        self.steps = passes(specs) if len(familiars) > 1 else [specs]
        self.planned, self.run_waiting, self.busy_wait_s = planned, run_waiting, busy_wait_s
        self.blocked: dict[str, dict[str, str]] = {f: {} for f in familiars}
        # A familiar's next pass is queued once this one is done; one another writer holds comes
        # back at the end of the queue.
        self._work = deque(_Work(f, 0, 0.0) for f in familiars)
        # Familiars this run published a snapshot for in an earlier pass: only their rest can be left
        # to a later run. Their manifest changed since the sensor asked for this run and lists what is
        # left, so its next tick requests it; a familiar not published here (its first pass had nothing,
        # or wrote nothing) would look unchanged to the sensor and wait for its next turn.
        self.published: set[str] = set()
        self.left: list[str] = []  # familiars whose later passes this run leaves to a later one

    def __iter__(self) -> Iterator[Visit]:
        while self._work:
            familiar_id, step, lock_wait_s = self._work.popleft()
            if step and familiar_id in self.published and self.run_waiting is not None and self.run_waiting():
                self.left.append(familiar_id)
                continue
            yield Visit(
                familiar_id, step,
                specs=[s for s in self.steps[step] if self.planned(s.asset, familiar_id)],
                later=tuple(s.asset for p in self.steps[step + 1:] for s in p if self.planned(s.asset, familiar_id)),
                lock_wait_s=lock_wait_s,
                blocked=self.blocked[familiar_id],
            )

    def busy(self, visit: Visit) -> bool:
        """Another writer holds the familiar: True if it goes back to the end (waited for then), False if it waited already."""
        if visit.lock_wait_s:
            return False
        self._work.append(_Work(visit.familiar_id, visit.step, self.busy_wait_s))
        return True

    def not_opened(self, visit: Visit, exc: BaseException) -> None:
        """The familiar could not be opened at all (config, lock, storage): its later passes are held back."""
        for asset in visit.later:
            visit.blocked.setdefault(asset, f"blocked: familiar not opened ({type(exc).__name__})")

    def done(self, visit: Visit, *, published: bool) -> None:
        """The visit is over (whatever it did): its next pass is queued; `published`: its snapshot changed."""
        if visit.step + 1 < len(self.steps):
            self._work.append(_Work(visit.familiar_id, visit.step + 1, 0.0))
        if published:
            self.published.add(visit.familiar_id)


# ---------------------------------------------------------------------------------------------
# The sensor's due assets
# ---------------------------------------------------------------------------------------------

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

# Cursor key (never a familiar id: those start with a letter or digit) of the familiars whose
# model-needing assets already ran once without a model: familiar id -> config fingerprint.
TOLD_NO_MODEL = "~told_no_model"

# Cursor key of the familiars dispatched while due: familiar id -> [attempts, when to ask again
# (epoch s)] should the dispatched run end with nothing published (the familiar then looks
# unchanged: a full disk, a broken store). The first retry comes RETRY_FIRST_S after a dispatch,
# then the wait doubles up to RETRY_MAX_S, so a familiar that keeps failing costs one run per
# RETRY_MAX_S, and memory catches up once the cause is gone without waiting for a new turn.
RETRIES = "~retry"
RETRY_FIRST_S = 15.0
RETRY_MAX_S = 120.0


# Cursor key of when each familiar was last looked at (epoch s): each familiar's own
# `[pipeline].sensor_interval_s` decides when the sensor, which ticks at the smallest of them,
# looks at it again (`cadence_due`).
EVALUATED = "~evaluated"

# A tick comes up to a second early or late against the daemon's 5 s loop (`defs/sensors.py:
# TICK_JITTER_S`); a familiar looked at `interval - CADENCE_SLACK_S` ago is due, so a 30 s familiar
# on a 5 s tick is looked at every sixth tick, not every seventh when one came a moment early.
CADENCE_SLACK_S = 1.0


# Cursor key of the familiars found settled (`FamiliarState.settled`: nothing due now or ever
# without a new write) -> the fingerprint of their files then (`files_fingerprint`). While the
# fingerprint holds, a tick skips the familiar with a few `stat` calls instead of loading its
# config and opening its turn log: the idle floor of 100 quiet familiars (issue 51).
QUIET = "~quiet"

# The moment a purge "ever" comes due: a settled familiar has nothing to purge even then.
NEVER = datetime.max.replace(tzinfo=timezone.utc) - timedelta(days=1)


def files_fingerprint(paths: FamiliarPaths, root: Path) -> str:
    """What a tick's decision about a familiar reads, as file stats: its turn log (and the log's WAL),
    published manifest, serving folder, rebuild marker, own and default config.

    Any write to those changes a stat (size, mtime or inode); a tick that stats them before it
    reads them can only see a newer state than the fingerprint says, so it looks again next time.
    An empty WAL file counts as none: the tick's own read-only open creates one when no writer
    holds the log open, and a write that reaches the log grows its WAL or changes the file.
    """
    stats = []
    wal = paths.turns_db.with_name(paths.turns_db.name + "-wal")
    for path in (paths.turns_db, wal, paths.serving_dir / "manifest.json", paths.serving_dir,
                 corrupt.marker_path(paths), paths.character_toml, default_dir(root) / "character.toml"):
        try:
            st = path.stat()
        except OSError:
            stats.append("-")
        else:
            stats.append("-" if path is wal and not st.st_size else f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(stats).encode()).hexdigest()[:16]


# Dagster's sensor daemon wakes its sensors every 5 s: no tick comes more often, and an interval of
# 5 s (the least `sensor_interval_s` allows) means every tick.
DAEMON_LOOP_S = 5


def every_tick(interval_s: float, tick_s: float | None = None) -> bool:
    """An interval at or below the sensor's tick (`tick_s`; unsaid: the daemon's loop) means every tick."""
    return interval_s <= (DAEMON_LOOP_S if tick_s is None else tick_s)


def cadence_due(last: float | None, interval_s: float, now: float, tick_s: float | None = None) -> bool:
    """Whether a familiar last looked at `last` (None: never) is due for a look at `now`, per its interval."""
    if last is None or every_tick(interval_s, tick_s):
        return True
    return now - last >= interval_s - CADENCE_SLACK_S


def below_tick_note(familiar_id: str, interval_s: int, tick_s: int) -> str:
    """What a tick says of a familiar whose interval is shorter than the sensor's tick (read at load)."""
    return (f"{familiar_id}: [pipeline].sensor_interval_s = {interval_s} is shorter than the sensor's tick of {tick_s}s, "
            "which was read when the code location loaded: it is looked at every tick until the code location is "
            "reloaded (UI: Deployment, Reload) or `familiar up` restarted")


def retry_wait(attempts: int) -> float:
    """Seconds until a familiar dispatched `attempts` times before is asked for again."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** attempts)


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
    damaged: str | None = None  # what is wrong with the published snapshot (missing, cut short); None: whole
    rebuilding: bool = False  # a corrupt store was moved aside and is being rebuilt (`storage.corrupt`)
    changed: tuple[str, ...] = ()  # projectors that follow changes, with an edit or deletion of a turn they read
    purge_due: bool = False  # erased or deleted turns whose text is due to go (`erasure.purge`)
    settled: bool = False  # nothing is or will become due until one of its files changes (`QUIET`)

    def turn_watermark(self, projector: str) -> int:
        return int(self.watermarks.get(projector, {}).get("turn_id", 0))


    def signature(self) -> list[int | str]:
        # `closed` counts: a batch that closes for quiet, with nothing else new, is news.
        return [self.latest_turn_id, self.latest_change_seq, self.snapshot_version, len(self.closed), self.log_id,
                *([1] if self.damaged else []), *(["rebuilding"] if self.rebuilding else []),
                *(["purge"] if self.purge_due else [])]


@dataclass(frozen=True)
class InFlightRun:
    """The newest queued or running run of a familiar, as the sensor sees it."""

    waiting: bool  # queued, not started: it will read the turn log when it starts
    dispatched_turn_id: int | None  # newest turn id when it was requested (None: not ours)

    def leaves_a_full_batch(self, config: FamiliarConfig, state: FamiliarState) -> bool:
        """A whole new fact batch arrived after this (running) run was requested.

        Such a run may already have read the turn log, so the new batch would wait for
        the tick after it ends; one follow-on run queued now starts the moment the
        familiar's slot frees (the queue allows one run per familiar at a time).
        """
        if self.waiting or self.dispatched_turn_id is None or not config.memory.is_active("rich_note"):
            return False
        return state.latest_turn_id - self.dispatched_turn_id >= config.memory.rich_note.batch_size


def triggered(trigger: str | None) -> list[ProjectorSpec]:
    """Registered specs the sensor requests on `trigger`, in registration (dependency) order."""
    return [spec for spec in registry.specs() if spec.trigger == trigger]


def read_state(paths: FamiliarPaths, config: FamiliarConfig | None = None) -> FamiliarState:
    """The familiar's turn log and published watermarks; with its config, also which short batches have closed.

    A damaged snapshot (`published_manifests`: manifest.json missing or unreadable, a file it
    names gone or cut short) is marked `damaged`, so that a run publishes a whole one again;
    its watermarks are manifest.json's when it is readable (they are the store's), else
    those of the newest whole snapshot on disk.
    """
    published = published_manifests(paths.serving_dir)
    manifest = published.manifest or published.intact(paths.serving_dir)
    version = manifest.version if manifest is not None else 0
    marks = dict((manifest.store_watermark.get("projectors") or {}) if manifest is not None else {})
    pending = manifest.pending_assets if manifest is not None else ()
    now = datetime.now(timezone.utc)
    rebuilding = corrupt.rebuilding(paths) is not None
    with TurnLog(paths.turns_db, readonly=True) as turn_log:
        latest, change, log_id = turn_log.latest_id(), turn_log.latest_change_seq(), turn_log.log_id()
        newest = turn_log.turns_by_ids([latest]) if latest else []
        closed = tuple(_closed_early(turn_log, config, latest, marks, now)) if config is not None else ()
        changed = tuple(changed_read(triggered(TURNS), turn_log, marks, change))
        purging = purge_due(turn_log, config) if config is not None else bool(turn_log.erasures(pending_only=True))
        settled = (config is not None and not (closed or changed or purging or pending or rebuilding or published.problem)
                   and caught_up(config, marks, latest, change) and not purge_due(turn_log, config, NEVER))
    age = (now - newest[0].created_at).total_seconds() if newest else float("inf")
    return FamiliarState(latest, change, age, version, marks, closed, log_id, pending, published.problem,
                         rebuilding=rebuilding, changed=changed, purge_due=purging, settled=settled)


def caught_up(config: FamiliarConfig, marks: dict, latest: int, latest_change: int) -> bool:
    """Nothing waits on the clock: the turn index has read every turn and change (else it waits for
    `index_quiet_s`), and no active turn-driven projector has a short batch that a quiet gap may close
    (`batch_closed`) or a full one. A short batch of a projector that waits for its size only
    (the summary's threshold) waits for new turns, which change the turn log's fingerprint."""
    index = marks.get("turns_fts", {})
    if int(index.get("turn_id", 0)) < latest or int(index.get("change_seq", 0)) < latest_change:
        return False
    for spec in triggered(TURNS):
        if spec.name not in config.memory.projectors:
            continue
        waiting = latest - int(marks.get(spec.name, {}).get("turn_id", 0))
        if waiting > 0 and (spec.batch_closed is not None or waiting >= batch_size(spec, config.memory.knobs(spec.name))):
            return False
    return True


def batch_size(spec: ProjectorSpec, knobs: Any) -> int:
    """How many new turns make a turn-driven projector due (its `batch_knob`, which its spec must name)."""
    assert spec.batch_knob is not None, f"turn-driven projector {spec.name!r} names no batch_knob"
    return int(getattr(knobs, spec.batch_knob))


def _closed_early(turn_log: TurnLog, config: FamiliarConfig, latest: int, marks: dict, now: datetime) -> Iterator[str]:
    """Active turn-driven projectors whose next batch, though short of their batch knob, is complete."""
    for spec in triggered(TURNS):
        if spec.batch_closed is None or spec.name not in config.memory.projectors:
            continue
        knobs = config.memory.knobs(spec.name)
        mark = int(marks.get(spec.name, {}).get("turn_id", 0))
        closed = spec.load_batch_closed()
        if 0 < latest - mark < batch_size(spec, knobs) and closed is not None and closed(turn_log, knobs, mark, now):
            yield spec.name


def due_assets(config: FamiliarConfig, state: FamiliarState, *, hold: frozenset[str] = frozenset()) -> list[str]:
    """Asset names whose thresholds are met, per the familiar's effective config.

    `hold`: assets not to request (those that would only say "skipped" again). A store being
    rebuilt (`storage.corrupt`) is due for every active projection.
    """
    active = set(config.memory.projectors)
    if state.rebuilding:  # every active projection, from the first turn, in one run
        return [s.asset for s in registry.specs() if (s.always_on or s.name in active) and s.asset not in hold]
    due = []
    for spec in triggered(TURNS):
        pending = state.latest_turn_id - state.turn_watermark(spec.name)
        if spec.name in active and spec.asset not in hold and (pending >= batch_size(spec, config.memory.knobs(spec.name))
                                    or spec.name in state.closed
                                    or spec.name in state.changed):
            due.append(spec.asset)
    if "facts" in due:
        # The fact-driven assets ride in the same run: one process start instead of a second
        # queued run per batch. Automation still covers facts changed any other way.
        due.extend(spec.asset for spec in triggered(FACTS) if spec.name in active)
    if state.damaged or state.purge_due or (index_behind(state) and (due or state.latest_turn_age_s >= config.pipeline.index_quiet_s)):
        # Turn vectors follow the same turns as the full-text index, in the same run. A damaged
        # snapshot, and turns due to be purged (the purge rides with the turn index), ask for these
        # too (the cheapest run): any run of the familiar republishes a
        # snapshot that lags the store or is damaged (`FamiliarRuntime.flush`).
        due[:0] = [spec.asset for spec in triggered(TURN_INDEX) if spec.always_on or spec.name in active]
    if state.pending:
        # What a run planned and left undone (it stopped between passes for a waiting run, or died).
        due.extend(spec.asset for spec in registry.specs()
                   if spec.asset in state.pending and spec.asset not in due and spec.asset not in hold
                   and (spec.always_on or spec.name in active))
    return due


def index_behind(state: FamiliarState) -> bool:
    mark = state.watermarks.get("turns_fts", {})
    return state.latest_turn_id > int(mark.get("turn_id", 0)) or state.latest_change_seq > int(mark.get("change_seq", 0))


def config_fingerprint(config: FamiliarConfig) -> str:
    """Changes whenever the familiar's effective config does (secrets are masked in the rendering)."""
    return hashlib.sha256(render_config(config).encode()).hexdigest()[:16]


def held_for_no_model(config: FamiliarConfig, told: dict, familiar_id: str, model_assets: frozenset[str]) -> frozenset[str]:
    """The model-needing assets to leave out: they already reported "skipped" under this config.

    The first run without a model shows, per asset, "skipped: no model configured ..." with the
    setting to change; requesting them again would only repeat it. A config change (a model
    set, or anything else) lets them run again.
    """
    if config.llm.slot("background").configured or told.get(familiar_id) != config_fingerprint(config):
        return frozenset()
    return model_assets


@dataclass
class TickPlan:
    """What one sensor tick decided: the runs (each familiar -> its due assets, in partition order) and the rest."""

    runs: list[dict[str, list[str]]]
    states: dict[str, FamiliarState]  # the due familiars' states, as read for their plan
    new_partitions: list[str]
    cursor: dict
    notes: list[str] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)  # familiar -> earlier dispatches of the same state (0: first)


def plan_tick(
    cursor: dict,
    familiars: list[str],
    known_partitions: Iterable[str],
    *,
    root: Path,
    in_flight: dict[str, InFlightRun],
    max_requests: int,
    model_assets: frozenset[str] = frozenset(),
    lanes: int = 1,
    max_gap: int | None = MAX_RANGE_GAP,
    queue_waiting: bool = False,
    now: float | None = None,
    tick_s: int | None = None,
) -> TickPlan:
    """One tick's decisions (`defs/sensors.py: run_requests` makes them run requests).

    `known_partitions`: the dynamic partitions in their order (Dagster's: insertion);
    the new ones are added after them in `familiars` order. At most `max_requests`
    familiars in all (the flood guard), cut into runs by `blocks` (`max_gap`; None: never)
    and then `lanes` (how many runs the queue starts at once). `queue_waiting`: a
    projection run is queued and not started yet; the due familiars then wait for the
    next tick (their cursor is not advanced), so that while every lane is busy they
    gather into one run instead of a queue of small ones, each paying a run's start.
    `model_assets`: the assets that need the background model (kind "llm"). `now` (epoch
    seconds, default the clock) decides which unchanged but still due familiars are asked
    for again (`RETRIES`).
    """
    now = time.time() if now is None else now
    notes: list[str] = []
    new_cursor = dict(cursor)
    told = dict(cursor.get(TOLD_NO_MODEL, {}))
    retries = dict(cursor.get(RETRIES, {}))
    evaluated = dict(cursor.get(EVALUATED, {}))
    attempts: dict[str, int] = {}
    known = list(dict.fromkeys(known_partitions))
    known_set, on_disk = set(known), set(familiars)
    new_partitions = [f for f in familiars if f not in known_set]
    order = [f for f in known if f in on_disk] + new_partitions
    plan: dict[str, list[str]] = {}  # familiar -> its due assets, in partition order
    states: dict[str, FamiliarState] = {}
    quiet = dict(cursor.get(QUIET, {}))
    for familiar_id in order:
        paths = FamiliarPaths.for_id(familiar_id, root)
        fingerprint = files_fingerprint(paths, root)
        if quiet.get(familiar_id) == fingerprint and familiar_id not in retries:
            continue  # settled, and none of its files changed since: nothing can be due
        quiet.pop(familiar_id, None)
        try:
            config = load_config(familiar_id, root=root)
            interval = config.pipeline.sensor_interval_s
            if tick_s is not None and interval < tick_s:
                notes.append(below_tick_note(familiar_id, interval, tick_s))
            if not cadence_due(evaluated.get(familiar_id), interval, now, tick_s):
                continue  # not its time yet: looked at again at a later tick, its turn log unread
            if every_tick(interval, tick_s):
                evaluated.pop(familiar_id, None)  # nothing to remember (and the cursor stays as it was)
            else:
                evaluated[familiar_id] = now
            state = read_state(paths, config)
        except (ConfigError, OSError, ValueError) as exc:
            notes.append(f"{familiar_id}: skipped ({exc})")
            continue
        if state.settled and familiar_id not in in_flight:  # nothing due (`due_assets` is empty), now or later
            quiet[familiar_id] = fingerprint
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
        if retry is not None:
            notes.append(f"{familiar_id}: its last run ended with nothing published and it is still due; "
                         f"asking again (attempt {retry[0] + 1})")
        if len(plan) >= max_requests:
            notes.append(f"{familiar_id}: deferred by the flood guard (max {max_requests} familiars per run)")
            continue
        knobs = {f"{s.name}.{s.batch_knob}": batch_size(s, config.memory.knobs(s.name)) for s in triggered(TURNS)}
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
    evaluated = {f: when for f, when in evaluated.items() if f in on_disk}
    quiet = {f: mark for f, mark in quiet.items() if f in on_disk}
    for key, value in ((TOLD_NO_MODEL, told), (RETRIES, retries), (EVALUATED, evaluated), (QUIET, quiet)):
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
        waiting = {f: when for f, when in evaluated.items() if f not in plan}  # whatever their cadence says
        waiting.update({f: cursor[EVALUATED][f] for f in plan if f in cursor.get(EVALUATED, {})})
        if waiting:
            new_cursor[EVALUATED] = waiting
        else:
            new_cursor.pop(EVALUATED, None)
        notes.append(f"{len(plan)} due familiar(s) wait: a projection run is queued and not started yet")
        return TickPlan([], {}, new_partitions, new_cursor, notes)
    runs = split_lanes(blocks(list(plan), position, max_gap), lanes)
    return TickPlan([{f: plan[f] for f in run} for run in runs], states, new_partitions, new_cursor, notes, attempts)


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
