"""The turn sensor's idle floor: a settled familiar is skipped on its files' fingerprint (issue 51).

A familiar with nothing due, now or later without a new write, is recorded in the cursor with
the fingerprint of its files; while that holds, a tick skips it with a few `stat` calls instead
of loading its config and opening its turn log. Every write a decision depends on (a turn, an
edit, an erasure, a publish, a config edit, a rebuild marker) changes the fingerprint, and
whatever the clock alone can make due (a short batch closing for quiet, the index waiting for
quiet, a purge whose retention has not passed) keeps a familiar from being settled.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import dagster as dg
import pytest

from familiar_pipeline.config import load_config
from familiar_pipeline.engine import registry, schedule
from familiar_pipeline.engine.schedule import QUIET, InFlightRun, plan_tick, read_state
from familiar_pipeline.storage import corrupt
from familiar_pipeline.storage.paths import FamiliarPaths, default_dir
from familiar_pipeline.storage.snapshots import Manifest
from familiar_pipeline.storage.turns import TurnLog

from .helpers import FAKE_MODEL_TOML, append_chat, make_familiar


def publish_marks(paths: FamiliarPaths, turn_id: int, *, version: int = 1, change_seq: int = 0, **behind: int) -> None:
    """A serving manifest saying every projector has read turns up to `turn_id` (`behind`: those that have not)."""
    marks = {spec.name: {"turn_id": behind.get(spec.name, turn_id), "change_seq": change_seq, "fact_id": 0}
             for spec in registry.specs()}
    paths.serving_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(version=version, published_at="2026-01-01T00:00:00+00:00",
                        store_watermark={"projectors": marks}, tables={})
    (paths.serving_dir / "manifest.json").write_text(json.dumps(manifest.to_json()))


def tick(cursor: dict, names: list[str], root, **kwargs) -> schedule.TickPlan:
    return plan_tick(cursor, names, names, root=root, in_flight=kwargs.pop("in_flight", {}), max_requests=50, **kwargs)


@pytest.fixture
def counted(monkeypatch):
    """How many times a tick opened each familiar (its turn log, through `read_state`)."""
    opened: list[str] = []
    real = schedule.read_state

    def counting(paths, config=None):
        opened.append(paths.familiar_id)
        return real(paths, config)

    monkeypatch.setattr(schedule, "read_state", counting)
    return opened


def settled_pair(tmp_path) -> tuple[FamiliarPaths, FamiliarPaths]:
    quiet, busy = make_familiar(tmp_path, "quiet"), make_familiar(tmp_path, "busy")
    append_chat(quiet, 10)
    append_chat(busy, 10)
    publish_marks(quiet, 10)
    return quiet, busy


def test_a_settled_familiar_is_skipped_unopened_until_a_turn_arrives(tmp_path, counted):
    quiet, _busy = settled_pair(tmp_path)
    first = tick({}, ["quiet", "busy"], tmp_path)
    assert [list(run) for run in first.runs] == [["busy"]]
    assert set(first.cursor[QUIET]) == {"quiet"}, "busy is due: not settled"
    assert read_state(quiet, load_config("quiet", root=tmp_path)).settled

    counted.clear()
    again = tick(first.cursor, ["quiet", "busy"], tmp_path)
    assert counted == ["busy"], "the settled familiar was skipped without opening its turn log"
    assert again.cursor[QUIET] == first.cursor[QUIET]

    append_chat(quiet, 10, start=10)  # a whole new batch
    counted.clear()
    woken = tick(again.cursor, ["quiet", "busy"], tmp_path)
    assert "quiet" in counted and [list(run) for run in woken.runs] == [["quiet"]]
    assert "quiet" not in woken.cursor.get(QUIET, {})


@pytest.mark.parametrize("write", ["own config", "default config", "publish", "manifest removed", "rebuild marker",
                                   "edit", "erasure"])
def test_every_write_a_decision_reads_wakes_a_settled_familiar(tmp_path, counted, write):
    quiet, _ = settled_pair(tmp_path)
    cursor = tick({}, ["quiet"], tmp_path).cursor
    assert "quiet" in cursor[QUIET]
    if write == "own config":
        quiet.character_toml.write_text(quiet.character_toml.read_text() + "\n[pipeline]\nsensor_interval_s = 6\n")
    elif write == "default config":
        shipped = default_dir(tmp_path) / "character.toml"
        (tmp_path / "_default").mkdir(exist_ok=True)
        (tmp_path / "_default" / "character.toml").write_text(shipped.read_text())
    elif write == "publish":
        publish_marks(quiet, 10, version=2, rolling_summary=5)
    elif write == "manifest removed":
        (quiet.serving_dir / "manifest.json").unlink()
    elif write == "rebuild marker":
        corrupt.marker_path(quiet).write_text(json.dumps({"reason": "test"}))
    else:
        with TurnLog(quiet.turns_db) as log:
            if write == "edit":
                log.record_edit(turn_id=3, new_content="an edited line", edited_at=datetime.now(timezone.utc))
            else:
                log.request_erasure(kind="person", target=log.turns_after(0)[0].author_key, requested_by="operator:test")
    counted.clear()
    plan = tick(cursor, ["quiet"], tmp_path)
    assert counted == ["quiet"], f"{write}: looked at again"
    if write in ("manifest removed", "rebuild marker", "edit", "erasure"):
        assert plan.runs and "quiet" not in plan.cursor.get(QUIET, {}), f"{write}: due, not settled"


def test_what_the_clock_alone_can_make_due_is_never_settled(tmp_path):
    config_of = lambda name: load_config(name, root=tmp_path)  # noqa: E731
    short = make_familiar(tmp_path, "short")  # facts close a short batch after a quiet gap
    append_chat(short, 13)
    publish_marks(short, 13, rich_note=10)
    assert not read_state(short, config_of("short")).settled

    summary = make_familiar(tmp_path, "summary")  # the summary waits for its threshold only: for new turns
    append_chat(summary, 13)
    publish_marks(summary, 13, rolling_summary=10)
    assert read_state(summary, config_of("summary")).settled

    index = make_familiar(tmp_path, "index")  # the index waits for index_quiet_s
    append_chat(index, 10)
    publish_marks(index, 10, turns_fts=8)
    assert not read_state(index, config_of("index")).settled

    kept = make_familiar(tmp_path, "kept", extra_toml=FAKE_MODEL_TOML + "\n[memory.privacy]\ndeleted_retention_hours = 24\n")
    append_chat(kept, 10)
    with TurnLog(kept.turns_db) as log:  # deleted now: its text goes in 24 h, with no write in between
        log.record_deletion(turn_id=4, deleted_at=datetime.now(timezone.utc))
        change = log.latest_change_seq()
    publish_marks(kept, 10, change_seq=change)
    state = read_state(kept, config_of("kept"))
    assert not state.purge_due and not state.settled


def test_a_familiar_with_a_run_in_flight_or_a_retry_is_not_recorded(tmp_path, counted):
    settled_pair(tmp_path)
    plan = tick({}, ["quiet"], tmp_path, in_flight={"quiet": InFlightRun(False, 10)})
    assert "quiet" not in plan.cursor.get(QUIET, {})
    recorded = tick({}, ["quiet"], tmp_path).cursor
    retrying = {**recorded, schedule.RETRIES: {"quiet": [1, 0.0]}}
    counted.clear()
    tick(retrying, ["quiet"], tmp_path)
    assert counted == ["quiet"], "a familiar waiting for a retry is looked at whatever its fingerprint"


def test_the_sensor_skips_settled_familiars_and_wakes_on_a_turn(tmp_path, monkeypatch, counted):
    """Through Dagster: the sensor's cursor carries the fingerprints from tick to tick."""
    from familiar_pipeline.defs.assets import MEMORY
    from familiar_pipeline.defs.sensors import build_turn_watermark_sensor

    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    names = [f"q{i}" for i in range(5)]
    for name in names:
        paths = make_familiar(tmp_path, name)
        append_chat(paths, 10)
        publish_marks(paths, 10)
    sensor = build_turn_watermark_sensor([MEMORY])
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", names)
        first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=None))
        assert not first.run_requests and set(json.loads(first.cursor)[QUIET]) == set(names)
        counted.clear()
        second = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=first.cursor))
        assert not second.run_requests and counted == []
        append_chat(FamiliarPaths.for_id("q3", tmp_path), 10, start=10)
        third = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=second.cursor))
        assert counted == ["q3"] and len(third.run_requests) == 1
        assert third.run_requests[0].tags["dagster/asset_partition_range_start"] == "q3"
