"""Asset checks: the invariants that would poison downstream projections if broken.

Each check is a plain function of a familiar's store and turn log (what it finds is
a list of violations), declared once as a `MemoryCheck` on the asset it guards. The
projection step evaluates them per familiar right after that asset's projector, on the
connection it wrote with (no second open of the file), and records one evaluation per
check and familiar, on that familiar's partition (`partition_evaluations`). Blocking checks (facts citing turns that
exist, subjects that are known participants, no fact retired twice, every
replacement id existing) hold back what is built on the asset for that familiar; the
reflection and dossier checks do not, and the snapshot check warns when the bot's
serving snapshot lags the store after the step's publish (the next run republishes it).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import dagster as dg
from dagster_shared.record import copy as copy_record
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluation,
    AssetCheckEvaluationTargetMaterializationData,
)

from familiar_pipeline.defs.partitions import familiars_partitions
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.snapshot_lag import snapshot_lag
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

SAMPLE = 10

# Each check runs per familiar, so it takes the familiars partitions; Dagster 1.13 marks
# a partitioned check as preview and warns at every definition. Acknowledged here, where
# we opt in, so `familiar backfill`, `familiar eval` ... do not print it on each start.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec",
                        category=dg.PreviewWarning)


def missing_source_turns(store: ProjectionStore, turn_log: TurnLog) -> list[tuple[int, int]]:
    """(fact id, turn id) pairs where a fact cites a turn the log does not have."""
    cited = store.fact_source_turns()
    existing = {t.id for t in turn_log.turns_by_ids(sorted({turn_id for _, turn_id in cited}))}
    return [(fact_id, turn_id) for fact_id, turn_id in cited if turn_id not in existing]


def unknown_subject_keys(store: ProjectionStore, turn_log: TurnLog, familiar_id: str) -> list[tuple[int, str]]:
    """(fact id, key) pairs whose subject is neither a known participant nor the familiar itself."""
    known = {p.canonical_key for p in turn_log.participants()} | {ego_key(familiar_id)}
    return [(fact_id, key) for fact_id, key in store.fact_subject_keys() if key not in known]


# ----------------------------------------------------------------------------- fact-driven invariants


def facts_superseded_twice(store: ProjectionStore, turn_log: TurnLog | None = None) -> list[tuple[int, int]]:
    """(fact id, times) for facts that more than one supersession decision retired.

    The store refuses to retire a retired fact, so a hit means the decision log
    and the facts table disagree (a hand edit, or a bug in a writer).
    """
    return store.facts_retired_more_than_once()


def dangling_superseded_by(store: ProjectionStore, turn_log: TurnLog | None = None) -> list[tuple[int, int]]:
    """(fact id, superseded_by) where the replacement fact does not exist (or is the fact itself)."""
    return store.dangling_replacements()


def uncited_reflections(store: ProjectionStore, turn_log: TurnLog) -> list[tuple[int, str]]:
    """(reflection id, why) for reflections citing no existing turn and no existing fact."""
    rows = store.all_reflections()
    all_turns = sorted({t for r in rows for t in r.cited_turn_ids})
    existing_turns = {t.id for t in turn_log.turns_by_ids(all_turns)} if all_turns else set()
    existing_facts = store.all_fact_ids()
    return [
        (r.id, f"turns {list(r.cited_turn_ids)}, facts {list(r.cited_fact_ids)}")
        for r in rows
        if not (set(r.cited_turn_ids) & existing_turns or set(r.cited_fact_ids) & existing_facts)
    ]


def dossiers_ahead_of_facts(store: ProjectionStore, turn_log: TurnLog | None = None) -> list[tuple[str, int]]:
    """(subject, last_fact_id) for dossiers claiming facts newer than the newest fact."""
    latest = store.latest_fact_id()
    return [(d.canonical_key, d.last_fact_id) for d in store.dossiers() if d.last_fact_id > latest]


SNAPSHOT_CHECK = "serving_snapshot_in_step"


@dataclass(frozen=True)
class MemoryCheck:
    """One invariant of one asset. `find(store, turn_log, familiar_id)` lists its violations;
    None for the snapshot check, which compares the published manifest with the store."""

    name: str
    asset: str
    description: str
    find: Callable[[ProjectionStore, TurnLog, str], list] | None
    what: str = ""
    blocking: bool = False

    @property
    def key(self) -> dg.AssetCheckKey:
        return dg.AssetCheckKey(dg.AssetKey(self.asset), self.name)

    @property
    def spec(self) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(self.name, asset=self.asset, description=self.description,
                                 blocking=self.blocking, partitions_def=familiars_partitions)

    def evaluate(self, runtime, familiar_id: str) -> dg.AssetCheckResult:
        """This familiar's result, on the runtime's open store (none yet: nothing to check)."""
        if not runtime.paths.memory_db.exists():
            return dg.AssetCheckResult(passed=True, metadata={"note": "no store yet"})
        try:
            with runtime.store() as store:
                if self.find is None:
                    lag = snapshot_lag(store, runtime.paths.serving_dir)
                    return dg.AssetCheckResult(passed=lag is None, severity=dg.AssetCheckSeverity.WARN,
                                               metadata={"lag": dg.MetadataValue.json(lag or {})})
                bad = self.find(store, runtime.turn_log(), familiar_id)
        except Exception as exc:  # a check that cannot run warns; it does not block the familiar's followers
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                       metadata={"error": f"could not check: {type(exc).__name__}: {exc}"})
        return dg.AssetCheckResult(
            passed=not bad,
            metadata={"violations": len(bad), "sample": dg.MetadataValue.json([list(map(str, b)) for b in bad[:SAMPLE]]),
                      "what": self.what},
        )


def partition_evaluations(instance: dg.DagsterInstance, run_id: str, check: MemoryCheck,
                          results: dict[str, dg.AssetCheckResult], familiars: Sequence[str]) -> list[AssetCheckEvaluation]:
    """One check's evaluations for a run: one per familiar of the run's partitions, on its own partition.

    Dagster plans a partitioned check once per partition of the run (as "planned" rows), but
    an `AssetCheckResult` of a run over several partitions is recorded with no partition:
    the planned rows were then resolved as "Skipped", the check's own row said "Passed" and
    the per-partition view counted none passed, so the UI disagreed with itself. So each
    familiar the step checked gets its evaluation on its partition, pointing at the
    materialization it checked; one the run did not process (it lies in the run's range
    but nothing was due for it) keeps its last result, carried over with a note, as long
    as that result still targets the partition's latest materialization.
    """
    key = check.key
    targets = _latest_materializations(instance, key.asset_key, familiars)
    evaluations = [
        AssetCheckEvaluation(
            asset_key=key.asset_key, check_name=check.name, passed=result.passed, metadata=result.metadata,
            target_materialization_data=targets.get(familiar), severity=result.severity,
            blocking=check.blocking, partition=familiar,
        )
        for familiar, result in results.items()
    ]
    unchecked = [f for f in familiars if f not in results and f in targets]
    for familiar, previous in _previous_evaluations(instance, key, unchecked, run_id).items():
        target = previous.target_materialization_data
        if target is None or target.storage_id != targets[familiar].storage_id:
            continue  # it checked an older materialization: nothing to carry over
        note = f"not checked again: this run changed nothing of {familiar}'s {check.asset}; its last result stands"
        evaluations.append(copy_record(previous, metadata={**previous.metadata, "carried_over": dg.MetadataValue.text(note)},
                                       blocking=False))  # it held nothing back when it ran; it does not now
    return evaluations


def _latest_materializations(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                             familiars: Sequence[str]) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """Per familiar, its partition's latest materialization of the asset (two queries for all of them)."""
    from dagster._core.events import DagsterEventType

    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        asset_key, DagsterEventType.ASSET_MATERIALIZATION, set(familiars))
    if not latest:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=list(latest.values())), limit=len(latest)).records
    by_id = {r.storage_id: r for r in records}
    return {
        familiar: AssetCheckEvaluationTargetMaterializationData(
            run_id=by_id[storage_id].run_id, storage_id=storage_id, timestamp=by_id[storage_id].timestamp)
        for familiar, storage_id in latest.items() if storage_id in by_id
    }


