"""Every script in benchmarks/ runs in its quick mode (`--quick`, benchmarks/quick.py).

A benchmark nobody runs breaks without anyone noticing: `scale.py` failed on main for weeks
once the CLI refused an unknown familiar (issue 51). Each script here runs end to end on small
sizes in a subprocess with its own temporary folder, DAGSTER_HOME and data root, and must
exit 0, print what it reports and leave no temporary folder behind. A new script without a
quick run fails `test_every_benchmark_script_has_a_quick_run`. Nothing here judges speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_eval import fixture

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"

# script -> (extra arguments, text its output must hold). "{data}" is a tiny LoCoMo-format file.
QUICK: dict[str, tuple[list[str], str]] = {
    "assembly": ([], "mean per layer (ms)"),
    "changes": ([], "edit: seconds p50"),
    "forget": ([], "Cass's markers in 0 files"),
    "freshness": ([], '"freshness_p50_s"'),
    "idle": (["--no-ui"], '"median_cores"'),
    "load": ([], "OK: nothing lost, fully projected"),
    "pipeline": (["--data", "{data}"], "LLM per 100 turns (whole graph)"),
    "report": (["--parts", "assembly,embedding,pipeline", "--data", "{data}", "--out", "{tmp}/report"], "wrote "),
    "run_start": ([], '"no-op"'),
    "scale": ([], '"busy_cpu_s_per_1000_turns"'),
    "step": ([], "per familiar"),
    "store": ([], "full-text index (turns)"),
    "turn_log": ([], "appends in"),
    "updates": (["--chats", "1"], '"quick": true'),
    "wishes": (["--data", "{data}"], '"section_tokens_mean"'),
}
# What the embedding runtime (fastembed, onnxruntime) leaves in TMPDIR whoever calls it: not the scripts' own.
RUNTIME_CACHES = {"fastembed_cache", ".ses"}
# Not benchmarks: the helper every script parses its arguments with.
NOT_SCRIPTS = {"quick"}


def test_every_benchmark_script_has_a_quick_run():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - NOT_SCRIPTS
    assert scripts == set(QUICK), "each script in benchmarks/ needs --quick and a row in QUICK"
    for name in scripts:
        assert "--quick" in (BENCHMARKS / f"{name}.py").read_text() or "parse_with_quick" in (
            BENCHMARKS / f"{name}.py").read_text(), name


@pytest.mark.parametrize("name", sorted(QUICK))
def test_the_benchmark_runs_in_its_quick_mode(name, tmp_path):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    args, expected = QUICK[name]
    argv = [a.format(data=data, tmp=tmp_path) for a in args]
    env = {**os.environ, "TMPDIR": str(scratch), "DAGSTER_HOME": str(tmp_path / "home"),
           "FAMILIAR_DATA_ROOT": str(tmp_path / "familiars"), "FAMILIAR_ENV_FILE": "",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("DISCORD_TOKEN", None)
    env.pop("FAMILIAR_LOCOMO", None)
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"benchmarks/{name}.py --quick failed:\n{done.stderr[-3000:]}"
    assert expected in done.stdout, done.stdout[-3000:]
    if name != "updates":  # its own quick flag predates benchmarks/quick.py
        assert "quick run" in done.stderr or name == "report"
    assert not [p for p in scratch.iterdir() if p.name not in RUNTIME_CACHES], \
        f"benchmarks/{name}.py left temporary files behind: {sorted(p.name for p in scratch.iterdir())}"
