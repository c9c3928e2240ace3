"""`familiar shard serve`: one host's share of the familiars, served as its own Dagster code location.

Starts Dagster's own gRPC code server (`dagster api grpc`) for `familiar_pipeline.definitions`
as the location `familiar_shard_<name>`, with this shard's data root and familiars in its
environment (`familiar_pipeline.shards`): its assets are `shard_<name>/...`, its partitions
`familiars_<name>`, and its turn sensor reads only its own familiars. The control plane
(`familiar control-plane`, on any host) lists this server in its workspace; its daemon
evaluates the sensor here and, with Dagster's `DefaultRunLauncher`, asks this server to
start each run, so runs execute on this host and touch only this host's files.

`--bot ID` (repeatable) also runs `familiar bot --familiar ID` for familiars of this shard
(Discord: DISCORD_TOKEN in the environment), under the same data root. Ctrl-C or SIGTERM
stops everything; a child that exits on its own stops the rest with a non-zero status.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from familiar_bot.app import supervisor
from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command

POLL_S = 0.2
READY_TIMEOUT_S = 180.0


def say(message: str) -> None:
    print(f"[familiar shard] {message}", file=sys.stderr, flush=True)


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="shard_action", metavar="ACTION", required=True)
    serve = actions.add_parser("serve", help="serve this host's familiars as a Dagster code location (gRPC)",
                               description="Serve one shard: a set of familiars under a data root of this host, as the "
                                           "code location familiar_shard_<name>.")
    serve.add_argument("--shard", required=True, help="the shard's name (a-z, 0-9, '_'), e.g. a")
    serve.add_argument("--data-root", required=True, type=Path, help="this shard's data root (one folder per familiar)")
    serve.add_argument("--familiars", default="",
                       help="comma-separated familiar ids this shard owns (default: every familiar under --data-root); "
                            "ids must be unique across shards")
    serve.add_argument("--instance", metavar="URL",
                       help="the shared instance's PostgreSQL URL (default: $FAMILIAR_INSTANCE_URL); runs started here "
                            "write their events there")
    serve.add_argument("--host", default="127.0.0.1", help="address the gRPC server binds to (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=4000, help="gRPC port (default 4000)")
    serve.add_argument("--bot", action="append", default=[], metavar="ID",
                       help="also run the Discord bot of this familiar of the shard (repeatable)")


def shard_env(shard: str, data_root: Path, familiars: list[str], url: str, dagster_home: Path) -> dict[str, str]:
    from familiar_pipeline import shards
    from familiar_pipeline.instance import INSTANCE_URL_ENV, POSTGRES_ENV

    env = supervisor.child_env(dagster_home=dagster_home)
    env.update({shards.SHARD_ENV: shard, "FAMILIAR_DATA_ROOT": str(data_root), INSTANCE_URL_ENV: url,
                "DAGSTER_HOME": str(dagster_home), **POSTGRES_ENV})
    if familiars:
        env[shards.SHARD_FAMILIARS_ENV] = ",".join(familiars)
    else:
        env.pop(shards.SHARD_FAMILIARS_ENV, None)
    return env


def code_server_argv(shard: str, host: str, port: int) -> list[str]:
    from familiar_pipeline.shards import location_name

    return [sys.executable, "-m", "dagster", "api", "grpc", "-m", "familiar_pipeline.definitions",
            "--location-name", location_name(shard), "-h", host, "-p", str(port)]


def wait_for_port(host: str, port: int, children: list[supervisor.Child], stop: threading.Event,
                  timeout: float = READY_TIMEOUT_S) -> None:
    import time

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for child in children:
            if not child.running():
                raise supervisor.ChildExited(child.describe_exit())
        if stop.is_set():
            raise InterruptedError
        if supervisor.port_in_use(host, port):
            return
        time.sleep(0.2)
    raise supervisor.ChildExited(f"the code server did not listen on {host}:{port} within {timeout:.0f}s")


def run(args: argparse.Namespace) -> int:
    from familiar_pipeline import shards
    from familiar_pipeline.instance import InstanceError, check_reachable, instance_url_from
    from familiar_pipeline.storage.paths import validate_familiar_id
    from familiar_pipeline.storage.private import private_dir

    try:
        shard = shards.validate_shard(args.shard)
    except shards.ShardError as exc:
        raise CliError(str(exc), EXIT_CONFIG) from None
    familiars = [f.strip() for f in args.familiars.split(",") if f.strip()]
    for familiar in familiars:
        validate_familiar_id(familiar)
    for familiar in args.bot:
        if familiars and familiar not in familiars:
            raise CliError(f"--bot {familiar}: not one of this shard's familiars ({', '.join(familiars)})", EXIT_CONFIG)
    if not 0 < args.port < 65536:
        raise CliError(f"--port must be 1-65535, got {args.port}", EXIT_CONFIG)
    url = instance_url_from(args.instance)
    if url is None:
        raise CliError("a shard needs the shared instance: --instance postgresql://... or $FAMILIAR_INSTANCE_URL", EXIT_CONFIG)
    try:
        url = check_reachable(url)
    except InstanceError as exc:
        raise CliError(str(exc)) from None
    local = supervisor.local_host(args.host)
    if supervisor.port_in_use(local, args.port):
        raise CliError(f"port {args.port} is already in use; pick another with --port")
    root = Path(args.data_root).expanduser().resolve()
    private_dir(root)
    home = private_dir(root.parent / f".dagster-shard-{shard}")  # the code server's own scratch, beside the data root
    env = shard_env(shard, root, familiars, url, home)

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    children: list[supervisor.Child] = []
    try:
        children.append(supervisor.start_child(f"code server {shards.location_name(shard)}",
                                                code_server_argv(shard, args.host, args.port), env=env,
                                                log_path=home / "code-server.log"))
        try:
            wait_for_port(local, args.port, children, stop)
        except supervisor.ChildExited as exc:
            say(f"not ready: {exc}")
            return 1
        except InterruptedError:
            return 0
        owned = ", ".join(familiars) if familiars else f"every familiar under {root}"
        say(f"ready: code location {shards.location_name(shard)} at {args.host}:{args.port} ({owned}); "
            f"log: {home / 'code-server.log'}")
        for familiar in args.bot:
            children.append(supervisor.start_child(f"bot {familiar}", [sys.executable, "-m", "familiar_bot.app.cli.main",
                                                                         "bot", "--familiar", familiar], env=env))
        return supervisor.watch_children(children, stop, say, POLL_S)
    finally:
        supervisor.shut_down(children, previous, say)


COMMAND = Command("shard", "serve this host's familiars as a Dagster code location of a sharded deployment "
                  "(familiar shard serve; see docs/scaling.md)", configure, run)
