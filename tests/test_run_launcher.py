"""The preloaded run launcher: runs forked from one process that imported everything once.

Through a real code server (the daemon's workspace) and a real instance: a run
launched twice is forked twice from the same preloaded process, with litellm already
imported; terminate cancels a running run; run monitoring sees a killed worker; a
run whose code needs another Python starts the stock way.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import dagster as dg
import pytest

from dagster._core.launcher import WorkerStatus
from dagster._core.storage.dagster_run import FINISHED_STATUSES
from dagster._core.test_utils import create_run_for_test, create_test_daemon_workspace_context
from dagster._core.workspace.load_target import ModuleTarget

from familiar_pipeline.run_launcher import PID_TAG, PreloadedRunLauncher, forkable, worker_alive
from familiar_pipeline import run_worker

LAUNCHER = {"module": "familiar_pipeline.run_launcher", "class": "PreloadedRunLauncher"}


@pytest.fixture
def launched(tmp_path, monkeypatch, request):
    """An instance with the preloaded launcher, its workspace, and a function that launches a job's run."""
    monkeypatch.setenv("LAUNCHER_TEST_DIR", str(tmp_path))
    (tmp_path / "home").mkdir()
    launcher = {**LAUNCHER, "config": getattr(request, "param", {})}
    overrides = {"run_launcher": launcher,
                 "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}
    target = ModuleTarget(module_name="tests.launcher_defs", attribute=None, working_directory=os.getcwd(),
                          location_name="launcher_test")
    with dg.instance_for_test(temp_dir=str(tmp_path / "home"), overrides=overrides) as instance, \
            create_test_daemon_workspace_context(target, instance) as workspace:

        def launch(job_name: str):
            context = workspace.create_request_context()
            [repo] = context.get_code_location("launcher_test").get_repositories().values()
            job = repo.get_full_job(job_name)
            run = create_run_for_test(instance, job_name=job_name, remote_job_origin=job.get_remote_origin(),
                                      job_code_origin=job.get_python_origin(), job_snapshot=job.job_snapshot)
            instance.launch_run(run.run_id, context)
            return run.run_id

        yield instance, launch
        instance.run_launcher.dispose()


def wait_for(instance, run_id: str, statuses, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run.status in statuses:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still {instance.get_run_by_id(run_id).status} after {timeout_s} s")


def test_runs_are_forked_from_one_preloaded_process(launched, tmp_path):
    instance, launch = launched
    assert isinstance(instance.run_launcher, PreloadedRunLauncher)
    runs = [launch("quick_job") for _ in range(2)]
    for run_id in runs:
        assert wait_for(instance, run_id, FINISHED_STATUSES).status == dg.DagsterRunStatus.SUCCESS
    marks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("quick-*.json"))]
    assert len(marks) == 2
    server = instance.run_launcher._server
    assert {m["ppid"] for m in marks} == {server.pid}, "both run workers are children of the one preloaded process"
    assert {int(instance.get_run_by_id(r).tags[PID_TAG]) for r in runs} == {m["pid"] for m in marks}
    assert all(m["litellm_imported"] for m in marks), "litellm was imported before the fork, not by the run"
    events = instance.all_logs(runs[1], of_type=dg.DagsterEventType.ENGINE_EVENT)
    assert any("forked from the preloaded process" in (e.message or "") for e in events)
    assert not worker_alive(marks[0]["pid"]), "a finished run worker is reaped"


def test_terminate_cancels_a_running_run_and_monitoring_sees_a_killed_worker(launched, tmp_path):
    instance, launch = launched
    run_id = launch("slow_job")
    deadline = time.monotonic() + 120
    while not (tmp_path / "slow.json").exists():
        assert time.monotonic() < deadline, "the slow run never started"
        time.sleep(0.1)
    run = instance.get_run_by_id(run_id)
    assert instance.run_launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
    assert instance.run_launcher.terminate(run_id)
    assert wait_for(instance, run_id, [dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE]).status == \
        dg.DagsterRunStatus.CANCELED

    (tmp_path / "slow.json").unlink()
    run_id = launch("slow_job")
    while not (tmp_path / "slow.json").exists():
        assert time.monotonic() < deadline, "the second slow run never started"
        time.sleep(0.1)
    pid = int(instance.get_run_by_id(run_id).tags[PID_TAG])
    os.kill(pid, signal.SIGKILL)  # out of memory, a kill -9: no event says so
    deadline = time.monotonic() + 10
    while worker_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    health = instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run_id))
    assert health.status == WorkerStatus.FAILED and str(pid) in health.msg
    assert instance.run_launcher.terminate(run_id), "nothing left to interrupt: canceled at once"
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.CANCELED


@pytest.mark.parametrize("launched", [{"preload": ["no_such_module_here"]}], indirect=True)
def test_a_preloaded_process_that_cannot_start_leaves_the_run_to_the_stock_launcher(launched, tmp_path):
    instance, launch = launched
    run_id = launch("quick_job")
    run = wait_for(instance, run_id, FINISHED_STATUSES)
    assert run.status == dg.DagsterRunStatus.SUCCESS and PID_TAG not in run.tags
    [mark] = [json.loads(p.read_text()) for p in tmp_path.glob("quick-*.json")]
    assert not mark["litellm_imported"], "a fresh process from the code server"
    messages = [e.message or "" for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)]
    assert any("preload failed: ModuleNotFoundError" in m and "fresh process instead" in m for m in messages), messages


@pytest.mark.parametrize("launched", [{"enabled": False}], indirect=True)
def test_enabled_false_starts_every_run_the_stock_way(launched, tmp_path):
    instance, launch = launched
    run = wait_for(instance, launch("quick_job"), FINISHED_STATUSES)
    assert run.status == dg.DagsterRunStatus.SUCCESS and PID_TAG not in run.tags
    assert instance.run_launcher._server is None, "no preloaded process started"


def test_a_run_for_another_python_is_not_forked():
    class Origin:
        executable_path = "/some/other/venv/bin/python"

    assert not forkable(Origin())
    Origin.executable_path = sys.executable
    assert forkable(Origin())
    assert not forkable(None)


def test_the_preloaded_process_reports_a_failed_preload_and_exits_when_its_launcher_goes(tmp_path):
    from familiar_pipeline.run_launcher import RunWorkerServer

    with pytest.raises(RuntimeError, match="did not start: preload failed: ModuleNotFoundError"):
        RunWorkerServer(("no_such_module_here",))
    server = RunWorkerServer(("json",))
    assert server.alive
    server.close()
    assert server.process.returncode == 0


def test_preload_imports_modules_and_calls_functions(monkeypatch):
    called = []
    monkeypatch.setattr(run_worker, "preload_projection_run", lambda: called.append(True))
    run_worker.preload(["json", "familiar_pipeline.run_worker:preload_projection_run"])
    assert called == [True]
