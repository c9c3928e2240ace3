"""What forgetting costs a familiar with 10,000 turns: one person, and one message.

Builds the familiar of `benchmarks/changes.py` (`--turns` synthetic turns of three people in two
servers and a DM, deterministic; each of Cass's turns carries a unique marker word) through the
whole graph with the scripted model (in-process Dagster, a throwaway instance, shipped cadence).
Then, one at a time: one message of Bo's is erased, then Cass, everything they said (the DM and
their server turns). After each request it runs what the turn sensor would ask for (the request
alone makes it due) and prints the seconds from the request to the erasure being done (every copy
purged: store rewritten, indexes rebuilt, snapshots republished, cache and run history scrubbed,
turn log vacuumed), the purge's own seconds, and the model calls per asset (calls the response
cache answered are free and not counted). Afterwards it scans every byte under the data root and
the Dagster home for Cass's markers. Through `familiar up` add the sensor interval (5 s) and a
run's start (~0.25 s).

    uv run python benchmarks/forget.py [--turns 10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

import dagster as dg  # noqa: E402

from familiar_pipeline.config.loading import load_config  # noqa: E402
from familiar_pipeline.defs.jobs import materialize_in_process  # noqa: E402
from familiar_pipeline.engine.schedule import due_assets, read_state  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402

from benchmarks.changes import PEOPLE, build, synthetic_turns  # noqa: E402
from benchmarks.pipeline import GRAPH_TOML, scripted_familiar  # noqa: E402

MARK = "zqxmark"


def marked_turns(n: int) -> list[dict]:
    rows = synthetic_turns(n)
    for i, row in enumerate(rows):
        if row["author_key"] == PEOPLE[0][0]:
            row["content"] += f" ({MARK}{i})"
    return rows


def folder_bytes(*roots: Path) -> int:
    return sum(p.stat().st_size for root in roots for p in root.rglob("*") if p.is_file())


def marker_files(*roots: Path) -> list[str]:
    return sorted(str(p) for root in roots for p in root.rglob("*")
                  if p.is_file() and MARK.encode() in p.read_bytes())


def erase(root: Path, paths, instance, fake, **request) -> dict:
    """Record one erasure and run what the sensor asks for until it is done."""
    started = time.perf_counter()
    with TurnLog(paths.turns_db) as log:
        erasure = log.request_erasure(requested_by="operator:bench", **request)
    calls: dict[str, int] = {}
    purge_note = ""
    runs = 0
    calls_before = len(fake.calls)
    while True:
        config = load_config("bench", root=root)
        due = due_assets(config, read_state(paths, config))
        if not due:
            break
        runs += 1
        result = materialize_in_process(due, instance=instance, data_root=root, partition_key="bench")
        for event in result.get_asset_materialization_events():
            meta = event.materialization.metadata
            n = int(meta.get("llm_calls", dg.IntMetadataValue(0)).value or 0)
            if n:
                calls[event.asset_key.path[-1]] = calls.get(event.asset_key.path[-1], 0) + n
            if "erasure" in meta:
                purge_note = str(meta["erasure"].value)
    seconds = time.perf_counter() - started
    with TurnLog(paths.turns_db, readonly=True) as log:
        [done] = [e for e in log.erasures() if e.id == erasure.id]
    assert done.status == "done", done
    assert sum(calls.values()) == len(fake.calls) - calls_before
    return {"kind": erasure.kind, "turns": len(erasure.turn_ids), "seconds": round(seconds, 2), "runs": runs,
            "calls": calls, "total_calls": sum(calls.values()), "purge": purge_note}


def run(turns: int) -> dict:
    with scripted_familiar(GRAPH_TOML) as (root, paths, instance, fake):
        home = Path(instance.root_directory)
        build_s, n_facts = build(root, paths, instance, marked_turns(turns))
        before = {"bytes": folder_bytes(root, home), "marker_files": len(marker_files(root, home))}
        with TurnLog(paths.turns_db, readonly=True) as log:
            bo = next(t for t in log.turns_after(turns // 2, limit=100) if t.author_key == PEOPLE[1][0])
        message = erase(root, paths, instance, fake, kind="message", target=f"turn:{bo.id}")
        person = erase(root, paths, instance, fake, kind="person", target=PEOPLE[0][0])
        after = {"bytes": folder_bytes(root, home), "marker_files": marker_files(root, home)}
        return {"turns": turns, "facts": n_facts, "build_s": round(build_s, 1), "erasures": [message, person],
                "before": before, "after": after, "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parse_with_quick(parser, turns=400)
    result = run(args.turns)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"familiar: {result['turns']} turns, {result['facts']} facts, built in {result['build_s']} s "
          f"(load {result['load_average']}); {result['before']['bytes'] / 1e6:.1f} MB on disk, "
          f"Cass's markers in {result['before']['marker_files']} files")
    for e in result["erasures"]:
        by = ", ".join(f"{k} {v}" for k, v in sorted(e["calls"].items())) or "-"
        print(f"forget {e['kind']}: {e['turns']} turns, {e['seconds']:.2f} s to done in {e['runs']} run(s), "
              f"{e['total_calls']} model calls ({by})")
        print(f"  purge: {e['purge']}")
    print(f"afterwards: {result['after']['bytes'] / 1e6:.1f} MB on disk, Cass's markers in "
          f"{len(result['after']['marker_files'])} files {result['after']['marker_files'][:5]}")


if __name__ == "__main__":
    main()
