"""Asset checks: the invariants that would poison downstream projections if broken.

Blocking checks (facts citing turns that exist, subjects that are known
participants, no fact retired twice, every replacement id existing) stop
downstream assets in the same run; the reflection and dossier checks and the
snapshot check warn (the snapshot one when the bot's serving snapshot lags the
store; the next run republishes it).
"""


import json
import warnings

import dagster as dg

from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.defs.partitions import familiars_partitions
from familiar_pipeline.defs.resources import FamiliarData
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

SAMPLE = 10

# Each check runs per familiar, so it takes the familiars partitions; Dagster 1.13 marks
# a partitioned check as preview and warns at every definition. Acknowledged here, where
# we opt in, so `familiar backfill`, `familiar eval` ... do not print it on each start.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec",
                        category=dg.PreviewWarning)


def _open(familiar_data: FamiliarData, familiar_id: str):
    paths = familiar_data.paths(familiar_id)
    return paths, ProjectionStore(paths.memory_db, read_only=True) if paths.memory_db.exists() else None


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


def checked_familiars(context: dg.AssetCheckExecutionContext) -> list[str]:
    """The run's familiars that its plan had the checked asset process (all of them without a plan)."""
    asset = context.check_specs[0].asset_key.path[-1]
    ops = (context.run.run_config or {}).get("ops") or {}
    planned = set(((ops.get(asset) or {}).get("config") or {}).get("familiars") or ())
    return [f for f in context.partition_keys if not planned or f in planned]


def per_familiar(context: dg.AssetCheckExecutionContext, check_one) -> dg.AssetCheckResult:
    """`check_one(familiar_id)` for each familiar of the run, as one result.

    Dagster 1.13 evaluates a check once per run, with no partition when the run covers
    several; the result passes only if every familiar passed, and names the ones that
    did not with their own metadata. A run of one familiar reports its result as is.
    A familiar that cannot be checked at all (its store unreadable: the asset has already
    reported that familiar failed) warns rather than blocking the others' followers.
    """
    results = {}
    for familiar_id in checked_familiars(context):
        try:
            results[familiar_id] = check_one(familiar_id)
        except Exception as exc:
            if len(context.partition_keys) == 1:
                raise
            results[familiar_id] = dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.WARN,
                metadata={"error": f"could not check: {type(exc).__name__}: {exc}"},
            )
    if len(results) == 1:
        return next(iter(results.values()))
    failing = {f: r for f, r in results.items() if not r.passed}
    errors = any(r.severity == dg.AssetCheckSeverity.ERROR for r in failing.values())
    severity = dg.AssetCheckSeverity.ERROR if errors or not failing else dg.AssetCheckSeverity.WARN
    return dg.AssetCheckResult(
        passed=not failing,
        severity=severity,
        metadata={
            "familiars_checked": len(results),
            "failing": dg.MetadataValue.json(
                {f: {k: v.value for k, v in r.metadata.items()} for f, r in failing.items()}
            ),
        },
    )


def _check_facts(familiar_data: FamiliarData, familiar_id: str, finder, what: str) -> dg.AssetCheckResult:
    paths, store = _open(familiar_data, familiar_id)
    if store is None:
        return dg.AssetCheckResult(passed=True, metadata={"note": "no store yet"})
    try:
        with TurnLog(paths.turns_db, readonly=True) as turn_log:
            bad = finder(store, turn_log)
    finally:
        store.close()
    return dg.AssetCheckResult(
        passed=not bad,
        metadata={"violations": len(bad), "sample": dg.MetadataValue.json([list(map(str, b)) for b in bad[:SAMPLE]]), "what": what},
    )


@dg.asset_check(asset="facts", blocking=True, partitions_def=familiars_partitions, description="Every fact's source_turn_ids exist in the turn log.")
def facts_cite_existing_turns(context: dg.AssetCheckExecutionContext, familiar_data: FamiliarData) -> dg.AssetCheckResult:
    return per_familiar(context, lambda f: _check_facts(familiar_data, f, missing_source_turns, "(fact id, missing turn id)"))


