"""Fact batches that close at a quiet gap: the pure rule, the sensor's dispatch, rebuild == incremental."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import dagster as dg
import pytest

from familiar_pipeline.defs.assets import FACT_DRIVEN, MEMORY
from familiar_pipeline.defs.sensors import build_turn_watermark_sensor
from familiar_pipeline.projectors.facts.batches import CLOCK_SLACK_S, close_batch
from familiar_pipeline.storage.turns import TurnLog

from .helpers import FAKE_MODEL_TOML, LINES, PEOPLE, make_familiar
from .test_pipeline import metadata_of, projection_tables, run_assets

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def turns_at(*seconds: float) -> list:
    return [SimpleNamespace(id=i + 1, created_at=T0 + timedelta(seconds=s)) for i, s in enumerate(seconds)]


def ids(batch) -> list[int]:
    return [t.id for t in batch]


def test_batch_ends_at_batch_size_or_before_a_quiet_gap():
    steady = turns_at(*range(0, 60, 5))  # 12 turns 5 s apart
    assert ids(close_batch(steady, batch_size=10, quiet_s=30, quiet_for_s=0)) == list(range(1, 11))
    gapped = turns_at(0, 5, 10, 50, 55)  # 40 s of silence before the fourth turn
    assert ids(close_batch(gapped, batch_size=10, quiet_s=30, quiet_for_s=0)) == [1, 2, 3]
    assert ids(close_batch(gapped, batch_size=10, quiet_s=40, quiet_for_s=0)) == [1, 2, 3]  # a gap of exactly quiet_s cuts
    assert close_batch(gapped, batch_size=10, quiet_s=41, quiet_for_s=0) == []  # no gap, too few, not quiet yet
    assert ids(close_batch(gapped, batch_size=2, quiet_s=30, quiet_for_s=0)) == [1, 2]  # the size comes first


def test_the_newest_turns_close_once_the_log_has_been_quiet_long_enough():
    lone = turns_at(0)
    assert close_batch(lone, batch_size=10, quiet_s=30, quiet_for_s=29) == []
    assert close_batch(lone, batch_size=10, quiet_s=30, quiet_for_s=30 + CLOCK_SLACK_S - 0.1) == []
    assert ids(close_batch(lone, batch_size=10, quiet_s=30, quiet_for_s=30 + CLOCK_SLACK_S)) == [1]
    assert close_batch([], batch_size=10, quiet_s=30, quiet_for_s=1e9) == []
    assert close_batch(turns_at(0, 500), batch_size=10, quiet_s=0, quiet_for_s=1e9) == [], "quiet_s 0: size only"


def append_at(paths, stamps: list[datetime], *, start: int = 0) -> None:
    with TurnLog(paths.turns_db) as log:
        for i, at in enumerate(stamps, start):
            key, name = PEOPLE[i % len(PEOPLE)]
            log.upsert_participant(key, username=name.lower(), global_name=name)
            log.append_turn(channel_id=10, guild_id=1, role="user", author_key=key, author_display=name,
                            content=f"{LINES[i % len(LINES)]} (#{i})", created_at=at)


def age_log(paths, seconds: float) -> None:
    """Script the clock: the turn log was last written `seconds` ago."""
    then = time.time() - seconds
    for path in (paths.turns_db, paths.turns_db.with_name(paths.turns_db.name + "-wal")):
        if path.exists():
            os.utime(path, (then, then))


QUIET_TOML = FAKE_MODEL_TOML + "\n[providers.memory.rich_note]\nquiet_s = 100\n"


def test_sensor_dispatches_a_lone_message_once_quiet_s_has_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "alpha", QUIET_TOML)
    append_at(paths, [datetime.now(timezone.utc) - timedelta(seconds=300)])  # stamped long ago, written just now
    sensor = build_turn_watermark_sensor([MEMORY])
    with dg.instance_for_test() as instance:
        first = sensor(dg.build_sensor_context(instance=instance))
        assert [sorted(k.path[-1] for k in r.asset_selection) for r in first.run_requests] == [["turns_fts", "wishes"]]
        instance.add_dynamic_partitions("familiars", ["alpha"])
        assert sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor)).run_requests == []
        age_log(paths, 60)  # quiet for 60 s < quiet_s: still open
        assert sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor)).run_requests == []
        age_log(paths, 100 + CLOCK_SLACK_S + 1)
        quiet = sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
        assert len(quiet.run_requests) == 1
        assert "facts" in {k.path[-1] for k in quiet.run_requests[0].asset_selection}
        assert json.loads(quiet.cursor)["alpha"] != json.loads(first.cursor)["alpha"]


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def test_incremental_build_with_quiet_cuts_equals_rebuild(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path, "fam", QUIET_TOML)
    minute = timedelta(minutes=1)
    graph = ["turns_fts", "rolling_summary", "facts"]

    def facts_batches():
        return metadata_of(run_assets(tmp_path, "fam", instance, graph), "facts")["batches"]

    append_at(paths, [T0 + i * minute for i in range(3)])  # turns 1-3, then silence
    assert facts_batches() == 0, "written just now: the log is not quiet yet"
    age_log(paths, 200)
    assert facts_batches() == 1  # 1-3 closed for quiet
    later = T0 + timedelta(hours=1)
    append_at(paths, [later + i * minute for i in range(4)] + [later + timedelta(minutes=20) + i * minute for i in range(5)], start=3)
    assert facts_batches() == 1  # 4-7 closed by the 17-minute gap; 8-12 still open
    age_log(paths, 200)
    assert facts_batches() == 1  # 8-12 closed for quiet
    append_at(paths, [later + timedelta(hours=1) + i * minute for i in range(12)], start=12)
    assert facts_batches() == 1  # 13-22 full; 23-24 open (just written)
    incremental = projection_tables(paths.memory_db)
    assert ("rich_note", 22) in {(row[0], row[1]) for row in incremental["watermarks"]}
    calls = len(fake_llm.calls)
    result = run_assets(tmp_path, "fam", instance, graph, rebuild=True)
    rebuilt = metadata_of(result, "facts")
    assert rebuilt["batches"] == 4 and rebuilt["llm_calls"] == 0 and rebuilt["llm_cached_calls"] == 4
    assert len(fake_llm.calls) == calls, "the same batches, so the same prompts: every reply cached"
    assert projection_tables(paths.memory_db) == incremental


def test_dossiers_fold_at_quiet_cuts_and_every_few_full_batches_and_rebuild_agrees(tmp_path, instance, fake_llm):
    """`batches_per_fold` = 3 saves calls on steady talk, yet a pause folds what was said before it."""
    from familiar_pipeline.storage.store import ProjectionStore

    toml = QUIET_TOML + "\n[providers.memory.people_dossier]\nbatches_per_fold = 3\n"
    paths = make_familiar(tmp_path, "fam", toml)
    minute = timedelta(minutes=1)
    graph = ["turns_fts", "rolling_summary", "facts", *(k.path[-1] for k in FACT_DRIVEN if k.path[-1] != "fact_embeddings")]

    def dossier_turn() -> int:
        run_assets(tmp_path, "fam", instance, graph)
        with ProjectionStore(paths.memory_db, read_only=True) as store:
            return store.get_watermark("people_dossier").turn_id

    append_at(paths, [T0 + i * minute for i in range(3)])
    assert dossier_turn() == 0, "written just now: the log is not quiet yet"
    age_log(paths, 200)
    assert dossier_turn() == 3, "1-3 closed for quiet: a short batch folds at once"
    later = T0 + timedelta(hours=1)
    append_at(paths, [later + i * minute for i in range(30)], start=3)  # three full batches: 4-13, 14-23, 24-33
    assert dossier_turn() == 33, "the third full batch folds"
    append_at(paths, [later + timedelta(hours=1) + i * minute for i in range(12)], start=33)  # 34-43 full; 44-45 open
    assert dossier_turn() == 33, "one full batch waits for two more"
    incremental = projection_tables(paths.memory_db)
    run_assets(tmp_path, "fam", instance, graph, rebuild=True)
    assert projection_tables(paths.memory_db) == incremental
