"""The instance's event log (familiar_pipeline.event_log) as `dagster_home/dagster.yaml` configures it.

Same files and schema as Dagster's SQLite event log: a range run through it records the
same per-familiar materializations, one planned event per asset instead of one per
partition, and its kept engines stay bounded and let go of deleted runs.
"""

from __future__ import annotations

import threading

import dagster as dg
import pytest

from familiar_pipeline.defs.jobs import materialize_in_process
from familiar_pipeline.event_log import KEPT_RUN_SHARDS, FamiliarSqliteEventLogStorage
from familiar_pipeline.testing.fake_llm import fake_llm
from familiar_pipeline.testing.scripted import careful_model

from .helpers import append_chat, make_familiar, repo_instance

NAMES = ["e1", "e2", "e3"]
ASSETS = ["turns_fts", "facts"]


@pytest.fixture
def data(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    for name in NAMES:
        append_chat(make_familiar(root, name), 10)
    return root


def range_run(instance, root) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions("familiars", NAMES)
    with fake_llm(careful_model):
        return materialize_in_process(ASSETS, instance=instance, data_root=root, tags={
            "dagster/asset_partition_range_start": NAMES[0], "dagster/asset_partition_range_end": NAMES[-1]})


def planned(instance, run_id: str) -> list:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED).records
    return [r.event_log_entry.dagster_event.event_specific_data for r in records]


def test_the_repository_instance_uses_it_in_dagsters_default_place(tmp_path, monkeypatch):
    with repo_instance(tmp_path / "home", monkeypatch) as instance:
        storage = instance.event_log_storage
        assert isinstance(storage, FamiliarSqliteEventLogStorage)
        assert storage._base_dir == str(tmp_path / "home" / "history" / "runs")
        with storage.index_connection() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1, "NORMAL"


def test_a_range_run_records_each_familiar_and_one_planned_event_per_asset(tmp_path, monkeypatch, data):
    with repo_instance(tmp_path / "home", monkeypatch) as instance:
        result = range_run(instance, data)
        assert result.success
        events = planned(instance, result.run_id)
        assert sorted(e.asset_key.path[-1] for e in events) == sorted(ASSETS)
        assert all(sorted(e.partitions_subset.get_partition_keys()) == NAMES for e in events)
        for name in NAMES:
            [record] = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("facts"), asset_partitions=[name]), limit=5).records
            assert record.asset_materialization.metadata["status"].value == "ok"
        assert instance.get_materialized_partitions(dg.AssetKey("facts")) == set(NAMES)


def test_the_stock_event_log_plans_one_event_per_familiar_and_asset(data):
    with dg.instance_for_test() as instance:
        result = range_run(instance, data)
        assert len(planned(instance, result.run_id)) == len(ASSETS) * len(NAMES)


def check_rows(instance) -> list[tuple]:
    """Each check execution of the index, as the UI reads it, with what its ids point at."""
    storage = instance.event_log_storage
    with storage.index_connection() as conn:
        rows = conn.exec_driver_sql(
            "SELECT c.asset_key, c.check_name, c.partition, c.execution_status, c.evaluation_event,"
            " e.dagster_event_type, m.partition FROM asset_check_executions c"
            " JOIN event_logs e ON e.id = c.evaluation_event_storage_id"
            " LEFT JOIN event_logs m ON m.id = c.materialization_event_storage_id").fetchall()
    out = []
    for asset_key, check_name, partition, status, event, event_type, target_partition in rows:
        evaluation = dg.deserialize_value(event, dg.EventLogEntry).dagster_event.event_specific_data
        assert (evaluation.check_name, evaluation.partition, evaluation.passed) == (
            check_name, partition, status == "SUCCEEDED")
        out.append((asset_key, check_name, partition, status, event_type, target_partition))
    return sorted(out, key=repr)


def test_check_evaluations_are_stored_as_dagsters_own_event_log_stores_them(tmp_path, monkeypatch, data):
    with dg.instance_for_test() as stock:
        expected = check_rows(stock) if range_run(stock, data).success else None
    with repo_instance(tmp_path / "home", monkeypatch) as instance:
        assert range_run(instance, data).success
        got = check_rows(instance)
    assert got == expected
    per_familiar = [row for row in got if row[2] is not None]
    assert {row[2] for row in per_familiar} == set(NAMES), "one evaluation per familiar, on its own partition"
    assert all(row[4] == "ASSET_CHECK_EVALUATION" and row[5] == row[2] for row in per_familiar), \
        "each points at its evaluation event and its own partition's materialization"


def test_kept_engines_stay_bounded_and_let_go_of_deleted_runs(tmp_path):
    storage = FamiliarSqliteEventLogStorage(str(tmp_path / "runs"))
    runs = [f"run{i:02d}" for i in range(KEPT_RUN_SHARDS + 4)]
    for run_id in runs:
        storage.store_event(dg.EventLogEntry(error_info=None, level="INFO", user_message=run_id, run_id=run_id,
                                             timestamp=1.0, dagster_event=None))
    assert len(storage._engines) <= KEPT_RUN_SHARDS + 1, "the index and the latest runs"
    assert [e.user_message for e in storage.get_logs_for_run(runs[0])] == [runs[0]], "a disposed engine reopens"
    storage.delete_events(runs[-1])
    assert runs[-1] not in storage._engines
    assert storage.get_logs_for_run(runs[-1]) == []

    seen = []
    reader = threading.Thread(target=lambda: seen.extend(storage.get_logs_for_run(runs[1])))
    reader.start()
    reader.join()
    assert [e.user_message for e in seen] == [runs[1]], "readable from another thread (the event log watcher's)"
    storage.wipe()
    assert storage.get_logs_for_run(runs[1]) == []
    storage.dispose()


def test_without_base_dir_or_dagster_home_it_says_which_it_needs(monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(ValueError, match="needs base_dir or DAGSTER_HOME"):
        FamiliarSqliteEventLogStorage()