@dg.asset_check(asset="facts", blocking=True, partitions_def=familiars_partitions, description="Every subject key is a known participant or the familiar's own ego key.")
def fact_subjects_are_participants(context: dg.AssetCheckExecutionContext, familiar_data: FamiliarData) -> dg.AssetCheckResult:
    return per_familiar(context, lambda familiar_id: _check_facts(
        familiar_data, familiar_id, lambda s, t: unknown_subject_keys(s, t, familiar_id), "(fact id, unknown key)"
    ))


def snapshot_check(asset_name: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset_name,
        name="serving_snapshot_in_step",
        partitions_def=familiars_partitions,
        description="The bot's Parquet snapshot carries the same watermarks as memory.duckdb.",
    )
    def _check(context: dg.AssetCheckExecutionContext, familiar_data: FamiliarData) -> dg.AssetCheckResult:
        return per_familiar(context, lambda familiar_id: _snapshot_in_step(familiar_data, familiar_id))

    return _check


def _snapshot_in_step(familiar_data: FamiliarData, familiar_id: str) -> dg.AssetCheckResult:
    paths, store = _open(familiar_data, familiar_id)
    if store is None:
        return dg.AssetCheckResult(passed=True, metadata={"note": "no store yet"})
    try:
        lag = snapshot_lag(store, paths.serving_dir)
    finally:
        store.close()
    return dg.AssetCheckResult(
        passed=lag is None,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"lag": dg.MetadataValue.json(lag or {})},
    )


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


@dg.asset_check(asset="fact_supersessions", blocking=True, partitions_def=familiars_partitions, description="No fact was retired by more than one supersession decision.")
def no_fact_superseded_twice(context: dg.AssetCheckExecutionContext, familiar_data: FamiliarData) -> dg.AssetCheckResult:
    return per_familiar(context, lambda f: _check_facts(familiar_data, f, facts_superseded_twice, "(fact id, times retired)"))


@dg.asset_check(asset="fact_supersessions", blocking=True, partitions_def=familiars_partitions, description="Every superseded_by points at an existing, different fact.")
def superseded_by_exists(context: dg.AssetCheckExecutionContext, familiar_data: FamiliarData) -> dg.AssetCheckResult:
    return per_familiar(context, lambda f: _check_facts(familiar_data, f, dangling_superseded_by, "(fact id, missing replacement)"))


@dg.asset_check(asset="reflections", partitions_def=familiars_partitions, description="Every reflection cites at least one existing turn or fact.")
def reflections_cite_something(context: dg.AssetCheckExecutionContext, familiar_data: FamiliarData) -> dg.AssetCheckResult:
    return per_familiar(context, lambda f: _check_facts(familiar_data, f, uncited_reflections, "(reflection id, citations)"))


@dg.asset_check(asset="people_dossiers", partitions_def=familiars_partitions, description="No dossier's last_fact_id is past the newest fact id.")
def dossiers_within_facts(context: dg.AssetCheckExecutionContext, familiar_data: FamiliarData) -> dg.AssetCheckResult:
    return per_familiar(context, lambda f: _check_facts(familiar_data, f, dossiers_ahead_of_facts, "(subject, last_fact_id)"))


FACT_DRIVEN_CHECKS = [
    no_fact_superseded_twice,
    superseded_by_exists,
    reflections_cite_something,
    dossiers_within_facts,
    snapshot_check("fact_supersessions"),
    snapshot_check("people_dossiers"),
    snapshot_check("reflections"),
]

ALL_CHECKS = [
    facts_cite_existing_turns,
    fact_subjects_are_participants,
    snapshot_check("facts"),
    snapshot_check("rolling_summary"),
    snapshot_check("turns_fts"),
    *FACT_DRIVEN_CHECKS,
]
