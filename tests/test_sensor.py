"""The turn-watermark sensor, one test per cursor situation."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from familiar_pipeline.defs.assets import MEMORY
from familiar_pipeline.defs.sensors import build_turn_watermark_sensor, run_lanes
from familiar_pipeline.engine.schedule import MAX_RANGE_GAP, blocks, due_assets, read_state, split_lanes

from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.snapshots import Manifest

from .helpers import append_chat, make_familiar, repo_instance


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    with dg.instance_for_test() as instance:
        yield tmp_path, instance


FOLLOWERS = ["fact_supersessions", "people_dossiers", "reflections"]  # active by default; embeddings are opt-in
INDEXES = ["turns_fts", "wishes"]  # turn-index assets: model-free, run once a conversation goes quiet
FULL = sorted(["facts", "rolling_summary", *INDEXES, *FOLLOWERS])


def tick(instance, cursor=None):
    sensor = build_turn_watermark_sensor([MEMORY])
    return sensor(dg.build_sensor_context(instance=instance, cursor=cursor))


def requested(result):
    """Familiar -> the assets the tick's run is due to process for it (its plan in the run config)."""
    assert len(result.run_requests) <= 1, "one run per tick"
    plan: dict[str, list[str]] = {}
    for request in result.run_requests:
        assert set(request.run_config["ops"]) == {"memory"}, "the built-in projections are one step"
        due_for = request.run_config["ops"]["memory"]["config"]["familiars"]
        assert set(due_for) == {k.path[-1] for k in request.asset_selection}
        for asset, familiars in due_for.items():
            for familiar in familiars:
                plan.setdefault(familiar, []).append(asset)
    return {familiar: sorted(assets) for familiar, assets in plan.items()}


def covered(result) -> tuple[str, str]:
    tags = result.run_requests[0].tags
    return tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]


def test_first_tick_with_backlog_adds_partition_and_requests_runs(env):
    root, instance = env
    append_chat(make_familiar(root, "alpha"), 35)
    result = tick(instance)
    assert requested(result) == {"alpha": FULL}
    added = [k for r in result.dynamic_partitions_requests for k in r.partition_keys]
    assert added == ["alpha"]
    assert json.loads(result.cursor)["alpha"][0] == 35


def test_nothing_new_requests_nothing(env):
    root, instance = env
    append_chat(make_familiar(root, "alpha"), 12)
    first = tick(instance)
    instance.add_dynamic_partitions("familiars", ["alpha"])
    second = tick(instance, cursor=first.cursor)
    assert second.run_requests == [] and not second.dynamic_partitions_requests
    assert second.cursor == first.cursor


def test_new_familiar_is_added_on_a_later_tick(env):
    root, instance = env
    append_chat(make_familiar(root, "alpha"), 3)
    first = tick(instance)
    instance.add_dynamic_partitions("familiars", ["alpha"])
    append_chat(make_familiar(root, "beta"), 3)
    second = tick(instance, cursor=first.cursor)
    assert [k for r in second.dynamic_partitions_requests for k in r.partition_keys] == ["beta"]
    assert requested(second) == {"beta": INDEXES}


def test_thresholds_decide_which_assets_run(env):
    root, instance = env
    paths = make_familiar(root, "alpha")
    append_chat(paths, 9)  # below batch_size=10 and turns_threshold=10
    assert requested(tick(instance)) == {"alpha": INDEXES}
    append_chat(paths, 1, start=9)  # exactly at the threshold
    assert requested(tick(instance)) == {"alpha": FULL}


def test_env_override_of_a_threshold_takes_effect(env, monkeypatch):
    root, instance = env
    append_chat(make_familiar(root, "alpha"), 5)
    monkeypatch.setenv("FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE", "5")
    assert requested(tick(instance)) == {"alpha": sorted(["facts", *INDEXES, *FOLLOWERS])}


def test_cursor_reset_redispatches_without_losing_anything(env):
    root, instance = env
    append_chat(make_familiar(root, "alpha"), 12)
    first = tick(instance)
    instance.add_dynamic_partitions("familiars", ["alpha"])
    assert tick(instance, cursor=first.cursor).run_requests == []
    reset = tick(instance, cursor=None)
    assert requested(reset) == requested(first)
    assert reset.run_requests[0].run_key == first.run_requests[0].run_key  # idempotent dispatch


