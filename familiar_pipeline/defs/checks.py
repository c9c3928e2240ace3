"""Asset checks: the invariants that would poison downstream projections if broken.

Each projector declares its invariants in its spec (``Invariant``: a plain function of
a familiar's store and turn log that lists the violations, in the projector's folder);
here each becomes a `MemoryCheck` on the asset it guards. The projection step evaluates
them per familiar right after that asset's projector, on the connection it wrote with
(no second open of the file), and reports one result per check per run
(`combine_check_results`). Blocking invariants (facts citing turns that exist, subjects
that are known participants, no fact retired twice, every replacement id existing) hold
back what is built on the asset for that familiar; the others do not, and the snapshot
check warns when the bot's serving snapshot lags the store after the step's publish
(the next run republishes it).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import dagster as dg

from familiar_pipeline.defs.partitions import familiars_partitions
from familiar_pipeline.projectors import registry
from familiar_pipeline.projectors.spec import ProjectorSpec
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

SAMPLE = 10

# Each check runs per familiar, so it takes the familiars partitions; Dagster 1.13 marks
# a partitioned check as preview and warns at every definition. Acknowledged here, where
# we opt in, so `familiar backfill`, `familiar eval` ... do not print it on each start.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec",
                        category=dg.PreviewWarning)


def snapshot_lag(store: ProjectionStore, serving_dir: Path) -> dict | None:
    """None when the published manifest matches the store's watermarks, else both sides."""
    try:
        manifest = json.loads((serving_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {"store": store.serving_watermark(), "snapshot": None}
    published = manifest.get("store_watermark")
    current = store.serving_watermark()
    return None if published == current else {"store": current, "snapshot": published}


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


def combine_check_results(results: dict[str, dg.AssetCheckResult], *, check: MemoryCheck) -> dg.AssetCheckResult:
    """One check's results over the familiars of a run, as the one result Dagster records for the run.

    Dagster 1.13 records a check once per run, with no partition when the run covers
    several familiars; the result passes only if every familiar passed, and names the
    ones that did not with their own metadata. A run of one familiar reports its result as is.
    """
    if len(results) == 1:
        result = next(iter(results.values()))
    else:
        failing = {f: r for f, r in results.items() if not r.passed}
        errors = any(r.severity == dg.AssetCheckSeverity.ERROR for r in failing.values())
        result = dg.AssetCheckResult(
            passed=not failing,
            severity=dg.AssetCheckSeverity.ERROR if errors or not failing else dg.AssetCheckSeverity.WARN,
            metadata={
                "familiars_checked": len(results),
                "failing": dg.MetadataValue.json({f: {k: v.value for k, v in r.metadata.items()} for f, r in failing.items()}),
            },
        )
    return result._replace(asset_key=check.key.asset_key, check_name=check.name)


def spec_checks(spec: ProjectorSpec) -> tuple[MemoryCheck, ...]:
    """The checks on one projector's asset: its declared invariants, then the snapshot check."""
    checks = [MemoryCheck(i.name, spec.asset, i.description, i.find, i.what, i.blocking) for i in spec.invariants]
    if spec.snapshot_check:
        checks.append(MemoryCheck(SNAPSHOT_CHECK, spec.asset,
                                  "The bot's Parquet snapshot carries the same watermarks as memory.duckdb.", None))
    return tuple(checks)


# The built-in projectors' checks (a plugin's come from its own spec: `memory_checks`).
CHECKS: tuple[MemoryCheck, ...] = tuple(c for spec in registry.BUILTIN_SPECS for c in spec_checks(spec))


def memory_checks(assets: Iterable[str]) -> tuple[MemoryCheck, ...]:
    """The checks on these assets, from the registered specs."""
    wanted = set(assets)
    return tuple(c for spec in registry.specs() if spec.asset in wanted for c in spec_checks(spec))
