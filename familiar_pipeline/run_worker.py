"""The preloaded run worker: one long-lived process that imports once and forks a run worker per run.

A Dagster run worker is a fresh Python process that imports Dagster, the code
location and, when a model call is due, litellm before its first step: 6-8 CPU-seconds
on a small host, more than the work of a run over a handful of familiars. This
process pays those imports once, then forks a child per run; the child starts with
everything imported and runs exactly what `dagster api execute_run` runs
(`execute_run_in_child`), so the run's events, statuses, logs and retries are
Dagster's own.

`PreloadedRunLauncher` (`familiar_pipeline.run_launcher`) starts this process with
`python -m familiar_pipeline.run_worker` and talks to it over its stdin/stdout, one JSON
line each way:

    -> {"run_id": "...", "instance_ref": "<serialized InstanceRef>"}
    <- {"pid": 12345}               (or {"error": "..."})

Its first line says whether the preload worked: {"ready": true, "pid": N} or
{"error": "..."} (the launcher then starts the run the stock way). It exits when its
stdin closes (the launcher, or the daemon that holds it, went away); run workers it
forked keep running to their end. It forks only while it has one thread: a fork of a
threaded process can inherit a lock some other thread held.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
import traceback


def preload_projection_run() -> None:
    """What a projection run imports: the code location, Dagster's run execution, litellm (offline), DuckDB, tantivy, Parquet,
    and the run logic the projectors' specs name."""
    # lazy: the preload is the point: imported once here, before the worker forks a run per request
    from familiar_pipeline.dagster_internals import preload_run_execution

    preload_run_execution()  # the run worker's entry point and what it executes with
    import duckdb  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import tantivy  # noqa: F401

    import familiar_pipeline.definitions  # noqa: F401  # lazy: as above
    from familiar_pipeline.engine import registry  # lazy: as above
    from familiar_pipeline.models.litellm_import import import_litellm  # lazy: as above

    import_litellm()
    for spec in registry.specs():  # the run logic each spec names (its prompt, the model client), imported on first use
        try:
            spec.load_hooks()
        except (ImportError, TypeError):
            pass  # a plugin's broken name: its own run fails and says so, the others fork as usual


def preload(entries: list[str]) -> None:
    """Import each `module` or call each `module:function`."""
    for entry in entries:
        module, _, function = entry.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()


def warm_instance(instance_ref: str) -> None:
    """Open and close the instance once: its storage classes, SQLAlchemy and the schema checks get imported here."""
    from dagster import DagsterInstance, deserialize_value

    from familiar_pipeline.dagster_internals import InstanceRef  # lazy: the worker imports Dagster in its preload

    with DagsterInstance.from_ref(deserialize_value(instance_ref, InstanceRef)) as instance:
        instance.get_run_by_id("0" * 32)
    import gc

    gc.collect()  # its connections are closed before any fork


def execute_run_in_child(run_id: str, instance_ref: str) -> int:
    """In a forked child: run `run_id` as `dagster api execute_run` does; the exit code."""
    from familiar_pipeline.dagster_internals import execute_run  # lazy: imported by the preload before the fork

    return execute_run(run_id, instance_ref)


def _fork_run(request: dict, channel: int) -> int:
    """Fork a child that runs the request's run; returns its pid (in the parent)."""
    run_id, instance_ref = str(request["run_id"]), str(request["instance_ref"])
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: not the launcher's channel, its own process group's signals
        os.close(channel)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own subprocesses are waited for as usual
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = execute_run_in_child(run_id, instance_ref)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the server loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reply(channel: int, message: dict) -> None:
    os.write(channel, (json.dumps(message) + "\n").encode())


def serve(entries: list[str], instance_ref: str | None = None) -> int:
    # The protocol gets its own copy of stdout; anything printed here goes to stderr.
    channel = os.dup(1)
    os.dup2(2, 1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished run workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of `dagster dev` stops the daemon, which closes stdin
    try:
        preload(entries)
        if instance_ref:
            warm_instance(instance_ref)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which starts runs the stock way
        traceback.print_exc()
        _reply(channel, {"error": f"preload failed: {type(exc).__name__}: {exc}"})
        return 3
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        _reply(channel, {"error": f"preload started threads ({names}); a fork could inherit their locks"})
        return 3
    _reply(channel, {"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        try:
            _reply(channel, {"pid": _fork_run(json.loads(line), channel)})
        except Exception as exc:  # noqa: BLE001 - a bad request or a failed fork: say so, keep serving
            _reply(channel, {"error": f"{type(exc).__name__}: {exc}"})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preload", action="append", default=[],
                        help="a module to import or module:function to call before serving (repeatable)")
    parser.add_argument("--instance-ref", default=None,
                        help="a serialized InstanceRef to open and close once before serving (imports its storage)")
    args = parser.parse_args(argv)
    return serve(args.preload, args.instance_ref)


if __name__ == "__main__":
    sys.exit(main())
