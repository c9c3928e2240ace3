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


def test_shipped_instance_turns_off_the_new_user_pop_up(tmp_path, monkeypatch):
    import shutil

    import dagster as dg

    shutil.copy(REPO / "dagster_home" / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))  # as `familiar up` and `dagster dev` set it
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.get_settings("nux") == {"enabled": False}
        assert instance.nux_enabled is False
        assert instance.get_settings("telemetry") == {"enabled": False}


def test_loading_the_code_location_prints_no_dagster_lifecycle_warnings():
    """Our commands load the definitions; Dagster's preview/beta notices must not reach the terminal."""
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    result = subprocess.run(
        [sys.executable, "-W", "default", "-c",
         "import familiar_pipeline.definitions as d, familiar_bot.app.cli.main as m; d.defs.resolve_asset_graph()"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PreviewWarning" not in result.stderr and "BetaWarning" not in result.stderr, result.stderr[-2000:]