def test_in_flight_run_defers_the_familiar(env):
    root, instance = env
    append_chat(make_familiar(root, "alpha"), 12)
    instance.add_dynamic_partitions("familiars", ["alpha"])
    instance.add_run(
        dg.DagsterRun(job_name="project_memory", run_id="r1", status=dg.DagsterRunStatus.STARTED, tags={"dagster/partition": "alpha"})
    )
    result = tick(instance)
    assert result.run_requests == []
    assert "alpha" not in json.loads(result.cursor or "{}")


def add_in_flight_run(instance, familiar, status, dispatched_turn_id):
    instance.add_run(dg.DagsterRun(
        job_name="project_memory", run_id=f"r-{status.value}-{dispatched_turn_id}", status=status,
        tags={"dagster/partition": familiar, "familiar/turn_id": str(dispatched_turn_id)},
    ))


def test_running_run_gets_one_follow_on_when_a_whole_batch_arrived_since(env):
    root, instance = env
    paths = make_familiar(root, "alpha")
    append_chat(paths, 12)
    instance.add_dynamic_partitions("familiars", ["alpha"])
    add_in_flight_run(instance, "alpha", dg.DagsterRunStatus.STARTED, 12)
    assert tick(instance).run_requests == []  # nothing new since it was requested
    append_chat(paths, 9, start=12)
    assert tick(instance).run_requests == []  # 9 new turns: not a whole batch yet
    append_chat(paths, 1, start=21)
    follow_on = tick(instance)
    assert requested(follow_on) == {"alpha": FULL}  # queued now, starts when the slot frees
    assert json.loads(follow_on.run_requests[0].tags["familiar/turn_ids"]) == {"alpha": 22}


def test_queued_run_is_never_joined_by_another(env):
    root, instance = env
    append_chat(make_familiar(root, "alpha"), 40)
    instance.add_dynamic_partitions("familiars", ["alpha"])
    add_in_flight_run(instance, "alpha", dg.DagsterRunStatus.NOT_STARTED, 1)
    assert tick(instance).run_requests == []  # it reads the turn log when it starts


def test_flood_guard_caps_requests_per_tick(env, monkeypatch):
    root, instance = env
    for name in ("a1", "a2", "a3", "a4"):
        append_chat(make_familiar(root, name), 11)
    monkeypatch.setenv("FAMILIAR__PIPELINE__MAX_FAMILIARS_PER_TICK", "2")
    first = tick(instance)
    assert len(requested(first)) == 2
    for r in first.dynamic_partitions_requests:
        instance.add_dynamic_partitions("familiars", list(r.partition_keys))
    second = tick(instance, cursor=first.cursor)
    assert len(requested(second)) == 2
    assert set(requested(first)) | set(requested(second)) == {"a1", "a2", "a3", "a4"}


def test_due_assets_reads_published_watermarks(tmp_path):
    paths = make_familiar(tmp_path, "alpha")
    append_chat(paths, 30)
    write_manifest(paths, 3, {"rich_note": {"turn_id": 25}, "turns_fts": {"turn_id": 30, "change_seq": 0},
                              "rolling_summary": {"turn_id": 10}})
    from familiar_pipeline.config import load_config

    state = read_state(paths)
    assert state.snapshot_version == 3
    assert due_assets(load_config("alpha", root=tmp_path), state) == ["rolling_summary"]


