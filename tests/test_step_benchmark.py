"""benchmarks/step.py runs end to end on a small case and reports what it says it reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_step_benchmark_runs_two_familiars_and_reports_per_familiar_figures(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "DAGSTER_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "step.py"), "--familiars", "2", "--repeat", "1",
                          "--json"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout)
    assert figures["all_runs_succeeded"] and figures["familiars"] == 2 and len(figures["runs"]) == 1
    assert figures["cpu_ms_per_familiar"] > 0 and figures["wall_ms_per_familiar"] > 0
    profile = figures["profile"]["calls_per_familiar"]
    # Each familiar's steady batch in a run over both: two passes (its facts, then the rest), each with one
    # store open and one publish; model calls (at least the summary, the facts and one supersession call
    # for the batch: a reflection comes every other 20-turn batch, a dossier once its facts weigh
    # fold_min_weight); the two index commits.
    assert profile["store open"] == 2 and profile["snapshot publish"] == 2
    assert profile["model calls (LlmClient.complete)"] >= 3 and profile["tantivy commit"] == 2
    assert not list(tmp_path.glob("tmp*")), "the benchmark left its temporary folder behind"
