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
  (Dagster's SQLite engine factory, so the kept engines behave as its own);
* the run launcher: `LaunchRunContext` (what `launch_run` receives), `CheckRunHealthResult` and
  `WorkerStatus` (what run monitoring expects back), `ConfigurableClassData` (how the instance
  hands a launcher its config);
* the run worker: `InstanceRef` (the serialized instance a forked run opens),
  `preload_run_execution` (the modules a run executes with, imported before the fork) and
  `execute_run` (the body of `dagster api execute_run`).

Everything else in `familiar_pipeline` uses the public `dagster` API (`serialize_value`,
`deserialize_value`, `DagsterInstance`, `DefaultRunLauncher` are public);
`tests/test_architecture.py` checks that only this module imports `dagster._` and that only the
instance's pieces import it. On a Dagster upgrade, this file is the list to check.
"""

from __future__ import annotations

from dagster import deserialize_value
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from dagster._core.storage.sql import create_engine
from dagster._serdes import ConfigurableClassData

__all__ = [
    "INDEX_SHARD_NAME", "SQLITE_BUSY_TIMEOUT_SECONDS", "CheckRunHealthResult", "ConfigurableClassData", "InstanceRef",
    "LaunchRunContext", "SqliteEventLogStorage", "WorkerStatus", "create_engine", "execute_run", "preload_run_execution",
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