def test_due_assets_adds_what_a_run_left_pending_if_active_and_not_held(tmp_path, monkeypatch):
    from familiar_pipeline.config import load_config

    paths = make_familiar(tmp_path, "alpha")
    append_chat(paths, 30)
    marks = {"rich_note": {"turn_id": 30}, "turns_fts": {"turn_id": 30, "change_seq": 0}, "rolling_summary": {"turn_id": 30}}
    write_manifest(paths, 4, marks, pending=("fact_supersessions", "reflections", "no_such_asset"))
    state = read_state(paths)
    assert state.pending == ("fact_supersessions", "reflections", "no_such_asset")
    assert due_assets(load_config("alpha", root=tmp_path), state) == ["fact_supersessions", "reflections"]
    assert due_assets(load_config("alpha", root=tmp_path), state, hold=frozenset({"reflections"})) == ["fact_supersessions"]
    monkeypatch.setenv("FAMILIAR__PROVIDERS__MEMORY__PROJECTORS", '["rich_note", "fact_supersede"]')
    assert due_assets(load_config("alpha", root=tmp_path), state) == ["fact_supersessions"], "reflection is off"


def test_index_alone_waits_for_a_quiet_conversation(env, monkeypatch):
    from datetime import datetime, timezone

    from familiar_pipeline.storage.turns import TurnLog

    root, instance = env
    paths = make_familiar(root, "alpha")
    with TurnLog(paths.turns_db) as log:
        log.append_turn(channel_id=1, role="user", author_key="discord:1", content="just now",
                        created_at=datetime.now(timezone.utc))
    first = tick(instance)
    assert first.run_requests == [], "a conversation in full flow: the index waits"
    instance.add_dynamic_partitions("familiars", ["alpha"])
    assert "alpha" not in json.loads(first.cursor), "not recorded, so a later tick looks again"
    monkeypatch.setenv("FAMILIAR__PIPELINE__INDEX_QUIET_S", "0")
    assert requested(tick(instance, cursor=first.cursor)) == {"alpha": INDEXES}


def test_sensor_ticks_at_the_configured_interval_within_the_daemon_loop(tmp_path, monkeypatch):
    # The daemon wakes sensors every 5 s and measures from the last tick: the minimum handed to
    # Dagster is one second less, so a 5 s cadence never skips a wake-up; the description says why.
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    monkeypatch.delenv("FAMILIAR__PIPELINE__SENSOR_INTERVAL_S", raising=False)
    assert build_turn_watermark_sensor([MEMORY]).minimum_interval_seconds == 4
    monkeypatch.setenv("FAMILIAR__PIPELINE__SENSOR_INTERVAL_S", "30")
    sensor = build_turn_watermark_sensor([MEMORY])
    assert sensor.minimum_interval_seconds == 29
    assert sensor.description.startswith("Ticks every 30s")
    assert "Dagster shows a minimum interval of 29s: one second under 30s" in sensor.description


def test_the_tick_is_the_smallest_interval_of_every_familiar_and_a_reload_sees_an_edit(tmp_path, monkeypatch):
    # It used to be the interval of the familiar named by FAMILIAR_ID (`familiar up --familiar`) alone.
    # A reload in the UI builds the Definitions afresh, which is what re-importing the module does here.
    import importlib

    import familiar_pipeline.definitions as definitions

    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    monkeypatch.delenv("FAMILIAR__PIPELINE__SENSOR_INTERVAL_S", raising=False)
    paths = make_familiar(tmp_path, "demo", extra_toml="[pipeline]\nsensor_interval_s = 30\n")
    make_familiar(tmp_path, "other", extra_toml="[pipeline]\nsensor_interval_s = 90\n")

    def served_sensor():
        return importlib.reload(definitions).defs.resolve_sensor_def("turn_watermark_sensor")

    for served in ("demo", "other"):
        monkeypatch.setenv("FAMILIAR_ID", served)
        sensor = served_sensor()
        assert sensor.minimum_interval_seconds == 29, served
        assert "(every 30s: demo; every 90s: other)" in sensor.description
    assert sensor.metadata["sensor_interval_s"].value == 30
    paths.character_toml.write_text("[pipeline]\nsensor_interval_s = 60\n")
    sensor = served_sensor()
    assert sensor.minimum_interval_seconds == 59 and sensor.description.startswith("Ticks every 60s")
    paths.character_toml.write_text("[pipeline]\nsensor_interval_s = 1\n")  # invalid: the location still loads
    sensor = served_sensor()
    assert sensor.minimum_interval_seconds == 89 and "demo: config error" in sensor.description
    assert "sensor_interval_s = 1" in sensor.description


