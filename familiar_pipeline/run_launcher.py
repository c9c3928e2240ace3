"""A Dagster run launcher that starts each run as a fork of a preloaded process.

Dagster's `DefaultRunLauncher` asks the code server to spawn a fresh Python process
per run, which imports Dagster, the code location and (at its first model call)
litellm: about 6-8 CPU-seconds here before the run does any work, paid by every run.
`PreloadedRunLauncher` keeps one process per code location server that has imported
all of that (`familiar_pipeline.run_worker`), and forks it for each run. The child runs
the same code as `dagster api execute_run`, so a run's events, logs, status, UI and
retries are unchanged; only its start is cheaper. The daemon's queue still decides
what runs when (this is a launcher, not a scheduler).

Selected in `dagster_home/dagster.yaml`:

    run_launcher:
      module: familiar_pipeline.run_launcher
      class: PreloadedRunLauncher

It falls back to the stock launcher (a fresh process from the code server) for a run
whose code location uses another Python executable, and whenever the preloaded
process cannot start. It restarts that process when the code location's server changes
(a "Reload" in the UI starts a new code server, so new runs get the new code).
Terminating a run sends its worker SIGINT, which Dagster turns into an interrupted
(canceled) run, as the stock launcher's cancel request does. Run monitoring asks
`check_run_worker_health`: a worker whose process is gone while its run is still
STARTED (killed, out of memory) is reported failed.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Mapping, NamedTuple

from dagster import DefaultRunLauncher, serialize_value

from familiar_pipeline.dagster_internals import CheckRunHealthResult, ConfigurableClassData, LaunchRunContext, WorkerStatus

log = logging.getLogger(__name__)

# The run tag with the forked worker's pid (terminate and health checks read it).
PID_TAG = "familiar/run_worker_pid"

# What the preloaded process imports by default (module, or module:function to call).
DEFAULT_PRELOAD = ("familiar_pipeline.run_worker:preload_projection_run",)

# How long the first start may take to import everything, and a fork to be answered.
READY_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 30.0


class CodeLocationKey(NamedTuple):
    """What a preloaded process was started for; a run with another key gets a new one."""

    pointer: str  # the code pointer, as text
    cwd: str | None  # its working directory
    server_id: str | None  # the code server's id: a reload in the UI changes it
    module: str | None  # the module to import before the first fork (a module code pointer)


class RunWorkerServer:
    """The preloaded process: started once, asked for one fork per run (see `familiar_pipeline.run_worker`)."""

    def __init__(self, preload: tuple[str, ...], *, cwd: str | None = None, instance_ref: str | None = None):
        args = [sys.executable, "-m", "familiar_pipeline.run_worker"]
        for entry in preload:
            args += ["--preload", entry]
        if instance_ref:
            args += ["--instance-ref", instance_ref]
        # stderr is the daemon's: a run worker's own output shows where the stock one's did.
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=cwd)
        hello = self._read(READY_TIMEOUT_S)
        if not hello.get("ready"):
            self.close()
            raise RuntimeError(f"the preloaded run worker did not start: {hello.get('error', hello)}")
        self.pid = int(hello["pid"])

    def fork_run(self, run_id: str, instance_ref: str) -> int:
        """The pid of a new run worker running `run_id`."""
        request = json.dumps({"run_id": run_id, "instance_ref": instance_ref}) + "\n"
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(request.encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise RuntimeError(f"the preloaded run worker is gone (exit {self.process.poll()})") from exc
        reply = self._read(REPLY_TIMEOUT_S)
        if "pid" not in reply:
            raise RuntimeError(f"the preloaded run worker could not start the run: {reply.get('error', reply)}")
        return int(reply["pid"])

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _read(self, timeout_s: float) -> dict:
        out = self.process.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout_s)
        line = out.readline() if ready else b""
        if not line:
            code = self.process.poll()
            raise RuntimeError(
                "the preloaded run worker " + (f"exited (code {code})" if code is not None else
                                               f"did not answer within {timeout_s:g} s")
                + "; its error is in the daemon's output"
            )
        return json.loads(line)

    def close(self) -> None:
        """Close its stdin: it exits; the run workers it forked finish their runs."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def forkable(job_code_origin: Any) -> bool:
    """Whether a run's code can run in a fork of this interpreter: same Python executable, a fork-capable OS."""
    return (
        job_code_origin is not None
        and hasattr(os, "fork")
        and job_code_origin.executable_path == sys.executable
    )


def worker_alive(pid: int) -> bool:
    """Whether `pid` is a live run worker forked by a preloaded process (not a zombie, not a reused pid)."""
    if not os.path.isdir("/proc"):  # no procfs (macOS): a signal-0 probe
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: the pid was reused
            return False
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X") and b"familiar_pipeline.run_worker" in cmdline


