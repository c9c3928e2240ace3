"""Asset checks: the invariants that would poison downstream projections if broken.

Each projector declares its invariants in its spec (``Invariant``: a plain function of
a familiar's store and turn log that lists the violations, in the projector's folder);
here each becomes a `MemoryCheck` on the asset it guards. The projection step evaluates
them per familiar right after that asset's projector, on the connection it wrote with
(no second open of the file), and records one evaluation per check and familiar, on that
familiar's partition (`partition_evaluations`). Blocking invariants (facts citing turns that exist, subjects
that are known participants, no fact retired twice, every replacement id existing) hold
back what is built on the asset for that familiar; the others do not. Two checks are the
kernel's, evaluated once per familiar after the step's publish: the snapshot check warns
when the bot's serving snapshot lags the store or is damaged (the next run republishes it),
and the store check, on the turn index, warns while a corrupt store moved aside is being
rebuilt or still lies beside the new one (`storage.corrupt`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import dagster as dg

from familiar_pipeline.dagster_internals import (
    AssetCheckEvaluation,
    carried_over,
    latest_materialization_targets,
    previous_check_evaluations,
)
from familiar_pipeline.defs.partitions import asset_key, familiars_partitions
from familiar_pipeline.engine import registry
from familiar_pipeline.engine.run_loop import INVARIANT
from familiar_pipeline.engine.spec import TURN_INDEX, ProjectorSpec
from familiar_pipeline.projectors import builtin
from familiar_pipeline.storage import corrupt
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.snapshot_lag import snapshot_lag
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

SAMPLE = 10

# Each check runs per familiar, so it takes the familiars partitions; Dagster 1.13 marks
# a partitioned check as preview and warns at every definition. Acknowledged here, where
# we opt in, so `familiar backfill`, `familiar eval` ... do not print it on each start.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec",
                        category=dg.PreviewWarning)


SNAPSHOT_CHECK = "serving_snapshot_in_step"
STORE_CHECK = "memory_store_intact"
SNAPSHOT, STORE = "snapshot", "store"  # the kernel's checks' kinds (INVARIANT: a projector's, the run loop's)


@dataclass(frozen=True)
class MemoryCheck:
    """One check of one asset: an invariant (`find(store, turn_log, familiar_id)` lists its
    violations), or one of the kernel's (`kind`): the snapshot check, which compares the
    published manifest with the store, and the store check, which looks for a moved-aside store."""

    name: str
    asset: str
    description: str
    find: Callable[[ProjectionStore, TurnLog, str], list] | None
    what: str = ""
    blocking: bool = False
    kind: str = INVARIANT

    @property
    def key(self) -> dg.AssetCheckKey:
        return dg.AssetCheckKey(asset_key(self.asset), self.name)

    @property
    def spec(self) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(self.name, asset=asset_key(self.asset), description=self.description,
                                 blocking=self.blocking, partitions_def=familiars_partitions)

    def holds_back(self, result: dg.AssetCheckResult) -> bool:
        """A failed blocking check (an error, not a check that could not run) holds back what is built on its asset."""
        return self.blocking and not result.passed and result.severity == dg.AssetCheckSeverity.ERROR

    def evaluate(self, runtime, familiar_id: str) -> dg.AssetCheckResult:
        """This familiar's result, on the runtime's open store (none yet: nothing to check)."""
        if self.kind == STORE:
            return store_result(runtime.paths)
        if not runtime.paths.memory_db.exists():
            return dg.AssetCheckResult(passed=True, metadata={"note": "no store yet"})
        try:
            with runtime.store() as store:
                if self.kind == SNAPSHOT:
                    lag = snapshot_lag(store, runtime.paths.serving_dir)
                    return dg.AssetCheckResult(passed=lag is None, severity=dg.AssetCheckSeverity.WARN,
                                               metadata={"lag": dg.MetadataValue.json(lag or {})})
                assert self.find is not None, f"invariant check {self.name} has no find"
                bad = self.find(store, runtime.turn_log(), familiar_id)
        except Exception as exc:  # a check that cannot run warns; it does not block the familiar's followers
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                       metadata={"error": f"could not check: {type(exc).__name__}: {exc}"})
        return dg.AssetCheckResult(
            passed=not bad,
            metadata={"violations": len(bad), "sample": dg.MetadataValue.json([list(map(str, b)) for b in bad[:SAMPLE]]),
                      "what": self.what},
        )


def partition_evaluations(instance: dg.DagsterInstance, run_id: str, checks: Sequence[MemoryCheck],
                          results: dict[dg.AssetCheckKey, dict[str, dg.AssetCheckResult]],
                          familiars: Sequence[str]) -> Iterator[AssetCheckEvaluation]:
    """The checks' evaluations for a run: per check, one per familiar of the run's partitions, on its own partition.

    Dagster plans a partitioned check once per partition of the run (as "planned" rows), but
    an `AssetCheckResult` of a run over several partitions is recorded with no partition:
    the planned rows were then resolved as "Skipped", the check's own row said "Passed" and
    the per-partition view counted none passed, so the UI disagreed with itself. So each
    familiar the step checked gets its evaluation on its partition, pointing at the
    materialization it checked; one the run did not process (it lies in the run's range
    but nothing was due for it) keeps its last result, carried over with a note, as long
    as that result still targets the partition's latest materialization. The targets are
    looked up once per asset (its checks share them), not once per check.
    """
    targets_by_asset: dict[dg.AssetKey, dict] = {}
    for check in checks:
        key = check.key
        if key.asset_key not in targets_by_asset:
            targets_by_asset[key.asset_key] = latest_materialization_targets(instance, key.asset_key, familiars)
        targets = targets_by_asset[key.asset_key]
        checked = results.get(key, {})
        for familiar, result in checked.items():
            yield AssetCheckEvaluation(
                asset_key=key.asset_key, check_name=check.name, passed=result.passed, metadata=result.metadata,
                target_materialization_data=targets.get(familiar), severity=result.severity,
                blocking=check.blocking, partition=familiar,
            )
        unchecked = [f for f in familiars if f not in checked and f in targets]
        for familiar, previous in previous_check_evaluations(instance, key, unchecked, run_id).items():
            target = previous.target_materialization_data
            if target is None or target.storage_id != targets[familiar].storage_id:
                continue  # it checked an older materialization: nothing to carry over
            note = f"not checked again: this run changed nothing of {familiar}'s {check.asset}; its last result stands"
            yield carried_over(previous, note)


def spec_checks(spec: ProjectorSpec) -> tuple[MemoryCheck, ...]:
    """The checks on one projector's asset: its declared invariants, then the snapshot check."""
    checks = [MemoryCheck(i.name, spec.asset, i.description, i.find, i.what, i.blocking) for i in spec.invariants]
    if spec.snapshot_check:
        checks.append(MemoryCheck(SNAPSHOT_CHECK, spec.asset,
                                  "The bot's Parquet snapshot is whole and carries the same watermarks as memory.duckdb.",
                                  None, kind=SNAPSHOT))
    if spec.trigger == TURN_INDEX and spec.always_on:
        checks.append(MemoryCheck(STORE_CHECK, spec.asset,
                                  "No corrupt memory.duckdb was moved aside: warns while one is rebuilt from turns.db "
                                  "and while the moved-aside file (which holds message text) is still there.",
                                  None, kind=STORE))
    return tuple(checks)


def store_result(paths: FamiliarPaths) -> dg.AssetCheckResult:
    """The store check: a rebuild under way, or a moved-aside store left (`storage.corrupt`)."""
    moved, marker = corrupt.moved_aside(paths), corrupt.rebuilding(paths)
    state = "rebuilding from turns.db" if marker is not None else ("rebuilt" if moved else "intact")
    return dg.AssetCheckResult(
        passed=marker is None and not moved, severity=dg.AssetCheckSeverity.WARN,
        metadata={"state": state, "moved_aside": len(moved), "newest_moved_aside": moved[-1].name if moved else "",
                  "reason": (marker or {}).get("reason", "")},
    )


# The built-in projectors' checks (a plugin's come from its own spec: `memory_checks`).
CHECKS: tuple[MemoryCheck, ...] = tuple(c for spec in builtin.BUILTIN_SPECS for c in spec_checks(spec))


def memory_checks(assets: Iterable[str]) -> tuple[MemoryCheck, ...]:
    """The checks on these assets, from the registered specs."""
    wanted = set(assets)
    return tuple(c for spec in registry.specs() if spec.asset in wanted for c in spec_checks(spec))
