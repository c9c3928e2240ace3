"""The code location loads in Dagster's own tooling, and the real `dagster dev` projects new turns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_dagster_definitions_validate():
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Validation successful" in result.stderr + result.stdout


# The real `dagster dev` (sensor -> runs -> snapshot, then a clean stop) is exercised end to end
# through `familiar up` in tests/test_up.py.