class PreloadedRunLauncher(DefaultRunLauncher):
    """Launches each run as a fork of a process that already imported the code location and litellm.

    Config (all optional): `preload`, a list of modules to import or `module:function` to
    call in the preloaded process (default: what a projection run needs); `enabled: false`
    launches every run the stock way.
    """

    def __init__(self, inst_data: ConfigurableClassData | None = None, preload: list[str] | None = None,
                 enabled: bool = True):
        super().__init__(inst_data=inst_data)
        self.preload = tuple(preload) if preload is not None else DEFAULT_PRELOAD
        self.enabled = enabled
        self._server: RunWorkerServer | None = None
        self._server_key: CodeLocationKey | None = None
        self._lock = threading.Lock()

    @classmethod
    def config_type(cls):
        from dagster import Array, Field

        return {
            "preload": Field(Array(str), is_required=False,
                             description="Modules to import (or module:function to call) before forking runs."),
            "enabled": Field(bool, is_required=False, default_value=True,
                             description="false: every run starts as a fresh process from the code server."),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        return cls(inst_data=inst_data, preload=config_value.get("preload"),
                   enabled=config_value.get("enabled", True))

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if not (self.enabled and forkable(origin)):
            return super().launch_run(context)
        started = time.perf_counter()
        try:
            pid, server_pid = self._fork(run.run_id, self._location_key(context, origin))
        except (RuntimeError, OSError, ValueError) as exc:  # it cannot start or answer: the stock way, said once
            self._instance.report_engine_event(f"{exc}; starting the run as a fresh process instead", run,
                                               cls=self.__class__)
            return super().launch_run(context)
        self._run_ids.add(run.run_id)
        self._instance.add_run_tags(run.run_id, {PID_TAG: str(pid)})
        self._instance.report_engine_event(
            f"Run worker pid {pid} forked from the preloaded process (pid {server_pid}) "
            f"in {time.perf_counter() - started:.2f} s", run, cls=self.__class__)

    def _location_key(self, context: LaunchRunContext, origin) -> CodeLocationKey:
        """What the preloaded process must match: the code pointer, its cwd, and the code server's id."""
        server_id = None
        remote = context.dagster_run.remote_job_origin
        if context.workspace is not None and remote is not None:
            try:
                location = context.workspace.get_code_location(remote.repository_origin.code_location_origin.location_name)
                server_id = getattr(location, "server_id", None)
            except Exception:  # noqa: BLE001 - no workspace entry: keep the running process
                server_id = None
        pointer = origin.repository_origin.code_pointer
        return CodeLocationKey(repr(pointer), getattr(pointer, "working_directory", None), server_id,
                               getattr(pointer, "module", None))

    def _fork(self, run_id: str, key: CodeLocationKey) -> tuple[int, int]:
        instance_ref = serialize_value(self._instance.get_ref())
        with self._lock:
            if self._server is not None and (self._server_key != key or not self._server.alive):
                self._server.close()
                self._server = None
            if self._server is None:
                modules = (key.module,) if key.module else ()
                self._server = RunWorkerServer((*modules, *self.preload), cwd=key.cwd, instance_ref=instance_ref)
                self._server_key = key
            try:
                return self._server.fork_run(run_id, instance_ref), self._server.pid
            except (RuntimeError, OSError, ValueError):
                self._server.close()
                self._server = None
                raise

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or PID_TAG not in run.tags:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        pid = int(run.tags[PID_TAG])
        if not worker_alive(pid):  # nothing runs it any more: canceled now, not after a timeout
            self._instance.report_run_canceled(run, message=f"Run worker process {pid} is gone; run canceled")
            return True
        self._instance.report_run_canceling(run)
        os.kill(pid, signal.SIGINT)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run) -> CheckRunHealthResult:
        if PID_TAG not in run.tags:  # started the stock way, which has no check: not reported failed
            return CheckRunHealthResult(WorkerStatus.RUNNING, "started as a fresh process: not checked")
        pid = int(run.tags[PID_TAG])
        if worker_alive(pid):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(pid))
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker process {pid} is gone", run_worker_id=str(pid))

    def join(self, timeout: int = 30) -> None:
        """Wait for the runs this launcher started, except those whose worker is gone (nothing would end them)."""
        if self.has_instance:
            for run_id in list(self._run_ids):
                run = self._instance.get_run_by_id(run_id)
                if run is not None and PID_TAG in run.tags and not worker_alive(int(run.tags[PID_TAG])):
                    self._run_ids.discard(run_id)
        super().join(timeout)

    def dispose(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.close()
                self._server = None