def _previous_evaluations(instance: dg.DagsterInstance, key: dg.AssetCheckKey, familiars: Sequence[str],
                          run_id: str) -> dict[str, AssetCheckEvaluation]:
    """Each familiar's newest evaluation of the check by an earlier run (one query for all of them)."""
    import sqlalchemy as db
    from dagster._core.events.log import EventLogEntry
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
    from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable as table
    from dagster._serdes import deserialize_value

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
        evaluation = deserialize_value(event, EventLogEntry).dagster_event.event_specific_data
        if isinstance(evaluation, AssetCheckEvaluation):
            found[partition] = evaluation
    return found


CHECKS: tuple[MemoryCheck, ...] = (
    MemoryCheck("facts_cite_existing_turns", "facts", "Every fact's source_turn_ids exist in the turn log.",
                lambda s, t, f: missing_source_turns(s, t), "(fact id, missing turn id)", blocking=True),
    MemoryCheck("fact_subjects_are_participants", "facts",
                "Every subject key is a known participant or the familiar's own ego key.",
                unknown_subject_keys, "(fact id, unknown key)", blocking=True),
    MemoryCheck("no_fact_superseded_twice", "fact_supersessions", "No fact was retired by more than one supersession decision.",
                lambda s, t, f: facts_superseded_twice(s), "(fact id, times retired)", blocking=True),
    MemoryCheck("superseded_by_exists", "fact_supersessions", "Every superseded_by points at an existing, different fact.",
                lambda s, t, f: dangling_superseded_by(s), "(fact id, missing replacement)", blocking=True),
    MemoryCheck("reflections_cite_something", "reflections", "Every reflection cites at least one existing turn or fact.",
                lambda s, t, f: uncited_reflections(s, t), "(reflection id, citations)"),
    MemoryCheck("dossiers_within_facts", "people_dossiers", "No dossier's last_fact_id is past the newest fact id.",
                lambda s, t, f: dossiers_ahead_of_facts(s), "(subject, last_fact_id)"),
    *(
        MemoryCheck(SNAPSHOT_CHECK, asset, "The bot's Parquet snapshot carries the same watermarks as memory.duckdb.", None)
        for asset in ("facts", "rolling_summary", "turns_fts", "fact_supersessions", "people_dossiers", "reflections")
    ),
)


def memory_checks(assets: Iterable[str]) -> tuple[MemoryCheck, ...]:
    """The checks on these assets."""
    wanted = set(assets)
    return tuple(c for c in CHECKS if c.asset in wanted)