def test_one_run_per_tick_covers_every_due_familiar(env):
    root, instance = env
    for name in ("a1", "a2", "a3", "a4", "a5"):
        append_chat(make_familiar(root, name), 12)
    result = tick(instance)
    assert len(result.run_requests) == 1
    assert requested(result) == {name: FULL for name in ("a1", "a2", "a3", "a4", "a5")}
    assert covered(result) == ("a1", "a5")
    request = result.run_requests[0]
    assert request.partition_key is None and request.tags["familiar/queue"] == "projections"
    assert json.loads(request.tags["familiar/turn_ids"]) == {name: 12 for name in ("a1", "a2", "a3", "a4", "a5")}


def published_up_to(paths, turn_id: int) -> None:
    """A serving manifest whose watermarks say every projector has processed turns up to `turn_id`."""
    marks = {name: {"turn_id": turn_id, "change_seq": 0}
             for name in ("turns_fts", "standing_wish", "rolling_summary", "rich_note", "supersede", "dossiers",
                         "reflections")}
    write_manifest(paths, 1, marks)


def write_manifest(paths, version: int, marks: dict, *, pending: tuple[str, ...] = ()) -> None:
    """A well-formed serving manifest (of a snapshot with no table files) carrying these watermarks."""
    paths.serving_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(version=version, published_at="2026-01-01T00:00:00+00:00",
                        store_watermark={"projectors": marks}, tables={}, pending_assets=pending)
    (paths.serving_dir / "manifest.json").write_text(json.dumps(manifest.to_json()))


def test_the_range_spans_familiars_between_the_due_ones_and_the_plan_leaves_them_out(env, monkeypatch):
    root, instance = env
    monkeypatch.setenv("FAMILIAR__PIPELINE__INDEX_QUIET_S", "0")
    for name in ("a1", "a2", "a3"):
        paths = make_familiar(root, name)
        append_chat(paths, 12)
        published_up_to(paths, 12)
    first = tick(instance)
    assert first.run_requests == []
    instance.add_dynamic_partitions("familiars", ["a1", "a2", "a3"])
    append_chat(FamiliarPaths.for_id("a1", root), 10, start=12)
    append_chat(FamiliarPaths.for_id("a3", root), 1, start=12)
    second = tick(instance, cursor=first.cursor)
    assert covered(second) == ("a1", "a3")
    assert requested(second) == {"a1": FULL, "a3": INDEXES}, "a2 is in the range, not in the plan"


def test_the_range_follows_partition_order_and_a_familiar_added_mid_run_joins_the_next_tick(env):
    root, instance = env
    append_chat(make_familiar(root, "zed"), 12)
    first = tick(instance)
    instance.add_dynamic_partitions("familiars", ["zed"])
    instance.add_run(dg.DagsterRun(job_name="project_memory", run_id="range-1", status=dg.DagsterRunStatus.STARTED,
                                   tags=dict(first.run_requests[0].tags)))
    append_chat(make_familiar(root, "amy"), 12)  # added while zed's run runs; sorts first, partitioned last
    second = tick(instance, cursor=first.cursor)
    assert [k for r in second.dynamic_partitions_requests for k in r.partition_keys] == ["amy"]
    assert requested(second) == {"amy": FULL}, "zed's run is in flight: only the newcomer"
    assert covered(second) == ("amy", "amy")
    instance.add_dynamic_partitions("familiars", ["amy"])
    append_chat(FamiliarPaths.for_id("zed", root), 10, start=12)  # a whole batch more: one follow-on
    third = tick(instance, cursor=second.cursor)
    assert requested(third) == {"zed": FULL}


def test_a_range_run_in_flight_defers_every_familiar_it_covers(env):
    root, instance = env
    for name in ("a1", "a2", "a3"):
        append_chat(make_familiar(root, name), 12)
    instance.add_dynamic_partitions("familiars", ["a1", "a2", "a3"])
    instance.add_run(dg.DagsterRun(  # a UI backfill over a1..a2: no plan, so both are taken
        job_name="project_memory", run_id="backfill", status=dg.DagsterRunStatus.NOT_STARTED,
        tags={"dagster/asset_partition_range_start": "a1", "dagster/asset_partition_range_end": "a2"}))
    assert requested(tick(instance)) == {"a3": FULL}


