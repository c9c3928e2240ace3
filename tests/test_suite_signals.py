"""The suite honours SIGTERM in what it starts, even when its shell started it with SIGINT ignored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent('''
    import signal
    import subprocess
    import time

    import dagster as dg


    @dg.asset
    def probe():
        return 1


    def test_a_subprocess_started_after_an_in_process_run_dies_on_sigterm():
        assert dg.materialize([probe]).success  # Dagster maps SIGTERM to SIGINT's handler after it
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
        child = subprocess.Popen(["sleep", "60"])
        started = time.monotonic()
        child.terminate()
        assert child.wait(timeout=10) == -signal.SIGTERM and time.monotonic() - started < 5
''')


def test_the_suite_started_with_sigint_ignored_still_terminates_its_subprocesses(tmp_path):
    """`nohup .ci/run &` starts pytest with SIGINT ignored; conftest gives it back its handler, or every
    Dagster compute-log `tail` started after the first in-process run would ignore SIGTERM."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_probe.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
