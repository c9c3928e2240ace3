"""`familiar control-plane`: one Dagster daemon and webserver over the shared Postgres instance and every shard.

Writes, into its DAGSTER_HOME (`--home`), a `dagster.yaml` for the Postgres instance
(`familiar_pipeline.instance.control_plane`: Dagster's Postgres storage, the stock
`DefaultRunLauncher`, per-shard run lanes) and a `workspace.yaml` with one `grpc_server`
entry per `--shard NAME=HOST:PORT` (each a `familiar shard serve`), then runs Dagster's own
`dagster-webserver` and `dagster-daemon run` on them. The daemon evaluates each shard's
sensors on that shard's code server and launches each run through it, so the run executes
on the shard's host. A shard that is down is a code location in error; the others are
served as usual. The daemon (like the webserver) watches every `grpc_server` location, asking
its server id every second, and reloads the location as soon as the code server answers again.
Run monitoring fails a run still going after `--max-run-seconds` (default 3600): with
`DefaultRunLauncher` that is the only way a run whose shard host died ever ends.

It leaves `familiar-control-plane.json` in its DAGSTER_HOME (the UI's address and the
shards) so that `familiar backfill` run with that DAGSTER_HOME submits to the right shard.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

import yaml

from familiar_bot.app import supervisor
from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command
from familiar_pipeline import webserver
from familiar_pipeline.storage.paths import REPO_ROOT

POLL_S = 0.2


def say(message: str) -> None:
    print(f"[familiar control-plane] {message}", file=sys.stderr, flush=True)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance", metavar="URL",
                        help="the shared instance's PostgreSQL URL (default: $FAMILIAR_INSTANCE_URL)")
    parser.add_argument("--shard", action="append", default=[], metavar="NAME=HOST:PORT", required=True,
                        help="a shard's code server (familiar shard serve), repeatable")
    parser.add_argument("--home", type=Path, default=REPO_ROOT / "dagster_home" / "control-plane",
                        help="DAGSTER_HOME of the control plane (default dagster_home/control-plane)")
    parser.add_argument("--host", default="127.0.0.1", help="address the Dagster UI binds to (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=3000, help="Dagster UI port (default 3000)")
    parser.add_argument("--max-run-seconds", type=int, default=None, metavar="S",
                        help="run monitoring fails a run still going after S seconds, e.g. one whose shard host died "
                             "(default 3600; 0: no limit)")


def parse_shards(entries: list[str]) -> dict[str, tuple[str, int]]:
    from familiar_pipeline.shards import ShardError, validate_shard

    found: dict[str, tuple[str, int]] = {}
    for entry in entries:
        name, _, address = entry.partition("=")
        host, _, port = address.rpartition(":")
        try:
            validate_shard(name)
        except ShardError as exc:
            raise CliError(f"--shard {entry}: {exc}", EXIT_CONFIG) from None
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CliError(f"--shard {entry}: expected NAME=HOST:PORT, e.g. a=10.0.0.5:4000", EXIT_CONFIG)
        if name in found:
            raise CliError(f"--shard {name} is given twice", EXIT_CONFIG)
        found[name] = (host, int(port))
    return found


def workspace_yaml(shards: dict[str, tuple[str, int]]) -> str:
    from familiar_pipeline.shards import location_name

    entries = [{"grpc_server": {"host": host, "port": port, "location_name": location_name(name)}}
               for name, (host, port) in shards.items()]
    return yaml.safe_dump({"load_from": entries}, sort_keys=False)


def run(args: argparse.Namespace) -> int:
    from familiar_pipeline.instance import (DEFAULT_MAX_RUNTIME_S, INSTANCE_URL_ENV, POSTGRES_ENV, InstanceError, check_reachable,
                                            instance_url_from, write_instance)
    from familiar_pipeline.storage.private import private_dir

    shards = parse_shards(args.shard)
    if not 0 < args.port < 65536:
        raise CliError(f"--port must be 1-65535, got {args.port}", EXIT_CONFIG)
    max_runtime_s = DEFAULT_MAX_RUNTIME_S if args.max_run_seconds is None else args.max_run_seconds
    if max_runtime_s < 0:
        raise CliError(f"--max-run-seconds must be 0 (no limit) or more, got {max_runtime_s}", EXIT_CONFIG)
    url = instance_url_from(args.instance)
    if url is None:
        raise CliError("the control plane needs the shared instance: --instance postgresql://... or $FAMILIAR_INSTANCE_URL",
                       EXIT_CONFIG)
    try:
        url = check_reachable(url)
    except InstanceError as exc:
        raise CliError(str(exc)) from None
    if supervisor.port_in_use(supervisor.local_host(args.host), args.port):
        raise CliError(f"port {args.port} is already in use; pick another with --port")
    home = private_dir(Path(args.home).expanduser().resolve())
    write_instance(home, shards=True, max_runtime_s=max_runtime_s)
    workspace = home / "workspace.yaml"
    workspace.write_text(workspace_yaml(shards))
    env = supervisor.child_env({INSTANCE_URL_ENV: url, "DAGSTER_HOME": str(home), **POSTGRES_ENV}, dagster_home=home)
    py = sys.executable
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    children: list[supervisor.Child] = []
    local = supervisor.local_address(args.host, args.port)
    try:
        children.append(supervisor.start_child(
            "dagster-webserver", [py, "-m", "dagster_webserver", "-w", str(workspace), "-h", args.host, "-p", str(args.port)],
            env=env, log_path=home / "webserver.log"))
        children.append(supervisor.start_child("dagster-daemon", [py, "-m", "dagster._daemon", "run", "-w", str(workspace)],
                                               env=env, log_path=home / "daemon.log"))
        say(f"shards: {', '.join(f'{n} at {h}:{p}' for n, (h, p) in shards.items())}; DAGSTER_HOME={home}")
        try:
            waited = supervisor.wait_until_ready(f"{local}/server_info", children, should_stop=stop.is_set)
        except supervisor.ChildExited as exc:
            say(f"not ready: {exc}")
            return 1
        except InterruptedError:
            return 0
        webserver.write_control_plane_marker(home, local, {n: f"{h}:{p}" for n, (h, p) in shards.items()})
        say(f"ready in {waited:.1f}s: {supervisor.ui_address(args.host, args.port)} (logs: {home}/webserver.log, daemon.log)")
        return supervisor.watch_children(children, stop, say, POLL_S)
    finally:
        (home / webserver.CONTROL_PLANE_MARKER).unlink(missing_ok=True)
        supervisor.shut_down(children, previous, say)


COMMAND = Command("control-plane", "run the Dagster daemon and UI of a sharded deployment over a shared Postgres "
                  "instance and every shard's code server (see docs/scaling.md)", configure, run)