def test_a_familiar_created_again_under_its_name_gets_a_new_run_key(env):
    """Dagster drops a request whose run key already ran: the old log's runs must not hide the new log's."""
    import shutil

    root, instance = env
    append_chat(make_familiar(root, "alpha"), 12)
    first = tick(instance)
    shutil.rmtree(root / "alpha")
    append_chat(make_familiar(root, "alpha"), 12)  # the same ids, counts and snapshot version as before
    again = tick(instance, cursor=first.cursor)
    assert requested(again) == requested(first)
    assert again.run_requests[0].run_key != first.run_requests[0].run_key


def test_due_familiars_far_apart_get_a_run_each():
    """A familiar in a run's range that is not due still costs Dagster events: long gaps split the run."""
    order = [f"f{i:03d}" for i in range(100)]
    position = {f: i for i, f in enumerate(order)}
    near = ["f000", "f003", f"f{4 + MAX_RANGE_GAP:03d}"]  # gaps of 2 and MAX_RANGE_GAP: one run
    assert blocks(near, position) == [near]
    far = ["f000", f"f{2 + MAX_RANGE_GAP:03d}", "f099"]  # a gap of MAX_RANGE_GAP + 1, then a long one
    assert blocks(far, position) == [["f000"], [f"f{2 + MAX_RANGE_GAP:03d}"], ["f099"]]
    assert blocks([], position) == []


def test_a_tick_splits_its_run_where_due_familiars_are_far_apart(env):
    root, instance = env
    names = [f"b{i:02d}" for i in range(MAX_RANGE_GAP + 3)]
    for name in names:
        make_familiar(root, name)
    append_chat(FamiliarPaths.for_id(names[0], root), 11)
    append_chat(FamiliarPaths.for_id(names[-1], root), 11)
    result = tick(instance)
    ranges = [(r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
              for r in result.run_requests]
    assert ranges == [(names[0], names[0]), (names[-1], names[-1])], "21 idle familiars between: two runs"
    assert len({r.run_key for r in result.run_requests}) == 2


def test_one_wave_of_due_familiars_is_cut_into_near_equal_runs_one_per_lane():
    due = [f"f{i:03d}" for i in range(21)]
    assert split_lanes([due], 2) == [due[:11], due[11:]]
    assert split_lanes([due], 3) == [due[:11], due[11:]], "21 familiars: two runs of at least 8, not three"
    more = [f"f{i:03d}" for i in range(24)]
    assert split_lanes([more], 3) == [more[:8], more[8:16], more[16:]]
    assert split_lanes([due[:15]], 2) == [due[:15]], "two runs of fewer than 8 familiars cost more than they save"
    assert split_lanes([due], 1) == [due]
    assert split_lanes([due[:3], due[10:]], 4) == [due[:3], due[10:]], "runs already cut stay as they are"
    assert split_lanes([], 2) == []


def test_run_lanes_is_the_queue_limit_of_projection_runs(tmp_path, monkeypatch):
    with repo_instance(tmp_path / "home", monkeypatch) as instance:
        assert run_lanes(instance) == 2, "dagster_home/dagster.yaml starts two projection runs at a time"
    limits = {"run_queue": {"tag_concurrency_limits": [{"key": "familiar/queue", "limit": 3}]}}
    with dg.instance_for_test(overrides=limits) as instance:
        assert run_lanes(instance) == 3
    with dg.instance_for_test() as instance:
        assert run_lanes(instance) == 1, "no limit said: one at a time"


def test_a_tick_on_the_repository_instance_gives_each_lane_its_own_familiars(tmp_path, monkeypatch):
    """Two lanes: a wave of 20 due familiars is two runs of 10; far-apart ones are not cut (one planned event per asset)."""
    root = tmp_path / "data"
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    names = [f"w{i:02d}" for i in range(20)]
    for name in names:
        append_chat(make_familiar(root, name), 12)
    with repo_instance(tmp_path / "home", monkeypatch) as instance:
        result = tick(instance)
        runs = [json.loads(r.tags["familiar/turn_ids"]) for r in result.run_requests]
        assert [sorted(run) for run in runs] == [names[:10], names[10:]]
        assert [covered_by(r) for r in result.run_requests] == [(names[0], names[9]), (names[10], names[19])]
        assert len({r.run_key for r in result.run_requests}) == 2

        later = [f"x{i:02d}" for i in range(MAX_RANGE_GAP + 3)]
        for name in later:
            make_familiar(root, name)
        append_chat(FamiliarPaths.for_id(later[0], root), 11)
        append_chat(FamiliarPaths.for_id(later[-1], root), 11)
        instance.add_dynamic_partitions("familiars", names)
        again = tick(instance, cursor=result.cursor)
        assert [covered_by(r) for r in again.run_requests] == [(later[0], later[-1])], \
            "idle familiars between cost nothing here: one run"


def covered_by(request) -> tuple[str, str]:
    return request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]


