"""What a projection run process imports and how long it takes to start and finish.

A Dagster run worker (in-process executor) imports the code location, then runs
its steps. This measures the same thing in a fresh Python process each time:

* `import`: `import familiar_pipeline.definitions` alone;
* `facts`: import, then materialize `turns_fts` and `facts` for one familiar with a
  new batch of 10 turns and the scripted model (one model call, one publish);
* `no-op`: the same run with nothing new (no model call is due).

For each: the process's wall time (median of `--repeat`), the import part, and which
heavy modules ended up loaded (litellm and pandas should not be, unless needed).

    uv run python benchmarks/run_start.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402

HEAVY = ("litellm", "pandas", "dagster", "duckdb", "pyarrow", "numpy", "tantivy", "fastembed", "onnxruntime")

WORKER = r"""
import json, sys, time
started = time.perf_counter()
import familiar_pipeline.definitions as d
imported = time.perf_counter()
result = {"import_s": imported - started}
if sys.argv[1] != "import":
    import dagster as dg
    from familiar_pipeline.defs.jobs import materialize_in_process
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["bench"])
        materialize_in_process(["turns_fts", "facts"], instance=instance, partition_key="bench")
    result["run_s"] = time.perf_counter() - imported
result["loaded"] = sorted(m for m in %r if m in sys.modules)
print(json.dumps(result))
""" % (HEAVY,)


def worker(mode: str, env: dict) -> dict:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", WORKER, mode], cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} worker failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - started
    return result


def append_batch(paths: FamiliarPaths, n: int = 10) -> None:
    with TurnLog(paths.turns_db) as log:
        start = log.latest_id()
        for i in range(start, start + n):
            log.append_turn(channel_id=1, role="user", author_key="discord:1", author_display="Ana",
                            content=f"Message {i}: I keep a journal about mountain walk number {i}",
                            created_at=datetime.now(timezone.utc))


def measure(repeat: int = 5) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as name:
        root = Path(name) / "familiars"
        paths = FamiliarPaths.for_id("bench", root)
        paths.dir.mkdir(parents=True)
        paths.character_toml.write_text('[llm.background]\nmodel = "fake/careful"\n')
        with TurnLog(paths.turns_db) as log:
            log.upsert_participant("discord:1", global_name="Ana")
        env = dict(os.environ, FAMILIAR_DATA_ROOT=str(root), LITELLM_LOCAL_MODEL_COST_MAP="True",
                   FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model")
        for mode in ("import", "facts", "no-op"):
            runs = []
            for _ in range(repeat):
                if mode == "facts":
                    append_batch(paths)
                runs.append(worker(mode, env))
            summary = {key: round(statistics.median(r[key] for r in runs), 2) for key in ("wall_s", "import_s", "run_s") if key in runs[0]}
            summary["loaded"] = runs[-1]["loaded"]
            results[mode] = summary
            print(f"{mode}: {summary}", flush=True)
    results["load_average"] = os.getloadavg()[0]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parse_with_quick(parser, repeat=1)
    print(json.dumps(measure(args.repeat)), flush=True)


if __name__ == "__main__":
    main()
