"""`familiar forget`: erase a person or one message from every file, and show the erasure log."""

from __future__ import annotations

import argparse
import getpass

from familiar_bot.app.cli.main import CliError, Command, require_familiar


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", required=True, help="familiar id (its folder under the data root)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--person", metavar="PLATFORM:USER_ID",
                      help="everything this person said, and every fact, dossier and reflection about them")
    what.add_argument("--message", metavar="MESSAGE_ID", help="one message, by its platform message id")
    what.add_argument("--status", action="store_true", help="list the erasure log (ids and counts, never text)")
    what.add_argument("--list-people", action="store_true", help="list the people this familiar knows, by key")
    parser.add_argument("--scope", help="only in this scope: guild:<server id> or channel:<channel id>")
    parser.add_argument("--by", help="who asked, for the erasure log (default: operator:<login name>)")
    parser.add_argument("--no-wait", action="store_true",
                        help="record the erasure (its messages are hidden at once) and leave the purge to the next run")
    parser.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                        help="how long to wait for the run that purges it (default 600)")
    parser.add_argument("--local", action="store_true",
                        help="run the purge in this process even if this checkout's `familiar up` is running")


def run(args: argparse.Namespace) -> int:
    from familiar_pipeline.forget import ForgetError, check_line, finish, record

    paths = require_familiar(args.familiar)
    if args.status:
        return _status(paths)
    if args.list_people:
        return _people(paths)
    by = args.by or f"operator:{getpass.getuser()}"
    try:
        erasure = record(args.familiar, person=args.person, message=args.message, scope=args.scope, requested_by=by)
    except ForgetError as exc:
        raise CliError(str(exc)) from None
    where = f" in {erasure.scope}" if erasure.scope else ""
    replies = (f"; {len(erasure.replies_erased)} of my replies to them erased, {len(erasure.replies_redacted)} "
               "that repeated their words redacted") if erasure.replies_erased or erasure.replies_redacted else ""
    print(f"erasure #{erasure.id} recorded: {len(erasure.turn_ids)} message(s) of {erasure.target}{where} "
          f"hidden from replies now{replies}")
    if args.no_wait:
        print("the next projection run purges them; `familiar forget --status` shows when it is done")
        return 0
    try:
        outcome = finish(args.familiar, erasure, wait_s=args.wait, force_local=args.local)
    except ForgetError as exc:
        raise CliError(str(exc)) from None
    how = f"run {outcome.run_id}" if outcome.run_id else "the turn sensor's run"
    print(f"erasure #{erasure.id} done in {outcome.seconds:.1f} s ({how}): purged from the turn log, memory, "
          "indexes, snapshots, the model cache, the run history and the logs; checked: "
          f"{check_line(outcome.erasure)}")
    return 0


def _status(paths) -> int:
    from familiar_pipeline.forget import check_line
    from familiar_pipeline.storage.turns import TurnLog

    with TurnLog(paths.turns_db, readonly=True) as turn_log:
        erasures = turn_log.erasures()
    if not erasures:
        print("no erasures")
    for e in erasures:
        done = f"done {e.done_at:%Y-%m-%d %H:%M:%S}" if e.done_at else "pending"
        checked = f"; {check_line(e)}" if e.check is not None else ""
        print(f"#{e.id} {e.requested_at:%Y-%m-%d %H:%M:%S} by {e.requested_by}: {e.kind} {e.target}"
              f"{' in ' + e.scope if e.scope else ''}, {len(e.turn_ids)} message(s), {done}{checked}")
    return 0


def _people(paths) -> int:
    from familiar_pipeline.storage.turns import TurnLog

    with TurnLog(paths.turns_db, readonly=True) as turn_log:
        for person in turn_log.participants():
            name = person.global_name or person.username or ""
            print(f"{person.canonical_key}\t{name}")
    return 0


COMMAND = Command("forget", "erase a person (--person) or one message (--message) from every file: the turn log, "
                  "memory, indexes, snapshots, the model cache, Dagster's run history and the logs", configure, run)
