"""Asset checks: the invariants that would poison downstream projections if broken.

Each check is a plain function of a familiar's store and turn log (what it finds is
a list of violations), declared once as a `MemoryCheck` on the asset it guards. The
projection step evaluates them per familiar right after that asset's projector, on the
connection it wrote with (no second open of the file), and reports one result per
check per run (`combine_check_results`). Blocking checks (facts citing turns that
exist, subjects that are known participants, no fact retired twice, every
replacement id existing) hold back what is built on the asset for that familiar; the
reflection and dossier checks do not, and the snapshot check warns when the bot's
serving snapshot lags the store after the step's publish (the next run republishes it).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import dagster as dg

from familiar_pipeline.defs.partitions import familiars_partitions
from familiar_pipeline.storage.identity import ego_key
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


def snapshot_lag(store: ProjectionStore, serving_dir) -> dict | None:
    """None when the published manifest matches the store's watermarks, else both sides."""
    try:
        manifest = json.loads((serving_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {"store": store.serving_watermark(), "snapshot": None}
    published = manifest.get("store_watermark")
    current = store.serving_watermark()
    return None if published == current else {"store": current, "snapshot": published}


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
