"""The one adapter over Dagster's private modules: what the instance's own pieces need and Dagster does not export.

Three modules plug into the Dagster *instance* (selected in `dagster_home/dagster.yaml`), not into
its definitions API: `event_log.py` subclasses Dagster's SQLite event log storage,
`run_launcher.py` subclasses its default run launcher, and `run_worker.py` executes a run
exactly as `dagster api execute_run` does, in a forked process. Dagster documents these plugin
points (a `module`/`class` pair in `dagster.yaml`; the "Internals" API reference), but 1.13 exports
neither their base classes nor their helpers from the public `dagster` namespace, only from
`dagster._...` modules. They are imported here and nowhere else, each with what it is for:

* the event log: `SqliteEventLogStorage` (the base class), `INDEX_SHARD_NAME` and
  `SQLITE_BUSY_TIMEOUT_SECONDS` (its shard name and timeout, kept identical), `create_engine`
  (Dagster's SQLite engine factory, so the kept engines behave as its own), and the tables a
  check evaluation is written to (`SqlEventLogStorageTable`, `AssetCheckExecutionsTable`,
  `AssetCheckExecutionRecordStatus`), so it can be written in one transaction;
* the run launcher: `LaunchRunContext` (what `launch_run` receives), `CheckRunHealthResult` and
  `WorkerStatus` (what run monitoring expects back), `ConfigurableClassData` (how the instance
  hands a launcher its config);
* the run worker: `InstanceRef` (the serialized instance a forked run opens),
  `preload_run_execution` (the modules a run executes with, imported before the fork) and
  `execute_run` (the body of `dagster api execute_run`);
* the asset checks (`defs/checks.py`), which record one evaluation per familiar on its own
  partition because an `AssetCheckResult` of a run over several partitions is recorded with
  none: `AssetCheckEvaluation` and the materialization it targets (`latest_materialization_targets`),
  and each partition's previous evaluation (`previous_check_evaluations`, read from the event
  log's check-execution table, which no public call returns by partition), `carried_over`.

Everything else in `familiar_pipeline` uses the public `dagster` API (`serialize_value`,
`deserialize_value`, `DagsterInstance`, `DefaultRunLauncher` are public);
`tests/test_architecture.py` checks that only this module imports `dagster._` and that only the
instance's pieces and the asset checks import it. On a Dagster upgrade, this file is the list to check.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timezone

import dagster as dg
from dagster import AssetCheckEvaluation, deserialize_value
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable, SqlEventLogStorageTable
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from dagster._core.storage.sql import create_engine
from dagster._serdes import ConfigurableClassData

__all__ = [
    "INDEX_SHARD_NAME", "AssetCheckExecutionRecordStatus", "AssetCheckExecutionsTable",
    "SqlEventLogStorageTable", "SQLITE_BUSY_TIMEOUT_SECONDS", "AssetCheckEvaluation", "AssetCheckEvaluationTargetMaterializationData",
    "CheckRunHealthResult", "ConfigurableClassData", "InstanceRef", "LaunchRunContext", "SqliteEventLogStorage", "WorkerStatus",
    "carried_over", "create_engine", "execute_run", "latest_materialization_targets", "preload_run_execution",
    "previous_check_evaluations",
]


def preload_run_execution() -> None:
    """Import what `execute_run` runs with (its entry point, the in-process executor): once, before the run worker forks."""
    import dagster._cli.api  # noqa: F401
    import dagster._core.executor.in_process  # noqa: F401


def execute_run(run_id: str, instance_ref: str) -> int:
    """Run `run_id` as `dagster api execute_run` does, in this process; the exit code.

    `instance_ref`: the serialized `InstanceRef` of the instance the run belongs to. SIGINT
    (the launcher's terminate) interrupts the step at a safe point, as in Dagster's own worker.
    """
    from dagster._cli.api import _execute_run_command_body
    from dagster._cli.utils import get_instance_for_cli
    from dagster._utils.interrupts import capture_interrupts

    with capture_interrupts():
        with get_instance_for_cli(instance_ref=deserialize_value(instance_ref, InstanceRef)) as instance:
            return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)


# --------------------------------------------------------------------------- asset checks per partition


def latest_materialization_targets(instance: dg.DagsterInstance, asset_key: dg.AssetKey, familiars: Sequence[str]
                                   ) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """Per familiar, its partition's latest materialization of the asset (two queries for all of them).

    A check evaluation needs only the materialization's storage id, run id and time; on a SQL
    event log they are read from the index's columns, without loading and deserializing each
    materialization event (what `fetch_materializations` does: ~1 ms per familiar and asset).
    """
    storage = instance.event_log_storage
    latest = storage.get_latest_storage_id_by_partition(
        asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(familiars))
    if not latest:
        return {}
    found: dict[int, tuple[str, float]] = {}
    if hasattr(storage, "index_connection"):
        import sqlalchemy as db

        table = SqlEventLogStorageTable
        with storage.index_connection() as conn:
            rows = conn.execute(db.select(table.c.id, table.c.run_id, table.c.timestamp)
                                .where(table.c.id.in_(list(latest.values())))).fetchall()
        # the column holds the event's UTC time, naive (Dagster writes utcfromtimestamp)
        found = {i: (run_id, at.replace(tzinfo=timezone.utc).timestamp()) for i, run_id, at in rows}
    else:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=list(latest.values())), limit=len(latest)).records
        found = {r.storage_id: (r.run_id, r.timestamp) for r in records}
    return {
        familiar: AssetCheckEvaluationTargetMaterializationData(
            run_id=found[storage_id][0], storage_id=storage_id, timestamp=found[storage_id][1])
        for familiar, storage_id in latest.items() if storage_id in found
    }


def previous_check_evaluations(instance: dg.DagsterInstance, key: dg.AssetCheckKey, familiars: Sequence[str],
                               run_id: str) -> dict[str, AssetCheckEvaluation]:
    """Each familiar's newest evaluation of the check by an earlier run (one query for all of them)."""
    import sqlalchemy as db
    from dagster._core.events.log import EventLogEntry
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
    from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable as table

    storage = instance.event_log_storage
    if not familiars or not hasattr(storage, "index_connection"):  # not a SQL event log: nothing carried over
        return {}
    done = [AssetCheckExecutionRecordStatus.SUCCEEDED.value, AssetCheckExecutionRecordStatus.FAILED.value]
    newest = (
        db.select(db.func.max(table.c.id))
        .where(table.c.asset_key == key.asset_key.to_string(), table.c.check_name == key.name,
               table.c.partition.in_(list(familiars)), table.c.run_id != run_id, table.c.execution_status.in_(done))
        .group_by(table.c.partition)
    )
    with storage.index_connection() as conn:
        rows = conn.execute(db.select(table.c.partition, table.c.evaluation_event).where(table.c.id.in_(newest))).fetchall()
    found = {}
    for partition, event in rows:
        dagster_event = deserialize_value(event, EventLogEntry).dagster_event
        evaluation = dagster_event.event_specific_data if dagster_event is not None else None
        if isinstance(evaluation, AssetCheckEvaluation):
            found[partition] = evaluation
    return found


def carried_over(previous: AssetCheckEvaluation, note: str) -> AssetCheckEvaluation:
    """An earlier evaluation recorded again for a run that did not check again; it holds nothing back now."""
    from dagster_shared.record import copy as copy_record

    return copy_record(previous, metadata={**previous.metadata, "carried_over": dg.MetadataValue.text(note)},
                       blocking=False)