def test_due_familiars_wait_while_a_projection_run_is_queued_and_gather_into_the_next(env):
    """Every lane busy and a run waiting: a tick requests nothing; the next tick after it starts takes them all."""
    root, instance = env
    append_chat(make_familiar(root, "q1"), 12)
    first = tick(instance)
    assert requested(first) == {"q1": FULL}
    instance.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id="waiting", status=dg.DagsterRunStatus.NOT_STARTED,
                                   tags={"familiar/queue": "projections", "familiar/turn_ids": '{"other":1}'}))
    append_chat(make_familiar(root, "q2"), 12)
    append_chat(FamiliarPaths.for_id("q1", root), 12, start=12)
    held = tick(instance, cursor=first.cursor)
    assert held.run_requests == []
    assert json.loads(held.cursor).get("q2") is None, "not dispatched: looked at again next tick"
    assert json.loads(held.cursor)["q1"] == json.loads(first.cursor)["q1"]
    instance.delete_run("waiting")  # it left the queue
    later = tick(instance, cursor=held.cursor)
    assert requested(later) == {"q1": FULL, "q2": FULL}, "both in one run once the queued one started"


def test_a_familiar_whose_run_published_nothing_is_asked_for_again_with_backoff(env):
    """A run that failed (a full disk, a broken store) leaves the familiar looking unchanged: it is
    asked for again by itself, with backoff, and not while a run of it is queued."""
    from familiar_pipeline.engine.schedule import RETRIES, RETRY_FIRST_S, InFlightRun, retry_wait
    from tests.helpers import sensor_tick

    root, _ = env
    paths = make_familiar(root, "alpha")
    append_chat(paths, 12)

    def at(now, cursor, in_flight=None):
        requests, _, cursor, notes = sensor_tick(cursor, ["alpha"], ["alpha"], root=root, in_flight=in_flight or {},
                                                   max_requests=5, now=now)
        return requests, cursor, notes

    first, cursor, _ = at(1000.0, {})
    assert len(first) == 1 and ":retry" not in first[0].run_key
    assert at(1000.0 + RETRY_FIRST_S - 1, cursor)[0] == [], "too soon"
    busy = {"alpha": InFlightRun(waiting=True, dispatched_turn_id=12)}
    assert at(1000.0 + RETRY_FIRST_S, cursor, busy)[0] == [], "its run is still queued"
    again, cursor, notes = at(1000.0 + RETRY_FIRST_S, cursor)
    assert [r.run_key for r in again] == [first[0].run_key + ":retry1"], "a new key, or Dagster would skip it"
    assert "nothing published and it is still due" in " ".join(notes)
    assert requested_plan(again) == requested_plan(first)
    t = 1000.0 + RETRY_FIRST_S
    assert at(t + retry_wait(1) - 1, cursor)[0] == [], "the wait doubles"
    third, cursor, _ = at(t + retry_wait(1), cursor)
    assert third[0].run_key.endswith(":retry2")

    append_chat(paths, 1, start=12)  # news: a normal dispatch, the count starts over
    fresh, cursor, _ = at(t + retry_wait(1) + 1, cursor)
    assert ":retry" not in fresh[0].run_key and cursor[RETRIES]["alpha"][0] == 0


