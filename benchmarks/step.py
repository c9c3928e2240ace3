"""The projection step's own CPU per familiar, in process: what a run spends once it has started.

N familiars (scripted model `fake/careful`, shipped defaults) each get a batch of
turns; a first run over all of them gets past cold start (imports, first opens,
empty stores); then, `--repeat` times, every familiar gets a new batch and one run
over the whole range processes it (the sensor's multi-familiar run, in this
process, on a throwaway `dg.instance_for_test()` configured with the repository's
event log class). Prints per-familiar CPU ms (`time.process_time`) and wall ms of
each steady-state run and their medians; then one more steady-state run under
cProfile, whose cumulative time is split into what the step spends it on (store
open/close, snapshot publish, model calls, DuckDB statements, tantivy commits,
Dagster's event log). Profiled times are inflated by the profiler: read the shares.

    uv run python benchmarks/step.py [--familiars 30] [--turns 20] [--repeat 3] [--no-profile] [--json]

No network: the scripted model answers in this process.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import pstats
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

import dagster as dg  # noqa: E402

from familiar_pipeline.defs.jobs import materialize_in_process  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402
from familiar_pipeline.testing.fake_llm import fake_llm  # noqa: E402
from familiar_pipeline.testing.scripted import careful_model  # noqa: E402
from tests.helpers import LINES, PEOPLE  # noqa: E402  (the chat lines the scripted model extracts facts from)

# The shipped default selection of a turn-driven run with its followers.
ASSETS = ["turns_fts", "rolling_summary", "facts", "fact_supersessions", "people_dossiers", "reflections"]
CHARACTER = '[llm.background]\nmodel = "fake/careful"\n'
EVENT_LOG = {"module": "familiar_pipeline.event_log", "class": "FamiliarSqliteEventLogStorage"}

# Where the profiled step's time goes: (label, predicate on (file, line, function)) over
# cumulative times; the categories may nest (a publish runs DuckDB statements), read each alone.
BREAKDOWN = [
    ("store open", lambda f, fn: f.endswith("storage/store.py") and fn == "__init__"),
    ("store close", lambda f, fn: f.endswith("storage/store.py") and fn == "close"),
    ("snapshot publish", lambda f, fn: f.endswith("storage/snapshots/publish.py") and fn == "publish_snapshot"),
    ("model calls (LlmClient.complete)", lambda f, fn: f.endswith("models/llm.py") and fn == "complete"),
    ("litellm.completion", lambda f, fn: "litellm" in f and fn == "wrapper" and "utils.py" in f),
    ("store statements (ProjectionStore.sql)", lambda f, fn: f.endswith("storage/store.py") and fn == "sql"),
    ("tantivy commit", lambda f, fn: "tantivy" in fn.lower() and "commit" in fn),
    ("turn log reads", lambda f, fn: f.endswith("storage/turns.py") and fn in ("turns_after", "turns_between", "turns")),
    ("Dagster event log (store_event)", lambda f, fn: "event_log" in f and fn == "store_event"),
    ("config load", lambda f, fn: f.endswith("config/loading.py") and fn == "load_config"),
]


def append_batch(paths: FamiliarPaths, n: int, start: int) -> None:
    """n user turns one second apart, ending now (a batch that closes at its size, not at a quiet gap)."""
    end = datetime.now(timezone.utc)
    with TurnLog(paths.turns_db) as log:
        for i in range(start, start + n):
            key, name = PEOPLE[i % len(PEOPLE)]
            log.upsert_participant(key, username=name.lower(), global_name=name)
            log.append_turn(channel_id=10, guild_id=1, role="user", author_key=key, author_display=name,
                            content=f"{LINES[i % len(LINES)]} (#{i})",
                            created_at=end - timedelta(seconds=start + n - 1 - i))


def breakdown(profile: cProfile.Profile) -> tuple[float, dict[str, dict]]:
    stats = pstats.Stats(profile).stats
    total = sum(v[2] for v in stats.values())
    out: dict[str, dict] = {}
    for label, match in BREAKDOWN:
        cum = calls = 0.0
        for (file, _line, fn), (_cc, nc, _tt, ct, callers) in stats.items():
            if match(file, fn):
                # cumulative time once per outermost call: skip recursive entries (callers that match too)
                if any(match(cf, cfn) for (cf, _cl, cfn) in callers):
                    continue
                cum += ct
                calls += nc
        out[label] = {"cum_s": round(cum, 3), "calls": int(calls)}
    return total, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--familiars", type=int, default=30)
    parser.add_argument("--turns", type=int, default=20, help="turns per familiar per batch (the default batch_size)")
    parser.add_argument("--repeat", type=int, default=3, help="steady-state runs timed (median reported)")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled run and its breakdown")
    parser.add_argument("--top", type=int, default=0, help="also print the profile's N functions by own time")
    parser.add_argument("--profile-out", help="write the profiled run's cProfile stats to this file (snakeviz, pstats)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parse_with_quick(parser, familiars=2, repeat=1)
    logging.getLogger("dagster").setLevel(logging.WARNING)

    names = [f"f{i:03d}" for i in range(args.familiars)]
    with tempfile.TemporaryDirectory() as tmp, fake_llm(careful_model):
        root = Path(tmp) / "familiars"
        familiars = []
        for name in names:
            paths = FamiliarPaths.for_id(name, root)
            paths.dir.mkdir(parents=True)
            paths.character_toml.write_text(CHARACTER)
            familiars.append(paths)
        (Path(tmp) / "home").mkdir()
        events = {**EVENT_LOG, "config": {"base_dir": str(Path(tmp) / "history" / "runs")}}
        with dg.instance_for_test(temp_dir=str(Path(tmp) / "home"), overrides={"event_log_storage": events}) as inst:
            inst.add_dynamic_partitions("familiars", names)
            tags = {"dagster/asset_partition_range_start": names[0], "dagster/asset_partition_range_end": names[-1]}
            batch = [0]
            sys_share: list[float] = []  # of each run's CPU, the kernel's (fsyncs of the stores and indexes)

            def step() -> tuple[float, float, bool]:
                for paths in familiars:
                    append_batch(paths, args.turns, batch[0] * args.turns)
                batch[0] += 1
                wall, cpu, times = time.perf_counter(), time.process_time(), os.times()
                result = materialize_in_process(ASSETS, instance=inst, data_root=root, tags=tags,
                                                raise_on_error=False, log_level="WARNING")
                after = os.times()
                sys_share.append((after.system - times.system) / max(1e-9, after.user + after.system - times.user - times.system))
                return time.perf_counter() - wall, time.process_time() - cpu, result.success

            cold_wall, cold_cpu, ok = step()
            runs = []
            for _ in range(args.repeat):
                wall, cpu, ok_run = step()
                ok = ok and ok_run
                runs.append({"cpu_ms_per_familiar": round(cpu / len(names) * 1000, 1),
                             "wall_ms_per_familiar": round(wall / len(names) * 1000, 1),
                             "system_cpu_share": round(sys_share[-1], 3)})
            profile_out = None
            if not args.no_profile:
                profiler = cProfile.Profile()
                profiler.enable()
                wall, _cpu, ok_run = step()
                profiler.disable()
                ok = ok and ok_run
                if args.profile_out:
                    profiler.dump_stats(args.profile_out)
                total, parts = breakdown(profiler)
                profile_out = {"profiled_wall_s": round(wall, 3), "profiled_total_s": round(total, 3),
                               "per_familiar_ms": {k: round(v["cum_s"] / len(names) * 1000, 1) for k, v in parts.items()},
                               "calls_per_familiar": {k: round(v["calls"] / len(names), 1) for k, v in parts.items()}}
                if args.top and not args.json:
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    figures = {
        "familiars": len(names), "turns_per_batch": args.turns, "repeat": args.repeat, "all_runs_succeeded": ok,
        "cold_cpu_ms_per_familiar": round(cold_cpu / len(names) * 1000, 1),
        "cold_wall_ms_per_familiar": round(cold_wall / len(names) * 1000, 1),
        "runs": runs,
        "cpu_ms_per_familiar": statistics.median(r["cpu_ms_per_familiar"] for r in runs),
        "wall_ms_per_familiar": statistics.median(r["wall_ms_per_familiar"] for r in runs),
        "profile": profile_out,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"{len(names)} familiars x {args.turns} turns, steady-state runs: "
          + ", ".join(f"{r['cpu_ms_per_familiar']:.0f}/{r['wall_ms_per_familiar']:.0f}" for r in runs)
          + " ms CPU/wall per familiar")
    print(f"median per familiar: CPU {figures['cpu_ms_per_familiar']:.1f} ms, wall {figures['wall_ms_per_familiar']:.1f} ms"
          f" (cold run: CPU {figures['cold_cpu_ms_per_familiar']:.0f} ms); kernel share of the CPU"
          f" {statistics.median(r['system_cpu_share'] for r in runs):.0%}; all runs succeeded: {ok};"
          f" load average {figures['load_average']}")
    if profile_out:
        print(f"profiled run (cProfile, inflated): {profile_out['profiled_wall_s']:.2f} s wall; per familiar, cumulative:")
        for label, ms in profile_out["per_familiar_ms"].items():
            print(f"  {label:36s} {ms:7.1f} ms  {profile_out['calls_per_familiar'][label]:6.1f} calls")


if __name__ == "__main__":
    main()
