"""`familiar backfill`: catch up or rebuild one projection of one familiar, as a Dagster run."""

from __future__ import annotations

import argparse

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command, require_familiar


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", required=True, help="familiar id (its folder under the data root)")
    parser.add_argument("--projection", required=True, help="projector or asset name, e.g. rich_note, facts, rolling_summary, turns_fts")
    parser.add_argument("--rebuild", action="store_true", help="drop the projection's rows and watermark first, then rebuild from turns")
    parser.add_argument("--shard", metavar="NAME",
                        help="sharded deployment (DAGSTER_HOME of a running `familiar control-plane`): the shard "
                             "that owns the familiar (default: found from the shards' partitions)")
    parser.add_argument("--local", action="store_true",
                        help="run in this process even if this checkout's `familiar up` is running")
    parser.add_argument("--no-wait", action="store_true",
                        help="with `familiar up` (or a control plane) running: queue the run and return; by default "
                             "this waits for it to end and says how it ended (exit 1 if it failed)")
    parser.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                        help="how long to wait for a queued run to end (default 600); it goes on after that")


def run(args: argparse.Namespace) -> int:
    from familiar_pipeline.backfill import WAIT_S, BackfillError, ProjectionDisabled, backfill

    from familiar_pipeline.backfill import ensure_dagster_home
    from familiar_pipeline.webserver import read_control_plane_marker

    if args.local or read_control_plane_marker(ensure_dagster_home()) is None:
        require_familiar(args.familiar)  # on a control plane the familiar's files are on its shard's host
    if args.no_wait and args.wait is not None:
        raise CliError("--wait and --no-wait contradict each other; give one", EXIT_CONFIG)
    if args.wait is not None and args.wait <= 0:
        raise CliError(f"--wait must be a positive number of seconds, got {args.wait:g}", EXIT_CONFIG)
    try:
        outcome = backfill(args.familiar, args.projection, rebuild=args.rebuild, allow_local=True, force_local=args.local,
                           shard=args.shard, wait_s=None if args.no_wait else (args.wait or WAIT_S))
    except ProjectionDisabled as exc:
        raise CliError(str(exc), EXIT_CONFIG) from None
    except BackfillError as exc:
        raise CliError(str(exc)) from exc
    print(f"{outcome.mode}: {outcome.detail}")
    return 0


COMMAND = Command("backfill", "catch up or rebuild one projection of one familiar (a Dagster run, visible in "
                  "the UI): queued on this checkout's `familiar up` if it runs on this DAGSTER_HOME, else "
                  "in this process; waits for the run and says how it ended (--no-wait: only queue it)",
                  configure, run)
