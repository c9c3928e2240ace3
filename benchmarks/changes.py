"""What one deleted or edited message costs a familiar with 10,000 turns: time to forgotten, model calls.

Builds a familiar of `--turns` synthetic chat turns (three people, two servers and a DM,
deterministic) through the whole graph with the scripted model (in-process Dagster, a
throwaway instance, shipped cadence), then deletes `--deletions` turns spread from the
oldest to the newest, and edits `--edits`, one at a time. After each change it runs what
the turn sensor would ask for (`schedule.due_assets` on the familiar's state: the change
alone makes facts and the summary due, their followers ride along) and prints, per change:
the seconds from the change to a published snapshot without it, and the model calls it
took per asset (calls the response cache answered are free and not counted). The time is
the run's own; through `familiar up` add the sensor interval (5 s) and a run's start
(~0.25 s, `benchmarks/run_start.py`).

    uv run python benchmarks/changes.py [--turns 10000] [--deletions 10] [--edits 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

import dagster as dg  # noqa: E402

from familiar_pipeline.config.loading import load_config  # noqa: E402
from familiar_pipeline.defs.jobs import materialize_in_process  # noqa: E402
from familiar_pipeline.projectors.facts.changes import facts_citing  # noqa: E402
from familiar_pipeline.engine.schedule import due_assets, read_state  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.storage.snapshots import SnapshotReader  # noqa: E402
from familiar_pipeline.storage.store import ProjectionStore  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402

from benchmarks.pipeline import ALL_ASSETS, GRAPH_TOML, scripted_familiar  # noqa: E402

PEOPLE = [("discord:1", "Cass"), ("discord:2", "Bo"), ("discord:3", "Mia")]
PLACES = [(10, 100), (20, 200), (30, None)]  # (channel, guild): two servers and a DM
WORDS = ("garden bakery cello hiking Lisbon album peanuts trip sister deadline library concert bike "
         "recipe puppy exam apartment festival violin marathon").split()
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def synthetic_turns(n: int, seed: int = 7) -> list[dict]:
    """n chat turns, a minute apart, in runs of a few turns per place: what a busy familiar hears."""
    rng = random.Random(seed)
    rows, place = [], PLACES[0]
    for i in range(n):
        if i % 6 == 0:
            place = rng.choice(PLACES)
        key, name = PEOPLE[0] if place[1] is None else rng.choice(PEOPLE)
        a, b = rng.sample(WORDS, 2)
        rows.append(dict(channel_id=place[0], guild_id=place[1], role="user", author_key=key, author_display=name,
                         content=f"I keep thinking about the {a} and the {b} this week, number {i}",
                         created_at=BASE + timedelta(minutes=i)))
    return rows


def served_fact_turns(paths: FamiliarPaths) -> set[int]:
    """Every source turn of a fact in the published snapshot (what the bot reads)."""
    table = SnapshotReader(paths.serving_dir).current().table("facts")
    return {t for ids in table.column("source_turn_ids").to_pylist() for t in ids}


def follow(root: Path, paths: FamiliarPaths, instance, fake) -> tuple[float, dict[str, int], list[str]]:
    """Run what the sensor would ask for now; (seconds, model calls per asset, the assets)."""
    started = time.perf_counter()
    config = load_config("bench", root=root)
    due = due_assets(config, read_state(paths, config))
    calls_before = len(fake.calls)
    result = materialize_in_process(due, instance=instance, data_root=root, partition_key="bench")
    seconds = time.perf_counter() - started
    calls = {}
    for event in result.get_asset_materialization_events():
        n = int(event.materialization.metadata.get("llm_calls", dg.IntMetadataValue(0)).value or 0)
        if n:
            calls[event.asset_key.path[-1]] = n
    assert sum(calls.values()) == len(fake.calls) - calls_before or not calls
    return seconds, calls, due


def build(root: Path, paths: FamiliarPaths, instance, rows: list[dict]) -> tuple[float, int]:
    """The familiar's turns logged and the whole graph built over them: (seconds, facts)."""
    with TurnLog(paths.turns_db) as log:
        for key, name in PEOPLE:
            log.upsert_participant(key, username=name.lower(), global_name=name)
        log.append_turns(rows)
    started = time.perf_counter()
    materialize_in_process(ALL_ASSETS, instance=instance, data_root=root, partition_key="bench")
    build_s = time.perf_counter() - started
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return build_s, store.count(store.table("facts"))


def run(turns: int, deletions: int, edits: int) -> dict:
    with scripted_familiar(GRAPH_TOML) as (root, paths, instance, fake):
        build_s, n_facts = build(root, paths, instance, synthetic_turns(turns))
        changes = []
        # spread from the oldest to the newest, and one among the newest windows (folded out exactly)
        positions = [max(1, round(turns * (k + 0.5) / deletions)) for k in range(deletions)] + [turns - 30]
        edit_positions = [max(1, round(turns * (k + 0.25) / max(edits, 1))) for k in range(edits)]
        for kind, position in [*(("delete", p) for p in reversed(positions)), *(("edit", p) for p in edit_positions)]:
            with TurnLog(paths.turns_db) as log:
                if kind == "delete":
                    log.record_deletion(turn_id=position)
                else:  # the next turn still standing (an edit of a deleted turn changes nothing)
                    while (edited := log.record_edit(turn_id=position, new_content="Actually I meant the violin "
                                                     f"and the exam, {position}")) is None or edited.deleted:
                        position += 1
            with ProjectionStore(paths.memory_db, read_only=True) as store:
                had = len(facts_citing(store, [position]))
            seconds, calls, due = follow(root, paths, instance, fake)
            if kind == "delete":
                assert position not in served_fact_turns(paths), f"turn {position} still served"
            changes.append({"kind": kind, "turn": position, "age_turns": turns - position, "facts_citing": had,
                            "seconds": round(seconds, 3), "calls": calls, "total_calls": sum(calls.values()),
                            "assets": due})
        return {"turns": turns, "facts": n_facts, "build_s": round(build_s, 1), "changes": changes,
                "load_average": [round(x, 2) for x in os.getloadavg()]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--deletions", type=int, default=10)
    parser.add_argument("--edits", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parse_with_quick(parser, turns=400)
    result = run(args.turns, args.deletions, args.edits)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"familiar: {result['turns']} turns, {result['facts']} facts, built in {result['build_s']} s "
          f"(load {result['load_average']})")
    print(f"{'change':<8}{'turn':>7}{'age':>7}{'facts':>7}{'s':>8}{'calls':>7}  calls by asset")
    for c in result["changes"]:
        by = ", ".join(f"{k} {v}" for k, v in sorted(c["calls"].items())) or "-"
        print(f"{c['kind']:<8}{c['turn']:>7}{c['age_turns']:>7}{c['facts_citing']:>7}{c['seconds']:>8.2f}"
              f"{c['total_calls']:>7}  {by}")
    for kind in ("delete", "edit"):
        rows = [c for c in result["changes"] if c["kind"] == kind]
        if rows:
            secs, calls = [c["seconds"] for c in rows], [c["total_calls"] for c in rows]
            print(f"{kind}: seconds p50 {statistics.median(secs):.2f} p95 {percentile(secs, 0.95):.2f}; "
                  f"model calls p50 {statistics.median(calls):.0f} p95 {percentile(calls, 0.95):.0f} "
                  f"max {max(calls)}")


if __name__ == "__main__":
    main()