def requested_plan(requests):
    return [r.run_config for r in requests]


def test_each_familiar_is_looked_at_at_its_own_cadence_and_an_edit_takes_effect_without_a_reload(env):
    """Issue 50: one `sensor_interval_s` (the familiar named at `up`) applied to every familiar, and the
    UI showed 4 s for a configured 5 s. Now the sensor ticks at the smallest interval, looks at each
    familiar at its own, lists them in its description (saying why Dagster shows one second less), and
    reads every familiar's config at each tick: an edit takes effect without rebuilding the sensor."""
    root, instance = env
    fast = make_familiar(root, "fast", extra_toml="[pipeline]\nsensor_interval_s = 5\n")
    slow = make_familiar(root, "slow", extra_toml="[pipeline]\nsensor_interval_s = 30\n")
    for paths in (fast, slow):
        append_chat(paths, 12)
    now = [1000.0]
    sensor = build_turn_watermark_sensor([MEMORY], clock=lambda: now[0])
    assert sensor.minimum_interval_seconds == 4
    assert sensor.metadata["sensor_interval_s"].value == 5
    assert json.loads(sensor.metadata["familiar_intervals_s"].value) == {"fast": 5, "slow": 30}
    assert sensor.description.startswith("Ticks every 5s, the smallest [pipeline].sensor_interval_s")
    assert "(every 5s: fast; every 30s: slow)" in sensor.description
    assert "Dagster shows a minimum interval of 4s: one second under 5s" in sensor.description

    def at(seconds: float, cursor):
        now[0] = 1000.0 + seconds
        result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
        return set(requested(result)), result.cursor

    seen, cursor = at(0, None)
    assert seen == {"fast", "slow"}  # first look at both
    instance.add_dynamic_partitions("familiars", ["fast", "slow"])
    append_chat(fast, 12, start=12)
    append_chat(slow, 12, start=12)
    seen, cursor = at(5, cursor)
    assert seen == {"fast"}, "slow's 30 s have not passed"
    seen, cursor = at(10, cursor)
    assert seen == set()
    # No run really ran here, so fast is asked for again now and then (its retries, on their own clock):
    # from here on, what counts is when slow is looked at.
    seen, cursor = at(29.5, cursor)  # a tick a moment early still counts as slow's thirtieth second
    assert "slow" in seen

    # An edit of slow's character.toml, the sensor as it was loaded: its next look is 60 s after the last.
    slow.character_toml.write_text("[pipeline]\nsensor_interval_s = 60\n")
    append_chat(slow, 12, start=24)
    for second in (35, 61, 80):
        seen, cursor = at(second, cursor)
        assert "slow" not in seen, second
    seen, cursor = at(90, cursor)
    assert "slow" in seen
    # And back to 5 s: looked at again at the next tick.
    slow.character_toml.write_text("[pipeline]\nsensor_interval_s = 5\n")
    append_chat(slow, 12, start=36)
    seen, cursor = at(95, cursor)
    assert "slow" in seen


def test_an_interval_shorter_than_the_loaded_tick_says_a_reload_is_needed(env):
    root, instance = env
    paths = make_familiar(root, "solo", extra_toml="[pipeline]\nsensor_interval_s = 30\n")
    instance.add_dynamic_partitions("familiars", ["solo"])
    sensor = build_turn_watermark_sensor([MEMORY], clock=lambda: 1000.0)
    assert sensor.minimum_interval_seconds == 29 and "(every 30s: solo)" in sensor.description
    paths.character_toml.write_text("[pipeline]\nsensor_interval_s = 5\n")
    result = sensor(dg.build_sensor_context(instance=instance, cursor=None))
    said = result.skip_reason.skip_message
    assert "solo: [pipeline].sensor_interval_s = 5 is shorter than the sensor's tick of 30s" in said
    assert "reloaded" in said
    # A reload (a new sensor definition) ticks at 5 s.
    assert build_turn_watermark_sensor([MEMORY]).minimum_interval_seconds == 4
