"""A code location for the run launcher's tests: a quick job and one that runs until it is interrupted.

Each asset writes `<LAUNCHER_TEST_DIR>/<asset>.json` with its process id and what it
found already imported, so a test can tell a forked run worker from a fresh process.
"""

import json
import os
import sys
import time
from pathlib import Path

import dagster as dg


def _mark(name: str, **extra) -> None:
    out = Path(os.environ["LAUNCHER_TEST_DIR"]) / f"{name}.json"
    out.write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid(),
                               "litellm_imported": "litellm" in sys.modules, **extra}))


@dg.asset
def quick() -> None:
    _mark(f"quick-{os.getpid()}")


@dg.asset
def slow() -> None:
    _mark("slow")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the run is terminated
        time.sleep(0.05)


defs = dg.Definitions(
    assets=[quick, slow],
    jobs=[dg.define_asset_job("quick_job", [quick]), dg.define_asset_job("slow_job", [slow])],
    executor=dg.in_process_executor,
)
