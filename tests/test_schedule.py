"""The scheduling decisions, called directly: no Dagster run, no instance, no model.

`familiar_pipeline.engine.schedule` decides the projection step's work order (passes,
a busy familiar requeued, blocked followers, yielding to a waiting run) and the turn
sensor's due assets and runs; `tests/test_multi_familiar_runs.py` and `tests/test_sensor.py`
check the same through Dagster.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from familiar_pipeline.config import load_config
from familiar_pipeline.engine.schedule import (
    MIN_FAMILIARS_PER_LANE, TOLD_NO_MODEL, FamiliarState, InFlightRun, QueueWatch, Visit, WorkOrder, blocks,
    config_fingerprint, due_assets, held_for_no_model, hold_followers, passes, plan_tick, read_state, split_lanes,
)
from familiar_pipeline.projectors import builtin
from familiar_pipeline.storage.turns import TurnLog

from .helpers import append_chat, make_familiar

SPECS = list(builtin.BUILTIN_SPECS)
ASSETS = [s.asset for s in SPECS]
FACT_DRIVEN = ["fact_supersessions", "people_dossiers", "reflections"]  # the active ones by default
MARKS_AT = {"rich_note": 0, "rolling_summary": 0}  # turn watermarks; the index is given on its own


def spec(asset: str):
    return next(s for s in SPECS if s.asset == asset)


def walk(order: WorkOrder, react=lambda order, visit: None) -> list[Visit]:
    """Every visit of the order, `react` standing in for the step; each published unless it was requeued."""
    seen = []
    for visit in order:
        seen.append(visit)
        if react(order, visit) != "requeued":
            order.done(visit, published=True)
    return seen


def trace(order: WorkOrder, react=lambda order, visit: None) -> list[tuple[str, int, float]]:
    """(familiar, pass, lock wait) of each visit."""
    return [(v.familiar_id, v.step, v.lock_wait_s) for v in walk(order, react)]


# --- the step's work order ---------------------------------------------------------------


def test_the_scheduling_module_loads_without_dagster():
    code = "import sys, familiar_pipeline.engine.schedule; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_passes_split_the_facts_and_what_they_read_from_the_rest():
    first, rest = passes(SPECS)
    assert [s.asset for s in first] == ["facts"]
    assert [s.asset for s in rest] == [a for a in ASSETS if a != "facts"], "each pass keeps the dependency order"
    followers = [spec(a) for a in FACT_DRIVEN]
    assert passes(followers) == [followers], "no facts selected: one pass"
    assert passes([spec("facts")]) == [[spec("facts")]], "an empty pass is left out"
    reading_the_index = dataclasses.replace(spec("facts"), inputs=("turns", "turns_fts"))
    first, rest = passes([spec("turns_fts"), spec("rolling_summary"), reading_the_index, spec("reflections")])
    assert [s.asset for s in first] == ["turns_fts", "facts"], "what the facts read goes first too"
    assert [s.asset for s in rest] == ["rolling_summary", "reflections"]


def test_one_familiar_is_one_pass_and_several_are_two():
    assert WorkOrder(SPECS, ["a"]).steps == [SPECS]
    assert trace(WorkOrder(SPECS, ["a"])) == [("a", 0, 0.0)]
    assert trace(WorkOrder(SPECS, ["a", "b"])) == [("a", 0, 0.0), ("b", 0, 0.0), ("a", 1, 0.0), ("b", 1, 0.0)]


def test_a_visit_runs_what_the_plan_has_for_its_familiar_and_names_its_later_passes():
    planned = {"facts": {"a", "b"}, "reflections": {"a"}}
    order = WorkOrder(SPECS, ["a", "b"], planned=lambda asset, f: f in planned.get(asset, ()))
    visits = {(v.familiar_id, v.step): v for v in walk(order)}
    assert [s.asset for s in visits["a", 0].specs] == ["facts"] and visits["a", 0].later == ("reflections",)
    assert visits["b", 0].later == () and visits["b", 1].specs == []
    assert [s.asset for s in visits["a", 1].specs] == ["reflections"]


def test_a_busy_familiar_goes_to_the_end_of_the_queue_once_then_waits_there():
    def a_is_busy(order: WorkOrder, visit: Visit):
        if visit.familiar_id == "a" and visit.step == 0 and order.busy(visit):
            return "requeued"
        return None

    seen = trace(WorkOrder(SPECS, ["a", "b", "c"], busy_wait_s=60.0), a_is_busy)
    assert seen == [("a", 0, 0.0), ("b", 0, 0.0), ("c", 0, 0.0), ("a", 0, 60.0),
                    ("b", 1, 0.0), ("c", 1, 0.0), ("a", 1, 0.0)], "the others first; a's rest after its facts"


def test_a_familiar_still_busy_after_its_wait_is_not_requeued_and_its_later_passes_are_held():
    order = WorkOrder(SPECS, ["a", "b"], busy_wait_s=5.0)
    held = {}
    for visit in order:
        if visit.familiar_id == "a" and visit.step == 0:
            if order.busy(visit):
                continue
            order.not_opened(visit, TimeoutError("still held"))  # what the step reports failed
        if visit.step == 1:
            held[visit.familiar_id] = dict(visit.blocked)
        order.done(visit, published=False)
    assert held["b"] == {}
    assert set(held["a"]) == set(ASSETS) - {"facts"}
    assert set(held["a"].values()) == {"blocked: familiar not opened (TimeoutError)"}


def test_blocked_followers_are_held_for_that_familiar_only_across_its_passes():
    order = WorkOrder(SPECS, ["a", "b"])
    second_pass = {}
    for visit in order:
        if visit.step == 0 and visit.familiar_id == "a":  # a's facts projector raised
            hold_followers(visit.blocked, spec("facts"), "blocked: facts failed for this familiar (ValueError)")
            hold_followers(visit.blocked, spec("fact_supersessions"), "a later reason")
        if visit.step == 1:
            second_pass[visit.familiar_id] = [s.asset for s in visit.specs if s.asset not in visit.blocked]
        order.done(visit, published=True)
    assert order.blocked["a"] == {a: "blocked: facts failed for this familiar (ValueError)"
                                  for a in ("fact_embeddings", *FACT_DRIVEN)}, "the first reason stays"
    # standing wishes read the facts softly: a's heuristic wishes still run while its facts fail
    assert second_pass["a"] == ["turns_fts", "rolling_summary", "wishes", "turn_embeddings", "turn_window_embeddings",
                                "turn_passage_embeddings"]
    assert second_pass["b"] == [a for a in ASSETS if a != "facts"]


def test_while_a_run_waits_only_familiars_published_in_the_first_pass_leave_their_rest():
    asked = []

    def waiting() -> bool:
        asked.append(True)
        return True

    order = WorkOrder(SPECS, ["a", "b", "c"], run_waiting=waiting)
    seen = []
    for visit in order:
        seen.append((visit.familiar_id, visit.step))
        order.done(visit, published=visit.familiar_id != "b")  # b's first pass wrote nothing
    assert seen == [("a", 0), ("b", 0), ("c", 0), ("b", 1)], "b's manifest is unchanged: the sensor would not ask"
    assert order.left == ["a", "c"]
    assert len(asked) == 2, "asked only for a published familiar's later pass"


def test_no_run_waiting_or_a_rebuild_takes_every_pass():
    for run_waiting in (lambda: False, None):
        order = WorkOrder(SPECS, ["a", "b"], run_waiting=run_waiting)
        assert [v.step for v in walk(order)] == [0, 0, 1, 1]
        assert order.left == []


def test_the_queue_is_asked_at_most_once_a_second_and_a_waiting_run_stays_seen():
    now, answers = [0.0], [False, True, False]
    watch = QueueWatch(lambda: answers.pop(0), clock=lambda: now[0])
    assert watch.run_waiting() is False
    now[0] = 0.5
    assert watch.run_waiting() is False and answers == [True, False], "not asked again within a second"
    now[0] = 1.5
    assert watch.run_waiting() is True
    now[0] = 9.0
    assert watch.run_waiting() is True and answers == [False], "sticky once seen"


# --- the sensor's due assets -------------------------------------------------------------


@pytest.fixture
def config(tmp_path):
    make_familiar(tmp_path, "f")  # the tests' cadence: a batch and a summary per 10 turns
    return load_config("f", root=tmp_path)


def state(latest: int, *, marks: dict | None = None, index_at: int | None = None, age_s: float = 10**6,
          closed: tuple[str, ...] = (), pending: tuple[str, ...] = ()) -> FamiliarState:
    watermarks = {name: {"turn_id": at} for name, at in {**MARKS_AT, **(marks or {})}.items()}
    watermarks["turns_fts"] = {"turn_id": latest if index_at is None else index_at, "change_seq": 0}
    return FamiliarState(latest_turn_id=latest, latest_change_seq=0, latest_turn_age_s=age_s, snapshot_version=1,
                         watermarks=watermarks, closed=closed, pending=pending)


def test_a_full_batch_is_due_with_the_fact_driven_followers_and_the_index(config):
    assert due_assets(config, state(9)) == []
    assert due_assets(config, state(10, marks={"rolling_summary": 10})) == ["facts", *FACT_DRIVEN]
    assert due_assets(config, state(10, index_at=0)) == ["turns_fts", "wishes", "rolling_summary", "facts", *FACT_DRIVEN]


def test_only_the_summary_due_does_not_drag_the_followers(config):
    assert due_assets(config, state(10, marks={"rich_note": 5}, index_at=0)) == ["turns_fts", "wishes", "rolling_summary"]


def test_a_batch_a_quiet_gap_closed_is_due_short_of_its_size(config):
    assert due_assets(config, state(3, marks={"rolling_summary": 3})) == []
    assert due_assets(config, state(3, marks={"rolling_summary": 3}, closed=("rich_note",))) == ["facts", *FACT_DRIVEN]


def test_read_state_sees_a_short_batch_closed_by_a_quiet_gap(tmp_path, config):
    paths = make_familiar(tmp_path, "quiet")
    append_chat(paths, 3)  # stamped months ago, but the log was written just now (an import, say): still open
    assert read_state(paths, config).closed == ()
    with TurnLog(paths.turns_db) as log:  # a turn months later: the gap before it closes 1-3
        log.append_turn(channel_id=10, role="user", author_key="discord:1", content="back again",
                        created_at=datetime.now(timezone.utc) - timedelta(seconds=5))
    state = read_state(paths, config)
    assert state.closed == ("rich_note",) and state.latest_turn_id == 4 and 5 <= state.latest_turn_age_s < 60
    assert read_state(paths).closed == (), "without a config: not looked for"


def test_the_index_alone_waits_for_index_quiet_s(config):
    assert config.pipeline.index_quiet_s == 30
    assert due_assets(config, state(3, index_at=0, age_s=5, marks={"rolling_summary": 3})) == []
    assert due_assets(config, state(3, index_at=0, age_s=30, marks={"rolling_summary": 3})) == ["turns_fts", "wishes"]
    edited = FamiliarState(3, 2, 5.0, 1, {"turns_fts": {"turn_id": 3, "change_seq": 1}})
    assert due_assets(config, edited) == [], "an edit is index work too, and waits the same"


def test_an_edit_or_deletion_of_a_turn_already_read_makes_its_readers_due_at_once(tmp_path, config):
    """Facts and the summary follow changes (`follows_changes`): a change to a turn they read is due
    now, without new turns or a quiet wait; one to a turn they have not read yet waits for its batch."""
    from familiar_pipeline.engine.registry import specs
    from familiar_pipeline.erasure.due import changed_read

    paths = make_familiar(tmp_path, "changed")
    append_chat(paths, 25)
    marks = {"rich_note": {"turn_id": 20, "change_seq": 0}, "rolling_summary": {"turn_id": 20, "change_seq": 0}}
    with TurnLog(paths.turns_db) as log:
        log.record_deletion(turn_id=23)  # not read yet by either
        assert list(changed_read(specs(), log, marks, log.latest_change_seq())) == []
        log.record_edit(turn_id=7, new_content="said differently now")
        assert list(changed_read(specs(), log, marks, log.latest_change_seq())) == ["rolling_summary", "rich_note"]
        followed = {**marks, "rich_note": {"turn_id": 20, "change_seq": 2}}
        assert list(changed_read(specs(), log, followed, log.latest_change_seq())) == ["rolling_summary"]
    changed = dataclasses.replace(state(25, marks={"rich_note": 20, "rolling_summary": 20}), changed=("rich_note",))
    assert due_assets(config, changed)[:1] == ["facts"] and "people_dossiers" in due_assets(config, changed)


def test_what_a_run_left_pending_is_due_if_active_and_not_held(config):
    left = state(10, marks={"rich_note": 10, "rolling_summary": 10},
                 pending=("fact_supersessions", "reflections", "fact_embeddings", "no_such_asset"))
    assert due_assets(config, left) == ["fact_supersessions", "reflections"], "fact_embedding is opt-in: off"
    assert due_assets(config, left, hold=frozenset({"reflections"})) == ["fact_supersessions"]
    fresh_batch = state(20, marks={"rich_note": 10, "rolling_summary": 20}, pending=("fact_supersessions",))
    assert due_assets(config, fresh_batch) == ["facts", *FACT_DRIVEN], "listed once"


def test_model_assets_are_held_once_told_there_is_no_model_until_the_config_changes(tmp_path, monkeypatch):
    make_familiar(tmp_path, "bare", "")
    bare = load_config("bare", root=tmp_path)
    model_assets = frozenset({"facts", "rolling_summary", *FACT_DRIVEN})
    assert held_for_no_model(bare, {}, "bare", model_assets) == frozenset(), "the first run says why it skips"
    told = {"bare": config_fingerprint(bare)}
    assert held_for_no_model(bare, told, "bare", model_assets) == model_assets
    assert due_assets(bare, state(10, index_at=0), hold=model_assets) == ["turns_fts", "wishes"]
    monkeypatch.setenv("FAMILIAR__PIPELINE__INDEX_QUIET_S", "7")
    assert held_for_no_model(load_config("bare", root=tmp_path), told, "bare", model_assets) == frozenset()
    make_familiar(tmp_path, "model")
    with_model = load_config("model", root=tmp_path)
    assert held_for_no_model(with_model, {"model": config_fingerprint(with_model)}, "model", model_assets) == frozenset()


def test_a_running_run_is_followed_up_only_for_a_whole_new_batch(config):
    running = InFlightRun(waiting=False, dispatched_turn_id=10)
    assert not running.leaves_a_full_batch(config, state(19))
    assert running.leaves_a_full_batch(config, state(20))
    assert not InFlightRun(waiting=True, dispatched_turn_id=10).leaves_a_full_batch(config, state(20))
    assert not InFlightRun(waiting=False, dispatched_turn_id=None).leaves_a_full_batch(config, state(20))


# --- cutting the due familiars into runs ------------------------------------------------


def test_blocks_cut_where_due_familiars_lie_far_apart():
    position = {f"f{i}": i for i in range(100)}
    assert blocks(["f0", "f3", "f50", "f52"], position, max_gap=20) == [["f0", "f3"], ["f50", "f52"]]
    assert blocks(["f0", "f21"], position, max_gap=20) == [["f0", "f21"]], "20 between: one run"
    assert blocks(["f0", "f22"], position, max_gap=20) == [["f0"], ["f22"]]
    assert blocks(["f0", "f99"], position, max_gap=None) == [["f0", "f99"]]


def test_lanes_split_one_run_into_near_equal_parts_of_enough_familiars():
    due = [f"f{i:02d}" for i in range(2 * MIN_FAMILIARS_PER_LANE + 1)]
    parts = split_lanes([due], lanes=2)
    assert [len(p) for p in parts] == [MIN_FAMILIARS_PER_LANE + 1, MIN_FAMILIARS_PER_LANE]
    assert sum(parts, []) == due, "partition order kept"
    assert split_lanes([due], lanes=4) == parts, "each lane keeps at least MIN_FAMILIARS_PER_LANE"
    assert split_lanes([due[:MIN_FAMILIARS_PER_LANE + 3]], lanes=2) == [due[:MIN_FAMILIARS_PER_LANE + 3]]
    assert split_lanes([due[:3], due[5:7]], lanes=2) == [due[:3], due[5:7]], "runs already cut stay as they are"


def test_a_tick_plans_the_due_familiars_into_lanes_and_waits_while_a_run_is_queued(tmp_path):
    names = [f"f{i:02d}" for i in range(2 * MIN_FAMILIARS_PER_LANE)] + ["idle"]
    for name in names:
        append_chat(make_familiar(tmp_path, name), 0 if name == "idle" else 10)
    plan = plan_tick({}, names, [], root=tmp_path, in_flight={}, max_requests=100, lanes=2)
    assert plan.new_partitions == names
    assert [list(run) for run in plan.runs] == [names[:MIN_FAMILIARS_PER_LANE], names[MIN_FAMILIARS_PER_LANE:-1]]
    assert plan.runs[0]["f00"] == ["turns_fts", "wishes", "rolling_summary", "facts", *FACT_DRIVEN]
    assert plan.cursor["f00"] == plan.states["f00"].signature()
    again = plan_tick(plan.cursor, names, names, root=tmp_path, in_flight={}, max_requests=100, lanes=2)
    assert again.runs == [], "nothing new since the cursor"

    held = plan_tick({}, names, names, root=tmp_path, in_flight={}, max_requests=100, lanes=2, queue_waiting=True)
    assert held.runs == [] and "f00" not in held.cursor, "looked at again next tick"
    busy = plan_tick({}, names, names, root=tmp_path, in_flight={"f00": InFlightRun(True, None)}, max_requests=3)
    assert [list(run) for run in busy.runs] == [["f01", "f02", "f03"]], "one in flight, then the flood guard"
    assert any("flood guard" in note for note in busy.notes)


def test_a_tick_remembers_who_was_told_there_is_no_model(tmp_path):
    paths = make_familiar(tmp_path, "bare", "")
    append_chat(paths, 10)
    model_assets = frozenset(s.asset for s in SPECS if s.needs_llm)
    first = plan_tick({}, ["bare"], ["bare"], root=tmp_path, in_flight={}, max_requests=5, model_assets=model_assets)
    assert "facts" in first.runs[0]["bare"]
    assert json.loads(json.dumps(first.cursor))[TOLD_NO_MODEL] == {"bare": config_fingerprint(load_config("bare", root=tmp_path))}
    append_chat(paths, 10, start=10)
    second = plan_tick(first.cursor, ["bare"], ["bare"], root=tmp_path, in_flight={}, max_requests=5,
                       model_assets=model_assets)
    assert second.runs == [{"bare": ["turns_fts", "wishes"]}], "the model assets would only say 'skipped' again"


def test_a_familiar_gathered_for_a_waiting_queue_is_looked_at_again_at_the_next_tick_whatever_its_cadence(tmp_path):
    """While a projection run waits for a lane, the due familiars wait for the next tick (their cursor
    is not advanced); one with a 30 s cadence must not then wait 30 s more for its next look."""
    from familiar_pipeline.engine.schedule import EVALUATED, cadence_due

    slow = make_familiar(tmp_path, "slow", extra_toml="[pipeline]\nsensor_interval_s = 30\n")
    append_chat(slow, 12)
    held = plan_tick({}, ["slow"], ["slow"], root=tmp_path, in_flight={}, max_requests=5, queue_waiting=True,
                     now=1000.0, tick_s=5)
    assert held.runs == [] and EVALUATED not in held.cursor
    looked = plan_tick(held.cursor, ["slow"], ["slow"], root=tmp_path, in_flight={}, max_requests=5, now=1005.0, tick_s=5)
    assert [list(run) for run in looked.runs] == [["slow"]]
    assert looked.cursor[EVALUATED] == {"slow": 1005.0}
    unchanged = plan_tick(looked.cursor, ["slow"], ["slow"], root=tmp_path, in_flight={}, max_requests=5,
                          now=1010.0, tick_s=5)
    assert unchanged.cursor[EVALUATED] == {"slow": 1005.0}, "not looked at: its 30 s have not passed"
    # The rule itself: every tick at or below the tick; else once `interval - 1 s` has passed.
    assert cadence_due(1000.0, 5, 1001.0, tick_s=5) and cadence_due(None, 30, 0.0, tick_s=5)
    assert not cadence_due(1000.0, 30, 1028.9, tick_s=5) and cadence_due(1000.0, 30, 1029.0, tick_s=5)
