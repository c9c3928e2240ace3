"""Concurrency and load: a burst through the responder while the pipeline projects it in
another process and the bot assembles; two writers for one familiar can never overlap.

The 10k-message, 50-channel figures come from `benchmarks/load.py`; this runs the same
scenario small (CI), and `FAMILIAR_RELIABILITY_FULL=1` runs it at full size.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from benchmarks.load import run_load
from familiar_pipeline.storage.store import ProjectionStore, StoreLockedError

REPO = Path(__file__).resolve().parents[1]
FULL = os.environ.get("FAMILIAR_RELIABILITY_FULL") == "1"


def test_a_burst_is_logged_whole_and_projected_batch_by_batch(tmp_path):
    messages, channels = (10_000, 50) if FULL else (600, 12)
    result = run_load(tmp_path, messages=messages, channels=channels, max_batches=10)
    print("\n".join(result.lines()))
    assert result.lost == 0 and result.duplicates == 0 and result.out_of_order_channels == 0
    assert result.pipeline_errors == [] and result.assembly_errors == 0
    from familiar_pipeline.projectors.facts.spec import RichNoteConfig

    assert result.pipeline_batches == messages // RichNoteConfig().batch_size, "each batch projected once"
    assert result.pipeline_runs > 1, "the backlog took several runs, batch by batch"
    assert result.facts_watermark == result.last_turn_id and result.fts_turn_docs == result.logged
    assert result.assembly_ms, "the bot assembled while the pipeline wrote"


def test_the_run_queue_allows_one_run_per_familiar():
    config = yaml.safe_load((REPO / "dagster_home" / "dagster.yaml").read_text())
    limits = config["run_queue"]["tag_concurrency_limits"]
    assert {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits


def test_duckdb_refuses_a_second_writer_process_with_a_clear_error(tmp_path):
    """The last line of defence behind the queue: another process already writing the store."""
    db = tmp_path / "memory.duckdb"
    ProjectionStore(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from familiar_pipeline.storage.store import ProjectionStore
            store = ProjectionStore({str(db)!r})
            print("holding", flush=True)
            time.sleep(30)
        """)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(StoreLockedError) as err:
            ProjectionStore(db)
        assert str(db) in str(err.value)
    finally:
        holder.kill()
        holder.wait(10)
    ProjectionStore(db).close()  # released with the process: the next run writes
