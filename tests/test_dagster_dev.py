"""The code location loads in Dagster's own tooling, and the real `dagster dev` projects new turns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_dagster_definitions_validate():
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Validation successful" in result.stderr + result.stdout


@pytest.mark.slow
def test_dagster_dev_sensor_projects_new_turns_into_the_snapshot():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import freshness

    result = freshness.run(rounds=1, sensor_interval=5, timeout=240)
    assert len(result["freshness_s"]) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # every child of dagster dev is gone (reaped by init)
        try:
            os.killpg(result["pgid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("processes of the dagster dev group are still alive after stop")
