"""`familiar forget`: erase a person or a message from every byte the project writes.

Two steps. The request is recorded in the turn log at once (`TurnLog.request_erasure`): the
turns are tombstoned, so the bot stops quoting them from its next reply, and the erasure log
keeps who asked, when and which turn ids. Then a projection run of the familiar follows the
deletions through memory and purges every copy (`erasure.purge`). With this checkout's
`familiar up` running, the turn sensor requests that run within a tick and this command waits
for the erasure to be done; otherwise the command runs it in this process, through Dagster,
once no other run of the familiar is in flight. Either way a run killed half-way leaves the
erasure pending and the next run finishes it.

An operator command, not a Dagster definition: it sits above the code location it runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import dagster as dg

from familiar_pipeline.backfill import BackfillError, ensure_dagster_home, verified_target
from familiar_pipeline.config import load_config
from familiar_pipeline.defs.jobs import materialize_in_process
from familiar_pipeline.defs.sensors import in_flight_runs
from familiar_pipeline.erasure.verify import summary
from familiar_pipeline.engine.schedule import due_assets, read_state
from familiar_pipeline.storage.paths import FamiliarPaths, validate_familiar_id
from familiar_pipeline.storage.turns import Erasure, TurnLog, TurnLogError

POLL_S = 0.5


class ForgetError(RuntimeError):
    """An erasure that could not be recorded or finished: one line for the operator."""


@dataclass(frozen=True)
class ForgetOutcome:
    erasure: Erasure  # as it stands at the end (status "done", or "pending" when left to a run)
    mode: str  # "in-process" | "sensor" | "recorded"
    run_id: str | None = None
    seconds: float = 0.0


def record(familiar_id: str, *, person: str | None = None, message: str | None = None, scope: str | None = None,
           requested_by: str) -> Erasure:
    """Record the erasure in the turn log (its turns tombstoned now); ForgetError on a bad or unknown target."""
    validate_familiar_id(familiar_id)
    if (person is None) == (message is None):
        raise ForgetError("give exactly one of --person platform:user_id or --message <message id>")
    paths = FamiliarPaths.for_id(familiar_id)
    if not paths.turns_db.exists():
        raise ForgetError(f"familiar {familiar_id!r} has no turn log at {paths.turns_db}")
    try:
        with TurnLog(paths.turns_db) as turn_log:
            return turn_log.request_erasure(kind="person" if person is not None else "message",
                                            target=person if person is not None else str(message),
                                            scope=scope, requested_by=requested_by)
    except (TurnLogError, ValueError) as exc:
        raise ForgetError(str(exc)) from None


def status(familiar_id: str, erasure_id: int) -> Erasure:
    with TurnLog(FamiliarPaths.for_id(familiar_id).turns_db, readonly=True) as turn_log:
        for erasure in turn_log.erasures():
            if erasure.id == erasure_id:
                return erasure
    raise ForgetError(f"familiar {familiar_id!r} has no erasure #{erasure_id}")


def finish(familiar_id: str, erasure: Erasure, *, wait_s: float = 600.0, force_local: bool = False,
           clock: Callable[[], float] = time.monotonic) -> ForgetOutcome:
    """Have a run purge the erasure's turns, and wait until it is done (ForgetError past `wait_s`)."""
    started = clock()
    try:
        url = None if force_local else verified_target()
    except BackfillError as exc:
        raise ForgetError(str(exc)) from None
    if url is not None:  # the turn sensor of this checkout's `familiar up` requests the run
        done = _wait_done(familiar_id, erasure.id, started + wait_s, clock)
        return ForgetOutcome(done, "sensor", None, clock() - started)
    run_id = _run_in_process(familiar_id, started + wait_s, clock)
    done = status(familiar_id, erasure.id)
    if done.status != "done":
        _raise_if_left(done)
        raise ForgetError(f"erasure #{erasure.id} is still pending after run {run_id}: a projection it waits for "
                          "failed or is behind; see the run in the Dagster UI (`familiar forget --status` "
                          "shows it; the next run finishes it)")
    return ForgetOutcome(done, "in-process", run_id, clock() - started)


def check_line(erasure: Erasure) -> str:
    """What the scan after the erasure's purge found, in one line ("" before it was scanned)."""
    check = erasure.check
    return "" if check is None else summary(check.words, check.files, check.left)


def _raise_if_left(erasure: Erasure) -> None:
    """ForgetError naming the files the scan after a purge still found an erased word in."""
    if erasure.status != "done" and erasure.check is not None and erasure.check.left:
        raise ForgetError(f"erasure #{erasure.id} is not done: {check_line(erasure)}; its messages stay hidden and "
                          "the next run purges again (`familiar forget --status` shows it)")


def _wait_done(familiar_id: str, erasure_id: int, deadline: float, clock: Callable[[], float]) -> Erasure:
    while True:
        erasure = status(familiar_id, erasure_id)
        if erasure.status == "done":
            return erasure
        _raise_if_left(erasure)
        if clock() >= deadline:
            raise ForgetError(f"erasure #{erasure_id} is recorded and its turns are hidden, but the run that purges "
                              "them has not finished yet; `familiar forget --status` shows when it has")
        time.sleep(POLL_S)


def _run_in_process(familiar_id: str, deadline: float, clock: Callable[[], float]) -> str:
    """One projection run of the familiar with what is due (the purge rides with the turn index)."""
    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    while familiar_id in in_flight_runs(instance, list(instance.get_dynamic_partitions("familiars"))):
        if clock() >= deadline:
            raise ForgetError(f"a run of {familiar_id!r} is still queued or running; the erasure is recorded "
                              "and the next run finishes it")
        time.sleep(POLL_S)  # one writer per familiar: the purge waits for that run
    instance.add_dynamic_partitions("familiars", [familiar_id])
    config = load_config(familiar_id)
    assets = due_assets(config, read_state(FamiliarPaths.for_id(familiar_id), config))
    result = materialize_in_process(assets, instance=instance, partition_key=familiar_id,
                                    tags={"familiar": familiar_id, "trigger": "familiar forget"},
                                    raise_on_error=False, log_level="WARNING")
    return result.run_id
